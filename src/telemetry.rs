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
pub const DB_POOL_CONNECTIONS: &str = "flashgate_db_pool_connections";
pub const DB_POOL_TIMEOUTS: &str = "flashgate_db_pool_timeouts_total";
pub const SOLD_OUT_DEALS: &str = "flashgate_sold_out_deals";
pub const CONNECTIONS_REFUSED: &str = "flashgate_connections_refused_total";
pub const SWEEPER_RUNS: &str = "flashgate_sweeper_runs_total";

/// Latency buckets in seconds: fine below 10 ms where the hot path lives, coarse above.
const LATENCY_BUCKETS_SECONDS: [f64; 16] = [
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
    10.0,
];

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
            .and_then(|builder| builder.install_recorder())
            .expect("the Prometheus recorder is installed once per process");
        describe();
        handle
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
    describe_gauge!(REDIS_UP, "1 when this instance has a Redis connection.");
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
}

/// Logs go to stderr; `RUST_LOG` overrides the configured filter.
pub fn init_logging(default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .try_init();
}
