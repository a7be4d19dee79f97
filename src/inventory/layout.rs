//! The bucket rows themselves: creating them with a deal, and the locked reads and writes
//! a rebalance is made of (the rebalance plan lives with the operations that run it).

use sqlx::PgConnection;

use crate::store::StoreError;

/// Splits `units` over `buckets` rows as evenly as possible (the first rows get the remainder).
pub fn split_evenly(units: i64, buckets: i32) -> Vec<i64> {
    assert!(units >= 0 && buckets >= 1);
    let n = i64::from(buckets);
    (0..n)
        .map(|b| units / n + i64::from(b < units % n))
        .collect()
}

/// Creates a new deal's buckets `0..split.len()` holding `split` available units each.
pub async fn create_buckets(
    tx: &mut PgConnection,
    deal_id: &str,
    split: &[i64],
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO inventory_buckets (deal_id, bucket, available)
         SELECT $1, b - 1, units FROM unnest($2::bigint[]) WITH ORDINALITY AS t(units, b)",
    )
    .bind(deal_id)
    .bind(split)
    .execute(tx)
    .await?;
    Ok(())
}

/// Locks every bucket of the deal in ascending order, adds the missing ones below
/// `buckets`, and returns every row's (bucket, available).
pub async fn lock_for_rebalance(
    tx: &mut PgConnection,
    deal_id: &str,
    buckets: i32,
) -> Result<Vec<(i32, i64)>, StoreError> {
    sqlx::query(
        "SELECT bucket FROM inventory_buckets WHERE deal_id = $1 ORDER BY bucket FOR NO KEY UPDATE",
    )
    .bind(deal_id)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "INSERT INTO inventory_buckets (deal_id, bucket, available)
         SELECT $1, b, 0 FROM generate_series(0, $2 - 1) AS b
         ON CONFLICT (deal_id, bucket) DO NOTHING",
    )
    .bind(deal_id)
    .bind(buckets)
    .execute(&mut *tx)
    .await?;
    Ok(sqlx::query_as(
        "SELECT bucket, available FROM inventory_buckets WHERE deal_id = $1 ORDER BY bucket",
    )
    .bind(deal_id)
    .fetch_all(&mut *tx)
    .await?)
}

/// Sets the available units of rows locked by [`lock_for_rebalance`] to `targets`.
pub async fn set_available(
    tx: &mut PgConnection,
    deal_id: &str,
    targets: &[(i32, i64)],
) -> Result<(), StoreError> {
    let (ids, available): (Vec<i32>, Vec<i64>) = targets.iter().copied().unzip();
    let updated = sqlx::query(
        "UPDATE inventory_buckets b SET available = t.available
           FROM unnest($2::int[], $3::bigint[]) AS t(bucket, available)
          WHERE b.deal_id = $1 AND b.bucket = t.bucket",
    )
    .bind(deal_id)
    .bind(&ids)
    .bind(&available)
    .execute(&mut *tx)
    .await?;
    assert_eq!(updated.rows_affected() as usize, targets.len());
    Ok(())
}
