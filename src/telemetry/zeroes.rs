//! Series that exist before their first event, at zero: an alert on `increase()` needs
//! the series before the first event (a series born at 1 shows no rise), and a dashboard
//! shows 0 rather than "no data".

use super::{
    AUDIT_RUNS, CONNECTIONS_REFUSED, DB_POOL_TIMEOUTS, DB_RETRIES, GROUPED_ORDERS, HTTP_REQUESTS,
    ORDERS_EXPIRED, PAYMENT_MISMATCHES, PAYMENT_OUTCOMES, PROVIDER_BREAKER_OPENED, PROVIDER_ERRORS,
    RECONCILER_FINDINGS, REDIS_ERRORS, REFUNDS_FAILED, RESERVATION_BATCHES_RECHECKED, SWEEPER_RUNS,
    WAITING_ROOM_CHALLENGES, WAITING_ROOM_REVOKED, WEBHOOK_EVENTS,
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
    export_challenge_zeroes();
    export_payment_zeroes();
}

/// Every outcome of a proof-of-work check (`waiting_room::challenge` spells them).
fn export_challenge_zeroes() {
    use crate::waiting_room::challenge::ChallengeError;
    let failures = [
        ChallengeError::Missing,
        ChallengeError::Forged,
        ChallengeError::OtherUser,
        ChallengeError::OtherDeal,
        ChallengeError::Expired,
        ChallengeError::TooEasy,
        ChallengeError::Replayed,
    ];
    let outcomes = failures.map(ChallengeError::outcome);
    for outcome in outcomes.into_iter().chain(["solved"]) {
        metrics::counter!(WAITING_ROOM_CHALLENGES, "outcome" => outcome).increment(0);
    }
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
