//! The `[payments]` section: the provider, its secrets and timeouts, and the workers that
//! settle payments.

use std::ops::RangeInclusive;

use serde::Deserialize;

use crate::settings::require;

/// The values `payments.session_seconds_min` may take: at most a day.
pub const SESSION_SECONDS_MIN_RANGE: RangeInclusive<u32> = 1..=86_400;

/// The values `payments.attempts_per_order_max` may take.
pub const ATTEMPTS_PER_ORDER_MAX_RANGE: RangeInclusive<u32> = 1..=100;

/// Longest `payments.expiry_grace_seconds`: the reservation is held that much past its
/// expiry, so the hold stays a matter of minutes.
pub const EXPIRY_GRACE_SECONDS_MAX: u32 = 300;

/// The values `payments.refund_tries_max` may take.
pub const REFUND_TRIES_MAX_RANGE: RangeInclusive<u32> = 1..=100;

/// The payment provider and the workers that settle payments.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PaymentSettings {
    /// Take payments through the provider; off, orders reserve stock without a payment attempt
    /// and never become paid.
    pub enabled: bool,
    /// The provider's name: the `{provider}` of `/v1/webhooks/{provider}`, stored with every
    /// attempt.
    pub provider: String,
    /// Base URL of the provider's API.
    pub base_url: String,
    /// Sent to the provider as a bearer token; a secret.
    pub api_key: String,
    /// Shared secret of the webhook signatures.
    pub webhook_secret: String,
    /// A webhook signed further than this from now is refused as stale (replay protection).
    pub webhook_tolerance_seconds: u32,
    /// Time to open a connection to the provider.
    pub connect_timeout_ms: u64,
    /// Time for one provider call to answer; past it the outcome is unknown, never failed.
    pub request_timeout_ms: u64,
    /// Retries of a provider call after a timeout or a 5xx, with jittered exponential backoff.
    pub retries_max: u32,
    /// Base of that backoff.
    pub retry_backoff_ms: u64,
    /// Shortest checkout session the provider accepts; a shorter reservation asks for this
    /// much.
    pub session_seconds_min: u32,
    /// Longest wait between two questions to the provider about a payment still in progress.
    pub check_backoff_max_seconds: u32,
    /// How often the outbox worker looks for side effects to carry out.
    pub outbox_interval_ms: u64,
    /// Most outbox entries claimed at once.
    pub outbox_batch_max: u32,
    /// An entry claimed by a worker that died is retried after this long.
    pub outbox_lease_seconds: u32,
    /// How often the reconciler compares local attempts with the provider.
    pub reconcile_interval_ms: u64,
    /// A pending attempt older than this is checked with the provider by the reconciler.
    pub reconcile_after_seconds: u32,
    /// Most attempts the reconciler checks in one pass.
    pub reconcile_batch_max: u32,
    /// Most payment attempts one order may have, its first included; one more is answered
    /// 409 `payment-attempts-exhausted`.
    pub attempts_per_order_max: u32,
    /// After `expires_at`, how long an order with a payment still open at the provider is
    /// held while the provider is asked about it; at `expires_at` plus this the reservation
    /// is released whatever the provider says, and later money follows the late-payment
    /// policy. Shown in every order as `hold_ends_at`.
    pub expiry_grace_seconds: u32,
    /// A refund the provider refuses is retried with backoff (2, 4, … up to 60 s apart) this
    /// many times in all, then marked FAILED and surfaced (`flashgate_refunds_failed`,
    /// `flashgate reconcile`) for a person to finish.
    pub refund_tries_max: u32,
    /// PEM file of the certificate authorities trusted for an `https` `base_url`, instead of
    /// the system's; empty to use the system's.
    pub ca_file: String,
    /// Provider calls failing or timing out one after another (each after its retries) that
    /// open the circuit breaker.
    pub breaker_failures_max: u32,
    /// How long an open breaker refuses provider calls before letting one probe through.
    pub breaker_open_ms: u64,
}

/// The API key and the webhook secret never reach logs.
impl std::fmt::Debug for PaymentSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PaymentSettings")
            .field("enabled", &self.enabled)
            .field("provider", &self.provider)
            .field("base_url", &self.base_url)
            .field("api_key", &"<redacted>")
            .field("webhook_secret", &"<redacted>")
            .finish_non_exhaustive()
    }
}

impl PaymentSettings {
    /// Checks every limit of the section; the message names the key.
    pub fn validate(&self) -> Result<(), String> {
        require(
            !self.provider.is_empty()
                && self
                    .provider
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_'),
            "payments.provider must be a short name of letters, digits and _",
        )?;
        require(
            !self.webhook_secret.is_empty(),
            "payments.webhook_secret must not be empty",
        )?;
        require(
            self.webhook_tolerance_seconds > 0,
            "payments.webhook_tolerance_seconds must be > 0",
        )?;
        require(
            self.connect_timeout_ms > 0 && self.request_timeout_ms > 0,
            "payments timeouts must be > 0",
        )?;
        require(
            SESSION_SECONDS_MIN_RANGE.contains(&self.session_seconds_min),
            &format!("payments.session_seconds_min must be {SESSION_SECONDS_MIN_RANGE:?}"),
        )?;
        require(
            self.check_backoff_max_seconds > 0,
            "payments.check_backoff_max_seconds must be > 0",
        )?;
        self.validate_workers()
    }

    /// The outbox, the reconciler, refunds, the breaker and the provider's address.
    fn validate_workers(&self) -> Result<(), String> {
        require(
            self.outbox_interval_ms > 0 && self.outbox_batch_max > 0,
            "payments outbox interval and batch must be > 0",
        )?;
        require(
            self.outbox_lease_seconds > 0,
            "payments.outbox_lease_seconds must be > 0",
        )?;
        require(
            self.reconcile_interval_ms > 0 && self.reconcile_batch_max > 0,
            "payments reconcile interval and batch must be > 0",
        )?;
        require(
            ATTEMPTS_PER_ORDER_MAX_RANGE.contains(&self.attempts_per_order_max),
            &format!("payments.attempts_per_order_max must be {ATTEMPTS_PER_ORDER_MAX_RANGE:?}"),
        )?;
        require(
            self.expiry_grace_seconds <= EXPIRY_GRACE_SECONDS_MAX,
            &format!("payments.expiry_grace_seconds must be at most {EXPIRY_GRACE_SECONDS_MAX}"),
        )?;
        require(
            REFUND_TRIES_MAX_RANGE.contains(&self.refund_tries_max),
            &format!("payments.refund_tries_max must be {REFUND_TRIES_MAX_RANGE:?}"),
        )?;
        require(
            self.base_url.starts_with("http://") || self.base_url.starts_with("https://"),
            "payments.base_url must start with http:// or https://",
        )?;
        require(
            self.breaker_failures_max > 0 && self.breaker_open_ms > 0,
            "payments.breaker_failures_max and payments.breaker_open_ms must be > 0",
        )
    }
}
