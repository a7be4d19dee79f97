//! The line gauges the advancing instance publishes.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::clock::monotonic;

use super::Step;
use super::lines::Line;
use super::outflow::Outflow;
use crate::telemetry;

/// Admissions counted over about a second, for the rate gauge.
struct RateWindow {
    started: Instant,
    admitted: i64,
}

/// The deals whose line gauges this instance has set: zeroed when it stops advancing them
/// (the lease moved, the line closed, shutdown), so a dashboard summing or taking the
/// largest value over instances shows only the current holder's figures.
#[derive(Default)]
pub(super) struct Gauges {
    rates: HashMap<String, RateWindow>,
    reported: HashSet<String>,
}

impl Gauges {
    /// Zeroes the line gauges of the reported deals `which` selects and forgets them.
    pub fn clear(&mut self, which: impl Fn(&str) -> bool) {
        let cleared: Vec<String> = self
            .reported
            .iter()
            .filter(|deal| which(deal))
            .cloned()
            .collect();
        for deal in cleared {
            for gauge in [
                telemetry::WAITING_ROOM_QUEUE_LENGTH,
                telemetry::WAITING_ROOM_PASSES_ACTIVE,
                telemetry::WAITING_ROOM_ESTIMATED_WAIT,
                telemetry::WAITING_ROOM_ADMISSION_RATE,
                telemetry::WAITING_ROOM_OUTFLOW,
                telemetry::WAITING_ROOM_HEALTH_P99,
                telemetry::WAITING_ROOM_LINE_ACTIVE,
            ] {
                metrics::gauge!(gauge, "deal" => deal.clone()).set(0.0);
            }
            self.rates.remove(&deal);
            self.reported.remove(&deal);
        }
    }

    /// Zeroes the gauges of the deals not in `open`: their lines closed.
    pub fn keep_only(&mut self, open: &[Line]) {
        let open: HashSet<&str> = open.iter().map(|l| l.id.as_str()).collect();
        self.clear(|deal| !open.contains(deal));
    }

    /// Publishes one step. A sold-out line admits nobody more: the tickets still in it are
    /// told so when they poll, so it shows no queue and no wait.
    pub fn record(&mut self, line: &Line, step: Step, sold_out: bool, outflow: &Outflow) {
        let deal = line.id.clone();
        self.reported.insert(deal.clone());
        let rate = outflow.per_second;
        metrics::gauge!(telemetry::WAITING_ROOM_OUTFLOW, "deal" => deal.clone()).set(rate);
        metrics::gauge!(telemetry::WAITING_ROOM_HEALTH_P99, "deal" => deal.clone())
            .set(outflow.p99_seconds.unwrap_or(0.0));
        let waiting = if sold_out { 0.0 } else { step.waiting as f64 };
        metrics::gauge!(telemetry::WAITING_ROOM_QUEUE_LENGTH, "deal" => deal.clone()).set(waiting);
        metrics::gauge!(telemetry::WAITING_ROOM_PASSES_ACTIVE, "deal" => deal.clone())
            .set(step.active as f64);
        metrics::gauge!(telemetry::WAITING_ROOM_LINE_ACTIVE, "deal" => deal.clone())
            .set(f64::from(u8::from(step.line_active)));
        metrics::gauge!(telemetry::WAITING_ROOM_ESTIMATED_WAIT, "deal" => deal.clone())
            .set(waiting / rate);
        metrics::counter!(telemetry::WAITING_ROOM_ADMITTED, "deal" => deal.clone())
            .increment(step.admitted as u64);
        metrics::counter!(telemetry::WAITING_ROOM_ABANDONED, "deal" => deal.clone())
            .increment(step.skipped as u64);
        if step.is_idle(line.terms.when_busy()) {
            // No more steps until someone joins: the rate would stay at its last value.
            metrics::gauge!(telemetry::WAITING_ROOM_ADMISSION_RATE, "deal" => deal.clone())
                .set(0.0);
            self.rates.remove(&deal);
            return;
        }
        let window = self.rates.entry(deal.clone()).or_insert(RateWindow {
            started: monotonic(),
            admitted: 0,
        });
        window.admitted += step.admitted;
        let elapsed = monotonic().saturating_duration_since(window.started);
        if elapsed >= Duration::from_secs(1) {
            metrics::gauge!(telemetry::WAITING_ROOM_ADMISSION_RATE, "deal" => deal)
                .set(window.admitted as f64 / elapsed.as_secs_f64());
            window.started = monotonic();
            window.admitted = 0;
        }
    }
}

/// Counts what one step of a line reported for its report: the buyers joined and passes
/// expired unused since the last step that reported them, then each admitted ticket's wait
/// (ms; -1 when unknown). The script hands each out once, so the sum over instances is the
/// line's figure.
pub(super) fn record_report(deal: &str, reported: &[i64]) {
    let [joined, expired, waits @ ..] = reported else {
        return;
    };
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    metrics::counter!(telemetry::WAITING_ROOM_JOINED, "deal" => deal.to_owned())
        .increment(count(*joined));
    metrics::counter!(telemetry::WAITING_ROOM_PASSES_EXPIRED_UNUSED, "deal" => deal.to_owned())
        .increment(count(*expired));
    if waits.is_empty() {
        return;
    }
    let histogram = metrics::histogram!(telemetry::WAITING_ROOM_WAIT, "deal" => deal.to_owned());
    for &ms in waits.iter().filter(|ms| **ms >= 0) {
        histogram.record(ms as f64 / 1000.0);
    }
}
