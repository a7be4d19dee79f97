//! Logs and metrics.
//!
//! Metric names live here as constants so the exporter, the code that records and the
//! dashboard agree on one spelling. Labels are bounded: route templates, reasons, outcomes
//! and deal ids, never raw paths, users or addresses; deal ids leave once their deal ended
//! `deals.metrics_retain_seconds` ago ([`retention`]). The documented list of every family
//! is docs/METRICS.md, checked against `/metrics` by a test.

mod events;
pub mod openmetrics;
mod process;
pub mod retention;
mod settings;
pub mod tally;
pub mod trace;
mod zeroes;

pub use settings::{LogFormat, TelemetrySettings};
pub use zeroes::ZERO_ROUTES;

use std::collections::BTreeSet;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use metrics_util::MetricKindMask;

use retention::{Retaining, Retention};

pub const HTTP_REQUESTS: &str = "flashgate_http_requests_total";
pub const HTTP_DURATION: &str = "flashgate_http_request_duration_seconds";
pub const ADMISSION_REJECTIONS: &str = "flashgate_admission_rejections_total";
pub const RESERVATIONS: &str = "flashgate_reservations_total";
pub const INVENTORY_UNITS: &str = "flashgate_inventory_units";
pub const ORDERS_EXPIRED: &str = "flashgate_orders_expired_total";
pub const REDIS_ERRORS: &str = "flashgate_redis_errors_total";
pub const REDIS_UP: &str = "flashgate_redis_up";
pub const GLOBAL_LIMIT_CHECKS: &str = "flashgate_global_limit_checks_total";
pub const GLOBAL_LIMIT_USER_SHARE_SPLIT: &str = "flashgate_global_limit_user_share_split";
pub const DB_POOL_CONNECTIONS: &str = "flashgate_db_pool_connections";
pub const DB_POOL_TIMEOUTS: &str = "flashgate_db_pool_timeouts_total";
pub const SOLD_OUT_DEALS: &str = "flashgate_sold_out_deals";
pub const CONNECTIONS_REFUSED: &str = "flashgate_connections_refused_total";
pub const SWEEPER_RUNS: &str = "flashgate_sweeper_runs_total";
pub const RESERVATION_GROUPS: &str = "flashgate_reservation_groups_total";
pub const GROUPED_ORDERS: &str = "flashgate_grouped_orders_total";
pub const RESERVATION_BATCH_SIZE: &str = "flashgate_reservation_batch_size";
pub const RESERVATION_BATCHES_RECHECKED: &str = "flashgate_reservation_batches_rechecked_total";
pub const LANES_BUSY: &str = "flashgate_reservation_lanes_busy";
/// JWKS fetches from the OpenID Connect provider, by outcome (`ok`, `error`).
pub const OIDC_JWKS_FETCHES: &str = "flashgate_oidc_jwks_fetches_total";
/// Usable keys held from the provider's JWKS.
pub const OIDC_KEYS: &str = "flashgate_oidc_keys";
pub const WEBHOOK_EVENTS: &str = "flashgate_webhook_events_total";
pub const WEBHOOK_LAG: &str = "flashgate_webhook_lag_seconds";
pub const PROVIDER_CALL_DURATION: &str = "flashgate_provider_call_duration_seconds";
pub const PROVIDER_ERRORS: &str = "flashgate_provider_errors_total";
pub const PROVIDER_BREAKER_STATE: &str = "flashgate_provider_breaker_state";
pub const PROVIDER_BREAKER_OPENED: &str = "flashgate_provider_breaker_opened_total";
pub const MANUAL_REVIEW_ORDERS: &str = "flashgate_manual_review_orders";
pub const MANUAL_REVIEW_OLDEST: &str = "flashgate_manual_review_oldest_seconds";
pub const PAYMENT_OUTCOMES: &str = "flashgate_payment_outcomes_total";
pub const LATE_PAYMENTS: &str = "flashgate_late_payments_total";
pub const REFUNDS_PENDING: &str = "flashgate_refunds_pending";
pub const OUTBOX_BACKLOG: &str = "flashgate_outbox_backlog";
pub const OUTBOX_PROCESSED: &str = "flashgate_outbox_processed_total";
pub const RECONCILER_FINDINGS: &str = "flashgate_reconciler_findings_total";
pub const PAYMENT_MISMATCHES: &str = "flashgate_payment_mismatches_total";
pub const REFUNDS_FAILED: &str = "flashgate_refunds_failed_total";
pub const REFUNDS_GIVEN_UP: &str = "flashgate_refunds_failed";
pub const INVARIANT_VIOLATIONS: &str = "flashgate_invariant_violations";
pub const OVERDUE_RESERVATIONS: &str = "flashgate_overdue_reservations";
pub const AUDIT_RUNS: &str = "flashgate_audit_runs_total";
pub const WAITING_ROOM_QUEUE_LENGTH: &str = "flashgate_waiting_room_queue_length";
pub const WAITING_ROOM_ADMITTED: &str = "flashgate_waiting_room_admitted_total";
pub const WAITING_ROOM_ADMISSION_RATE: &str = "flashgate_waiting_room_admission_rate";
pub const WAITING_ROOM_OUTFLOW: &str = "flashgate_waiting_room_outflow_per_second";
pub const WAITING_ROOM_HEALTH_P99: &str = "flashgate_waiting_room_health_p99_seconds";
pub const WAITING_ROOM_PASSES_ACTIVE: &str = "flashgate_waiting_room_passes_active";
pub const WAITING_ROOM_ABANDONED: &str = "flashgate_waiting_room_abandoned_total";
pub const WAITING_ROOM_ESTIMATED_WAIT: &str = "flashgate_waiting_room_estimated_wait_seconds";
pub const WAITING_ROOM_PASS_REJECTIONS: &str = "flashgate_waiting_room_pass_rejections_total";
pub const WAITING_ROOM_REVOKED: &str = "flashgate_waiting_room_passes_revoked_total";
pub const WAITING_ROOM_CHALLENGES: &str = "flashgate_waiting_room_challenges_total";
pub const WAITING_ROOM_LINE_READS: &str = "flashgate_waiting_room_line_reads_total";
pub const WAITING_ROOM_LINE_ACTIVE: &str = "flashgate_waiting_room_line_active";
pub const WAITING_ROOM_LINE_SWITCHES: &str = "flashgate_waiting_room_line_switches_total";
pub const WAITING_ROOM_JOINED: &str = "flashgate_waiting_room_joined_total";
pub const WAITING_ROOM_WAIT: &str = "flashgate_waiting_room_wait_seconds";
pub const WAITING_ROOM_PASSES_EXPIRED_UNUSED: &str =
    "flashgate_waiting_room_passes_expired_unused_total";
pub const WAITING_ROOM_ORDERS: &str = "flashgate_waiting_room_orders_total";
pub const WAITING_ROOM_ORDERS_PAID: &str = "flashgate_waiting_room_orders_paid";
pub const BUILD_INFO: &str = "flashgate_build_info";
pub const CAPACITY: &str = "flashgate_capacity";
pub const RESERVATION_TRANSACTION: &str = "flashgate_reservation_transaction_seconds";
pub const DB_RETRIES: &str = "flashgate_db_retries_total";
pub const DB_POOL_WAIT: &str = "flashgate_db_pool_wait_seconds";
pub const REFUNDS_PENDING_OLDEST: &str = "flashgate_refunds_pending_oldest_seconds";
pub const OUTBOX_OLDEST: &str = "flashgate_outbox_oldest_seconds";
pub const EVENTS: &str = "flashgate_events_total";
pub const EVENTS_OLDEST_KEPT: &str = "flashgate_events_oldest_kept_seconds";
pub const EVENTS_FEED_RATE: &str = "flashgate_events_feed_per_second";
pub const EVENT_DELIVERIES: &str = "flashgate_event_deliveries_total";
pub const EVENT_DELIVERY_SECONDS: &str = "flashgate_event_delivery_seconds";
pub const EVENT_ENDPOINT_PENDING: &str = "flashgate_event_endpoint_pending";
pub const EVENT_ENDPOINT_OLDEST_PENDING: &str = "flashgate_event_endpoint_oldest_pending_seconds";
pub const EVENT_ENDPOINT_FAILING: &str = "flashgate_event_endpoint_failing";

/// The version and, when it was built from a git checkout, the commit (`build.rs`).
const VERSION: &str = env!("CARGO_PKG_VERSION");
const COMMIT: &str = env!("FLASHGATE_GIT_COMMIT");

/// How long a retired deal's series may stay unrendered before the exporter drops them:
/// every other series is touched before each render, so only retired ones go idle.
const RETIRED_IDLE: Duration = Duration::from_millis(1);

/// Latency buckets in seconds: fine below 10 ms where the hot path lives, coarse above.
const LATENCY_BUCKETS_SECONDS: [f64; 16] = [
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
    10.0,
];

/// Orders per reservation batch: 1 at low load, up to `orders.batch_max` under a stampede.
const BATCH_SIZE_BUCKETS: [f64; 16] = [
    1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0, 96.0, 128.0, 256.0, 1024.0,
];

/// Webhook lag buckets in seconds: providers deliver within seconds, retries within minutes.
const LAG_BUCKETS_SECONDS: [f64; 10] = [0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0];

/// Waiting-room wait buckets in seconds: from a line that barely forms to a two-hour queue.
const WAIT_BUCKETS_SECONDS: [f64; 14] = [
    1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 2700.0, 3600.0, 5400.0, 7200.0,
];

/// The process-wide metrics: the Prometheus exporter's handle and the series it keeps.
pub struct Metrics {
    handle: PrometheusHandle,
    retention: Arc<Retention>,
}

impl Metrics {
    /// Housekeeping the exporter needs now and then (histogram buckets).
    pub fn run_upkeep(&self) {
        self.handle.run_upkeep();
    }

    /// The text exposition: process figures read now, retired deals' series left out.
    pub fn render(&self) -> String {
        tally::drain_all();
        process::record();
        self.retention.rendered(|| self.handle.render())
    }

    /// Deals that have series on `/metrics`.
    pub fn deals(&self) -> BTreeSet<String> {
        self.retention.deals()
    }

    /// Drops every series of these deals from the next render on (until recorded again).
    pub fn retire_deals(&self, deals: &BTreeSet<String>) {
        if !deals.is_empty() {
            tracing::debug!(?deals, "metric series of ended deals retired");
            self.retention.retire(deals);
        }
    }
}

static PROMETHEUS: OnceLock<Metrics> = OnceLock::new();

/// The process-wide Prometheus recorder, installed on first use; shared by gateways in one process.
pub fn prometheus() -> &'static Metrics {
    PROMETHEUS.get_or_init(|| {
        let recorder = PrometheusBuilder::new()
            .idle_timeout(
                MetricKindMask::COUNTER | MetricKindMask::GAUGE,
                Some(RETIRED_IDLE),
            )
            .set_buckets_for_metric(
                Matcher::Full(HTTP_DURATION.to_owned()),
                &LATENCY_BUCKETS_SECONDS,
            )
            .and_then(|b| {
                b.set_buckets_for_metric(
                    Matcher::Full(PROVIDER_CALL_DURATION.to_owned()),
                    &LATENCY_BUCKETS_SECONDS,
                )
            })
            .and_then(|b| {
                b.set_buckets_for_metric(
                    Matcher::Full(WEBHOOK_LAG.to_owned()),
                    &LAG_BUCKETS_SECONDS,
                )
            })
            .and_then(|b| {
                b.set_buckets_for_metric(
                    Matcher::Full(RESERVATION_BATCH_SIZE.to_owned()),
                    &BATCH_SIZE_BUCKETS,
                )
            })
            .and_then(|b| {
                b.set_buckets_for_metric(
                    Matcher::Full(RESERVATION_TRANSACTION.to_owned()),
                    &LATENCY_BUCKETS_SECONDS,
                )
            })
            .and_then(|b| {
                b.set_buckets_for_metric(
                    Matcher::Full(EVENT_DELIVERY_SECONDS.to_owned()),
                    &LATENCY_BUCKETS_SECONDS,
                )
            })
            .and_then(|b| {
                b.set_buckets_for_metric(
                    Matcher::Full(DB_POOL_WAIT.to_owned()),
                    &LATENCY_BUCKETS_SECONDS,
                )
            })
            .and_then(|b| {
                b.set_buckets_for_metric(
                    Matcher::Full(WAITING_ROOM_WAIT.to_owned()),
                    &WAIT_BUCKETS_SECONDS,
                )
            })
            .expect("the histogram buckets are valid")
            .build_recorder();
        let handle = recorder.handle();
        let retention = Arc::new(Retention::default());
        let retaining = Retaining {
            inner: recorder,
            retention: retention.clone(),
        };
        metrics::set_global_recorder(retaining)
            .expect("the Prometheus recorder is installed once per process");
        describe();
        process::describe();
        zeroes::export();
        metrics::gauge!(BUILD_INFO, "version" => VERSION, "commit" => COMMIT).set(1.0);
        Metrics { handle, retention }
    })
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        HTTP_REQUESTS,
        "HTTP requests answered, by route template and status."
    );
    describe_histogram!(
        HTTP_DURATION,
        metrics::Unit::Seconds,
        "Time to answer a request."
    );
    describe_counter!(
        ADMISSION_REJECTIONS,
        "Requests turned away before inventory, by reason."
    );
    describe_counter!(
        RESERVATIONS,
        "Reservation attempts that reached inventory, by outcome."
    );
    describe_gauge!(
        INVENTORY_UNITS,
        "Units per deal and state (available, reserved, sold)."
    );
    describe_counter!(
        ORDERS_EXPIRED,
        "Orders expired by the sweeper, units released."
    );
    describe_counter!(REDIS_ERRORS, "Redis commands that failed or timed out.");
    describe_gauge!(
        REDIS_UP,
        "1 when Redis passes this instance's health probe (PING; on a cluster, CLUSTER INFO ok on every primary) and commands are being answered."
    );
    describe_counter!(
        GLOBAL_LIMIT_CHECKS,
        "Shared per-user and per-deal limit checks, by where they were decided: redis, slice (a deal's slice held here), share (this instance's share of a user's budget) or fallback (the local share while Redis is down)."
    );
    describe_gauge!(
        GLOBAL_LIMIT_USER_SHARE_SPLIT,
        "The instance count this instance spends its share of every user's budget by (the budget's percent over that many instances); 0 while it spends none and every per-user check asks Redis."
    );
    describe_gauge!(
        DB_POOL_CONNECTIONS,
        "PostgreSQL connections by pool and state."
    );
    describe_counter!(
        DB_POOL_TIMEOUTS,
        "Requests refused because no connection was free in time."
    );
    describe_gauge!(SOLD_OUT_DEALS, "Deals in this instance's sold-out mirror.");
    describe_counter!(
        CONNECTIONS_REFUSED,
        "TCP connections closed at once over the limit."
    );
    describe_counter!(SWEEPER_RUNS, "Expiry sweeper passes, by outcome.");
    describe_counter!(
        OIDC_JWKS_FETCHES,
        "JWKS fetches from the OpenID Connect provider (auth.oidc), by outcome; errors leave the keys held in use."
    );
    describe_gauge!(
        OIDC_KEYS,
        "Usable keys held from the OpenID Connect provider's JWKS; 0 without a provider."
    );
    describe_counter!(
        RESERVATION_GROUPS,
        "Reservation batches run (one statement each)."
    );
    describe_counter!(
        GROUPED_ORDERS,
        "Orders placed in a batch of more than one (any outcome)."
    );
    describe_counter!(
        RESERVATION_BATCHES_RECHECKED,
        "Reservation statements that met an existing idempotency key or per-user counter and were decided again the careful way."
    );
    describe_histogram!(
        RESERVATION_BATCH_SIZE,
        metrics::Unit::Count,
        "Orders per reservation batch."
    );
    describe_gauge!(
        LANES_BUSY,
        "Reservation batches in flight on this instance, over every deal."
    );
    describe_counter!(WEBHOOK_EVENTS, "Provider webhooks received, by result.");
    describe_counter!(
        REFUNDS_FAILED,
        "Refunds given up after payments.refund_tries_max refusals by the provider."
    );
    describe_gauge!(
        REFUNDS_GIVEN_UP,
        "Refunds in state FAILED: money owed back that a person must return."
    );
    describe_counter!(
        PAYMENT_MISMATCHES,
        "Payments the provider reports with another amount or currency than the order's, voided or refunded, by provider status."
    );
    describe_histogram!(
        WEBHOOK_LAG,
        metrics::Unit::Seconds,
        "From the provider creating an event to us consuming it."
    );
    describe_histogram!(
        PROVIDER_CALL_DURATION,
        metrics::Unit::Seconds,
        "Provider calls, retries included, by operation."
    );
    describe_counter!(
        PROVIDER_ERRORS,
        "Provider calls that failed after their retries, by operation and kind."
    );
    describe_gauge!(
        PROVIDER_BREAKER_STATE,
        "Circuit breaker on provider calls: 0 closed, 1 half-open (probing), 2 open."
    );
    describe_counter!(
        PROVIDER_BREAKER_OPENED,
        "Times the circuit breaker on provider calls opened."
    );
    describe_gauge!(
        MANUAL_REVIEW_ORDERS,
        "Orders holding late money for an operator (late-payment policy manual_review)."
    );
    describe_gauge!(
        MANUAL_REVIEW_OLDEST,
        metrics::Unit::Seconds,
        "How long the oldest order in manual review has waited; 0 when none waits."
    );
    describe_counter!(
        PAYMENT_OUTCOMES,
        "Provider payment states applied to orders, by outcome."
    );
    describe_counter!(
        LATE_PAYMENTS,
        "Payments that arrived after their order stopped holding stock, by resolution."
    );
    describe_gauge!(
        REFUNDS_PENDING,
        "Refunds requested and not yet confirmed by the provider."
    );
    describe_gauge!(OUTBOX_BACKLOG, "Outbox entries not yet carried out.");
    describe_counter!(
        OUTBOX_PROCESSED,
        "Outbox entries handled, by kind and result."
    );
    describe_counter!(
        RECONCILER_FINDINGS,
        "Differences the reconciler found with the provider, by kind."
    );
    describe_gauge!(
        INVARIANT_VIOLATIONS,
        "Findings of the last invariant audit, by check; anything above 0 is a bug."
    );
    describe_gauge!(
        OVERDUE_RESERVATIONS,
        "Pending orders past expires_at by more than ops.overdue_after_seconds."
    );
    describe_counter!(AUDIT_RUNS, "Invariant audits run, by outcome.");
    describe_database();
    describe_waiting_room();
    events::describe();
}

fn describe_database() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_gauge!(
        BUILD_INFO,
        "Always 1; the version and git commit this gateway was built from, as labels."
    );
    describe_gauge!(
        CAPACITY,
        "What this instance runs with, chosen from its cores or set: runtime worker threads, request pool connections, lanes per deal."
    );
    describe_histogram!(
        RESERVATION_TRANSACTION,
        metrics::Unit::Seconds,
        "Time one reservation batch spent in PostgreSQL, from its connection to its answer."
    );
    describe_counter!(
        DB_RETRIES,
        "Transactions run again after a deadlock or serialization failure, by operation."
    );
    describe_histogram!(
        DB_POOL_WAIT,
        metrics::Unit::Seconds,
        "Time a reservation batch waited for a free connection from its pool."
    );
    describe_gauge!(
        REFUNDS_PENDING_OLDEST,
        metrics::Unit::Seconds,
        "Age of the oldest refund not yet confirmed by the provider; 0 when none waits."
    );
    describe_gauge!(
        OUTBOX_OLDEST,
        metrics::Unit::Seconds,
        "Age of the oldest outbox entry not yet carried out; 0 when none waits."
    );
}

fn describe_waiting_room() {
    use metrics::{describe_counter, describe_gauge};
    describe_gauge!(
        WAITING_ROOM_QUEUE_LENGTH,
        "Tickets waiting in a deal's line, as the instance advancing it reports; 0 from the others and once the deal sold out."
    );
    describe_counter!(
        WAITING_ROOM_ADMITTED,
        "Tickets admitted from a deal's line, passes handed out."
    );
    describe_gauge!(
        WAITING_ROOM_ADMISSION_RATE,
        "Tickets admitted per second over the last second, by deal."
    );
    describe_gauge!(
        WAITING_ROOM_OUTFLOW,
        "The rate a deal's line admits at: admit_per_second, or the adaptive loop's decision."
    );
    describe_gauge!(
        WAITING_ROOM_HEALTH_P99,
        "The worst instance's order p99 for a deal's pass holders, as the adaptive loop saw it."
    );
    describe_gauge!(
        WAITING_ROOM_PASSES_ACTIVE,
        "Passes outstanding (admitted, not yet used or expired), by deal."
    );
    describe_counter!(
        WAITING_ROOM_ABANDONED,
        "Tickets skipped because their holder stopped polling, by deal."
    );
    describe_gauge!(
        WAITING_ROOM_ESTIMATED_WAIT,
        metrics::Unit::Seconds,
        "Wait of the last ticket in a deal's line at its admission rate; 0 once the deal sold out."
    );
    describe_counter!(
        WAITING_ROOM_PASS_REJECTIONS,
        "Orders refused for a missing or invalid Flashgate-Pass, by reason."
    );
    describe_counter!(
        WAITING_ROOM_REVOKED,
        "Waiting-room sessions ended by an operator or by a paid or cancelled order (ending one again is not counted)."
    );
    describe_counter!(
        WAITING_ROOM_CHALLENGES,
        "Proof-of-work solutions checked when joining a line, by outcome."
    );
    describe_gauge!(
        WAITING_ROOM_LINE_ACTIVE,
        "1 while a deal's line queues newcomers, 0 while a when_busy line admits joins at once, as the instance advancing it reports."
    );
    describe_counter!(
        WAITING_ROOM_LINE_SWITCHES,
        "when_busy lines turned active (arrivals past the outflow) or calm again, by the state switched to."
    );
    describe_counter!(
        WAITING_ROOM_LINE_READS,
        "Public line-state reads, by where they were answered from: memory or redis."
    );
    describe_report();
}

/// What a line did, as its report (`GET /admin/deals/{id}/report`) counts it.
fn describe_report() {
    use metrics::{describe_counter, describe_histogram};
    describe_counter!(
        WAITING_ROOM_JOINED,
        "Buyers who took a place in a deal's line (a requeue after an unused pass is not counted again)."
    );
    describe_histogram!(
        WAITING_ROOM_WAIT,
        metrics::Unit::Seconds,
        "Time from taking a place in a deal's line to admission, by deal."
    );
    describe_counter!(
        WAITING_ROOM_PASSES_EXPIRED_UNUSED,
        "Passes that expired without an order and without their session being ended, by deal."
    );
    describe_counter!(WAITING_ROOM_ORDERS, "Orders placed with a pass, by deal.");
    metrics::describe_gauge!(
        WAITING_ROOM_ORDERS_PAID,
        "Orders placed with a pass and paid since, by deal (counted from PostgreSQL every waiting_room.paid_sample_interval_ms)."
    );
}

/// Logs go to stderr, as text or as JSON lines carrying the request span's fields (so a
/// collector can group a request's lines by its id); `RUST_LOG` overrides the filter.
pub fn init_logging(settings: &TelemetrySettings) {
    let directives = std::env::var("RUST_LOG")
        .ok()
        .filter(|value| !value.trim().is_empty())
        .unwrap_or_else(|| settings.log_filter.clone());
    let filter = tracing_subscriber::EnvFilter::try_new(quiet_redis_client(&directives))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&settings.log_filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match settings.log_format {
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init(),
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .try_init(),
    };
}

/// Names the authenticated user in the current request's span.
pub fn record_user(user: &crate::domain::UserId) {
    tracing::Span::current().record("user", user.as_str());
}

/// The Redis client logs a warning per reconnect attempt and per slot refresh: hundreds of
/// lines a minute while a cluster node is down, which the gateway already reports itself,
/// rate-limited (`redis.outage_log_interval_ms`). So its warnings are dropped unless the
/// filter names `redis` itself (`RUST_LOG=info,redis=debug` to see them).
fn quiet_redis_client(directives: &str) -> String {
    let names_redis = directives.split(',').any(|directive| {
        let target = directive
            .trim()
            .split(['=', '['])
            .next()
            .unwrap_or_default();
        target == "redis" || target.starts_with("redis::")
    });
    if names_redis {
        directives.to_owned()
    } else {
        format!("{directives},{QUIET_REDIS_CLIENT}")
    }
}

/// What the Redis client may log unless the filter says otherwise.
const QUIET_REDIS_CLIENT: &str = "redis=error";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_redis_client_is_quiet_unless_named() {
        assert_eq!(quiet_redis_client("info"), "info,redis=error");
        assert_eq!(
            quiet_redis_client("warn,flashgate=debug"),
            "warn,flashgate=debug,redis=error"
        );
        assert_eq!(quiet_redis_client("info,redis=debug"), "info,redis=debug");
        assert_eq!(
            quiet_redis_client("redis::cluster=warn"),
            "redis::cluster=warn"
        );
        assert_eq!(
            quiet_redis_client("info,redis_link=debug"),
            "info,redis_link=debug,redis=error"
        );
    }
}
