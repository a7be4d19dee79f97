//! The `[telemetry]` section: what the logs show and how they are written, and where
//! traces go.

use serde::Deserialize;

/// The log filter and format.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetrySettings {
    /// The tracing filter when `RUST_LOG` is not set.
    pub log_filter: String,
    /// `text` for people at a terminal, `json` (one object per line) for log collectors.
    pub log_format: LogFormat,
    /// The OTLP/HTTP collector's base URL (spans go to `<it>/v1/traces`); empty: tracing
    /// off. `OTEL_EXPORTER_OTLP_ENDPOINT` sets it too.
    pub otlp_endpoint: String,
    /// The share of requests without a sampled caller that are traced (0 to 1); errors and
    /// slow requests are traced whatever it is.
    pub trace_ratio: f64,
    /// A request slower than this is traced even when not sampled.
    pub trace_slow_ms: u64,
}

/// The values `telemetry.trace_slow_ms` may take: from a millisecond to a minute.
const TRACE_SLOW_MS_RANGE: std::ops::RangeInclusive<u64> = 1..=60_000;

impl TelemetrySettings {
    /// The ratio is a probability, the threshold in range, the endpoint an HTTP URL.
    pub fn validate(&self) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.trace_ratio) {
            return Err("telemetry.trace_ratio must be between 0 and 1".into());
        }
        if !TRACE_SLOW_MS_RANGE.contains(&self.trace_slow_ms) {
            return Err(format!(
                "telemetry.trace_slow_ms must be {TRACE_SLOW_MS_RANGE:?}"
            ));
        }
        let endpoint = self.otlp_endpoint.trim();
        if !endpoint.is_empty()
            && !endpoint.starts_with("http://")
            && !endpoint.starts_with("https://")
        {
            return Err(format!(
                "telemetry.otlp_endpoint must be an http:// or https:// URL (or empty), not {endpoint:?}"
            ));
        }
        Ok(())
    }
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}
