//! Order state changes driven by payments. Each one is an update guarded by the status the
//! caller saw, so a webhook, the sweeper and a cancel racing on one order produce exactly
//! one outcome.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::domain::{LatePaymentPolicy, OrderEvent, OrderStatus};
use crate::inventory::{self, HeldOrder};
use crate::store::StoreError;
use sqlx::Row;
use sqlx::postgres::PgRow;

use crate::store::rows;

/// An order locked for a payment decision, with the late-payment policy it was placed
/// under and where its deal keeps stock.
#[derive(Debug, Clone)]
pub struct LockedOrder {
    pub id: Uuid,
    pub deal_id: String,
    pub user_id: String,
    pub quantity: i32,
    pub status: super::StatusColumn,
    pub late_payment_policy: LatePaymentPolicy,
    pub bucket_count: i32,
    pub per_user_limit: i32,
    /// Where the order's units are when its reservation is kept in its row.
    pub bucket: Option<i32>,
}

impl<'r> sqlx::FromRow<'r, PgRow> for LockedOrder {
    fn from_row(row: &'r PgRow) -> Result<Self, sqlx::Error> {
        Ok(Self {
            id: row.try_get("id")?,
            deal_id: row.try_get("deal_id")?,
            user_id: row.try_get("user_id")?,
            quantity: row.try_get("quantity")?,
            status: rows::parsed(row, "status")?,
            late_payment_policy: rows::parsed(row, "late_payment_policy")?,
            bucket_count: row.try_get("bucket_count")?,
            per_user_limit: row.try_get("per_user_limit")?,
            bucket: row.try_get("bucket")?,
        })
    }
}

impl LockedOrder {
    pub fn status(&self) -> OrderStatus {
        self.status.0
    }

    fn held(&self) -> HeldOrder {
        HeldOrder {
            id: self.id,
            deal_id: self.deal_id.clone(),
            user_id: self.user_id.clone(),
            quantity: self.quantity,
            bucket: self.bucket,
        }
    }
}

/// Locks the order row (after its attempt: the payments lock order is attempt, order,
/// user units, buckets).
pub async fn lock(
    tx: &mut PgConnection,
    order_id: Uuid,
) -> Result<Option<LockedOrder>, StoreError> {
    Ok(sqlx::query_as::<_, LockedOrder>(
        "SELECT o.id, o.deal_id, o.user_id, o.quantity, o.status, o.late_payment_policy,
                d.bucket_count, d.per_user_limit, o.bucket
           FROM orders o JOIN deals d ON d.id = o.deal_id
          WHERE o.id = $1 FOR NO KEY UPDATE OF o",
    )
    .bind(order_id)
    .fetch_optional(tx)
    .await?)
}

/// Applies `event` to the order if it is still in the status `order` was read with. A status
/// that holds no units clears the bucket kept in the row: the caller releases them.
pub async fn apply(
    tx: &mut PgConnection,
    order: &LockedOrder,
    event: OrderEvent,
) -> Result<Option<OrderStatus>, StoreError> {
    let Ok(to) = order.status().transition(event) else {
        return Ok(None);
    };
    let updated = sqlx::query(
        "UPDATE orders
            SET status = $3, updated_at = now(), bucket = CASE WHEN $4 THEN bucket END
          WHERE id = $1 AND status = $2",
    )
    .bind(order.id)
    .bind(order.status().as_str())
    .bind(to.as_str())
    .bind(to.holds_units())
    .execute(tx)
    .await?;
    Ok((updated.rows_affected() == 1).then_some(to))
}

/// Payment confirmed for a pending order: PAID, reserved units become sold.
pub async fn pay(tx: &mut PgConnection, order: &LockedOrder) -> Result<bool, StoreError> {
    if apply(tx, order, OrderEvent::PaymentSucceeded).await? != Some(OrderStatus::Paid) {
        return Ok(false);
    }
    inventory::consume(tx, &order.held()).await?;
    Ok(true)
}

/// Payment failed for a pending order: CANCELLED, units back to their buckets.
pub async fn fail(tx: &mut PgConnection, order: &LockedOrder) -> Result<bool, StoreError> {
    if apply(tx, order, OrderEvent::PaymentFailed).await?.is_none() {
        return Ok(false);
    }
    inventory::release(tx, &[order.held()]).await?;
    Ok(true)
}

/// Money arrived for an order that had given its units back (or an operator fulfils an
/// order in review): take them again if the deal and the user's limit allow, and mark the
/// order PAID. Returns false (changing nothing) when the units are gone.
pub async fn reserve_again_and_pay(
    tx: &mut PgConnection,
    order: &LockedOrder,
) -> Result<bool, StoreError> {
    if order.status().transition(OrderEvent::ReserveAgain).is_err() {
        return Ok(false);
    }
    sqlx::query("SAVEPOINT late_payment")
        .execute(&mut *tx)
        .await?;
    let taken = take_units(tx, order).await?;
    if !taken {
        sqlx::query("ROLLBACK TO SAVEPOINT late_payment")
            .execute(&mut *tx)
            .await?;
        return Ok(false);
    }
    let moved = apply(tx, order, OrderEvent::ReserveAgain).await?;
    assert_eq!(
        moved,
        Some(OrderStatus::Paid),
        "the order row is locked by this transaction"
    );
    inventory::consume(tx, &order.held()).await?;
    Ok(true)
}

/// Late money on a deal whose policy is `manual_review`: the order waits in MANUAL_REVIEW
/// (holding no units) for an operator. False when the order had moved.
pub async fn hold_for_review(
    tx: &mut PgConnection,
    order: &LockedOrder,
) -> Result<bool, StoreError> {
    if apply(tx, order, OrderEvent::HoldForReview).await?.is_none() {
        return Ok(false);
    }
    sqlx::query("UPDATE orders SET review_since = now() WHERE id = $1")
        .bind(order.id)
        .execute(tx)
        .await?;
    Ok(true)
}

async fn take_units(tx: &mut PgConnection, order: &LockedOrder) -> Result<bool, StoreError> {
    inventory::reserve_again(
        tx,
        order.id,
        &order.deal_id,
        &order.user_id,
        order.quantity,
        order.per_user_limit,
    )
    .await
}

/// The reservation of a pending order follows its provider's checkout session when that
/// ends first. Returns the order's expiry afterwards, `None` when it no longer waits for
/// payment.
pub async fn follow_session(
    tx: &mut PgConnection,
    order_id: Uuid,
    session_ends_at: Option<DateTime<Utc>>,
) -> Result<Option<DateTime<Utc>>, StoreError> {
    Ok(sqlx::query_scalar(
        "UPDATE orders SET expires_at = LEAST(expires_at, COALESCE($2, expires_at)), updated_at = now()
          WHERE id = $1 AND status = $3
         RETURNING expires_at",
    )
    .bind(order_id)
    .bind(session_ends_at)
    .bind(OrderStatus::PendingPayment.as_str())
    .fetch_optional(tx)
    .await?)
}
