//! Payments: turning reservations into sales without trusting the browser.
//!
//! Every order gets a payment attempt at a hosted-checkout provider, created after the
//! reservation committed and outside any transaction. The result comes only from signed,
//! deduplicated provider webhooks and from asking the provider (sweeper, reconciler),
//! never from the payer's browser. All of it funnels into [`settle::apply`], which moves
//! attempt and order together with updates guarded by their old states. Side effects that
//! must reach the provider (refunds, captures, voids) go through the transactional
//! [`outbox`].
//!
//! - [`provider`]: the provider abstraction; [`http_provider`]: its HTTP implementation,
//!   behind a circuit [`breaker`].
//! - [`attempts`], [`refunds`], [`outbox`]: the tables.
//! - [`checkout`]: creating payments for orders; [`webhook`]: receiving events.
//! - [`effects`]: the outbox worker; [`mismatch`]: money for another amount.
//! - [`workers`]: overdue-payment checks before expiry, reconciler.
//! - [`review`]: the queue of late payments held for an operator (`manual_review`).

pub mod applied;
pub mod attempts;
pub mod breaker;
pub mod checkout;
pub mod effects;
pub mod http_provider;
pub mod mismatch;
pub mod outbox;
pub mod provider;
pub mod refunds;
pub mod review;
mod settings;
pub mod settle;
pub mod signature;
pub mod webhook;
pub mod workers;

use std::sync::Arc;

use crate::clock::Clock;
use crate::store::Writes;
use provider::PaymentProvider;

pub use settings::PaymentSettings;

/// The provider and the settings every payment path needs.
#[derive(Clone)]
pub struct Payments {
    pub provider: Arc<dyn PaymentProvider>,
    pub settings: PaymentSettings,
    /// How bookkeeping written outside a transaction of its own is committed before the
    /// provider is called or anyone is answered.
    pub writes: Writes,
    /// The application's clock: a webhook's age is judged on it.
    pub clock: Clock,
}

impl Payments {
    pub fn new(
        provider: Arc<dyn PaymentProvider>,
        settings: PaymentSettings,
        writes: Writes,
        clock: Clock,
    ) -> Self {
        Self {
            provider,
            settings,
            writes,
            clock,
        }
    }
}

/// Payment counters that only move when something goes wrong exist from the start, at
/// zero, for every label value they can take: the payment alerts use `increase()` and
/// `rate()` on them. The values are spelled as where they are recorded (`payments::webhook`,
/// `payments::settle`, `payments::workers`, `payments::http_provider`).
pub fn export_zeroes() {
    use crate::telemetry::{
        PAYMENT_MISMATCHES, PAYMENT_OUTCOMES, PROVIDER_BREAKER_OPENED, PROVIDER_ERRORS,
        RECONCILER_FINDINGS, REFUNDS_FAILED, WEBHOOK_EVENTS,
    };
    use provider::ProviderError;
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
