//! Bucketed inventory: a deal's stock split over `bucket_count` rows, the per-user unit
//! counters and the reservation lines. This module is the only writer of those tables. A
//! reservation that took a single bucket is kept in its order's row instead of a line
//! (`orders.bucket`, written by the order engine from this module's answer).
//!
//! One hot row serialises every purchase behind a single lock. Splitting it lets concurrent
//! reservations take different rows. Every decrement is conditional and backed by
//! `CHECK (available >= 0)`, so no path can oversell.
//!
//! **The one way to reserve** is the SQL function `inventory_reserve_batch` (see the
//! reservation engine migration): it takes a batch of requests of one deal (a single order
//! is a batch of one), decides each in arrival order exactly as if it had run alone, and
//! writes buckets, counters and lines in the caller's statement, answering the bucket of
//! each reservation it left to the order's row. The order engine calls it
//! from `orders_place_batch`; a late payment calls it through [`reserve_again`].
//!
//! Lock order, everywhere: a user's `user_deal_units` row first, then buckets in ascending
//! order. A batch locks its lane's [`share`] of the buckets with `SKIP LOCKED`, and more
//! buckets (also `SKIP LOCKED`) only when its share cannot serve a request; a request that
//! could only be decided by waiting is handed back undecided and runs again locking every
//! non-empty bucket in ascending order while holding no bucket. No transaction ever waits
//! for a bucket while holding another out of order, so reservations, releases and stock
//! changes cannot deadlock.

mod events;
mod layout;
mod release;
mod stock;

use std::collections::HashMap;

use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

pub use events::{StockChange, StockEvents};
pub use layout::{create_buckets, lock_for_rebalance, set_available, split_evenly};
pub use release::{HeldOrder, consume, release};
pub use stock::{StockError, adjust};

use crate::domain::OrderStatus;
use crate::store::StoreError;

/// The buckets lane `lane` of `lanes` draws from first: every `lanes`-th bucket, so the
/// lanes of one instance never contend with each other for a row.
pub fn share(lane: usize, lanes: usize, bucket_count: i32) -> Vec<i32> {
    assert!(lanes >= 1 && lane < lanes);
    (0..bucket_count.max(0))
        .filter(|bucket| *bucket as usize % lanes == lane)
        .collect()
}

/// Takes `quantity` units again for an order that had given them back (a late payment),
/// inside the caller's transaction, through the batch function as a batch of one that
/// waits for every bucket. False when the user's limit or the stock does not allow it;
/// then nothing was written.
pub async fn reserve_again(
    tx: &mut PgConnection,
    order_id: Uuid,
    deal_id: &str,
    user_id: &str,
    quantity: i32,
    per_user_limit: i32,
) -> Result<bool, StoreError> {
    assert!(quantity >= 1);
    let outcome: Option<String> = sqlx::query_scalar(
        "SELECT r.outcomes[1] FROM inventory_reserve_batch($1, ARRAY[$2::uuid], ARRAY[$3::text],
                ARRAY[$4::int], ARRAY[0], $5, '{}', true, false, false) AS r",
    )
    .bind(deal_id)
    .bind(order_id)
    .bind(user_id)
    .bind(quantity)
    .bind(per_user_limit)
    .fetch_one(tx)
    .await?;
    Ok(outcome.as_deref() == Some("reserved"))
}

/// A deal's units by state, summed over its buckets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    pub available: i64,
    pub reserved: i64,
    pub sold: i64,
    /// Units that became available again since the deal opened (given back or added); it
    /// only grows (see `holders` for what an unchanged value tells).
    pub freed: i64,
}

/// Stock totals of `deal_ids` (deals without buckets are absent). The one place that
/// computes units per deal; everything that needs them calls this.
pub async fn totals(
    pool: &PgPool,
    deal_ids: &[String],
) -> Result<HashMap<String, Totals>, StoreError> {
    let rows: Vec<(String, i64, i64, i64, i64)> = sqlx::query_as(
        "SELECT deal_id, sum(available)::bigint, sum(reserved)::bigint, sum(sold)::bigint,
                sum(freed)::bigint
           FROM inventory_buckets WHERE deal_id = ANY($1) GROUP BY deal_id",
    )
    .bind(deal_ids)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(deal, available, reserved, sold, freed)| {
            (
                deal,
                Totals {
                    available,
                    reserved,
                    sold,
                    freed,
                },
            )
        })
        .collect())
}

/// Units available per deal (of `deal_ids`), and which of the `asked` (deal, user) pairs
/// hold units of their deal, read in one statement and so one snapshot: a unit a listed
/// holder took is counted as gone from `available` exactly when the holder is listed.
pub async fn available_and_holders(
    pool: &PgPool,
    deal_ids: &[String],
    asked: &[(String, String)],
) -> Result<HashMap<String, (i64, Vec<String>)>, StoreError> {
    let (asked_deals, asked_users): (Vec<&str>, Vec<&str>) = asked
        .iter()
        .map(|(deal, user)| (deal.as_str(), user.as_str()))
        .unzip();
    let rows: Vec<(String, i64, Vec<String>)> = sqlx::query_as(
        "WITH asked AS (SELECT * FROM unnest($2::text[], $3::text[]) AS t(deal_id, user_id))
         SELECT b.deal_id, sum(b.available)::bigint,
                coalesce((SELECT array_agg(c.user_id)
                            FROM user_deal_units c
                            JOIN asked a ON a.deal_id = c.deal_id AND a.user_id = c.user_id
                           WHERE c.deal_id = b.deal_id AND c.units > 0), '{}')
           FROM inventory_buckets b WHERE b.deal_id = ANY($1) GROUP BY b.deal_id",
    )
    .bind(deal_ids)
    .bind(asked_deals)
    .bind(asked_users)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(deal, available, holders)| (deal, (available, holders)))
        .collect())
}

/// Who ever held units of a deal, with its available and freed units, read in one
/// statement and so one snapshot (see `holders`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holders {
    /// At most the `users_max + 1` first found, so that a caller sees when there are more.
    pub users: Vec<String>,
    pub available: i64,
    pub freed: i64,
}

/// Users who ever held units of `deal_id` (a placed order keeps its user's counter row,
/// even at zero units; a refused request leaves none). With nothing available in the same
/// snapshot, anyone who orders later takes units freed later, so `freed` moves.
pub async fn holders(
    pool: &PgPool,
    deal_id: &str,
    users_max: usize,
) -> Result<Holders, StoreError> {
    let limit = i64::try_from(users_max).unwrap_or(i64::MAX - 1) + 1;
    let (available, freed, users): (i64, i64, Vec<String>) = sqlx::query_as(
        "SELECT coalesce(sum(b.available), 0)::bigint, coalesce(sum(b.freed), 0)::bigint,
                ARRAY(SELECT c.user_id FROM user_deal_units c WHERE c.deal_id = $1 LIMIT $2)
           FROM inventory_buckets b WHERE b.deal_id = $1",
    )
    .bind(deal_id)
    .bind(limit)
    .fetch_one(pool)
    .await?;
    Ok(Holders {
        users,
        available,
        freed,
    })
}

/// Units still available for `deal_id`, as committed.
pub async fn available(pool: &PgPool, deal_id: &str) -> Result<i64, StoreError> {
    let totals = totals(pool, &[deal_id.to_owned()]).await?;
    Ok(totals.get(deal_id).map_or(0, |t| t.available))
}

/// A consistent picture of one deal's inventory, checked against the orders that explain it.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub stock_total: i64,
    pub available: i64,
    pub reserved: i64,
    pub sold: i64,
    pub buckets: Vec<(i32, i64)>,
    /// `stock_total = available + reserved + sold`, and reserved and sold units match what
    /// pending and paid orders hold (`held_units`: lines, and buckets kept in order rows).
    pub invariant_holds: bool,
}

/// Reads the snapshot in one REPEATABLE READ transaction so concurrent orders cannot make
/// a healthy deal look broken.
pub async fn snapshot(pool: &PgPool, deal_id: &str) -> Result<Option<Snapshot>, StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .execute(&mut *tx)
        .await?;
    let stock_total: Option<i64> =
        sqlx::query_scalar("SELECT stock_total FROM deals WHERE id = $1")
            .bind(deal_id)
            .fetch_optional(&mut *tx)
            .await?;
    let Some(stock_total) = stock_total else {
        return Ok(None);
    };
    let rows: Vec<(i32, i64, i64, i64)> = sqlx::query_as(
        "SELECT bucket, available, reserved, sold FROM inventory_buckets
          WHERE deal_id = $1 ORDER BY bucket",
    )
    .bind(deal_id)
    .fetch_all(&mut *tx)
    .await?;
    let (lines_reserved, lines_sold): (i64, i64) = sqlx::query_as(
        "SELECT COALESCE(sum(l.quantity) FILTER (WHERE o.status = $2), 0)::bigint,
                COALESCE(sum(l.quantity) FILTER (WHERE o.status = $3), 0)::bigint
           FROM held_units l JOIN orders o ON o.id = l.order_id
          WHERE l.deal_id = $1",
    )
    .bind(deal_id)
    .bind(OrderStatus::PendingPayment.as_str())
    .bind(OrderStatus::Paid.as_str())
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    let available = rows.iter().map(|r| r.1).sum();
    let reserved = rows.iter().map(|r| r.2).sum();
    let sold = rows.iter().map(|r| r.3).sum();
    let invariant_holds = stock_total == available + reserved + sold
        && reserved == lines_reserved
        && sold == lines_sold
        && rows.iter().all(|r| r.1 >= 0 && r.2 >= 0 && r.3 >= 0);
    Ok(Some(Snapshot {
        stock_total,
        available,
        reserved,
        sold,
        buckets: rows.iter().map(|r| (r.0, r.1)).collect(),
        invariant_holds,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lane_shares_are_disjoint_and_cover_every_bucket() {
        let shares: Vec<Vec<i32>> = (0..3).map(|lane| share(lane, 3, 8)).collect();
        assert_eq!(shares[0], vec![0, 3, 6]);
        let mut all: Vec<i32> = shares.concat();
        all.sort();
        assert_eq!(all, (0..8).collect::<Vec<_>>());
        assert!(share(3, 4, 2).is_empty());
    }
}
