//! The manual-review queue: late money on deals whose late-payment policy is
//! `manual_review` parks its order in MANUAL_REVIEW, and an operator works through the
//! queue (`/admin/payments/review`, `flashgate review`). Each action goes through the same
//! guarded transitions as the automatic policies: fulfilling takes the units again exactly
//! as `reserve_or_refund` does (and refuses when they are gone), refunding queues the
//! refund exactly as `refund` does.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::attempts::Attempt;
use super::refunds;
use super::settle;
use crate::domain::{AttemptStatus, OrderEvent, OrderStatus};
use crate::orders::settlement::{self, LockedOrder};
use crate::store::StoreError;
use sqlx::Row;
use sqlx::postgres::PgRow;

/// One order waiting for an operator.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ReviewItem {
    pub order_id: Uuid,
    pub deal_id: String,
    pub user_id: String,
    pub quantity: i32,
    pub amount_minor: i64,
    pub currency: String,
    pub review_since: DateTime<Utc>,
    pub attempt_id: Uuid,
    pub provider_payment_id: Option<String>,
}

impl<'r> sqlx::FromRow<'r, PgRow> for ReviewItem {
    fn from_row(row: &'r PgRow) -> Result<Self, sqlx::Error> {
        Ok(Self {
            order_id: row.try_get("order_id")?,
            deal_id: row.try_get("deal_id")?,
            user_id: row.try_get("user_id")?,
            quantity: row.try_get("quantity")?,
            amount_minor: row.try_get("amount_minor")?,
            currency: row.try_get("currency")?,
            review_since: row.try_get("review_since")?,
            attempt_id: row.try_get("attempt_id")?,
            provider_payment_id: row.try_get("provider_payment_id")?,
        })
    }
}

/// What an operator's action came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReviewOutcome {
    /// Units taken again; the order is PAID.
    Fulfilled,
    /// Refund queued; the order is REFUND_PENDING.
    RefundQueued,
    /// Not enough units left (or the buyer's limit): nothing changed; refund instead.
    NoStock,
    /// No such order.
    NotFound,
    /// The order is not (or no longer) in review.
    NotInReview(OrderStatus),
}

const ITEM_SELECT: &str =
    "SELECT o.id AS order_id, o.deal_id, o.user_id, o.quantity, o.amount_minor,
        o.currency, o.review_since, a.id AS attempt_id, a.provider_payment_id
   FROM orders o
   JOIN payment_attempts a ON a.order_id = o.id AND a.status = $2 AND NOT a.accepted
  WHERE o.status = $3
    AND NOT EXISTS (SELECT 1 FROM refunds r WHERE r.attempt_id = a.id)";

/// The queue, oldest first (at most `limit`).
pub async fn list(pool: &PgPool, limit: u32) -> Result<Vec<ReviewItem>, StoreError> {
    let sql = format!("{ITEM_SELECT} ORDER BY o.review_since, o.id LIMIT $1");
    Ok(sqlx::query_as::<_, ReviewItem>(sqlx::AssertSqlSafe(sql))
        .bind(i64::from(limit))
        .bind(AttemptStatus::Succeeded.as_str())
        .bind(OrderStatus::ManualReview.as_str())
        .fetch_all(pool)
        .await?)
}

/// How many orders wait for review, and how long the oldest has waited (seconds).
pub async fn backlog(pool: &PgPool) -> Result<(i64, f64), StoreError> {
    let (count, oldest): (i64, Option<f64>) = sqlx::query_as(
        "SELECT count(*), EXTRACT(EPOCH FROM now() - min(review_since))::float8
           FROM orders WHERE status = $1",
    )
    .bind(OrderStatus::ManualReview.as_str())
    .fetch_one(pool)
    .await?;
    Ok((count, oldest.unwrap_or(0.0).max(0.0)))
}

/// Takes the order's units again and keeps the money, if units are left.
pub async fn fulfil(pool: &PgPool, order_id: Uuid) -> Result<ReviewOutcome, StoreError> {
    act(pool, order_id, Action::Fulfil).await
}

/// Gives the money back.
pub async fn refund(pool: &PgPool, order_id: Uuid) -> Result<ReviewOutcome, StoreError> {
    act(pool, order_id, Action::Refund).await
}

#[derive(Debug, Clone, Copy)]
enum Action {
    Fulfil,
    Refund,
}

/// Locks the held attempt and its order (in the payments lock order), checks the order is
/// still in review, and runs `action`; commits only what an action changed.
async fn act(pool: &PgPool, order_id: Uuid, action: Action) -> Result<ReviewOutcome, StoreError> {
    let mut tx = pool.begin().await?;
    let attempt: Option<Attempt> = sqlx::query_as(
        "SELECT a.id, a.order_id, a.provider, a.provider_payment_id, a.status, a.amount_minor,
                a.currency, a.capture_method, a.checkout_url, a.provider_expires_at, a.accepted,
                a.checks, a.created_at, a.create_uncertain
           FROM payment_attempts a
          WHERE a.order_id = $1 AND a.status = $2 AND NOT a.accepted
            AND NOT EXISTS (SELECT 1 FROM refunds r WHERE r.attempt_id = a.id)
          ORDER BY a.created_at LIMIT 1
          FOR UPDATE OF a",
    )
    .bind(order_id)
    .bind(AttemptStatus::Succeeded.as_str())
    .fetch_optional(&mut *tx)
    .await?;
    let Some(order) = settlement::lock(&mut tx, order_id).await? else {
        return Ok(ReviewOutcome::NotFound);
    };
    let (OrderStatus::ManualReview, Some(attempt)) = (order.status(), attempt) else {
        return Ok(ReviewOutcome::NotInReview(order.status()));
    };
    let outcome = match action {
        Action::Fulfil => fulfil_in(&mut tx, &order, &attempt).await?,
        Action::Refund => refund_in(&mut tx, &order, &attempt).await?,
    };
    if matches!(
        outcome,
        ReviewOutcome::Fulfilled | ReviewOutcome::RefundQueued
    ) {
        tx.commit().await?;
        tracing::info!(order = %order_id, ?outcome, "manual review settled");
    }
    Ok(outcome)
}

async fn fulfil_in(
    tx: &mut PgConnection,
    order: &LockedOrder,
    attempt: &Attempt,
) -> Result<ReviewOutcome, StoreError> {
    if !settlement::reserve_again_and_pay(tx, order).await? {
        return Ok(ReviewOutcome::NoStock);
    }
    super::attempts::accept(tx, attempt.id).await?;
    settle::order_paid(tx, attempt).await?;
    Ok(ReviewOutcome::Fulfilled)
}

async fn refund_in(
    tx: &mut PgConnection,
    order: &LockedOrder,
    attempt: &Attempt,
) -> Result<ReviewOutcome, StoreError> {
    let moved = settlement::apply(tx, order, OrderEvent::RefundRequested).await?;
    assert_eq!(
        moved,
        Some(OrderStatus::RefundPending),
        "the order row is locked"
    );
    refunds::request(tx, attempt, "manual_review").await?;
    Ok(ReviewOutcome::RefundQueued)
}
