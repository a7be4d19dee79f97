//! The sequencer: gives committed events their feed position, in the order it first sees
//! them committed, under an advisory lock so one sequencer runs at a time.
//!
//! Ids are taken when a row is written, so a transaction holding a lower id may commit after
//! one holding a higher id; a reader following ids would step past it for good. Positions
//! are given only to rows already committed (nothing uncommitted is visible here), each
//! above every position given before, so a reader following positions never misses one.
//! Two changes of one order are serialised by its row lock: the later one writes its event
//! after the earlier committed, with the higher id, and a round that sees it sees the
//! earlier too; rows are positioned in id order, so an order's events keep their sequence.
//!
//! The sequencer also announces a deal's stock running out or coming back: after each
//! round, the deals of the orders it positioned are compared with what was last announced.

use std::collections::BTreeSet;

use sqlx::{Postgres, Row, Transaction};

use crate::store::StoreError;
use crate::telemetry;

/// The advisory lock key of the sequencer (and of the deliveries' leadership, see `run`).
pub const LOCK_KEY: i64 = 0x666c_6173_6865_7631;

/// Positions up to `batch_max` committed events; returns how many. Zero when another
/// instance holds the lock.
pub async fn round(pool: &sqlx::PgPool, batch_max: i64) -> Result<usize, StoreError> {
    let mut tx = pool.begin().await?;
    let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1)")
        .bind(LOCK_KEY)
        .fetch_one(&mut *tx)
        .await?;
    if !locked {
        return Ok(0);
    }
    let rows = sqlx::query(
        "WITH base AS (SELECT coalesce(max(position), 0) AS top FROM events
                        WHERE position IS NOT NULL),
              next AS (SELECT s.id, row_number() OVER (ORDER BY s.id) AS n
                         FROM (SELECT id FROM events WHERE position IS NULL
                                ORDER BY id LIMIT $1) s)
         UPDATE events e SET position = base.top + next.n
           FROM next, base WHERE e.id = next.id
         RETURNING e.type, e.deal_id, e.order_id IS NOT NULL AS of_order",
    )
    .bind(batch_max)
    .fetch_all(&mut *tx)
    .await?;
    let mut deals = BTreeSet::new();
    for row in &rows {
        let kind: String = row.get("type");
        metrics::counter!(telemetry::EVENTS, "type" => kind).increment(1);
        if row.get::<bool, _>("of_order") {
            deals.insert(row.get::<String, _>("deal_id"));
        }
    }
    for deal in deals {
        announce_stock(&mut tx, &deal).await?;
    }
    tx.commit().await?;
    Ok(rows.len())
}

/// Writes `deal.sold_out` or `deal.reopened` when the deal's available units crossed zero
/// since the last such event (a deal starts as not sold out).
async fn announce_stock(tx: &mut Transaction<'_, Postgres>, deal: &str) -> Result<(), StoreError> {
    // The deal row's lock orders this event's sequence with pause and resume.
    let row = sqlx::query(
        "SELECT (SELECT coalesce(sum(b.available), 0)::bigint FROM inventory_buckets b
                  WHERE b.deal_id = d.id) AS available,
                d.paused,
                coalesce((SELECT e.type = 'deal.sold_out' FROM events e
                           WHERE e.order_id IS NULL AND e.deal_id = d.id
                             AND e.type IN ('deal.sold_out', 'deal.reopened')
                           ORDER BY e.sequence DESC LIMIT 1), false) AS announced_out
           FROM deals d WHERE d.id = $1 FOR NO KEY UPDATE",
    )
    .bind(deal)
    .fetch_optional(&mut **tx)
    .await?;
    let Some(row) = row else { return Ok(()) };
    let available: i64 = row.get("available");
    let kind = match (available == 0, row.get::<bool, _>("announced_out")) {
        (true, false) => "deal.sold_out",
        (false, true) => "deal.reopened",
        _ => return Ok(()),
    };
    sqlx::query(
        "INSERT INTO events (position, type, deal_id, sequence, paused, available)
         SELECT (SELECT coalesce(max(position), 0) FROM events WHERE position IS NOT NULL) + 1,
                $2, $1,
                coalesce((SELECT max(sequence) FROM events
                           WHERE order_id IS NULL AND deal_id = $1), 0) + 1,
                $3, $4",
    )
    .bind(deal)
    .bind(kind)
    .bind(row.get::<bool, _>("paused"))
    .bind(available)
    .execute(&mut **tx)
    .await?;
    metrics::counter!(telemetry::EVENTS, "type" => kind).increment(1);
    Ok(())
}
