//! Where Redis is: one server, or a cluster given by its seed nodes (`redis.url` with
//! several URLs separated by commas), and a live connection to either.

use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection, PubSub};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Client, Cmd, RedisResult, Value};

use super::health;

/// One server, or the seed nodes of a cluster (kept for listening, see [`Target::listener`]).
pub(super) enum Target {
    Server(Client),
    Cluster(Box<ClusterClient>, Vec<Client>),
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
        let seeds: Vec<&str> = url
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .collect();
        let client = ClusterClient::new(seeds.clone())?;
        let nodes = seeds
            .into_iter()
            .map(Client::open)
            .collect::<RedisResult<_>>()?;
        Ok(Target::Cluster(Box::new(client), nodes))
    }

    /// A connection that only listens (publish/subscribe): to the server, or to the first
    /// seed of a cluster that answers, since a message published on any node of a cluster
    /// reaches every node.
    pub(super) async fn listener(&self) -> RedisResult<PubSub> {
        match self {
            Target::Server(client) => client.get_async_pubsub().await,
            Target::Cluster(_, nodes) => {
                let mut failed = None;
                for node in nodes {
                    match node.get_async_pubsub().await {
                        Ok(listener) => return Ok(listener),
                        Err(error) => failed = Some(error),
                    }
                }
                Err(failed.unwrap_or_else(|| (redis::ErrorKind::Io, "no seed node").into()))
            }
        }
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
            Target::Cluster(client, _) => {
                client.get_async_connection().await.map(Connection::Cluster)
            }
        }
    }
}
