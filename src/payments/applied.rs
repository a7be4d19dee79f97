//! What applying a provider report did, and the two steps every path that closes an
//! attempt shares: locking its order, and giving the order's units back when no other
//! attempt is still open. Apart from the settlement rules (`settle`) and the rejection of
//! mismatched money (`mismatch`), which both use them.

use sqlx::PgConnection;

use super::attempts::{self, Attempt};
use crate::domain::OrderStatus;
use crate::orders::settlement::{self, LockedOrder};
use crate::orders::sweeper;
use crate::store::StoreError;

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

/// `attempt` just closed without money: when it was its pending order's last open attempt,
/// the order gives its units back, as EXPIRED once its reservation has ended (whoever gets
/// here first, the sweeper's provider check or the provider's own webhook), else CANCELLED.
pub(super) async fn release_if_last(
    tx: &mut PgConnection,
    attempt: &Attempt,
) -> Result<Applied, StoreError> {
    let order = lock_order(tx, attempt).await?;
    if order.status() != OrderStatus::PendingPayment || attempts::other_pending(tx, attempt).await?
    {
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
