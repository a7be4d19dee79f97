//! Bucketed inventory: a deal's stock split over `bucket_count` rows.
//!
//! One hot row serialises every purchase behind a single lock. Splitting it lets concurrent
//! reservations take different rows. Each reservation is a conditional decrement that can
//! never drive a row below zero (`available >= q`, backed by `CHECK (available >= 0)`), and
//! it runs inside the caller's short order transaction.
//!
//! Lock order, everywhere: a user's `user_deal_units` row first, then buckets in
//! ascending order. A reservation follows a [`Plan`]: the first choice takes one bucket
//! with `SKIP LOCKED` and never waits, so a request does not queue behind a locked bucket
//! while another has stock. Only when that fails does it wait, in a fresh transaction that
//! holds no bucket yet: on one named bucket, or on every non-empty bucket in ascending
//! order. No transaction ever waits for a bucket while holding another out of order, so
//! reservations, releases and stock changes cannot deadlock.

mod release;
mod stock;

use sqlx::{PgConnection, PgPool};

pub use release::{HeldOrder, consume, release};
pub use stock::{StockError, adjust, available_by_deal};

use crate::store::StoreError;

/// Units taken from one bucket for one order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Line {
    pub bucket: i32,
    pub quantity: i32,
}

/// A successful reservation inside an open transaction.
#[derive(Debug)]
pub struct Reserved {
    pub lines: Vec<Line>,
    /// Some bucket reached zero: the deal may now be sold out and is worth checking.
    pub emptied_a_bucket: bool,
}

/// How a reservation looks for units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// One bucket that covers the order, tried from `start` on, skipping locked rows.
    AnyFree { start: i32 },
    /// Every bucket that fits was busy: wait for this one.
    Bucket(i32),
    /// No single bucket covers the order: lock every non-empty bucket, ascending.
    Spread,
}

#[derive(Debug, thiserror::Error)]
pub enum ReserveError {
    /// Fewer than the requested units remain; `available` is what the deal still has.
    #[error("not enough stock: {available} available")]
    Insufficient { available: i64 },
    /// The plan found nothing without waiting. Roll back (releasing any lock the attempt
    /// took) and run the order again with this plan.
    #[error("retry the reservation with {0:?}")]
    Retry(Plan),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Takes `quantity` units of `deal_id` inside `tx`, following `plan`.
pub async fn reserve(
    tx: &mut PgConnection,
    deal_id: &str,
    quantity: i32,
    bucket_count: i32,
    plan: Plan,
) -> Result<Reserved, ReserveError> {
    assert!(quantity >= 1 && bucket_count >= 1);
    let taken = match plan {
        Plan::AnyFree { start } => take_free(tx, deal_id, quantity, bucket_count, start).await?,
        Plan::Bucket(bucket) => take_bucket(tx, deal_id, quantity, bucket).await?,
        Plan::Spread => return take_spread(tx, deal_id, quantity).await,
    };
    match taken {
        Some(reserved) => Ok(reserved),
        None => Err(next_plan(tx, deal_id, quantity).await?),
    }
}

/// Nothing was taken: decide from committed stock whether the deal is sold out, or which
/// plan can still succeed.
async fn next_plan(
    tx: &mut PgConnection,
    deal_id: &str,
    quantity: i32,
) -> Result<ReserveError, StoreError> {
    let buckets: Vec<(i32, i64)> = sqlx::query_as(
        "SELECT bucket, available FROM inventory_buckets WHERE deal_id = $1 AND available > 0",
    )
    .bind(deal_id)
    .fetch_all(&mut *tx)
    .await?;
    let available: i64 = buckets.iter().map(|(_, units)| units).sum();
    if available < i64::from(quantity) {
        return Ok(ReserveError::Insufficient { available });
    }
    let fitting: Vec<i32> = buckets
        .iter()
        .filter(|(_, units)| *units >= i64::from(quantity))
        .map(|(bucket, _)| *bucket)
        .collect();
    Ok(match fitting.as_slice() {
        [] => ReserveError::Retry(Plan::Spread),
        some => ReserveError::Retry(Plan::Bucket(some[rand::random_range(0..some.len())])),
    })
}

/// One conditional decrement on the first unlocked bucket, from `start`, that covers
/// `quantity`. Never waits.
async fn take_free(
    tx: &mut PgConnection,
    deal_id: &str,
    quantity: i32,
    bucket_count: i32,
    start: i32,
) -> Result<Option<Reserved>, StoreError> {
    let row: Option<(i32, i64)> = sqlx::query_as(
        "UPDATE inventory_buckets b
            SET available = b.available - $2, reserved = b.reserved + $2
           FROM (SELECT bucket FROM inventory_buckets
                  WHERE deal_id = $1 AND available >= $2
                  ORDER BY (bucket + $3) % $4
                  LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED) pick
          WHERE b.deal_id = $1 AND b.bucket = pick.bucket AND b.available >= $2
         RETURNING b.bucket, b.available",
    )
    .bind(deal_id)
    .bind(i64::from(quantity))
    .bind(start)
    .bind(bucket_count)
    .fetch_optional(&mut *tx)
    .await?;
    Ok(row.map(|(bucket, after)| single(bucket, quantity, after)))
}

/// One conditional decrement on `bucket`, waiting for its lock if need be.
async fn take_bucket(
    tx: &mut PgConnection,
    deal_id: &str,
    quantity: i32,
    bucket: i32,
) -> Result<Option<Reserved>, StoreError> {
    let row: Option<(i32, i64)> = sqlx::query_as(
        "UPDATE inventory_buckets
            SET available = available - $3, reserved = reserved + $3
          WHERE deal_id = $1 AND bucket = $2 AND available >= $3
         RETURNING bucket, available",
    )
    .bind(deal_id)
    .bind(bucket)
    .bind(i64::from(quantity))
    .fetch_optional(&mut *tx)
    .await?;
    Ok(row.map(|(bucket, after)| single(bucket, quantity, after)))
}

fn single(bucket: i32, quantity: i32, available_after: i64) -> Reserved {
    assert!(available_after >= 0, "CHECK (available >= 0) holds");
    Reserved {
        lines: vec![Line { bucket, quantity }],
        emptied_a_bucket: available_after == 0,
    }
}

/// The deal has the units but no single bucket does: lock every non-empty bucket in
/// ascending order and take from the fullest first.
async fn take_spread(
    tx: &mut PgConnection,
    deal_id: &str,
    quantity: i32,
) -> Result<Reserved, ReserveError> {
    let buckets: Vec<(i32, i64)> = sqlx::query_as(
        "SELECT bucket, available FROM inventory_buckets
          WHERE deal_id = $1 AND available > 0 ORDER BY bucket FOR NO KEY UPDATE",
    )
    .bind(deal_id)
    .fetch_all(&mut *tx)
    .await
    .map_err(StoreError::from)?;
    let lines = allocate(&buckets, quantity).ok_or(ReserveError::Insufficient {
        available: buckets.iter().map(|(_, available)| available).sum(),
    })?;
    let (ids, units): (Vec<i32>, Vec<i32>) = lines.iter().map(|l| (l.bucket, l.quantity)).unzip();
    let emptied: Vec<bool> = sqlx::query_scalar(
        "UPDATE inventory_buckets b
            SET available = b.available - t.q, reserved = b.reserved + t.q
           FROM unnest($2::int[], $3::int[]) AS t(bucket, q)
          WHERE b.deal_id = $1 AND b.bucket = t.bucket AND b.available >= t.q
         RETURNING b.available = 0",
    )
    .bind(deal_id)
    .bind(&ids)
    .bind(&units)
    .fetch_all(&mut *tx)
    .await
    .map_err(StoreError::from)?;
    // The rows are locked by this transaction, so every line must have applied.
    assert_eq!(emptied.len(), lines.len());
    Ok(Reserved {
        emptied_a_bucket: emptied.iter().any(|e| *e),
        lines,
    })
}

/// Splits `quantity` over `buckets` (id, available), fullest first; `None` if they cannot cover it.
pub(crate) fn allocate(buckets: &[(i32, i64)], quantity: i32) -> Option<Vec<Line>> {
    let mut by_size: Vec<(i32, i64)> = buckets.to_vec();
    by_size.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut wanted = i64::from(quantity);
    let mut lines = Vec::new();
    for (bucket, available) in by_size {
        if wanted == 0 {
            break;
        }
        let take = available.min(wanted);
        if take > 0 {
            lines.push(Line {
                bucket,
                quantity: i32::try_from(take).ok()?,
            });
            wanted -= take;
        }
    }
    (wanted == 0).then_some(lines)
}

/// Units still available for `deal_id`, as committed.
pub async fn available(pool: &PgPool, deal_id: &str) -> Result<i64, StoreError> {
    let total: i64 = sqlx::query_scalar(
        "SELECT COALESCE(sum(available), 0)::bigint FROM inventory_buckets WHERE deal_id = $1",
    )
    .bind(deal_id)
    .fetch_one(pool)
    .await?;
    Ok(total)
}

/// A consistent picture of one deal's inventory, checked against the orders that explain it.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub stock_total: i64,
    pub available: i64,
    pub reserved: i64,
    pub sold: i64,
    pub buckets: Vec<(i32, i64)>,
    /// `stock_total = available + reserved + sold`, and reserved and sold units match the
    /// reservation lines of pending and paid orders.
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
        "SELECT COALESCE(sum(l.quantity) FILTER (WHERE o.status = 'PENDING_PAYMENT'), 0)::bigint,
                COALESCE(sum(l.quantity) FILTER (WHERE o.status = 'PAID'), 0)::bigint
           FROM reservation_lines l JOIN orders o ON o.id = l.order_id
          WHERE l.deal_id = $1 AND l.released_at IS NULL",
    )
    .bind(deal_id)
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
    fn allocate_takes_fullest_first_and_covers_exactly() {
        let lines = allocate(&[(0, 1), (1, 3), (2, 2)], 4).unwrap();
        assert_eq!(
            lines,
            vec![
                Line {
                    bucket: 1,
                    quantity: 3
                },
                Line {
                    bucket: 2,
                    quantity: 1
                }
            ]
        );
        assert!(allocate(&[(0, 1), (1, 1)], 3).is_none());
        assert!(allocate(&[], 1).is_none());
    }

    proptest::proptest! {
        #[test]
        fn allocate_never_overdraws(
            sizes in proptest::collection::vec(0i64..20, 1..16),
            quantity in 1i32..60,
        ) {
            let buckets: Vec<(i32, i64)> = sizes.iter().enumerate().map(|(i, s)| (i as i32, *s)).collect();
            let total: i64 = sizes.iter().sum();
            match allocate(&buckets, quantity) {
                Some(lines) => {
                    proptest::prop_assert_eq!(lines.iter().map(|l| i64::from(l.quantity)).sum::<i64>(), i64::from(quantity));
                    for line in lines {
                        proptest::prop_assert!(i64::from(line.quantity) <= sizes[line.bucket as usize]);
                    }
                }
                None => proptest::prop_assert!(total < i64::from(quantity)),
            }
        }
    }
}
