//! What flashgate needs from a payment provider, independent of any one provider's API.
//!
//! Every call may time out or fail; callers treat a timeout as "unknown", never as
//! "failed": they retry with the same idempotency key or ask the provider later.

use std::future::Future;
use std::pin::Pin;

use chrono::{DateTime, Utc};
use uuid::Uuid;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A request to take money for one payment attempt.
#[derive(Debug, Clone)]
pub struct CreatePayment {
    /// Derived from the attempt id, so a retried create returns the same payment.
    pub idempotency_key: String,
    pub amount_minor: i64,
    pub currency: String,
    /// Our attempt id, echoed by the provider in every payment object and event.
    pub reference: Uuid,
    pub order_id: Uuid,
    /// Authorise now and capture later, instead of charging at once.
    pub capture_manual: bool,
    /// How long the payer may take at the hosted checkout.
    pub expires_in_seconds: u32,
}

/// Where a payment stands at the provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderStatus {
    /// Waiting for the payer.
    RequiresPayment,
    /// Authorised, not yet captured (manual capture).
    RequiresCapture,
    Succeeded,
    Failed,
    Canceled,
    Expired,
}

/// The provider's view of one payment.
#[derive(Debug, Clone)]
pub struct ProviderPayment {
    pub id: String,
    pub status: ProviderStatus,
    pub amount_minor: i64,
    pub currency: String,
    /// Our attempt id, if the provider echoed it back in a form we could read.
    pub reference: Option<Uuid>,
    pub checkout_url: Option<String>,
    pub expires_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone)]
pub struct ProviderRefund {
    pub id: String,
    pub payment_id: String,
    pub amount_minor: i64,
    pub succeeded: bool,
}

/// A verified, parsed provider event.
#[derive(Debug, Clone)]
pub struct ProviderEvent {
    pub id: String,
    pub kind: String,
    pub created_at: Option<DateTime<Utc>>,
    pub subject: EventSubject,
}

#[derive(Debug, Clone)]
pub enum EventSubject {
    Payment(ProviderPayment),
    Refund(ProviderRefund),
    /// An event type flashgate does not act on.
    Other,
}

#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// No answer in time: the outcome is unknown.
    #[error("provider did not answer in time")]
    Timeout,
    /// No connection could be opened (refused, unreachable, TLS handshake failed): the
    /// request was never sent, so it cannot have taken effect. Worth retrying later.
    #[error("provider not reachable: {0}")]
    Refused(String),
    /// A 5xx or a broken answer: worth retrying later; the call may have taken effect.
    #[error("provider unavailable: {0}")]
    Unavailable(String),
    /// The request conflicts with the payment's state (e.g. capturing a cancelled payment).
    #[error("provider refused: {0}")]
    Conflict(String),
    /// Not sent: the circuit breaker is open after repeated failures. Like `Refused`, the
    /// call cannot have taken effect; ask again later.
    #[error("provider circuit breaker open; call not sent")]
    CircuitOpen,
    #[error("provider knows no such payment")]
    NotFound,
    /// Any other 4xx, or an answer we cannot read.
    #[error("provider rejected the call: {0}")]
    Rejected(String),
}

impl ProviderError {
    /// Whether the call may have taken effect and is safe to repeat with the same key.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            ProviderError::Timeout
                | ProviderError::Refused(_)
                | ProviderError::Unavailable(_)
                | ProviderError::CircuitOpen
        )
    }

    /// Whether the call certainly never reached the provider.
    pub fn never_sent(&self) -> bool {
        matches!(self, ProviderError::Refused(_) | ProviderError::CircuitOpen)
    }

    pub fn label(&self) -> &'static str {
        match self {
            ProviderError::Timeout => "timeout",
            ProviderError::Refused(_) => "refused",
            ProviderError::Unavailable(_) => "unavailable",
            ProviderError::Conflict(_) => "conflict",
            ProviderError::NotFound => "not_found",
            ProviderError::Rejected(_) => "rejected",
            ProviderError::CircuitOpen => "circuit_open",
        }
    }
}

/// Why an incoming webhook was refused before anything else was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WebhookError {
    #[error("missing or malformed signature")]
    BadSignature,
    #[error("signature timestamp outside the tolerance")]
    Stale,
    #[error("event body could not be read")]
    Malformed,
}

/// A hosted-checkout payment provider.
pub trait PaymentProvider: Send + Sync {
    /// The name used in `/v1/webhooks/{provider}` and stored with every attempt.
    fn name(&self) -> &str;
    fn create_payment<'a>(
        &'a self,
        request: &'a CreatePayment,
    ) -> BoxFuture<'a, Result<ProviderPayment, ProviderError>>;
    fn get_payment<'a>(
        &'a self,
        id: &'a str,
    ) -> BoxFuture<'a, Result<ProviderPayment, ProviderError>>;
    fn capture<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<ProviderPayment, ProviderError>>;
    fn void<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<ProviderPayment, ProviderError>>;
    fn refund<'a>(
        &'a self,
        payment_id: &'a str,
        amount_minor: i64,
        idempotency_key: &'a str,
    ) -> BoxFuture<'a, Result<ProviderRefund, ProviderError>>;
    /// Checks the signature header against the raw body, at `now_unix` seconds.
    fn verify_webhook(
        &self,
        signature: Option<&[u8]>,
        body: &[u8],
        now_unix: i64,
    ) -> Result<(), WebhookError>;
    /// Reads a verified event body.
    fn parse_event(&self, body: &[u8]) -> Result<ProviderEvent, WebhookError>;
    /// Whether calls are refused at once by an open circuit breaker: an adaptive waiting
    /// room admits fewer buyers while they could not pay.
    fn breaker_open(&self) -> bool {
        false
    }
}
