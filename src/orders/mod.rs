//! Orders: placing them (idempotently, with their reservation), reading and cancelling.
//!
//! Orders are placed in batches by the [`lanes::Engine`]: each batch is one call of the SQL
//! function `orders_place_batch`, which asks inventory to reserve, inserts the orders it
//! reserved (the idempotency key is a unique index on them; a refused request writes
//! nothing) and runs the placement hook (payments opens the first attempt), all in one
//! statement: one round trip, one short transaction that never waits on a user or a
//! provider.

pub mod batch;
pub mod lanes;
mod settings;
pub mod settlement;
pub mod sweeper;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

use crate::domain::{OrderEvent, OrderStatus, UserId};
use crate::inventory::{self, HeldOrder};
use crate::store::StoreError;
use crate::telemetry;
use sqlx::postgres::PgRow;
use sqlx::{FromRow, Row};

use crate::store::rows;

pub use batch::{PlacementHook, Request, place_batch};
pub use settings::{OrderSettings, SweeperSettings};

/// An order as stored.
#[derive(Debug, Clone)]
pub struct Order {
    pub id: Uuid,
    pub user_id: String,
    pub deal_id: String,
    /// The deal's name when the order was placed, as stored with it; `None` for an order
    /// just answered by the placing batch (whose row is not read back).
    pub deal_name: Option<String>,
    pub status: StatusColumn,
    pub quantity: i32,
    pub amount_minor: i64,
    pub currency: String,
    pub expires_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
}

impl<'r> sqlx::FromRow<'r, PgRow> for Order {
    fn from_row(row: &'r PgRow) -> Result<Self, sqlx::Error> {
        Ok(Self {
            id: row.try_get("id")?,
            user_id: row.try_get("user_id")?,
            deal_id: row.try_get("deal_id")?,
            deal_name: row.try_get("deal_name")?,
            status: rows::parsed(row, "status")?,
            quantity: row.try_get("quantity")?,
            amount_minor: row.try_get("amount_minor")?,
            currency: row.try_get("currency")?,
            expires_at: row.try_get("expires_at")?,
            created_at: row.try_get("created_at")?,
        })
    }
}

/// `orders.status`, parsed; the CHECK constraint keeps it to known names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatusColumn(pub OrderStatus);

impl TryFrom<String> for StatusColumn {
    type Error = String;
    fn try_from(raw: String) -> Result<Self, Self::Error> {
        OrderStatus::parse(&raw).map(StatusColumn).ok_or(raw)
    }
}

impl Order {
    pub fn status(&self) -> OrderStatus {
        self.status.0
    }
}

/// The outcome of placing an order.
#[derive(Debug)]
pub struct Placed {
    pub order: Order,
    /// The idempotency key had already produced this order; nothing new was reserved.
    pub replayed: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum OrderError {
    #[error("not enough stock ({available} units left)")]
    SoldOut { available: i64 },
    #[error("the sale is not open")]
    SaleNotOpen,
    #[error("at most {limit} units per user")]
    PerUserLimit { limit: i32 },
    #[error("this Idempotency-Key was used for a different request")]
    IdempotencyConflict,
    #[error("order not found")]
    NotFound,
    #[error("order is {0}")]
    InvalidState(OrderStatus),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for OrderError {
    fn from(error: sqlx::Error) -> Self {
        Self::Store(error.into())
    }
}

pub(crate) const ORDER_COLUMNS: &str =
    "id, user_id, deal_id, deal_name, status, quantity, amount_minor, currency, expires_at,
     created_at";

/// What the request asked for; a key replayed with a different fingerprint is a conflict.
pub fn fingerprint(deal_id: &str, quantity: u32) -> Vec<u8> {
    format!("v1\n{deal_id}\n{quantity}").into_bytes()
}

/// Counts the outcome of placing one order.
pub(crate) fn record(outcome: Result<Placed, OrderError>) -> Result<Placed, OrderError> {
    let label = match &outcome {
        Ok(placed) if placed.replayed => "replayed",
        Ok(_) => "reserved",
        Err(OrderError::SoldOut { .. }) => "sold_out",
        Err(OrderError::PerUserLimit { .. }) => "per_user_limit",
        Err(OrderError::SaleNotOpen) => "sale_not_open",
        Err(OrderError::IdempotencyConflict) => "idempotency_conflict",
        Err(OrderError::Store(StoreError::PoolExhausted)) => "overloaded",
        Err(_) => "error",
    };
    metrics::counter!(telemetry::RESERVATIONS, "outcome" => label).increment(1);
    outcome
}

/// Whether the user already placed an order under `key`. Asked only on paths that refuse
/// a request before it reaches a batch (the batch itself tells replays and conflicts apart
/// in the statement that places), so that a reused key is named before the refusal.
pub async fn key_used(pool: &PgPool, user: &UserId, key: &str) -> Result<bool, OrderError> {
    let used = sqlx::query_scalar::<_, bool>(
        "SELECT EXISTS (SELECT 1 FROM orders WHERE user_id = $1 AND idempotency_key = $2)",
    )
    .bind(user.as_str())
    .bind(key)
    .fetch_one(pool)
    .await?;
    Ok(used)
}

/// The user's own order; anyone else's reads as not found.
pub async fn get(pool: &PgPool, user: &UserId, order_id: Uuid) -> Result<Order, OrderError> {
    let sql = format!("SELECT {ORDER_COLUMNS} FROM orders WHERE id = $1 AND user_id = $2");
    sqlx::query_as::<_, Order>(sqlx::AssertSqlSafe(sql))
        .bind(order_id)
        .bind(user.as_str())
        .fetch_optional(pool)
        .await?
        .ok_or(OrderError::NotFound)
}

/// Cancels a pending order and returns its units to their buckets, exactly once.
pub async fn cancel(pool: &PgPool, user: &UserId, order_id: Uuid) -> Result<Order, OrderError> {
    let to = OrderStatus::PendingPayment
        .transition(OrderEvent::Cancel)
        .expect("a pending order can be cancelled");
    let mut tx = pool.begin().await?;
    // The row's bucket is read and cleared in the update: the released units go back there.
    let sql = format!(
        "UPDATE orders o SET status = $3, updated_at = now(), bucket = NULL
           FROM (SELECT id AS held_id, bucket AS held_bucket FROM orders
                  WHERE id = $1 AND user_id = $2 AND status = 'PENDING_PAYMENT'
                    FOR NO KEY UPDATE) held
          WHERE o.id = held.held_id AND o.status = 'PENDING_PAYMENT'
         RETURNING {ORDER_COLUMNS}, held.held_bucket"
    );
    let cancelled = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(order_id)
        .bind(user.as_str())
        .bind(to.as_str())
        .fetch_optional(&mut *tx)
        .await?;
    let Some(row) = cancelled else {
        tx.rollback().await?;
        let current = get(pool, user, order_id).await?;
        return Err(OrderError::InvalidState(current.status()));
    };
    let order = Order::from_row(&row)?;
    let bucket: Option<i32> = row.try_get("held_bucket")?;
    inventory::release(&mut tx, &[held(&order, bucket)]).await?;
    tx.commit().await?;
    Ok(order)
}

fn held(order: &Order, bucket: Option<i32>) -> HeldOrder {
    HeldOrder {
        id: order.id,
        deal_id: order.deal_id.clone(),
        user_id: order.user_id.clone(),
        quantity: order.quantity,
        bucket,
    }
}
