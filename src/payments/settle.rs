//! Bringing local state in line with what the provider says about a payment.
//!
//! Webhooks, the sweeper, the outbox worker and the reconciler all end here, so a payment
//! has one set of rules however its news arrives. One transaction locks the attempt, then
//! the order, checks the amount against the price snapshot and applies only legal moves:
//! a duplicate or out-of-order report finds the state already moved and changes nothing.

use serde_json::json;
use sqlx::{PgConnection, PgPool};

use super::attempts::{self, Attempt, AttemptStatus};
use super::mismatch;
use super::outbox::{self, Kind};
use super::provider::{ProviderPayment, ProviderStatus};
use super::refunds;
use crate::domain::{CaptureMethod, LatePaymentPolicy, OrderEvent, OrderStatus};
use crate::orders::settlement::{self, LockedOrder};
use crate::orders::sweeper;
use crate::store::StoreError;
use crate::telemetry;

/// What applying a provider report did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// The order is now PAID and its units sold.
    Paid,
    /// The report was already applied.
    Duplicate,
    /// Authorised (manual capture); the capture is queued.
    Authorized,
    /// The attempt failed and the order gave its units back (`deal_id` may leave sold-out).
    Released { deal_id: String },
    /// The attempt closed after the order's reservation ended: the order expired and gave
    /// its units back, exactly as the sweeper would have done.
    Expired { deal_id: String },
    /// The attempt failed; the order waits for another attempt or its expiry.
    Failed,
    /// Money for an order that had expired: units taken again, order PAID.
    LateReserved,
    /// Money for an order that had expired: refund queued, order REFUND_PENDING.
    LateRefunded,
    /// Money for an order that had expired, on a `manual_review` deal: order MANUAL_REVIEW.
    LateHeld,
    /// Authorisation for an order that no longer holds stock: void queued.
    LateVoided,
    /// The order was already paid by another attempt: this money is refunded.
    ExtraRefunded,
    /// Still waiting for the payer.
    Pending,
    /// A refund was confirmed.
    Refunded,
    /// Amount or currency differ from the price snapshot: nothing applied.
    Mismatch,
    /// The provider itself reports an amount or currency other than the order's: the money
    /// is voided or refunded, never captured, and the attempt closed (releasing the order's
    /// units when it was its last open attempt).
    MismatchRejected { released: Option<String> },
    /// No attempt of ours has this payment.
    UnknownPayment,
}

impl Applied {
    pub fn label(&self) -> &'static str {
        match self {
            Applied::Paid => "paid",
            Applied::Duplicate => "duplicate",
            Applied::Authorized => "authorized",
            Applied::Released { .. } => "released",
            Applied::Expired { .. } => "expired",
            Applied::Failed => "failed",
            Applied::LateReserved => "late_reserved",
            Applied::LateRefunded => "late_refunded",
            Applied::LateHeld => "late_held",
            Applied::LateVoided => "late_voided",
            Applied::ExtraRefunded => "extra_refunded",
            Applied::Pending => "pending",
            Applied::Refunded => "refunded",
            Applied::Mismatch => "mismatch",
            Applied::MismatchRejected { .. } => "mismatch_rejected",
            Applied::UnknownPayment => "unknown_payment",
        }
    }

    /// The deal that got units back, whose sold-out flag must clear.
    pub fn released_deal(&self) -> Option<&str> {
        match self {
            Applied::Released { deal_id } | Applied::Expired { deal_id } => Some(deal_id),
            Applied::MismatchRejected { released } => released.as_deref(),
            _ => None,
        }
    }
}

/// Applies the provider's view of `payment`, as read from the provider's API, in one
/// transaction. When the provider's amount or currency differs from the order's, the
/// payment is rejected: voided or refunded, and the order no longer waits for it.
pub async fn apply(
    pool: &PgPool,
    provider: &str,
    payment: &ProviderPayment,
) -> Result<Applied, StoreError> {
    let mut tx = pool.begin().await?;
    let applied = apply_in(&mut tx, provider, payment).await?;
    if applied != Applied::Mismatch {
        tx.commit().await?;
        return Ok(applied);
    }
    tx.rollback().await?;
    let mut tx = pool.begin().await?;
    let rejected = mismatch::reject(&mut tx, provider, payment).await?;
    tx.commit().await?;
    Ok(rejected)
}

/// Closes an attempt no create call ever reached the provider with (so nobody can pay it),
/// as the provider would report an expired session.
pub async fn close_never_created(
    pool: &PgPool,
    attempt_id: uuid::Uuid,
) -> Result<Applied, StoreError> {
    let mut tx = pool.begin().await?;
    let closed: Option<Attempt> = sqlx::query_as(
        "UPDATE payment_attempts SET status = 'EXPIRED', updated_at = now()
          WHERE id = $1 AND status = 'PENDING' AND provider_payment_id IS NULL
            AND NOT create_uncertain
         RETURNING id, order_id, provider, provider_payment_id, status, amount_minor, currency,
                   capture_method, checkout_url, provider_expires_at, accepted, checks,
                   created_at, create_uncertain",
    )
    .bind(attempt_id)
    .fetch_optional(&mut *tx)
    .await?;
    let applied = match closed {
        Some(attempt) => release_if_last(&mut tx, &attempt).await?,
        None => Applied::Duplicate,
    };
    tx.commit().await?;
    Ok(applied)
}

/// Whether the provider's amount and currency are the attempt's (ISO 4217 codes compared
/// without regard to case: providers differ in how they spell them).
pub fn amount_matches(attempt: &Attempt, payment: &ProviderPayment) -> bool {
    payment.amount_minor == attempt.amount_minor
        && payment.currency.eq_ignore_ascii_case(&attempt.currency)
}

/// Applies the provider's view of `payment` inside the caller's transaction. On
/// `Mismatch` the caller must roll back.
pub async fn apply_in(
    tx: &mut PgConnection,
    provider: &str,
    payment: &ProviderPayment,
) -> Result<Applied, StoreError> {
    let Some(attempt) =
        attempts::lock_for_payment(tx, provider, &payment.id, payment.reference).await?
    else {
        return Ok(Applied::UnknownPayment);
    };
    if !amount_matches(&attempt, payment) {
        tracing::error!(
            attempt = %attempt.id, order = %attempt.order_id, provider_payment = %payment.id,
            expected_minor = attempt.amount_minor, got_minor = payment.amount_minor,
            expected_currency = %attempt.currency, got_currency = %payment.currency,
            "payment amount or currency does not match the order"
        );
        metrics::counter!(telemetry::PAYMENT_OUTCOMES, "outcome" => "mismatch").increment(1);
        return Ok(Applied::Mismatch);
    }
    let applied = match payment.status {
        ProviderStatus::Succeeded => succeeded(tx, &attempt).await?,
        ProviderStatus::RequiresCapture => authorized(tx, &attempt).await?,
        ProviderStatus::Failed | ProviderStatus::Canceled => {
            failed(tx, &attempt, AttemptStatus::Failed).await?
        }
        ProviderStatus::Expired => failed(tx, &attempt, AttemptStatus::Expired).await?,
        ProviderStatus::RequiresPayment => Applied::Pending,
    };
    metrics::counter!(telemetry::PAYMENT_OUTCOMES, "outcome" => applied.label()).increment(1);
    if let Some(resolution) = late_resolution(&applied) {
        metrics::counter!(telemetry::LATE_PAYMENTS, "resolution" => resolution).increment(1);
    }
    Ok(applied)
}

fn late_resolution(applied: &Applied) -> Option<&'static str> {
    match applied {
        Applied::LateReserved => Some("reserved"),
        Applied::LateRefunded => Some("refunded"),
        Applied::LateHeld => Some("review"),
        Applied::LateVoided => Some("voided"),
        _ => None,
    }
}

pub(super) async fn lock_order(
    tx: &mut PgConnection,
    attempt: &Attempt,
) -> Result<LockedOrder, StoreError> {
    // Attempts are only ever created from their order's row, and orders with attempts are
    // never deleted. Should one be missing all the same, the settlement is refused and
    // rolled back (the provider retries), never applied to nothing.
    settlement::lock(tx, attempt.order_id).await?.ok_or_else(|| {
        tracing::error!(attempt = %attempt.id, order = %attempt.order_id, "payment attempt without its order");
        StoreError::Unexpected(std::sync::Arc::new(sqlx::Error::RowNotFound))
    })
}

async fn succeeded(tx: &mut PgConnection, attempt: &Attempt) -> Result<Applied, StoreError> {
    if attempt.status == AttemptStatus::Succeeded {
        return Ok(Applied::Duplicate);
    }
    // A payment reported failed or expired may still succeed later (a late capture, say):
    // the money is real, so the attempt follows the provider.
    let to = AttemptStatus::Succeeded;
    assert!(attempts::transition(tx, attempt.id, attempt.status, to).await?);
    let order = lock_order(tx, attempt).await?;
    match order.status() {
        OrderStatus::PendingPayment => {
            accept(tx, attempt).await?;
            assert!(
                settlement::pay(tx, &order).await?,
                "the order row is locked"
            );
            order_paid(tx, attempt).await?;
            Ok(Applied::Paid)
        }
        OrderStatus::Expired | OrderStatus::Cancelled => late(tx, &order, attempt).await,
        OrderStatus::Paid
        | OrderStatus::RefundPending
        | OrderStatus::Refunded
        | OrderStatus::ManualReview => {
            refunds::request(tx, attempt, "order_already_paid").await?;
            Ok(Applied::ExtraRefunded)
        }
    }
}

/// Money for an order that gave its units back: the deal's policy decides. A manual-capture
/// payment only gets here when a capture raced the order's end (the capture re-checks the
/// order, but the order may end while the provider captures): that money is refunded, so a
/// cancelled order never becomes PAID.
async fn late(
    tx: &mut PgConnection,
    order: &LockedOrder,
    attempt: &Attempt,
) -> Result<Applied, StoreError> {
    let automatic = attempt.capture_method == CaptureMethod::Automatic;
    if automatic && order.late_payment_policy == LatePaymentPolicy::ManualReview {
        assert!(
            settlement::hold_for_review(tx, order).await?,
            "the order row is locked"
        );
        tracing::warn!(order = %order.id, attempt = %attempt.id, "late payment held for manual review");
        return Ok(Applied::LateHeld);
    }
    if automatic
        && order.late_payment_policy == LatePaymentPolicy::ReserveOrRefund
        && settlement::reserve_again_and_pay(tx, order).await?
    {
        accept(tx, attempt).await?;
        order_paid(tx, attempt).await?;
        return Ok(Applied::LateReserved);
    }
    let moved = settlement::apply(tx, order, OrderEvent::PaymentSucceeded).await?;
    assert_eq!(
        moved,
        Some(OrderStatus::RefundPending),
        "the order row is locked"
    );
    refunds::request(tx, attempt, "late_payment").await?;
    Ok(Applied::LateRefunded)
}

async fn authorized(tx: &mut PgConnection, attempt: &Attempt) -> Result<Applied, StoreError> {
    if attempt.status != AttemptStatus::Pending {
        return Ok(Applied::Duplicate);
    }
    let order = lock_order(tx, attempt).await?;
    let payload =
        json!({ "attempt_id": attempt.id, "provider_payment_id": attempt.provider_payment_id });
    if order.status() == OrderStatus::PendingPayment {
        outbox::enqueue(
            tx,
            Kind::Capture,
            &format!("capture:{}", attempt.id),
            payload,
        )
        .await?;
        return Ok(Applied::Authorized);
    }
    outbox::enqueue(tx, Kind::Void, &format!("void:{}", attempt.id), payload).await?;
    Ok(Applied::LateVoided)
}

async fn failed(
    tx: &mut PgConnection,
    attempt: &Attempt,
    to: AttemptStatus,
) -> Result<Applied, StoreError> {
    if attempt.status != AttemptStatus::Pending {
        return Ok(Applied::Duplicate);
    }
    let from = AttemptStatus::Pending;
    assert!(attempts::transition(tx, attempt.id, from, to).await?);
    release_if_last(tx, attempt).await
}

/// `attempt` just closed without money: when it was its pending order's last open attempt,
/// the order gives its units back, as EXPIRED once its reservation has ended (whoever gets
/// here first, the sweeper's provider check or the provider's own webhook), else CANCELLED.
pub(super) async fn release_if_last(
    tx: &mut PgConnection,
    attempt: &Attempt,
) -> Result<Applied, StoreError> {
    let order = lock_order(tx, attempt).await?;
    if order.status() != OrderStatus::PendingPayment || other_pending(tx, attempt).await? {
        return Ok(Applied::Failed);
    }
    if let Some(deal_id) = sweeper::expire_if_due(tx, order.id).await? {
        return Ok(Applied::Expired { deal_id });
    }
    assert!(
        settlement::fail(tx, &order).await?,
        "the order row is locked"
    );
    Ok(Applied::Released {
        deal_id: order.deal_id,
    })
}

async fn other_pending(tx: &mut PgConnection, attempt: &Attempt) -> Result<bool, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM payment_attempts WHERE order_id = $1 AND id <> $2 AND status = 'PENDING')",
    )
    .bind(attempt.order_id)
    .bind(attempt.id)
    .fetch_one(tx)
    .await?)
}

/// Marks `attempt` as the one that paid its order (unique per order).
pub(super) async fn accept(tx: &mut PgConnection, attempt: &Attempt) -> Result<(), StoreError> {
    sqlx::query("UPDATE payment_attempts SET accepted = true WHERE id = $1")
        .bind(attempt.id)
        .execute(tx)
        .await?;
    Ok(())
}

pub(super) async fn order_paid(tx: &mut PgConnection, attempt: &Attempt) -> Result<(), StoreError> {
    // The receipt names the deal as the order snapshotted it, never as it is now.
    let deal_name: String = sqlx::query_scalar("SELECT deal_name FROM orders WHERE id = $1")
        .bind(attempt.order_id)
        .fetch_one(&mut *tx)
        .await?;
    let payload = json!({ "order_id": attempt.order_id, "attempt_id": attempt.id, "deal_name": deal_name, "amount_minor": attempt.amount_minor, "currency": attempt.currency });
    outbox::enqueue(
        tx,
        Kind::OrderPaid,
        &format!("order_paid:{}", attempt.order_id),
        payload,
    )
    .await
}
