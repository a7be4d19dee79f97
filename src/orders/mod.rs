//! Orders: placing one (idempotently, with its reservation), reading and cancelling it.
//!
//! An order is created in one short transaction that inserts the order row (the
//! idempotency key is a unique index on it), counts the units against the user's limit,
//! takes the units from the buckets and records which buckets they came from. Nothing in
//! that transaction waits on a user or a payment provider.

pub mod group;
pub mod settlement;
pub mod sweeper;

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::admission::Admitted;
use crate::domain::{IdempotencyKey, OrderEvent, OrderStatus, UserId};
use crate::inventory::{self, HeldOrder, Plan, ReserveError};
use crate::payments::attempts;
use crate::store::StoreError;
use crate::telemetry;

/// An order as stored.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Order {
    pub id: Uuid,
    pub user_id: String,
    pub deal_id: String,
    #[sqlx(try_from = "String")]
    pub status: StatusColumn,
    pub quantity: i32,
    pub amount_minor: i64,
    pub currency: String,
    pub expires_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
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
    /// A bucket reached zero: the deal may have just sold out.
    pub emptied_a_bucket: bool,
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
    "id, user_id, deal_id, status, quantity, amount_minor, currency, expires_at, created_at";

/// What the request asked for; a key replayed with a different fingerprint is a conflict.
pub fn fingerprint(deal_id: &str, quantity: u32) -> Vec<u8> {
    format!("v1\n{deal_id}\n{quantity}").into_bytes()
}

/// Places an admitted order. A reservation that would have to wait, or a transient
/// conflict, rolls the transaction back and runs it again, at most `retries_max` times;
/// the last attempt locks every non-empty bucket in order, which always decides.
///
/// With `payment_provider`, the order's first payment attempt is written in the same
/// transaction; the provider itself is called only after the commit.
pub async fn place(
    pool: &PgPool,
    admitted: &Admitted,
    key: &IdempotencyKey,
    retries_max: u32,
    payment_provider: Option<&str>,
) -> Result<Placed, OrderError> {
    let mut plan = Plan::AnyFree {
        start: rand::random_range(0..admitted.deal.bucket_count),
    };
    for attempt in 0..=retries_max {
        let last = attempt == retries_max;
        let plan_now = if last { Plan::Spread } else { plan };
        match place_once(pool, admitted, key, plan_now, payment_provider).await {
            Run::Again(next) if !last => plan = next,
            Run::Finished(Err(OrderError::Store(StoreError::Retryable(error)))) if !last => {
                tracing::debug!(%error, attempt, "order transaction retried");
            }
            Run::Finished(outcome) => return record(outcome),
            Run::Again(_) => break,
        }
    }
    record(Err(OrderError::Store(StoreError::PoolExhausted)))
}

/// One run of the order transaction.
enum Run {
    Finished(Result<Placed, OrderError>),
    /// Rolled back; run again with this reservation plan.
    Again(Plan),
}

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

async fn place_once(
    pool: &PgPool,
    admitted: &Admitted,
    key: &IdempotencyKey,
    plan: Plan,
    payment_provider: Option<&str>,
) -> Run {
    match try_place(pool, admitted, key, plan, payment_provider).await {
        Ok(placed) => Run::Finished(Ok(placed)),
        Err(Step::Failed(error)) => Run::Finished(Err(error)),
        Err(Step::Retry(plan)) => Run::Again(plan),
    }
}

/// Why one run of the order transaction stopped early.
enum Step {
    Failed(OrderError),
    Retry(Plan),
}

impl<E: Into<OrderError>> From<E> for Step {
    fn from(error: E) -> Self {
        Step::Failed(error.into())
    }
}

async fn try_place(
    pool: &PgPool,
    admitted: &Admitted,
    key: &IdempotencyKey,
    plan: Plan,
    payment_provider: Option<&str>,
) -> Result<Placed, Step> {
    let deal = &admitted.deal;
    let quantity = admitted.quantity.as_i32();
    let request = fingerprint(&deal.id, admitted.quantity.get());
    let mut tx = pool.begin().await?;
    let Some(order) = insert_order(&mut tx, admitted, key, &request).await? else {
        tx.rollback().await?;
        return Ok(replay(pool, admitted.user.as_str(), key.as_str(), &request).await?);
    };
    count_against_limit(&mut tx, admitted).await?;
    let reserved =
        match inventory::reserve(&mut tx, &deal.id, quantity, deal.bucket_count, plan).await {
            Ok(reserved) => reserved,
            Err(ReserveError::Insufficient { available }) => {
                return Err(OrderError::SoldOut { available }.into());
            }
            Err(ReserveError::Retry(next)) => {
                tx.rollback().await?;
                return Err(Step::Retry(next));
            }
            Err(ReserveError::Store(error)) => return Err(error.into()),
        };
    insert_lines(
        &mut tx,
        order.id,
        &order.deal_id,
        order.quantity,
        &reserved.lines,
    )
    .await?;
    if let Some(provider) = payment_provider {
        attempts::insert_initial(&mut tx, order.id, provider, &deal.capture_method).await?;
    }
    tx.commit().await?;
    Ok(Placed {
        order,
        replayed: false,
        emptied_a_bucket: reserved.emptied_a_bucket,
    })
}

/// Inserts the order with the deal's price and the database clock's expiry, unless the key
/// was used before (`None`) or the sale window is closed by PostgreSQL's clock (`None`).
async fn insert_order(
    tx: &mut PgConnection,
    admitted: &Admitted,
    key: &IdempotencyKey,
    request: &[u8],
) -> Result<Option<Order>, OrderError> {
    let sql = format!(
        "INSERT INTO orders (id, user_id, deal_id, idempotency_key, request_fingerprint, status,
                             quantity, unit_price_minor, amount_minor, currency, expires_at)
         SELECT $1, $2, d.id, $4, $5, 'PENDING_PAYMENT', $6, d.unit_price_minor,
                d.unit_price_minor * $6, d.currency,
                now() + make_interval(secs => d.reservation_ttl_seconds)
           FROM deals d
          WHERE d.id = $3
            AND (d.starts_at IS NULL OR d.starts_at <= now())
            AND (d.ends_at IS NULL OR now() < d.ends_at)
            AND NOT d.paused
         ON CONFLICT (user_id, idempotency_key) DO NOTHING
         RETURNING {ORDER_COLUMNS}"
    );
    Ok(sqlx::query_as::<_, Order>(sqlx::AssertSqlSafe(sql))
        .bind(Uuid::now_v7())
        .bind(admitted.user.as_str())
        .bind(&admitted.deal.id)
        .bind(key.as_str())
        .bind(request)
        .bind(admitted.quantity.as_i32())
        .fetch_optional(tx)
        .await?)
}

/// Adds the units to the user's counter, refusing (with no row) to pass the deal's limit.
async fn count_against_limit(tx: &mut PgConnection, admitted: &Admitted) -> Result<(), OrderError> {
    let deal = &admitted.deal;
    let quantity = admitted.quantity.as_i32();
    if add_units(
        tx,
        &deal.id,
        admitted.user.as_str(),
        quantity,
        deal.per_user_limit,
    )
    .await?
    {
        Ok(())
    } else {
        Err(OrderError::PerUserLimit {
            limit: deal.per_user_limit,
        })
    }
}

/// Adds `quantity` to the user's units in the deal unless that would pass `limit`; the
/// guarded upsert makes concurrent requests of one user queue on one row.
pub(crate) async fn add_units(
    tx: &mut PgConnection,
    deal_id: &str,
    user_id: &str,
    quantity: i32,
    limit: i32,
) -> Result<bool, StoreError> {
    if quantity > limit {
        return Ok(false);
    }
    let counted: Option<i32> = sqlx::query_scalar(
        "INSERT INTO user_deal_units AS u (deal_id, user_id, units, limit_units)
         VALUES ($1, $2, $3, $4)
         ON CONFLICT (deal_id, user_id) DO UPDATE
            SET units = u.units + EXCLUDED.units, limit_units = EXCLUDED.limit_units
          WHERE u.units + EXCLUDED.units <= EXCLUDED.limit_units
         RETURNING units",
    )
    .bind(deal_id)
    .bind(user_id)
    .bind(quantity)
    .bind(limit)
    .fetch_optional(tx)
    .await?;
    assert!(counted.is_none_or(|units| units <= limit));
    Ok(counted.is_some())
}

pub(crate) async fn insert_lines(
    tx: &mut PgConnection,
    order_id: Uuid,
    deal_id: &str,
    quantity: i32,
    lines: &[inventory::Line],
) -> Result<(), StoreError> {
    let buckets: Vec<i32> = lines.iter().map(|l| l.bucket).collect();
    let units: Vec<i32> = lines.iter().map(|l| l.quantity).collect();
    assert_eq!(
        units.iter().sum::<i32>(),
        quantity,
        "lines cover the order exactly"
    );
    sqlx::query(
        "INSERT INTO reservation_lines (order_id, deal_id, bucket, quantity)
         SELECT $1, $2, bucket, q FROM unnest($3::int[], $4::int[]) AS t(bucket, q)",
    )
    .bind(order_id)
    .bind(deal_id)
    .bind(&buckets)
    .bind(&units)
    .execute(tx)
    .await?;
    Ok(())
}

/// The key was used before: the same request replays its order, another is a conflict.
/// No row at all means the insert was refused by the sale window.
pub(crate) async fn replay(
    pool: &PgPool,
    user_id: &str,
    key: &str,
    request: &[u8],
) -> Result<Placed, OrderError> {
    let sql = format!(
        "SELECT {ORDER_COLUMNS}, request_fingerprint FROM orders WHERE user_id = $1 AND idempotency_key = $2"
    );
    let row = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(user_id)
        .bind(key)
        .fetch_optional(pool)
        .await?;
    let Some(row) = row else {
        return Err(OrderError::SaleNotOpen);
    };
    let stored: Vec<u8> = sqlx::Row::try_get(&row, "request_fingerprint")?;
    if stored != request {
        return Err(OrderError::IdempotencyConflict);
    }
    let order = <Order as sqlx::FromRow<_>>::from_row(&row)?;
    Ok(Placed {
        order,
        replayed: true,
        emptied_a_bucket: false,
    })
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
    let sql = format!(
        "UPDATE orders SET status = $3, updated_at = now()
          WHERE id = $1 AND user_id = $2 AND status = 'PENDING_PAYMENT'
         RETURNING {ORDER_COLUMNS}"
    );
    let cancelled = sqlx::query_as::<_, Order>(sqlx::AssertSqlSafe(sql))
        .bind(order_id)
        .bind(user.as_str())
        .bind(to.as_str())
        .fetch_optional(&mut *tx)
        .await?;
    let Some(order) = cancelled else {
        tx.rollback().await?;
        let current = get(pool, user, order_id).await?;
        return Err(OrderError::InvalidState(current.status()));
    };
    inventory::release(&mut tx, &[held(&order)]).await?;
    tx.commit().await?;
    Ok(order)
}

fn held(order: &Order) -> HeldOrder {
    HeldOrder {
        id: order.id,
        deal_id: order.deal_id.clone(),
        user_id: order.user_id.clone(),
        quantity: order.quantity,
    }
}
