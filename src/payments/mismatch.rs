//! A payment whose amount or currency, as the provider's own API reports it, is not the
//! order's price snapshot.
//!
//! Such money is never captured and never pays the order: an authorisation is voided, a
//! completed charge refunded (both through the outbox, so they happen at least once), the
//! attempt is closed as FAILED, and when it was the order's last open attempt the order
//! gives its units back. A webhook that disagrees with the order is only refused (it may be
//! forged or garbled); this path runs on what the provider's API says.

use serde_json::json;
use sqlx::PgConnection;

use super::applied::{Applied, release_if_last};
use super::attempts::{self, Attempt, AttemptStatus};
use super::outbox::{self, Kind};
use super::provider::{ProviderPayment, ProviderStatus};
use super::refunds;
use crate::store::StoreError;
use crate::telemetry;

/// Rejects `payment` inside the caller's transaction.
pub async fn reject(
    tx: &mut PgConnection,
    provider: &str,
    payment: &ProviderPayment,
) -> Result<Applied, StoreError> {
    let Some(attempt) =
        attempts::lock_for_payment(tx, provider, &payment.id, payment.reference).await?
    else {
        return Ok(Applied::UnknownPayment);
    };
    tracing::error!(
        attempt = %attempt.id, order = %attempt.order_id, provider_payment = %payment.id,
        expected_minor = attempt.amount_minor, got_minor = payment.amount_minor,
        expected_currency = %attempt.currency, got_currency = %payment.currency,
        status = ?payment.status,
        "the provider reports another amount or currency than the order's: payment rejected"
    );
    give_back(tx, &attempt, payment).await?;
    let released = if attempt.status == AttemptStatus::Pending {
        let (from, to) = (AttemptStatus::Pending, AttemptStatus::Failed);
        assert!(attempts::transition(tx, attempt.id, from, to).await?);
        release_if_last(tx, &attempt)
            .await?
            .released_deal()
            .map(str::to_owned)
    } else {
        None
    };
    metrics::counter!(telemetry::PAYMENT_MISMATCHES, "status" => status_label(payment.status))
        .increment(1);
    Ok(Applied::MismatchRejected { released })
}

/// Queues whatever returns the money: a void for an authorisation or an open session, a
/// refund (of what the provider took) for a completed charge.
async fn give_back(
    tx: &mut PgConnection,
    attempt: &Attempt,
    payment: &ProviderPayment,
) -> Result<(), StoreError> {
    match payment.status {
        ProviderStatus::RequiresPayment | ProviderStatus::RequiresCapture => {
            let payload = json!({ "attempt_id": attempt.id, "provider_payment_id": payment.id });
            outbox::enqueue(tx, Kind::Void, &format!("void:{}", attempt.id), payload).await
        }
        ProviderStatus::Succeeded => {
            let taken = Attempt {
                amount_minor: payment.amount_minor,
                currency: payment.currency.clone(),
                provider_payment_id: Some(payment.id.clone()),
                ..attempt.clone()
            };
            refunds::request(tx, &taken, "amount_mismatch").await
        }
        ProviderStatus::Failed | ProviderStatus::Canceled | ProviderStatus::Expired => Ok(()),
    }
}

fn status_label(status: ProviderStatus) -> &'static str {
    match status {
        ProviderStatus::RequiresPayment => "requires_payment",
        ProviderStatus::RequiresCapture => "requires_capture",
        ProviderStatus::Succeeded => "succeeded",
        ProviderStatus::Failed => "failed",
        ProviderStatus::Canceled => "canceled",
        ProviderStatus::Expired => "expired",
    }
}
