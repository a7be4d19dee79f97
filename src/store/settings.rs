//! The `[database]` section: the pools, their timeouts and the failover checks, declared
//! beside the code that opens the pools.

use serde::Deserialize;

use crate::settings::{redact_url, require};

/// Shortest `database.failover_log_interval_ms`: a failover warns at most once a second.
pub const FAILOVER_LOG_INTERVAL_MS_MIN: u64 = 1000;

/// PostgreSQL: where it is, how many connections each pool holds and how long a request
/// waits for one.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseSettings {
    /// The PostgreSQL connection string; with several hosts, the gateway follows the primary.
    pub url: String,
    /// Connections serving user requests; when all are busy for `acquire_timeout_ms`, a request
    /// is answered 503. 0 chooses them from the cores (see [`Self::request_pool_size`]).
    pub request_pool_max: u32,
    /// Connections kept apart for the sweeper, the sold-out mirror and metrics, so sale traffic
    /// cannot starve them.
    pub background_pool_max: u32,
    /// Connections for the admin API, so operators can act in the middle of a sale storm.
    pub admin_pool_max: u32,
    /// Connections kept for payment webhooks, so a sale storm cannot delay confirming payments.
    pub webhook_pool_max: u32,
    /// Connections of the event sequencer and deliveries, so a slow or dead receiver never
    /// takes a connection the sale needs.
    pub events_pool_max: u32,
    /// How long a request waits for a connection before it is answered 503 instead of queueing.
    pub acquire_timeout_ms: u64,
    /// How long an admin request waits for one of its connections before it is answered 503.
    pub admin_acquire_timeout_ms: u64,
    /// A statement running longer than this is cancelled by PostgreSQL.
    pub statement_timeout_ms: u64,
    /// Apply pending migrations when `serve` starts (under an advisory lock, so many instances
    /// may).
    pub migrate_on_start: bool,
    /// `url` leads to a pooler handing out a server connection per transaction (PgBouncer
    /// in transaction mode): every checkout runs in a transaction of its own.
    pub transaction_pooler: bool,
    /// Direct connection for what a transaction pooler cannot carry (migrations, LISTEN);
    /// empty means `url`.
    pub direct_url: String,
    /// With several hosts in `url`, how often the gateway checks it still talks to the primary.
    pub primary_check_interval_ms: u64,
    /// During a failover, at most one warning (with the count of failed requests) this often.
    pub failover_log_interval_ms: u64,
}

impl DatabaseSettings {
    /// The request pool's size on `cores` cores: `request_pool_max` when set, else 8 a core
    /// between 16 and 64. A purchase holds a connection only for its batch, so a few per core
    /// keep every lane and the reads beside them supplied; past 64, connections cost
    /// PostgreSQL memory and lock contention without serving more.
    pub fn request_pool_size(&self, cores: usize) -> u32 {
        match self.request_pool_max {
            0 => u32::try_from(cores.saturating_mul(8))
                .unwrap_or(u32::MAX)
                .clamp(16, 64),
            size => size,
        }
    }

    /// Checks every limit of the section; the message names the key.
    pub fn validate(&self) -> Result<(), String> {
        require(
            self.background_pool_max > 0,
            "database.background_pool_max must be > 0",
        )?;
        require(
            self.admin_pool_max > 0,
            "database.admin_pool_max must be > 0",
        )?;
        require(
            self.webhook_pool_max > 0,
            "database.webhook_pool_max must be > 0",
        )?;
        require(
            self.events_pool_max >= 2,
            "database.events_pool_max must be at least 2",
        )?;
        require(
            self.acquire_timeout_ms > 0,
            "database.acquire_timeout_ms must be > 0",
        )?;
        require(
            self.admin_acquire_timeout_ms >= self.acquire_timeout_ms,
            "database.admin_acquire_timeout_ms must be at least database.acquire_timeout_ms",
        )?;
        require(
            self.statement_timeout_ms > 0,
            "database.statement_timeout_ms must be > 0",
        )?;
        require(
            self.primary_check_interval_ms > 0,
            "database.primary_check_interval_ms must be > 0",
        )?;
        require(
            self.failover_log_interval_ms >= FAILOVER_LOG_INTERVAL_MS_MIN,
            &format!(
                "database.failover_log_interval_ms must be at least {FAILOVER_LOG_INTERVAL_MS_MIN}"
            ),
        )
    }
}

/// Secrets never reach logs.
impl std::fmt::Debug for DatabaseSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatabaseSettings")
            .field("url", &redact_url(&self.url))
            .field("request_pool_max", &self.request_pool_max)
            .field("background_pool_max", &self.background_pool_max)
            .field("acquire_timeout_ms", &self.acquire_timeout_ms)
            .finish_non_exhaustive()
    }
}
