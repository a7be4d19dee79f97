//! One batch of orders for one deal, placed with one statement.
//!
//! The whole decision runs inside PostgreSQL (`orders_place_batch`, which calls inventory's
//! `inventory_reserve_batch`): a round trip per batch instead of ten, and locks held only
//! for the time the function runs. Every request is decided in arrival order exactly as if
//! it had run alone, and one request's refusal never fails the others. Only when a request
//! could be decided solely by waiting for a bucket another batch holds does the function
//! hand it (and every later one) back; those run again at once in a second statement that
//! waits for the buckets in ascending order.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use sqlx::{Connection, PgPool};
use uuid::Uuid;

use super::{Order, OrderError, Placed, StatusColumn, fingerprint};
use crate::admission::Admitted;
use crate::clock::{elapsed_since, monotonic};
use crate::deals::Deal;
use crate::domain::IdempotencyKey;
use crate::store::StoreError;
use crate::telemetry;
use sqlx::Row as _;
use sqlx::postgres::PgRow;

/// Work another module adds to the order transaction for the orders a batch placed
/// (payments opens their first payment attempt). Orders knows it only through this
/// interface, so it depends on no such module.
pub trait PlacementHook: Send + Sync {
    /// A SQL function `(order_ids uuid[], argument text)`, run in the batch's transaction
    /// with the ids of the orders it placed.
    fn sql_function(&self) -> &'static str;
    /// The second argument of that function.
    fn argument(&self) -> &str;
}

/// One request of a batch.
#[derive(Debug, Clone)]
pub struct Request {
    pub user_id: String,
    pub key: String,
    pub quantity: i32,
    pub fingerprint: Vec<u8>,
}

impl Request {
    pub fn of(admitted: &Admitted, key: &IdempotencyKey) -> Self {
        Self {
            user_id: admitted.user.as_str().to_owned(),
            key: key.as_str().to_owned(),
            quantity: admitted.quantity.as_i32(),
            fingerprint: fingerprint(&admitted.deal.id, admitted.quantity.get()),
        }
    }
}

/// How a batch is placed.
#[derive(Clone, Default)]
pub struct BatchOptions {
    /// The buckets this batch's lane draws from first; empty means any free bucket.
    pub share: Vec<i32>,
    pub hook: Option<Arc<dyn PlacementHook>>,
    /// Runs the statement in a transaction of its own, committed before returning.
    pub commit_before_answer: bool,
    /// Reads which keys exist and takes the buyers' counters with `ON CONFLICT` from the
    /// start, instead of inserting them plainly first and deciding again if one exists.
    pub careful: bool,
}

/// The answers of a batch, one per request in order.
#[derive(Debug)]
pub struct Batch {
    pub results: Vec<Result<Placed, OrderError>>,
    /// The deal has no available unit left after this batch.
    pub ran_out: bool,
    /// A statement's plain inserts met an existing key or buyer, so it decided again.
    pub rechecked: bool,
}

/// One row of `orders_place_batch`.
#[derive(Debug)]
struct Row {
    n: i32,
    outcome: String,
    available: Option<i64>,
    ran_out: bool,
    /// The batch met an existing key or counter and was decided again, the careful way.
    rechecked: bool,
    id: Option<Uuid>,
    user_id: Option<String>,
    deal_id: Option<String>,
    status: Option<String>,
    quantity: Option<i32>,
    amount_minor: Option<i64>,
    currency: Option<String>,
    expires_at: Option<DateTime<Utc>>,
    created_at: Option<DateTime<Utc>>,
}

impl<'r> sqlx::FromRow<'r, PgRow> for Row {
    fn from_row(row: &'r PgRow) -> Result<Self, sqlx::Error> {
        Ok(Self {
            n: row.try_get("n")?,
            outcome: row.try_get("outcome")?,
            available: row.try_get("available")?,
            ran_out: row.try_get("ran_out")?,
            rechecked: row.try_get("rechecked")?,
            id: row.try_get("id")?,
            user_id: row.try_get("user_id")?,
            deal_id: row.try_get("deal_id")?,
            status: row.try_get("status")?,
            quantity: row.try_get("quantity")?,
            amount_minor: row.try_get("amount_minor")?,
            currency: row.try_get("currency")?,
            expires_at: row.try_get("expires_at")?,
            created_at: row.try_get("created_at")?,
        })
    }
}

/// Places `requests` (all for `deal`, in arrival order).
pub async fn place_batch(
    pool: &PgPool,
    deal: &Deal,
    requests: &[Request],
    options: &BatchOptions,
) -> Result<Batch, StoreError> {
    assert!(!requests.is_empty());
    let mut rows = run(pool, deal, requests, options, false).await?;
    // Every row of a statement carries its flag; the first stands for the statement.
    let rechecked_of = |rows: &[Row]| rows.first().is_some_and(|row| row.rechecked);
    let mut rechecked = u64::from(rechecked_of(&rows));
    if let Some(first) = rows.iter().position(|row| row.outcome == "undecided") {
        let again = run(pool, deal, &requests[first..], options, true).await?;
        rechecked += u64::from(rechecked_of(&again));
        rows.truncate(first);
        rows.extend(again);
    }
    assert_eq!(rows.len(), requests.len(), "one answer per request");
    if rechecked > 0 {
        metrics::counter!(telemetry::RESERVATION_BATCHES_RECHECKED).increment(rechecked);
    }
    let ran_out = rows.last().is_some_and(|row| row.ran_out);
    let results = rows.into_iter().map(|row| answer(deal, row)).collect();
    Ok(Batch {
        results,
        ran_out,
        rechecked: rechecked > 0,
    })
}

/// For each request, the 1-based position of the previous request with the same user and
/// key, or 0.
fn previous_same_key(requests: &[Request]) -> Vec<i32> {
    let mut last = std::collections::HashMap::new();
    requests
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let position = i32::try_from(i + 1).expect("a batch is far below i32::MAX");
            last.insert((r.user_id.as_str(), r.key.as_str()), position)
                .unwrap_or(0)
        })
        .collect()
}

async fn run(
    pool: &PgPool,
    deal: &Deal,
    requests: &[Request],
    options: &BatchOptions,
    wait_all: bool,
) -> Result<Vec<Row>, StoreError> {
    let ids: Vec<Uuid> = requests.iter().map(|_| Uuid::now_v7()).collect();
    let users: Vec<&str> = requests.iter().map(|r| r.user_id.as_str()).collect();
    let keys: Vec<&str> = requests.iter().map(|r| r.key.as_str()).collect();
    let fingerprints: Vec<&[u8]> = requests.iter().map(|r| r.fingerprint.as_slice()).collect();
    let units: Vec<i32> = requests.iter().map(|r| r.quantity).collect();
    let hook = options.hook.as_deref();
    let query = sqlx::query_as(
        "SELECT * FROM orders_place_batch($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
    )
    .bind(&deal.id)
    .bind(&ids)
    .bind(&users)
    .bind(&keys)
    .bind(&fingerprints)
    .bind(&units)
    .bind(previous_same_key(requests))
    .bind(&options.share)
    .bind(wait_all)
    .bind(hook.map(PlacementHook::sql_function))
    .bind(hook.map(PlacementHook::argument))
    .bind(options.careful);
    let waiting = monotonic();
    let mut conn = pool.acquire().await?;
    metrics::histogram!(telemetry::DB_POOL_WAIT).record(elapsed_since(waiting).as_secs_f64());
    let running = monotonic();
    let rows: Vec<Row> = if options.commit_before_answer {
        let mut tx = conn.begin().await?;
        let rows = query.fetch_all(&mut *tx).await?;
        tx.commit().await?;
        rows
    } else {
        query.fetch_all(&mut *conn).await?
    };
    metrics::histogram!(telemetry::RESERVATION_TRANSACTION)
        .record(elapsed_since(running).as_secs_f64());
    assert!(
        rows.iter()
            .enumerate()
            .all(|(i, row)| row.n as usize == i + 1),
        "answers come in request order"
    );
    assert!(
        !wait_all || rows.iter().all(|row| row.outcome != "undecided"),
        "waiting for every bucket always decides"
    );
    Ok(rows)
}

fn answer(deal: &Deal, row: Row) -> Result<Placed, OrderError> {
    let replayed = match row.outcome.as_str() {
        "reserved" => false,
        "replayed" => true,
        "idempotency_conflict" => return Err(OrderError::IdempotencyConflict),
        "sale_not_open" => return Err(OrderError::SaleNotOpen),
        "per_user_limit" => {
            return Err(OrderError::PerUserLimit {
                limit: deal.per_user_limit,
            });
        }
        "sold_out" => {
            return Err(OrderError::SoldOut {
                available: row.available.unwrap_or(0),
            });
        }
        other => return Err(unexpected(&format!("orders_place_batch answered {other}"))),
    };
    Ok(Placed {
        order: order_of(row)?,
        replayed,
    })
}

fn order_of(row: Row) -> Result<Order, OrderError> {
    let missing = || unexpected("an answered order has no order row");
    let status = row.status.ok_or_else(missing)?;
    Ok(Order {
        id: row.id.ok_or_else(missing)?,
        user_id: row.user_id.ok_or_else(missing)?,
        deal_id: row.deal_id.ok_or_else(missing)?,
        deal_name: None,
        status: StatusColumn::try_from(status).map_err(|_| missing())?,
        quantity: row.quantity.ok_or_else(missing)?,
        amount_minor: row.amount_minor.ok_or_else(missing)?,
        currency: row.currency.ok_or_else(missing)?,
        expires_at: row.expires_at.ok_or_else(missing)?,
        created_at: row.created_at.ok_or_else(missing)?,
    })
}

/// The batch function broke its own contract.
pub(crate) fn unexpected(what: &str) -> OrderError {
    OrderError::Store(StoreError::Unexpected(std::sync::Arc::new(
        sqlx::Error::Protocol(what.to_owned()),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(user: &str, key: &str) -> Request {
        Request {
            user_id: user.into(),
            key: key.into(),
            quantity: 1,
            fingerprint: vec![],
        }
    }

    #[test]
    fn repeated_keys_point_at_their_previous_request() {
        let batch = [
            request("a", "k"),
            request("b", "k"),
            request("a", "k"),
            request("a", "j"),
            request("a", "k"),
        ];
        assert_eq!(previous_same_key(&batch), vec![0, 0, 1, 0, 3]);
    }
}
