//! The `[ops]` section: the invariant audit every instance runs in the background.

use serde::Deserialize;

use crate::settings::require;

/// Shortest `ops.audit_interval_ms`: the audit reads every table, so at most once a second.
pub const AUDIT_INTERVAL_MS_MIN: u64 = 1000;

/// How often the audit runs and what it counts as overdue.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpsSettings {
    /// How often the audit runs; its findings become `flashgate_invariant_violations`.
    pub audit_interval_ms: u64,
    /// A pending order this long past its expiry counts as overdue (the sweeper is behind).
    pub overdue_after_seconds: u64,
}

impl OpsSettings {
    /// Checks every limit of the section; the message names the key.
    pub fn validate(&self) -> Result<(), String> {
        require(
            self.audit_interval_ms >= AUDIT_INTERVAL_MS_MIN,
            &format!("ops.audit_interval_ms must be at least {AUDIT_INTERVAL_MS_MIN}"),
        )?;
        require(
            self.overdue_after_seconds > 0,
            "ops.overdue_after_seconds must be > 0",
        )
    }
}
