//! Series that exist before their first event, at zero: an alert on `increase()` needs
//! the series before the first event (a series born at 1 shows no rise), and a dashboard
//! shows 0 rather than "no data". The series of one module's own outcomes are exported by
//! that module (`waiting_room::challenge::export_zeroes`, `payments::export_zeroes`), which
//! the application calls once the recorder is installed.

use super::{
    AUDIT_RUNS, CONNECTIONS_REFUSED, DB_POOL_TIMEOUTS, DB_RETRIES, GROUPED_ORDERS, HTTP_REQUESTS,
    OIDC_JWKS_FETCHES, OIDC_KEYS, ORDERS_EXPIRED, REDIS_ERRORS, RESERVATION_BATCHES_RECHECKED,
    SWEEPER_RUNS, WAITING_ROOM_LINE_READS, WAITING_ROOM_REVOKED,
};

/// Routes on the buyer's path whose 5xx answers are exported at zero from the start, so
/// the first failure moves `increase()` (the 5xx alert); spelled as `http::router` names
/// its route templates.
pub const ZERO_ROUTES: [&str; 8] = [
    "/v1/deals/{id}",
    "/v1/deals/{id}/orders",
    "/v1/deals/{id}/queue",
    "/v1/deals/{id}/queue/{ticket}",
    "/v1/orders/{id}",
    "/v1/orders/{id}/cancel",
    "/v1/orders/{id}/payments",
    "/v1/webhooks/{provider}",
];

/// The unlabelled counters, and the counters alerts watch with every label value they can
/// take.
pub(super) fn export() {
    for name in [
        ORDERS_EXPIRED,
        REDIS_ERRORS,
        DB_POOL_TIMEOUTS,
        CONNECTIONS_REFUSED,
        GROUPED_ORDERS,
        RESERVATION_BATCHES_RECHECKED,
        WAITING_ROOM_REVOKED,
    ] {
        metrics::counter!(name).increment(0);
    }
    for outcome in ["ok", "error", "panic"] {
        metrics::counter!(SWEEPER_RUNS, "outcome" => outcome).increment(0);
        metrics::counter!(AUDIT_RUNS, "outcome" => outcome).increment(0);
    }
    for route in ZERO_ROUTES {
        for status in ["500", "503"] {
            metrics::counter!(HTTP_REQUESTS, "route" => route, "status" => status).increment(0);
        }
    }
    metrics::counter!(DB_RETRIES, "operation" => "reservation").increment(0);
    for outcome in ["ok", "error"] {
        metrics::counter!(OIDC_JWKS_FETCHES, "outcome" => outcome).increment(0);
    }
    metrics::gauge!(OIDC_KEYS).set(0.0);
    for source in ["memory", "redis"] {
        metrics::counter!(WAITING_ROOM_LINE_READS, "source" => source).increment(0);
    }
}
