//! Logs and metrics.
//!
//! Metric names live here as constants so the exporter, the code that records and the
//! dashboard agree on one spelling. Labels are bounded: route templates, reasons, outcomes
//! and deal ids, never raw paths, users or addresses.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

pub const HTTP_REQUESTS: &str = "flashgate_http_requests_total";
pub const HTTP_DURATION: &str = "flashgate_http_request_duration_seconds";
pub const ADMISSION_REJECTIONS: &str = "flashgate_admission_rejections_total";
pub const RESERVATIONS: &str = "flashgate_reservations_total";
pub const INVENTORY_UNITS: &str = "flashgate_inventory_units";
pub const ORDERS_EXPIRED: &str = "flashgate_orders_expired_total";
pub const REDIS_ERRORS: &str = "flashgate_redis_errors_total";
pub const REDIS_UP: &str = "flashgate_redis_up";
pub const GLOBAL_LIMIT_CHECKS: &str = "flashgate_global_limit_checks_total";
pub const DB_POOL_CONNECTIONS: &str = "flashgate_db_pool_connections";
pub const DB_POOL_TIMEOUTS: &str = "flashgate_db_pool_timeouts_total";
pub const SOLD_OUT_DEALS: &str = "flashgate_sold_out_deals";
pub const CONNECTIONS_REFUSED: &str = "flashgate_connections_refused_total";
pub const SWEEPER_RUNS: &str = "flashgate_sweeper_runs_total";
pub const RESERVATION_GROUPS: &str = "flashgate_reservation_groups_total";
pub const GROUPED_ORDERS: &str = "flashgate_grouped_orders_total";
pub const RESERVATION_BATCH_SIZE: &str = "flashgate_reservation_batch_size";
pub const LANES_BUSY: &str = "flashgate_reservation_lanes_busy";
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
pub const WAITING_ROOM_PASSES_ACTIVE: &str = "flashgate_waiting_room_passes_active";
pub const WAITING_ROOM_ABANDONED: &str = "flashgate_waiting_room_abandoned_total";
pub const WAITING_ROOM_ESTIMATED_WAIT: &str = "flashgate_waiting_room_estimated_wait_seconds";
pub const WAITING_ROOM_PASS_REJECTIONS: &str = "flashgate_waiting_room_pass_rejections_total";
pub const WAITING_ROOM_REVOKED: &str = "flashgate_waiting_room_passes_revoked_total";
pub const WAITING_ROOM_CHALLENGES: &str = "flashgate_waiting_room_challenges_total";

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

static PROMETHEUS: OnceLock<PrometheusHandle> = OnceLock::new();

/// The process-wide Prometheus recorder, installed on first use. Several gateways in one
/// process (as in tests) share it.
pub fn prometheus() -> &'static PrometheusHandle {
    PROMETHEUS.get_or_init(|| {
        let handle = PrometheusBuilder::new()
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
            .and_then(|builder| builder.install_recorder())
            .expect("the Prometheus recorder is installed once per process");
        describe();
        export_zeroes();
        handle
    })
}

/// Unlabelled counters exist from the start, at zero: an alert on `increase()` needs the
/// series before the first event, and a dashboard shows 0 rather than "no data".
fn export_zeroes() {
    for name in [
        ORDERS_EXPIRED,
        REDIS_ERRORS,
        DB_POOL_TIMEOUTS,
        CONNECTIONS_REFUSED,
    ] {
        metrics::counter!(name).increment(0);
    }
    export_payment_zeroes();
}

/// Payment counters that only move when something goes wrong exist from the start, at
/// zero, for every label value they can take: the payment alerts use `increase()` and
/// `rate()` on them. The values are spelled as where they are recorded (`payments::webhook`,
/// `payments::settle`, `payments::workers`, `payments::http_provider`).
fn export_payment_zeroes() {
    use crate::payments::provider::ProviderError;
    for result in [
        "bad_signature",
        "stale",
        "malformed",
        "mismatch",
        "unknown_provider",
        "error",
    ] {
        metrics::counter!(WEBHOOK_EVENTS, "result" => result).increment(0);
    }
    metrics::counter!(PAYMENT_OUTCOMES, "outcome" => "mismatch").increment(0);
    metrics::counter!(REFUNDS_FAILED).increment(0);
    metrics::counter!(PROVIDER_BREAKER_OPENED).increment(0);
    for status in ["requires_payment", "requires_capture", "succeeded"] {
        metrics::counter!(PAYMENT_MISMATCHES, "status" => status).increment(0);
    }
    for kind in [
        "paid_at_provider_pending_locally",
        "amount_mismatch",
        "paid_locally_not_at_provider",
        "paid_locally_unknown_at_provider",
        "unrefunded_extra_payment",
        "refund_stuck",
        "refund_failed",
    ] {
        metrics::counter!(RECONCILER_FINDINGS, "kind" => kind).increment(0);
    }
    let errors = [
        ProviderError::Timeout,
        ProviderError::Refused(String::new()),
        ProviderError::Unavailable(String::new()),
        ProviderError::Conflict(String::new()),
        ProviderError::NotFound,
        ProviderError::Rejected(String::new()),
        ProviderError::CircuitOpen,
    ];
    for op in ["create", "get", "capture", "void", "refund"] {
        for error in &errors {
            metrics::counter!(PROVIDER_ERRORS, "op" => op, "kind" => error.label()).increment(0);
        }
    }
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
    describe_gauge!(REDIS_UP, "1 when this instance has a Redis connection.");
    describe_counter!(
        GLOBAL_LIMIT_CHECKS,
        "Shared per-user and per-deal limit checks, by where they were decided: redis, a local slice, or the local fallback share while Redis is down."
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
        RESERVATION_GROUPS,
        "Reservation batches run (one statement each)."
    );
    describe_counter!(
        GROUPED_ORDERS,
        "Orders placed in a batch of more than one (any outcome)."
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
    describe_waiting_room();
}

fn describe_waiting_room() {
    use metrics::{describe_counter, describe_gauge};
    describe_gauge!(
        WAITING_ROOM_QUEUE_LENGTH,
        "Tickets waiting in a deal's line (reported by the advancing instance)."
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
        "Wait of the last ticket in a deal's line at its admission rate."
    );
    describe_counter!(
        WAITING_ROOM_PASS_REJECTIONS,
        "Orders refused for a missing or invalid Flashgate-Pass, by reason."
    );
    describe_counter!(
        WAITING_ROOM_REVOKED,
        "Waiting-room sessions ended by an operator or by a paid or cancelled order."
    );
    describe_counter!(
        WAITING_ROOM_CHALLENGES,
        "Proof-of-work solutions checked when joining a line, by outcome."
    );
}

/// Logs go to stderr, as text or as one JSON object per line (with the fields of the
/// request's span, so a collector can group a request's lines by its id); `RUST_LOG`
/// overrides the configured filter.
pub fn init_logging(settings: &crate::config::TelemetrySettings) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&settings.log_filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match settings.log_format {
        crate::config::LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init(),
        crate::config::LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .try_init(),
    };
}
