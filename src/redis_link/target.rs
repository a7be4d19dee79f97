//! Where Redis is: one server, or a cluster given by its seed nodes (`redis.url` with
//! several URLs separated by commas), and a live connection to either.

use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Client, Cmd, RedisResult, Value};

use super::health;

/// One server, or the seed nodes of a cluster.
pub(super) enum Target {
    Server(Client),
    Cluster(Box<ClusterClient>),
}

/// A live connection to either.
#[derive(Clone)]
pub(super) enum Connection {
    Server(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Connection {
    pub(super) async fn run(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            Connection::Server(connection) => connection.req_packed_command(cmd).await,
            Connection::Cluster(connection) => connection.req_packed_command(cmd).await,
        }
    }

    pub(super) async fn probe(&mut self) -> RedisResult<()> {
        match self {
            Connection::Server(connection) => health::probe_server(connection).await,
            Connection::Cluster(connection) => health::probe_cluster(connection).await,
        }
    }
}

impl Target {
    pub(super) fn open(url: &str) -> RedisResult<Self> {
        if !url.contains(',') {
            return Client::open(url).map(Target::Server);
        }
        let seeds = url.split(',').map(str::trim).filter(|u| !u.is_empty());
        let client = ClusterClient::new(seeds)?;
        Ok(Target::Cluster(Box::new(client)))
    }

    pub(super) async fn connect(&self, timeout: Duration) -> RedisResult<Connection> {
        match self {
            Target::Server(client) => {
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(timeout * 5))
                    .set_response_timeout(Some(timeout));
                client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
                    .map(Connection::Server)
            }
            Target::Cluster(client) => client.get_async_connection().await.map(Connection::Cluster),
        }
    }
}
