//! Returning reserved units to the buckets they came from.
//!
//! The caller has already moved each order out of PENDING_PAYMENT with a conditional update,
//! in the same transaction; that guard is what makes a release happen exactly once.
//!
//! An order's units are in its reservation lines not yet released and, when it took a
//! single bucket at placement, in its own row (`orders.bucket`, read by the caller into
//! [`HeldOrder::bucket`]; the update that releases the order clears it).

use sqlx::PgConnection;
use uuid::Uuid;

use crate::store::StoreError;
use sqlx::Row;
use sqlx::postgres::PgRow;

/// An order whose reservation is being given back.
#[derive(Debug, Clone)]
pub struct HeldOrder {
    pub id: Uuid,
    pub deal_id: String,
    pub user_id: String,
    pub quantity: i32,
    /// The bucket holding the order's units when its reservation is kept in its row.
    pub bucket: Option<i32>,
}

impl<'r> sqlx::FromRow<'r, PgRow> for HeldOrder {
    fn from_row(row: &'r PgRow) -> Result<Self, sqlx::Error> {
        Ok(Self {
            id: row.try_get("id")?,
            deal_id: row.try_get("deal_id")?,
            user_id: row.try_get("user_id")?,
            quantity: row.try_get("quantity")?,
            bucket: row.try_get("bucket")?,
        })
    }
}

/// Moves the reserved units of a paid order to sold, in its buckets (ascending).
pub async fn consume(tx: &mut PgConnection, order: &HeldOrder) -> Result<(), StoreError> {
    sqlx::query(
        "SELECT 1 FROM inventory_buckets
          WHERE (deal_id, bucket) IN (SELECT deal_id, bucket FROM reservation_lines
                                       WHERE order_id = $1 AND released_at IS NULL
                                      UNION ALL SELECT $2::text, $3::int WHERE $3 IS NOT NULL)
          ORDER BY deal_id, bucket FOR NO KEY UPDATE",
    )
    .bind(order.id)
    .bind(&order.deal_id)
    .bind(order.bucket)
    .execute(&mut *tx)
    .await?;
    let sold: i64 = sqlx::query_scalar(
        "WITH held AS (SELECT deal_id, bucket, quantity FROM reservation_lines
                        WHERE order_id = $1 AND released_at IS NULL
                       UNION ALL SELECT $2::text, $3::int, $4::int WHERE $3 IS NOT NULL),
              t AS (SELECT deal_id, bucket, sum(quantity)::bigint AS q FROM held
                     GROUP BY deal_id, bucket),
              u AS (UPDATE inventory_buckets b
                       SET reserved = b.reserved - t.q, sold = b.sold + t.q
                      FROM t WHERE b.deal_id = t.deal_id AND b.bucket = t.bucket
                    RETURNING t.q)
         SELECT COALESCE(sum(q), 0)::bigint FROM u",
    )
    .bind(order.id)
    .bind(&order.deal_id)
    .bind(order.bucket)
    .bind(order.quantity)
    .fetch_one(&mut *tx)
    .await?;
    assert_eq!(
        sold,
        i64::from(order.quantity),
        "a paid order's units all move to sold"
    );
    Ok(())
}

/// Gives back the units of `orders` (already transitioned by the caller) inside `tx`:
/// users' counters first, then buckets, each locked in ascending order.
pub async fn release(tx: &mut PgConnection, orders: &[HeldOrder]) -> Result<(), StoreError> {
    if orders.is_empty() {
        return Ok(());
    }
    let ids: Vec<Uuid> = orders.iter().map(|o| o.id).collect();
    let deals: Vec<&str> = orders.iter().map(|o| o.deal_id.as_str()).collect();
    let users: Vec<&str> = orders.iter().map(|o| o.user_id.as_str()).collect();
    let units: Vec<i32> = orders.iter().map(|o| o.quantity).collect();
    let buckets: Vec<Option<i32>> = orders.iter().map(|o| o.bucket).collect();
    sqlx::query(
        "SELECT 1 FROM user_deal_units
          WHERE (deal_id, user_id) IN (SELECT * FROM unnest($1::text[], $2::text[]))
          ORDER BY deal_id, user_id FOR NO KEY UPDATE",
    )
    .bind(&deals)
    .bind(&users)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "UPDATE user_deal_units u SET units = u.units - t.q
           FROM (SELECT d, usr, sum(q)::int AS q FROM unnest($1::text[], $2::text[], $3::int[]) AS x(d, usr, q)
                  GROUP BY d, usr) t
          WHERE u.deal_id = t.d AND u.user_id = t.usr",
    )
    .bind(&deals)
    .bind(&users)
    .bind(&units)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "SELECT 1 FROM inventory_buckets
          WHERE (deal_id, bucket) IN (SELECT deal_id, bucket FROM reservation_lines
                                       WHERE order_id = ANY($1) AND released_at IS NULL
                                      UNION ALL
                                      SELECT d, b FROM unnest($2::text[], $3::int[]) AS f(d, b)
                                       WHERE b IS NOT NULL)
          ORDER BY deal_id, bucket FOR NO KEY UPDATE",
    )
    .bind(&ids)
    .bind(&deals)
    .bind(&buckets)
    .execute(&mut *tx)
    .await?;
    let returned: i64 = sqlx::query_scalar(
        "WITH l AS (UPDATE reservation_lines SET released_at = now()
                     WHERE order_id = ANY($1) AND released_at IS NULL
                    RETURNING deal_id, bucket, quantity),
              f AS (SELECT d, b, q FROM unnest($2::text[], $3::int[], $4::int[]) AS f(d, b, q)
                     WHERE b IS NOT NULL),
              t AS (SELECT deal_id, bucket, sum(quantity)::bigint AS q
                      FROM (SELECT * FROM l UNION ALL SELECT * FROM f) held
                     GROUP BY deal_id, bucket),
              u AS (UPDATE inventory_buckets b
                       SET available = b.available + t.q, reserved = b.reserved - t.q,
                           freed = b.freed + t.q
                      FROM t WHERE b.deal_id = t.deal_id AND b.bucket = t.bucket
                    RETURNING t.q)
         SELECT COALESCE(sum(q), 0)::bigint FROM u",
    )
    .bind(&ids)
    .bind(&deals)
    .bind(&buckets)
    .bind(&units)
    .fetch_one(&mut *tx)
    .await?;
    assert_eq!(
        returned,
        orders.iter().map(|o| i64::from(o.quantity)).sum::<i64>(),
        "every released unit goes back to a bucket"
    );
    Ok(())
}
