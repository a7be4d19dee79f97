//! A Redis connection that is allowed to be missing.
//!
//! Redis only accelerates flashgate, so the gateway must start and serve without it. This
//! handle keeps at most one multiplexed connection, bounds every command by a timeout,
//! counts failures, drops a broken connection and lets a background task reconnect.
//!
//! `redis.url` holding several URLs separated by commas selects a Redis Cluster: they are
//! its seed nodes, and each command goes to the primary of its key's slot (a script to the
//! slot of its first key; every script keeps its keys in one slot).

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Client, Cmd, FromRedisValue, RedisResult, Value};
use tokio::sync::RwLock;
use tokio_util::sync::CancellationToken;

use crate::telemetry;

#[derive(Debug, thiserror::Error)]
pub enum RedisError {
    #[error("redis is not connected")]
    Disconnected,
    #[error("redis command timed out")]
    Timeout,
    #[error("redis command failed: {0}")]
    Command(#[from] redis::RedisError),
}

#[derive(Clone)]
pub struct RedisHandle {
    inner: Arc<Inner>,
}

/// One server, or the seed nodes of a cluster.
enum Target {
    Server(Client),
    Cluster(Box<ClusterClient>),
}

/// A live connection to either.
#[derive(Clone)]
enum Connection {
    Server(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Connection {
    async fn run(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            Connection::Server(connection) => connection.req_packed_command(cmd).await,
            Connection::Cluster(connection) => connection.req_packed_command(cmd).await,
        }
    }
}

impl Target {
    fn open(url: &str) -> RedisResult<Self> {
        if !url.contains(',') {
            return Client::open(url).map(Target::Server);
        }
        let seeds = url.split(',').map(str::trim).filter(|u| !u.is_empty());
        let client = ClusterClient::new(seeds)?;
        Ok(Target::Cluster(Box::new(client)))
    }

    async fn connect(&self, timeout: Duration) -> RedisResult<Connection> {
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

struct Inner {
    client: Option<Target>,
    connection: RwLock<Option<Connection>>,
    key_prefix: String,
    command_timeout: Duration,
}

impl RedisHandle {
    /// Never fails: a bad URL or an unreachable server leaves the handle disconnected.
    pub fn new(url: &str, key_prefix: &str, command_timeout: Duration) -> Self {
        let client = Target::open(url)
            .inspect_err(
                |error| tracing::error!(%error, "redis url is invalid; running without redis"),
            )
            .ok();
        Self {
            inner: Arc::new(Inner {
                client,
                connection: RwLock::new(None),
                key_prefix: key_prefix.to_owned(),
                command_timeout,
            }),
        }
    }

    pub fn key(&self, suffix: &str) -> String {
        format!("{}{}", self.inner.key_prefix, suffix)
    }

    pub async fn is_connected(&self) -> bool {
        self.inner.connection.read().await.is_some()
    }

    /// Runs one command with the configured timeout; any failure drops the connection.
    pub async fn run<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, RedisError> {
        let Some(mut connection) = self.inner.connection.read().await.clone() else {
            metrics::counter!(telemetry::REDIS_ERRORS).increment(1);
            return Err(RedisError::Disconnected);
        };
        let outcome = tokio::time::timeout(self.inner.command_timeout, async {
            let value = connection.run(cmd).await?;
            T::from_redis_value(value).map_err(redis::RedisError::from)
        })
        .await;
        let error = match outcome {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(error)) => RedisError::Command(error),
            Err(_) => RedisError::Timeout,
        };
        metrics::counter!(telemetry::REDIS_ERRORS).increment(1);
        *self.inner.connection.write().await = None;
        Err(error)
    }

    /// Connects whenever disconnected, until `shutdown`.
    pub async fn keep_connected(self, interval: Duration, shutdown: CancellationToken) {
        loop {
            if !self.is_connected().await {
                self.connect().await;
            }
            let up = if self.is_connected().await { 1.0 } else { 0.0 };
            metrics::gauge!(telemetry::REDIS_UP).set(up);
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(interval) => {}
            }
        }
    }

    /// One connection attempt; failure is counted and leaves the handle disconnected.
    pub async fn connect(&self) {
        let Some(client) = self.inner.client.as_ref() else {
            return;
        };
        let connecting = client.connect(self.inner.command_timeout);
        let timeout = self.inner.command_timeout * 5;
        let connected = tokio::time::timeout(timeout, connecting)
            .await
            .unwrap_or_else(|_| Err((redis::ErrorKind::Io, "connect timed out").into()));
        match connected {
            Ok(connection) => {
                tracing::info!("redis connected");
                *self.inner.connection.write().await = Some(connection);
            }
            Err(error) => {
                metrics::counter!(telemetry::REDIS_ERRORS).increment(1);
                tracing::debug!(%error, "redis connect failed; serving from PostgreSQL");
            }
        }
    }
}
