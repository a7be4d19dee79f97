//! The `[redis]` section: the optional Redis, its timeouts and health checks, declared
//! beside the connection that reads it.

use std::ops::RangeInclusive;

use serde::Deserialize;

use crate::settings::{redact_url, require};

/// The values `redis.health_check_interval_ms` may take: `/readyz` follows Redis within a
/// second, and the probe runs at most every 50 ms.
pub const HEALTH_CHECK_INTERVAL_MS_RANGE: RangeInclusive<u64> = 50..=1000;

/// Shortest `redis.outage_log_interval_ms`: an outage warns at most once a second.
pub const OUTAGE_LOG_INTERVAL_MS_MIN: u64 = 1000;

/// Where Redis is and how the shared connection treats silence and outages.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSettings {
    /// The Redis connection string; several, separated by commas, are the seed nodes of a
    /// cluster.
    pub url: String,
    /// Prefix of every key the gateway writes, so several deployments (or tests) can share one
    /// Redis.
    pub key_prefix: String,
    /// A command slower than this counts as an error, and the caller falls back to PostgreSQL.
    pub command_timeout_ms: u64,
    /// Command timeouts drop the shared connection only when Redis has answered nothing for
    /// this long, so a slow moment (or a CPU-starved gateway) is a few failed calls, not
    /// every call failing until the next reconnect.
    pub unresponsive_after_ms: u64,
    /// How often a lost connection is dialled again.
    pub reconnect_interval_ms: u64,
    /// While Redis stays unreachable, the log repeats its warning at most this often.
    pub outage_log_interval_ms: u64,
    /// How often a probe command decides whether Redis is up (`/readyz`,
    /// `flashgate_redis_up`): a connection may exist while every command fails.
    pub health_check_interval_ms: u64,
}

impl RedisSettings {
    /// Checks every limit of the section; the message names the key.
    pub fn validate(&self) -> Result<(), String> {
        require(
            self.command_timeout_ms > 0,
            "redis.command_timeout_ms must be > 0",
        )?;
        require(
            self.unresponsive_after_ms >= self.command_timeout_ms,
            "redis.unresponsive_after_ms must be at least redis.command_timeout_ms",
        )?;
        require(
            self.reconnect_interval_ms > 0,
            "redis.reconnect_interval_ms must be > 0",
        )?;
        require(
            HEALTH_CHECK_INTERVAL_MS_RANGE.contains(&self.health_check_interval_ms),
            &format!(
                "redis.health_check_interval_ms must be between {} and {}",
                HEALTH_CHECK_INTERVAL_MS_RANGE.start(),
                HEALTH_CHECK_INTERVAL_MS_RANGE.end()
            ),
        )?;
        require(
            self.outage_log_interval_ms >= OUTAGE_LOG_INTERVAL_MS_MIN,
            &format!("redis.outage_log_interval_ms must be at least {OUTAGE_LOG_INTERVAL_MS_MIN}"),
        )
    }
}

/// The URL's password never reaches logs.
impl std::fmt::Debug for RedisSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSettings")
            .field("url", &redact_url(&self.url))
            .field("key_prefix", &self.key_prefix)
            .finish_non_exhaustive()
    }
}
