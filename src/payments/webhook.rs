//! Receiving provider webhooks.
//!
//! The signature and its timestamp are checked on the raw body before anything else is
//! read. The event id is recorded in `payment_events` in the same transaction that applies
//! the event, so each event takes effect exactly once however often it is delivered.

use sqlx::{PgConnection, PgPool};

use super::Payments;
use super::applied::Applied;
use super::provider::{EventSubject, ProviderEvent, WebhookError};
use super::settle;
use crate::store::StoreError;
use crate::telemetry;

/// What became of a delivered webhook.
#[derive(Debug)]
pub enum Received {
    /// Applied (or harmlessly recorded) for the first time.
    Accepted(Applied),
    /// This event id was consumed before.
    Duplicate,
}

#[derive(Debug, thiserror::Error)]
pub enum WebhookRejection {
    #[error("no such payment provider")]
    UnknownProvider,
    #[error(transparent)]
    Invalid(#[from] WebhookError),
    /// No attempt of ours has this payment (yet): not consumed, to be delivered again.
    #[error("no payment attempt matches this event")]
    UnknownPayment,
    /// Amount or currency differ from the order's price snapshot: refused, alerted.
    #[error("payment amount or currency does not match the order")]
    Mismatch,
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Payments {
    pub async fn receive(
        &self,
        pool: &PgPool,
        provider: &str,
        signature: Option<&[u8]>,
        body: &[u8],
    ) -> Result<Received, WebhookRejection> {
        let outcome = self.receive_checked(pool, provider, signature, body).await;
        let result = match &outcome {
            Ok(Received::Accepted(_)) => "accepted",
            Ok(Received::Duplicate) => "duplicate",
            Err(WebhookRejection::Invalid(WebhookError::BadSignature)) => "bad_signature",
            Err(WebhookRejection::Invalid(WebhookError::Stale)) => "stale",
            Err(WebhookRejection::Invalid(WebhookError::Malformed)) => "malformed",
            Err(WebhookRejection::Mismatch) => "mismatch",
            Err(WebhookRejection::UnknownProvider) => "unknown_provider",
            Err(WebhookRejection::UnknownPayment) => "unknown_payment",
            Err(WebhookRejection::Store(_)) => "error",
        };
        metrics::counter!(telemetry::WEBHOOK_EVENTS, "result" => result).increment(1);
        outcome
    }

    async fn receive_checked(
        &self,
        pool: &PgPool,
        provider: &str,
        signature: Option<&[u8]>,
        body: &[u8],
    ) -> Result<Received, WebhookRejection> {
        if provider != self.provider.name() {
            return Err(WebhookRejection::UnknownProvider);
        }
        self.provider
            .verify_webhook(signature, body, self.clock.now().timestamp())?;
        let event = self.provider.parse_event(body)?;
        if let Some(created_at) = event.created_at {
            let lag = (self.clock.now() - created_at).num_milliseconds().max(0) as f64 / 1000.0;
            metrics::histogram!(telemetry::WEBHOOK_LAG).record(lag);
        }
        let mut tx = pool.begin().await.map_err(StoreError::from)?;
        if !record_event(&mut tx, provider, &event).await? {
            return Ok(Received::Duplicate);
        }
        let applied = apply_event(&mut tx, provider, &event).await?;
        if applied == Applied::UnknownPayment {
            // Possibly a report racing our own record of the payment: not consumed, so
            // the provider delivers it again.
            tx.rollback().await.map_err(StoreError::from)?;
            return Err(WebhookRejection::UnknownPayment);
        }
        if applied == Applied::Mismatch {
            tx.rollback().await.map_err(StoreError::from)?;
            return Err(WebhookRejection::Mismatch);
        }
        tx.commit().await.map_err(StoreError::from)?;
        Ok(Received::Accepted(applied))
    }
}

/// Records the event id; false if it was consumed before.
async fn record_event(
    tx: &mut PgConnection,
    provider: &str,
    event: &ProviderEvent,
) -> Result<bool, StoreError> {
    let payment_id = match &event.subject {
        EventSubject::Payment(payment) => Some(payment.id.as_str()),
        EventSubject::Refund(refund) => Some(refund.payment_id.as_str()),
        EventSubject::Other => None,
    };
    let inserted = sqlx::query(
        "INSERT INTO payment_events (provider, event_id, event_type, provider_payment_id, outcome, provider_created_at)
         VALUES ($1, $2, $3, $4, 'received', $5)
         ON CONFLICT (provider, event_id) DO NOTHING",
    )
    .bind(provider)
    .bind(&event.id)
    .bind(&event.kind)
    .bind(payment_id)
    .bind(event.created_at)
    .execute(tx)
    .await?;
    Ok(inserted.rows_affected() == 1)
}

async fn apply_event(
    tx: &mut PgConnection,
    provider: &str,
    event: &ProviderEvent,
) -> Result<Applied, StoreError> {
    let applied = match &event.subject {
        EventSubject::Payment(payment) => settle::apply_in(tx, provider, payment).await?,
        EventSubject::Refund(refund) if refund.succeeded => {
            refunds_done(tx, provider, &refund.payment_id, &refund.id).await?
        }
        EventSubject::Refund(_) | EventSubject::Other => Applied::Pending,
    };
    sqlx::query("UPDATE payment_events SET outcome = $3 WHERE provider = $1 AND event_id = $2")
        .bind(provider)
        .bind(&event.id)
        .bind(applied.label())
        .execute(tx)
        .await?;
    Ok(applied)
}

async fn refunds_done(
    tx: &mut PgConnection,
    provider: &str,
    payment_id: &str,
    refund_id: &str,
) -> Result<Applied, StoreError> {
    let completed =
        super::refunds::complete_for_payment(tx, provider, payment_id, refund_id).await?;
    Ok(if completed {
        Applied::Refunded
    } else {
        Applied::Duplicate
    })
}
