//! The expiry sweeper: gives back the stock of orders nobody paid for in time.
//!
//! Every instance runs one. Each pass claims a batch of overdue orders with
//! `FOR UPDATE SKIP LOCKED`, so instances never wait on each other or expire an order
//! twice, moves them to EXPIRED guarded by their old status (a racing cancel wins or loses
//! cleanly) and releases their units to the buckets they came from, in one transaction.
//! Overdue is judged by PostgreSQL's clock. An order with a payment attempt still pending
//! is left alone for at most `grace` past its expiry: the payments worker first asks the
//! provider (a payment may have gone through) and closes the attempt. At `expires_at +
//! grace` the order expires whatever the provider said; money that arrives later is a late
//! payment. So a reservation always ends, and a new attempt (refused at or after
//! `expires_at`) can never postpone it.
//!
//! [`expire_if_due`] is the same move for one order inside someone else's transaction: a
//! provider report that closes the last open attempt of an order whose reservation has
//! ended expires the order rather than cancelling it, so expiry reads `EXPIRED` whichever
//! of the sweeper and the provider's webhook lands first.

use std::collections::BTreeSet;
use std::time::Duration;

use sqlx::{PgConnection, PgPool};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::domain::{AttemptStatus, OrderEvent, OrderStatus};
use crate::inventory::{self, HeldOrder};
use crate::store::StoreError;
use crate::telemetry;

/// What one pass did.
#[derive(Debug, Default)]
pub struct Swept {
    pub expired: usize,
    /// Deals that got units back.
    pub deals: BTreeSet<String>,
}

/// Expires at most `batch_max` overdue orders; an order with an attempt still pending only
/// once it is `grace` past its expiry.
pub async fn sweep_once(
    pool: &PgPool,
    batch_max: u32,
    grace: Duration,
) -> Result<Swept, StoreError> {
    let to = OrderStatus::PendingPayment
        .transition(OrderEvent::Expire)
        .expect("a pending order can expire");
    let mut tx = pool.begin().await?;
    let expired: Vec<HeldOrder> = sqlx::query_as(
        "WITH due AS (
             SELECT id, bucket FROM orders
              WHERE status = 'PENDING_PAYMENT' AND expires_at <= now()
                AND (expires_at <= now() - make_interval(secs => $3)
                     OR NOT EXISTS (SELECT 1 FROM payment_attempts a
                                     WHERE a.order_id = orders.id AND a.status = $4))
              ORDER BY expires_at
              LIMIT $1
                FOR UPDATE SKIP LOCKED)
         UPDATE orders o SET status = $2, updated_at = now(), bucket = NULL
           FROM due
          WHERE o.id = due.id AND o.status = 'PENDING_PAYMENT'
         RETURNING o.id, o.deal_id, o.user_id, o.quantity, due.bucket",
    )
    .bind(i64::from(batch_max))
    .bind(to.as_str())
    .bind(grace.as_secs_f64())
    .bind(AttemptStatus::Pending.as_str())
    .fetch_all(&mut *tx)
    .await?;
    assert!(expired.len() <= batch_max as usize);
    inventory::release(&mut tx, &expired).await?;
    tx.commit().await?;
    metrics::counter!(telemetry::ORDERS_EXPIRED).increment(expired.len() as u64);
    Ok(Swept {
        expired: expired.len(),
        deals: expired.into_iter().map(|order| order.deal_id).collect(),
    })
}

/// Expires `order_id` inside the caller's transaction if it is still pending and its
/// `expires_at` has passed, releasing its units; returns its deal when it did. The caller
/// holds the order's row lock or takes it here.
pub async fn expire_if_due(
    tx: &mut PgConnection,
    order_id: Uuid,
) -> Result<Option<String>, StoreError> {
    let to = OrderStatus::PendingPayment
        .transition(OrderEvent::Expire)
        .expect("a pending order can expire");
    let expired: Option<HeldOrder> = sqlx::query_as(
        "UPDATE orders o SET status = $2, updated_at = now(), bucket = NULL
           FROM (SELECT id AS held_id, bucket AS held_bucket FROM orders
                  WHERE id = $1 AND status = 'PENDING_PAYMENT' AND expires_at <= now()
                    FOR NO KEY UPDATE) held
          WHERE o.id = held.held_id AND o.status = 'PENDING_PAYMENT'
         RETURNING o.id, o.deal_id, o.user_id, o.quantity, held.held_bucket AS bucket",
    )
    .bind(order_id)
    .bind(to.as_str())
    .fetch_optional(&mut *tx)
    .await?;
    let Some(order) = expired else {
        return Ok(None);
    };
    inventory::release(tx, std::slice::from_ref(&order)).await?;
    metrics::counter!(telemetry::ORDERS_EXPIRED).increment(1);
    Ok(Some(order.deal_id))
}

/// Sweeps every `interval` until `shutdown`, handing each batch's deals to `on_released`
/// (which clears their sold-out flags). A full batch is followed at once by another.
pub async fn run<F, Fut>(
    pool: PgPool,
    interval: Duration,
    batch_max: u32,
    grace: Duration,
    shutdown: CancellationToken,
    on_released: F,
) where
    F: Fn(BTreeSet<String>) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    loop {
        let full_batch = match pass(&pool, batch_max, grace).await {
            Some(swept) => {
                let full = swept.expired as u64 >= u64::from(batch_max);
                if !swept.deals.is_empty() {
                    on_released(swept.deals).await;
                }
                full
            }
            None => false,
        };
        let pause = if full_batch { Duration::ZERO } else { interval };
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(pause) => {}
        }
    }
}

/// One pass, run as its own task so that a broken invariant (a panic) is reported and the
/// next pass still runs, instead of expiry stopping on this instance.
async fn pass(pool: &PgPool, batch_max: u32, grace: Duration) -> Option<Swept> {
    let pool = pool.clone();
    let outcome = tokio::spawn(async move { sweep_once(&pool, batch_max, grace).await }).await;
    let label = match &outcome {
        Ok(Ok(_)) => "ok",
        Ok(Err(StoreError::Unavailable(error))) => {
            crate::store::failover::record("expiry sweep", error);
            "error"
        }
        Ok(Err(error)) => {
            tracing::warn!(%error, "expiry sweep failed");
            "error"
        }
        Err(panic) => {
            tracing::error!(%panic, "expiry sweep broke an invariant");
            "panic"
        }
    };
    metrics::counter!(telemetry::SWEEPER_RUNS, "outcome" => label).increment(1);
    outcome.ok()?.ok()
}
