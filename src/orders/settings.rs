//! The `[orders]` and `[sweeper]` sections: how orders are taken and batched, and how often
//! unpaid ones are expired.

use serde::Deserialize;

use super::lanes::LaneSettings;
use crate::settings::require;

/// What one order may ask for and how the engine batches orders.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrderSettings {
    /// Largest quantity one order may ask for; a larger one is an invalid request, whatever the
    /// deal allows.
    pub quantity_max: u32,
    /// Longest `Idempotency-Key` accepted, in bytes.
    pub idempotency_key_bytes_max: usize,
    /// A batch that met a deadlock or serialization failure runs again at most this many times.
    pub retries_max: u32,
    /// Batches of one deal in flight at once on this instance, each with its own share of
    /// the buckets.
    pub lanes: usize,
    /// Most orders placed in one batch (one statement, one transaction).
    pub batch_max: usize,
    /// Batches of a deal placed the careful way after one met an existing key or buyer.
    pub careful_after_recheck: u32,
}

impl OrderSettings {
    /// Checks every limit of the section; the message names the key.
    pub fn validate(&self) -> Result<(), String> {
        require(
            (1..=1_000_000).contains(&self.quantity_max),
            "orders.quantity_max must be 1..=1000000",
        )?;
        require(
            (1..=1024).contains(&self.batch_max),
            "orders.batch_max must be 1..=1024",
        )?;
        require(
            (1..=64).contains(&self.lanes),
            "orders.lanes must be 1..=64",
        )?;
        require(
            (1..=255).contains(&self.idempotency_key_bytes_max),
            "orders.idempotency_key_bytes_max must be 1..=255",
        )
    }

    /// The engine's batching; `commit_before_answer` when the pool is a transaction pooler.
    pub fn lanes(&self, commit_before_answer: bool) -> LaneSettings {
        LaneSettings {
            lanes: self.lanes,
            batch_max: self.batch_max,
            retries_max: self.retries_max,
            commit_before_answer,
            careful_after_recheck: self.careful_after_recheck,
        }
    }
}

/// How often the sweeper expires unpaid orders, and how many at a time.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweeperSettings {
    /// How often each instance looks for reservations past `expires_at`.
    pub interval_ms: u64,
    /// Most orders expired in one transaction.
    pub batch_max: u32,
}

impl SweeperSettings {
    /// Checks every limit of the section; the message names the key.
    pub fn validate(&self) -> Result<(), String> {
        require(self.interval_ms > 0, "sweeper.interval_ms must be > 0")?;
        require(self.batch_max > 0, "sweeper.batch_max must be > 0")
    }
}
