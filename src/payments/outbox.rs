//! The transactional outbox: side effects recorded in the same transaction as the state
//! change that causes them, then carried out at least once by a worker.
//!
//! Entries are claimed with `FOR UPDATE SKIP LOCKED` and a lease, so several instances
//! share the work and an entry whose worker died is picked up again. Every consumer is
//! idempotent (refunds carry a stable key, captures and voids are idempotent at the
//! provider), which is what makes "at least once" safe.

use serde_json::Value;
use sqlx::{PgConnection, PgPool};

use crate::store::{StoreError, Writes};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Tell the shop an order is paid (delivered to the log; a shop hook would go here).
    OrderPaid,
    Refund,
    Capture,
    Void,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::OrderPaid => "order_paid",
            Kind::Refund => "refund",
            Kind::Capture => "capture",
            Kind::Void => "void",
        }
    }

    fn parse(raw: &str) -> Option<Self> {
        [Kind::OrderPaid, Kind::Refund, Kind::Capture, Kind::Void]
            .into_iter()
            .find(|k| k.as_str() == raw)
    }
}

/// Records a side effect; the same `dedupe_key` is recorded once.
pub async fn enqueue(
    tx: &mut PgConnection,
    kind: Kind,
    dedupe_key: &str,
    payload: Value,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO outbox (kind, dedupe_key, payload) VALUES ($1, $2, $3)
         ON CONFLICT (dedupe_key) DO NOTHING",
    )
    .bind(kind.as_str())
    .bind(dedupe_key)
    .bind(payload)
    .execute(tx)
    .await?;
    Ok(())
}

/// A claimed entry.
#[derive(Debug)]
pub struct Entry {
    pub id: i64,
    pub kind: Kind,
    pub payload: Value,
    pub attempts: i32,
}

/// Claims up to `batch_max` due entries for `lease_seconds`; the lease is committed before
/// any entry is carried out, so no other worker takes them meanwhile.
pub async fn claim(
    pool: &PgPool,
    writes: Writes,
    batch_max: u32,
    lease_seconds: u32,
) -> Result<Vec<Entry>, StoreError> {
    let mut conn = writes.acquire(pool).await?;
    let rows: Vec<(i64, String, Value, i32)> = sqlx::query_as(
        "UPDATE outbox SET available_at = now() + make_interval(secs => $2), attempts = attempts + 1
          WHERE id IN (SELECT id FROM outbox WHERE done_at IS NULL AND available_at <= now()
                        ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED)
         RETURNING id, kind, payload, attempts",
    )
    .bind(i64::from(batch_max))
    .bind(f64::from(lease_seconds))
    .fetch_all(&mut *conn)
    .await?;
    conn.commit().await?;
    Ok(rows
        .into_iter()
        .filter_map(|(id, kind, payload, attempts)| {
            Some(Entry {
                id,
                kind: Kind::parse(&kind)?,
                payload,
                attempts,
            })
        })
        .collect())
}

pub async fn done(pool: &PgPool, writes: Writes, id: i64) -> Result<(), StoreError> {
    let mut conn = writes.acquire(pool).await?;
    sqlx::query("UPDATE outbox SET done_at = now(), last_error = NULL WHERE id = $1")
        .bind(id)
        .execute(&mut *conn)
        .await?;
    conn.commit().await
}

/// Leaves the entry for a later try, backing off with the number of attempts.
pub async fn retry_later(
    pool: &PgPool,
    writes: Writes,
    id: i64,
    error: &str,
) -> Result<(), StoreError> {
    let mut conn = writes.acquire(pool).await?;
    sqlx::query(
        "UPDATE outbox SET last_error = $2,
                available_at = now() + make_interval(secs => LEAST(60, power(2, LEAST(attempts, 6)))::float8)
          WHERE id = $1",
    )
    .bind(id)
    .bind(error)
    .execute(&mut *conn)
    .await?;
    conn.commit().await
}

/// How long the oldest entry not yet carried out has waited, in seconds; 0 when none.
pub async fn oldest_seconds(pool: &PgPool) -> Result<f64, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT COALESCE(EXTRACT(EPOCH FROM now() - min(created_at))::float8, 0)
           FROM outbox WHERE done_at IS NULL",
    )
    .fetch_one(pool)
    .await?)
}

/// Entries not yet carried out.
pub async fn backlog(pool: &PgPool) -> Result<i64, StoreError> {
    Ok(
        sqlx::query_scalar("SELECT count(*) FROM outbox WHERE done_at IS NULL")
            .fetch_one(pool)
            .await?,
    )
}
