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
pub mod settle;
pub mod signature;
pub mod webhook;
pub mod workers;

use std::sync::Arc;

use crate::config::PaymentSettings;
use crate::store::Writes;
use provider::PaymentProvider;

/// The provider and the settings every payment path needs.
#[derive(Clone)]
pub struct Payments {
    pub provider: Arc<dyn PaymentProvider>,
    pub settings: PaymentSettings,
    /// How bookkeeping written outside a transaction of its own is committed before the
    /// provider is called or anyone is answered.
    pub writes: Writes,
}

impl Payments {
    pub fn new(
        provider: Arc<dyn PaymentProvider>,
        settings: PaymentSettings,
        writes: Writes,
    ) -> Self {
        Self {
            provider,
            settings,
            writes,
        }
    }
}
