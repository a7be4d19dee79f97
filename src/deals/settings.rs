//! The `[deals]` section: the per-instance catalogue cache and the per-deal gauges.

use serde::Deserialize;

use crate::settings::require;

/// How long and how much of the catalogue an instance keeps, and how long a deal's series
/// stay on `/metrics`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DealSettings {
    /// How long a deal's settings (price, window, limits) are kept in memory before being re-
    /// read.
    pub cache_ttl_ms: u64,
    /// Most deals cached in memory; beyond it the cache is cleared and refilled on demand.
    pub cache_entries_max: usize,
    /// Most deal ids kept in memory to answer unknown ids without PostgreSQL; with more
    /// deals than this, each unknown id is looked up (and its absence cached) on its own.
    pub catalogue_ids_max: usize,
    /// How often the inventory gauges are refreshed from PostgreSQL.
    pub metrics_interval_ms: u64,
    /// How long after a deal ends (or at once when it is deleted) its `deal`-labelled
    /// series stay on `/metrics`; after that they are dropped, so the label does not grow
    /// with every deal ever sold.
    pub metrics_retain_seconds: u64,
}

impl DealSettings {
    /// Checks every limit of the section; the message names the key.
    pub fn validate(&self) -> Result<(), String> {
        require(self.cache_ttl_ms > 0, "deals.cache_ttl_ms must be > 0")?;
        require(
            self.cache_entries_max > 0 && self.catalogue_ids_max > 0,
            "deals.cache_entries_max and deals.catalogue_ids_max must be > 0",
        )?;
        require(
            self.metrics_interval_ms > 0,
            "deals.metrics_interval_ms must be > 0",
        )
    }
}
