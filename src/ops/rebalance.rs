//! Changing a deal's bucket count without losing or creating a unit.
//!
//! More buckets let more purchases run side by side; fewer keep a small remainder from
//! being scattered over rows that each hold too little for an order. A rebalance is one
//! transaction that:
//!
//! 1. takes a per-deal advisory lock, so two rebalances of one deal run one after the other;
//! 2. locks every bucket row of the deal in ascending order with `FOR NO KEY UPDATE` (the
//!    project-wide lock order: per-user counter rows first, then buckets ascending; a
//!    rebalance holds no counter row, so it cannot deadlock with orders, releases
//!    or stock changes). `FOR NO KEY UPDATE` still lets new reservations reference
//!    the rows;
//! 3. creates the rows a larger count needs;
//! 4. spreads the deal's *available* units evenly over buckets `0..N`, leaving reserved and
//!    sold units where they are;
//! 5. sets `deals.bucket_count = N` and announces the change to every instance.
//!
//! Shrinking keeps the rows at `N` and above: they may still hold reserved or sold units
//! that reservations (lines, orders' buckets) point at, and cancelling or expiring those orders returns units
//! to them. Such rows stay fully usable: no reservation plan filters on
//! `bucket < bucket_count` (the first choice only uses the count to pick a starting point),
//! so units released to a drained row are sold like any other, and the next rebalance moves
//! them back into the first `N` buckets.

use sqlx::PgPool;

use crate::deals::{self, BUCKETS_MAX};
use crate::inventory::{self, split_evenly};
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum RebalanceError {
    #[error("buckets must be 1-{BUCKETS_MAX}")]
    InvalidCount,
    #[error("deal not found")]
    NotFound,
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for RebalanceError {
    fn from(error: sqlx::Error) -> Self {
        Self::Store(error.into())
    }
}

/// What a rebalance did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rebalanced {
    pub deal_id: String,
    pub buckets_before: i32,
    pub buckets_after: i32,
    /// Units that changed bucket.
    pub units_moved: i64,
    /// Available units of every row after the rebalance, by bucket.
    pub available: Vec<(i32, i64)>,
}

/// Spreads `deal_id`'s available units over `buckets` buckets; see the module docs.
pub async fn rebalance(
    pool: &PgPool,
    deal_id: &str,
    buckets: i32,
) -> Result<Rebalanced, RebalanceError> {
    if !(1..=BUCKETS_MAX).contains(&buckets) {
        return Err(RebalanceError::InvalidCount);
    }
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('flashgate.rebalance'), hashtext($1))")
        .bind(deal_id)
        .execute(&mut *tx)
        .await?;
    let before: Option<i32> = sqlx::query_scalar("SELECT bucket_count FROM deals WHERE id = $1")
        .bind(deal_id)
        .fetch_optional(&mut *tx)
        .await?;
    let buckets_before = before.ok_or(RebalanceError::NotFound)?;
    let rows = inventory::lock_for_rebalance(&mut tx, deal_id, buckets).await?;
    let targets = plan(&rows, buckets);
    inventory::set_available(&mut tx, deal_id, &targets).await?;
    deals::set_bucket_count(&mut tx, deal_id, buckets).await?;
    tx.commit().await?;
    Ok(Rebalanced {
        deal_id: deal_id.to_owned(),
        buckets_before,
        buckets_after: buckets,
        units_moved: units_moved(&rows, &targets),
        available: targets,
    })
}

/// The available units each row should hold: all of them spread evenly over buckets
/// `0..buckets`, none on rows at or above `buckets`.
fn plan(rows: &[(i32, i64)], buckets: i32) -> Vec<(i32, i64)> {
    let total: i64 = rows.iter().map(|(_, available)| available).sum();
    let split = split_evenly(total, buckets);
    let targets: Vec<(i32, i64)> = rows
        .iter()
        .map(|&(bucket, _)| {
            let target = usize::try_from(bucket)
                .ok()
                .and_then(|b| split.get(b))
                .copied();
            (bucket, target.unwrap_or(0))
        })
        .collect();
    assert_eq!(
        targets.iter().map(|(_, a)| a).sum::<i64>(),
        total,
        "a rebalance neither loses nor creates a unit"
    );
    targets
}

fn units_moved(rows: &[(i32, i64)], targets: &[(i32, i64)]) -> i64 {
    rows.iter()
        .zip(targets)
        .map(|((_, before), (_, after))| (after - before).max(0))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growing_spreads_available_over_the_new_count() {
        let rows: Vec<(i32, i64)> = (0..8).map(|b| (b, 4)).collect::<Vec<_>>();
        let mut with_new = rows.clone();
        with_new.extend((8..32).map(|b| (b, 0)));
        let targets = plan(&with_new, 32);
        assert_eq!(targets.len(), 32);
        assert!(targets.iter().all(|(_, a)| *a == 1));
        assert_eq!(units_moved(&with_new, &targets), 24);
    }

    #[test]
    fn shrinking_drains_the_rows_above_the_count() {
        let rows: Vec<(i32, i64)> = (0..32).map(|b| (b, i64::from(b % 3))).collect();
        let targets = plan(&rows, 8);
        assert!(targets[8..].iter().all(|(_, a)| *a == 0));
        let kept: Vec<i64> = targets[..8].iter().map(|(_, a)| *a).collect();
        assert!(kept.iter().max().unwrap() - kept.iter().min().unwrap() <= 1);
    }

    proptest::proptest! {
        #[test]
        fn no_unit_is_lost_or_created(
            sizes in proptest::collection::vec(0i64..50, 1..40),
            buckets in 1i32..64,
        ) {
            let rows: Vec<(i32, i64)> = sizes.iter().enumerate().map(|(b, a)| (b as i32, *a)).collect();
            let mut all = rows.clone();
            all.extend((rows.len() as i32..buckets).map(|b| (b, 0)));
            let targets = plan(&all, buckets);
            proptest::prop_assert_eq!(targets.iter().map(|t| t.1).sum::<i64>(), sizes.iter().sum::<i64>());
            proptest::prop_assert!(targets.iter().all(|&(b, a)| a >= 0 && (b < buckets || a == 0)));
        }
    }
}
