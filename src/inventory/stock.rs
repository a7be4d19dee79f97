//! Administrative stock changes, through the same constraints as reservations: units are
//! added to or removed from `available` only, never from reserved or sold units.

use sqlx::PgConnection;

use super::split_evenly;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum StockError {
    #[error("deal not found")]
    NotFound,
    #[error("cannot remove {requested} units: only {available} are available")]
    NotEnoughAvailable { requested: i64, available: i64 },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Adds (`delta > 0`) or removes (`delta < 0`) available units, spread over the buckets,
/// in the caller's transaction (which also records the deal's new total).
pub async fn adjust(tx: &mut PgConnection, deal_id: &str, delta: i64) -> Result<(), StockError> {
    let buckets: Vec<(i32, i64)> = sqlx::query_as(
        "SELECT bucket, available FROM inventory_buckets
          WHERE deal_id = $1 ORDER BY bucket FOR NO KEY UPDATE",
    )
    .bind(deal_id)
    .fetch_all(&mut *tx)
    .await
    .map_err(StoreError::from)?;
    if buckets.is_empty() {
        return Err(StockError::NotFound);
    }
    let changes = plan(&buckets, delta)?;
    let (ids, deltas): (Vec<i32>, Vec<i64>) = changes.into_iter().unzip();
    sqlx::query(
        "UPDATE inventory_buckets b
            SET available = b.available + t.d, freed = b.freed + greatest(t.d, 0)
           FROM unnest($2::int[], $3::bigint[]) AS t(bucket, d)
          WHERE b.deal_id = $1 AND b.bucket = t.bucket",
    )
    .bind(deal_id)
    .bind(&ids)
    .bind(&deltas)
    .execute(tx)
    .await
    .map_err(StoreError::from)?;
    Ok(())
}

/// Per-bucket changes for `delta`: additions spread evenly, removals from the fullest buckets.
fn plan(buckets: &[(i32, i64)], delta: i64) -> Result<Vec<(i32, i64)>, StockError> {
    assert!(!buckets.is_empty());
    if delta >= 0 {
        let count = i32::try_from(buckets.len()).unwrap_or(i32::MAX);
        let split = split_evenly(delta, count);
        return Ok(buckets
            .iter()
            .zip(split)
            .map(|((b, _), d)| (*b, d))
            .collect());
    }
    let available: i64 = buckets.iter().map(|(_, a)| a).sum();
    let requested = delta.unsigned_abs().min(i64::MAX as u64) as i64;
    if requested > available {
        return Err(StockError::NotEnoughAvailable {
            requested,
            available,
        });
    }
    let after = level_down(buckets, requested);
    Ok(buckets
        .iter()
        .zip(after)
        .map(|((b, before), after)| (*b, after - before))
        .collect())
}

/// Lowers the fullest buckets to a common level until `requested` units are removed.
fn level_down(buckets: &[(i32, i64)], requested: i64) -> Vec<i64> {
    let removed_at = |level: i64| -> i64 { buckets.iter().map(|(_, a)| (a - level).max(0)).sum() };
    let (mut low, mut high) = (0, buckets.iter().map(|(_, a)| *a).max().unwrap_or(0));
    while low < high {
        let mid = low + (high - low) / 2;
        if removed_at(mid) <= requested {
            high = mid
        } else {
            low = mid + 1
        }
    }
    let mut after: Vec<i64> = buckets.iter().map(|(_, a)| (*a).min(low)).collect();
    let mut remaining = requested - removed_at(low);
    for level in after.iter_mut().filter(|a| **a == low && low > 0) {
        if remaining == 0 {
            break;
        }
        *level -= 1;
        remaining -= 1;
    }
    assert_eq!(
        remaining, 0,
        "the level search leaves less than one unit per bucket"
    );
    after
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removals_level_the_fullest_buckets() {
        let changes = plan(&[(0, 5), (1, 1), (2, 3)], -4).unwrap();
        assert_eq!(changes, vec![(0, -3), (1, 0), (2, -1)]);
    }

    #[test]
    fn cannot_remove_more_than_available() {
        assert!(matches!(
            plan(&[(0, 1), (1, 1)], -3),
            Err(StockError::NotEnoughAvailable {
                requested: 3,
                available: 2
            })
        ));
    }

    #[test]
    fn additions_are_spread() {
        assert_eq!(plan(&[(0, 0), (1, 9)], 3).unwrap(), vec![(0, 2), (1, 1)]);
    }
}
