//! The `refunds` table: money to give back, one refund per successful attempt.

use serde_json::json;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::attempts::Attempt;
use super::outbox::{self, Kind};
use crate::domain::OrderEvent;
use crate::orders::settlement;
use crate::store::{StoreError, Writes};
use sqlx::Row;
use sqlx::postgres::PgRow;

/// Records a full refund of `attempt` and queues it for the provider; a second request for
/// the same attempt changes nothing.
pub async fn request(
    tx: &mut PgConnection,
    attempt: &Attempt,
    reason: &str,
) -> Result<(), StoreError> {
    let refund_id: Option<Uuid> = sqlx::query_scalar(
        "INSERT INTO refunds (id, attempt_id, order_id, amount_minor, currency, reason, status)
         VALUES ($1, $2, $3, $4, $5, $6, 'PENDING')
         ON CONFLICT (attempt_id) DO NOTHING
         RETURNING id",
    )
    .bind(Uuid::now_v7())
    .bind(attempt.id)
    .bind(attempt.order_id)
    .bind(attempt.amount_minor)
    .bind(&attempt.currency)
    .bind(reason)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(refund_id) = refund_id else {
        return Ok(());
    };
    let payload = json!({
        "refund_id": refund_id,
        "provider_payment_id": attempt.provider_payment_id,
        "amount_minor": attempt.amount_minor,
    });
    outbox::enqueue(tx, Kind::Refund, &format!("refund:{refund_id}"), payload).await
}

/// The provider confirmed refund `refund_id`: mark it, and finish the order when it was
/// waiting only for this money to go back.
pub async fn complete(
    pool: &PgPool,
    refund_id: Uuid,
    provider_refund_id: &str,
) -> Result<(), StoreError> {
    let mut tx = pool.begin().await?;
    let order_id: Option<Uuid> = sqlx::query_scalar(
        "UPDATE refunds SET status = 'SUCCEEDED', provider_refund_id = $2, updated_at = now()
          WHERE id = $1 AND status = 'PENDING'
         RETURNING order_id",
    )
    .bind(refund_id)
    .bind(provider_refund_id)
    .fetch_optional(&mut *tx)
    .await?;
    if let Some(order_id) = order_id {
        finish_order(&mut tx, order_id).await?;
    }
    tx.commit().await?;
    Ok(())
}

/// A refund event from the provider for payment `provider_payment_id`.
pub async fn complete_for_payment(
    tx: &mut PgConnection,
    provider: &str,
    provider_payment_id: &str,
    provider_refund_id: &str,
) -> Result<bool, StoreError> {
    let order_id: Option<Uuid> = sqlx::query_scalar(
        "UPDATE refunds r SET status = 'SUCCEEDED', provider_refund_id = $3, updated_at = now()
           FROM payment_attempts a
          WHERE a.id = r.attempt_id AND a.provider = $1 AND a.provider_payment_id = $2
            AND r.status = 'PENDING'
         RETURNING r.order_id",
    )
    .bind(provider)
    .bind(provider_payment_id)
    .bind(provider_refund_id)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(order_id) = order_id else {
        return Ok(false);
    };
    finish_order(tx, order_id).await?;
    Ok(true)
}

/// REFUND_PENDING becomes REFUNDED once no refund of the order is pending.
async fn finish_order(tx: &mut PgConnection, order_id: Uuid) -> Result<(), StoreError> {
    // Locking the order first makes two refunds finishing together see each other.
    let Some(order) = settlement::lock(tx, order_id).await? else {
        return Ok(());
    };
    let pending: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM refunds WHERE order_id = $1 AND status = 'PENDING')",
    )
    .bind(order_id)
    .fetch_one(&mut *tx)
    .await?;
    if !pending {
        settlement::apply(tx, &order, OrderEvent::RefundCompleted).await?;
    }
    Ok(())
}

/// Counts a refused try of refund `refund_id`; at `tries_max` tries the refund is marked
/// FAILED and true is returned (nobody retries it any more).
pub async fn record_failure(
    pool: &PgPool,
    writes: Writes,
    refund_id: Uuid,
    error: &str,
    tries_max: u32,
) -> Result<bool, StoreError> {
    let mut conn = writes.acquire(pool).await?;
    let status: Option<String> = sqlx::query_scalar(
        "UPDATE refunds SET tries = tries + 1, last_error = $2, updated_at = now(),
                status = CASE WHEN tries + 1 >= $3 THEN 'FAILED' ELSE status END
          WHERE id = $1 AND status = 'PENDING'
         RETURNING status",
    )
    .bind(refund_id)
    .bind(error)
    .bind(i64::from(tries_max))
    .fetch_optional(&mut *conn)
    .await?;
    conn.commit().await?;
    Ok(status.as_deref() == Some("FAILED"))
}

/// A refund given up on, for the reconciler's report.
#[derive(Debug, Clone)]
pub struct FailedRefund {
    pub id: Uuid,
    pub order_id: Uuid,
    pub amount_minor: i64,
    pub currency: String,
    pub tries: i32,
    pub last_error: Option<String>,
}

impl<'r> sqlx::FromRow<'r, PgRow> for FailedRefund {
    fn from_row(row: &'r PgRow) -> Result<Self, sqlx::Error> {
        Ok(Self {
            id: row.try_get("id")?,
            order_id: row.try_get("order_id")?,
            amount_minor: row.try_get("amount_minor")?,
            currency: row.try_get("currency")?,
            tries: row.try_get("tries")?,
            last_error: row.try_get("last_error")?,
        })
    }
}

/// Refunds given up on (at most `limit`), oldest first.
pub async fn failed(pool: &PgPool, limit: u32) -> Result<Vec<FailedRefund>, StoreError> {
    Ok(sqlx::query_as(
        "SELECT id, order_id, amount_minor, currency, tries, last_error FROM refunds
          WHERE status = 'FAILED' ORDER BY created_at LIMIT $1",
    )
    .bind(i64::from(limit))
    .fetch_all(pool)
    .await?)
}

/// Refunds in state FAILED.
pub async fn failed_count(pool: &PgPool) -> Result<i64, StoreError> {
    Ok(
        sqlx::query_scalar("SELECT count(*) FROM refunds WHERE status = 'FAILED'")
            .fetch_one(pool)
            .await?,
    )
}

/// How long the oldest refund not yet confirmed has waited, in seconds; 0 when none.
pub async fn pending_oldest_seconds(pool: &PgPool) -> Result<f64, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT COALESCE(EXTRACT(EPOCH FROM now() - min(created_at))::float8, 0)
           FROM refunds WHERE status = 'PENDING'",
    )
    .fetch_one(pool)
    .await?)
}

/// Refunds requested and not yet confirmed.
pub async fn pending(pool: &PgPool) -> Result<i64, StoreError> {
    Ok(
        sqlx::query_scalar("SELECT count(*) FROM refunds WHERE status = 'PENDING'")
            .fetch_one(pool)
            .await?,
    )
}

/// Refunds still pending ten minutes after they were requested: id and order id.
pub async fn stuck(pool: &PgPool) -> Result<Vec<(Uuid, Uuid)>, StoreError> {
    Ok(sqlx::query_as(
        "SELECT id, order_id FROM refunds
          WHERE status = 'PENDING' AND created_at < now() - interval '10 minutes'",
    )
    .fetch_all(pool)
    .await?)
}
