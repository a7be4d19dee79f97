//! Test access to Redis as the gateway sees it: one server, or a Redis Cluster when
//! `REDIS_URL` lists several seed nodes separated by commas.

use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

/// A connection to the server or the cluster of `url`.
#[derive(Clone)]
pub enum TestRedis {
    Server(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl ConnectionLike for TestRedis {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            TestRedis::Server(connection) => connection.req_packed_command(cmd),
            TestRedis::Cluster(connection) => connection.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            TestRedis::Server(connection) => {
                connection.req_packed_commands(pipeline, offset, count)
            }
            TestRedis::Cluster(connection) => {
                connection.req_packed_commands(pipeline, offset, count)
            }
        }
    }

    fn get_db(&self) -> i64 {
        0
    }
}

fn nodes(url: &str) -> Vec<&str> {
    url.split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .collect()
}

pub async fn redis_connection(url: &str) -> redis::RedisResult<TestRedis> {
    if !url.contains(',') {
        return redis::Client::open(url)?
            .get_multiplexed_async_connection()
            .await
            .map(TestRedis::Server);
    }
    ClusterClient::new(nodes(url))?
        .get_async_connection()
        .await
        .map(TestRedis::Cluster)
}

/// Removes every Redis key under `prefix` (on each node of a cluster: the seed nodes are
/// its primaries); best effort, a leak only costs memory.
pub async fn delete_redis_keys(url: &str, prefix: &str) {
    for node in nodes(url) {
        let Ok(client) = redis::Client::open(node) else {
            continue;
        };
        let connect = client.get_multiplexed_async_connection();
        let Ok(Ok(mut conn)) = tokio::time::timeout(Duration::from_secs(1), connect).await else {
            continue;
        };
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{prefix}*"))
            .query_async(&mut conn)
            .await
            .unwrap_or_default();
        for key in keys {
            // One key per command: on a cluster node, keys of different slots.
            let _ = redis::cmd("DEL")
                .arg(key)
                .query_async::<i64>(&mut conn)
                .await;
        }
    }
}
