//! The `[orders]` and `[sweeper]` sections: how orders are taken and batched, and how often
//! unpaid ones are expired.

use std::ops::RangeInclusive;

use serde::Deserialize;

use super::lanes::LaneSettings;
use crate::settings::require;

/// The values `orders.quantity_max` may take.
pub const QUANTITY_MAX_RANGE: RangeInclusive<u32> = 1..=1_000_000;

/// The values `orders.batch_max` may take: one statement carries a batch, so it stays small.
pub const BATCH_MAX_RANGE: RangeInclusive<usize> = 1..=1024;

/// The values `orders.lanes` may take (0: from the cores): each lane in flight holds a
/// request connection.
pub const LANES_RANGE: RangeInclusive<usize> = 0..=64;

/// The lanes chosen from the cores: two a core, at least 4 and at most 16.
pub const LANES_FROM_CORES: RangeInclusive<usize> = 4..=16;

/// The values `orders.idempotency_key_bytes_max` may take: a key is stored with its order.
pub const IDEMPOTENCY_KEY_BYTES_MAX_RANGE: RangeInclusive<usize> = 1..=255;

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
    /// the buckets; 0 chooses them from the cores (see [`Self::lanes_for`]).
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
            QUANTITY_MAX_RANGE.contains(&self.quantity_max),
            &format!("orders.quantity_max must be {QUANTITY_MAX_RANGE:?}"),
        )?;
        require(
            BATCH_MAX_RANGE.contains(&self.batch_max),
            &format!("orders.batch_max must be {BATCH_MAX_RANGE:?}"),
        )?;
        require(
            LANES_RANGE.contains(&self.lanes),
            &format!("orders.lanes must be {LANES_RANGE:?}"),
        )?;
        require(
            IDEMPOTENCY_KEY_BYTES_MAX_RANGE.contains(&self.idempotency_key_bytes_max),
            &format!(
                "orders.idempotency_key_bytes_max must be {IDEMPOTENCY_KEY_BYTES_MAX_RANGE:?}"
            ),
        )
    }

    /// The lanes on `cores` cores beside a request pool of `request_pool` connections:
    /// `lanes` when set, else two a core within [`LANES_FROM_CORES`], one connection fewer
    /// than the pool at most. A batch holds a lane's connection while PostgreSQL works on it
    /// and while it waits for the disk, so two a core keep the cores busy through the commits;
    /// more split the waiting orders into smaller batches, each paying its fixed cost.
    pub fn lanes_for(&self, cores: usize, request_pool: u32) -> usize {
        let below_pool = (request_pool as usize).saturating_sub(1).max(1);
        match self.lanes {
            0 => cores
                .saturating_mul(2)
                .clamp(*LANES_FROM_CORES.start(), *LANES_FROM_CORES.end())
                .min(below_pool),
            lanes => lanes,
        }
    }

    /// The engine's batching with `lanes` lanes; `commit_before_answer` when the pool is a
    /// transaction pooler.
    pub fn lanes(&self, lanes: usize, commit_before_answer: bool) -> LaneSettings {
        LaneSettings {
            lanes,
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
