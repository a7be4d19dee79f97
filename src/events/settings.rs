//! The `[events]` section: the event feed, its retention, and the push deliveries to the
//! shop's endpoints.

use serde::Deserialize;

use crate::settings::require;

/// Longest endpoint URL accepted, in bytes; a longer one is refused with 400.
pub const URL_BYTES_CEILING: usize = 8192;

/// Longest a delivery may give way to a sale: an hour.
const YIELD_MAX_CEILING_MS: u64 = 3_600_000;

/// How the feed is kept and how events are pushed.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventSettings {
    /// Runs the sequencer and the deliveries on this instance. Events are written with
    /// every change regardless; without a running instance they wait in the log.
    pub enabled: bool,
    /// Endpoints may point at loopback, private, link-local and metadata addresses. Off by
    /// default, so an endpoint cannot become a way into the operator's network.
    pub allow_private_targets: bool,
    /// Longest endpoint URL, in bytes.
    pub url_bytes_max: usize,
    /// Most events the sequencer positions in one transaction.
    pub sequencer_batch_max: i64,
    /// Shortest pause between sequencer rounds while events keep arriving.
    pub poll_interval_min_ms: u64,
    /// Longest pause between rounds when idle: an empty round doubles the pause up to this.
    pub poll_interval_max_ms: u64,
    /// Most events one endpoint is sent per round (the orders among them go in parallel).
    pub delivery_batch_max: i64,
    /// Most requests in flight to one endpoint at a time (each for a different order).
    pub concurrency_per_endpoint: usize,
    /// A delivery not answered within this is a failure and is retried.
    pub request_timeout_ms: u64,
    /// First retry delay; it doubles per failed attempt, with full jitter.
    pub retry_initial_ms: u64,
    /// Longest delay between attempts, also the cap on a receiver's `Retry-After`.
    pub retry_max_ms: u64,
    /// An endpoint that has failed for this long without one accepted delivery is marked
    /// failing and no longer tried; its events are kept for a replay.
    pub failing_after_seconds: u64,
    /// Longest overlap an operator may give a rotated secret.
    pub rotation_overlap_seconds_max: u64,
    /// Events older than this are deleted (each order's and deal's last event is kept, so
    /// its sequence goes on).
    pub retention_hours: u64,
    /// How often old events are deleted and the backlog gauges refreshed; also the longest
    /// an idle endpoint waits before looking for a replay when no new event woke it.
    pub maintenance_interval_ms: u64,
    /// Most events a pull (`GET /admin/events`) returns.
    pub page_limit_max: i64,
    /// How often an instance that is not delivering asks again to take over.
    pub leader_retry_ms: u64,
    /// While the sequencer positions more events a second than this (a sale under way),
    /// deliveries give way to the sale; 0 never does.
    pub yield_above_per_second: u64,
    /// How far behind the feed a delivery that gives way may fall: an event this old is
    /// sent whatever the feed's rate.
    pub yield_max_ms: u64,
}

impl EventSettings {
    /// When deliveries give way to a sale.
    pub fn yield_rule(&self) -> super::pace::Yield {
        super::pace::Yield {
            above_per_second: self.yield_above_per_second,
            max: std::time::Duration::from_millis(self.yield_max_ms),
        }
    }

    /// Checks every limit of the section; the message names the key.
    pub fn validate(&self) -> Result<(), String> {
        require(
            (16..=URL_BYTES_CEILING).contains(&self.url_bytes_max),
            &format!("events.url_bytes_max must be between 16 and {URL_BYTES_CEILING}"),
        )?;
        for (ok, key) in [
            (self.sequencer_batch_max >= 1, "sequencer_batch_max"),
            (self.delivery_batch_max >= 1, "delivery_batch_max"),
            (
                self.concurrency_per_endpoint >= 1,
                "concurrency_per_endpoint",
            ),
            (self.request_timeout_ms >= 1, "request_timeout_ms"),
            (self.retry_initial_ms >= 1, "retry_initial_ms"),
            (self.poll_interval_min_ms >= 1, "poll_interval_min_ms"),
            (self.failing_after_seconds >= 1, "failing_after_seconds"),
            (self.retention_hours >= 1, "retention_hours"),
            (
                self.maintenance_interval_ms >= 100,
                "maintenance_interval_ms",
            ),
            (self.page_limit_max >= 1, "page_limit_max"),
            (self.leader_retry_ms >= 1, "leader_retry_ms"),
        ] {
            require(ok, &format!("events.{key} is below its minimum"))?;
        }
        require(
            self.yield_max_ms <= YIELD_MAX_CEILING_MS,
            &format!("events.yield_max_ms must be at most {YIELD_MAX_CEILING_MS}"),
        )?;
        require(
            self.poll_interval_min_ms <= self.poll_interval_max_ms,
            "events.poll_interval_min_ms must not exceed events.poll_interval_max_ms",
        )?;
        require(
            self.retry_initial_ms <= self.retry_max_ms,
            "events.retry_initial_ms must not exceed events.retry_max_ms",
        )
    }
}
