//! The `[telemetry]` section: what the logs show and how they are written.

use serde::Deserialize;

/// The log filter and format.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetrySettings {
    /// The tracing filter when `RUST_LOG` is not set.
    pub log_filter: String,
    /// `text` for people at a terminal, `json` (one object per line) for log collectors.
    pub log_format: LogFormat,
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}
