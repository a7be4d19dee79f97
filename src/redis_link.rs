//! A Redis connection that is allowed to be missing.
//!
//! Redis only accelerates flashgate, so the gateway must start and serve without it. This
//! handle keeps at most one multiplexed connection, bounds every command by a timeout,
//! counts failures, drops a broken connection and lets a background task reconnect.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{AsyncConnectionConfig, Client, Cmd, FromRedisValue};
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

struct Inner {
    client: Option<Client>,
    connection: RwLock<Option<MultiplexedConnection>>,
    key_prefix: String,
    command_timeout: Duration,
}

impl RedisHandle {
    /// Never fails: a bad URL or an unreachable server leaves the handle disconnected.
    pub fn new(url: &str, key_prefix: &str, command_timeout: Duration) -> Self {
        let client = Client::open(url)
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
            let value = connection.req_packed_command(cmd).await?;
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
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.inner.command_timeout * 5))
            .set_response_timeout(Some(self.inner.command_timeout));
        match client
            .get_multiplexed_async_connection_with_config(&config)
            .await
        {
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
