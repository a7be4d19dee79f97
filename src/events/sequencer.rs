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
//! Deal events are numbered here, as they are positioned. `deal.sold_out` and
//! `deal.reopened` are written here too: a round reads, in one snapshot, the events it
//! positions and the deals' available units, walks the units back to before the round by
//! each order event's effect (an order holds its units while `PENDING_PAYMENT` or `PAID`),
//! then forward again, and announces every crossing of zero right after the order event
//! that caused it.

use std::collections::{BTreeMap, BTreeSet};

use sqlx::{Postgres, Row, Transaction};

use crate::domain::OrderStatus;
use crate::store::StoreError;
use crate::telemetry;

/// The advisory lock key of the sequencer.
pub const LOCK_KEY: i64 = 0x666c_6173_6865_7631;

/// One unpositioned event, as the round reads it.
struct Pending {
    id: i64,
    kind: String,
    deal_id: String,
    /// `None` for a deal event.
    order: Option<OrderChange>,
}

/// What an order event did to its deal's available units.
struct OrderChange {
    quantity: i64,
    held_before: bool,
    held_after: bool,
}

impl OrderChange {
    /// Units the change gave back to (positive) or took from (negative) the deal.
    fn freed(&self) -> i64 {
        match (self.held_before, self.held_after) {
            (true, false) => self.quantity,
            (false, true) => -self.quantity,
            _ => 0,
        }
    }
}

/// A deal's state as the round walks it.
struct DealWalk {
    available: i64,
    announced_out: bool,
    paused: bool,
    next_sequence: i32,
}

/// A row the round writes: a position for an existing event (with its deal sequence), or a
/// new deal event.
enum Placed {
    Existing {
        id: i64,
        sequence: Option<i32>,
    },
    New {
        kind: &'static str,
        deal: String,
        sequence: i32,
        paused: bool,
        available: i64,
    },
}

fn holds(status: Option<&str>) -> bool {
    let held = [OrderStatus::PendingPayment, OrderStatus::Paid].map(OrderStatus::as_str);
    status.is_some_and(|s| held.contains(&s))
}

/// Positions up to `batch_max` committed events; returns how many rows entered the feed.
/// Zero when another instance holds the lock.
pub async fn round(pool: &sqlx::PgPool, batch_max: i64) -> Result<usize, StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut *tx)
        .await?;
    let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1)")
        .bind(LOCK_KEY)
        .fetch_one(&mut *tx)
        .await?;
    if !locked {
        return Ok(0);
    }
    let pending = read_pending(&mut tx, batch_max).await?;
    if pending.is_empty() {
        return Ok(0);
    }
    let mut deals = start_walks(&mut tx, &pending).await?;
    let placed = place(&pending, &mut deals);
    let top: i64 = sqlx::query_scalar(
        "SELECT coalesce(max(position), 0) FROM events WHERE position IS NOT NULL",
    )
    .fetch_one(&mut *tx)
    .await?;
    write(&mut tx, top, &placed).await?;
    tx.commit().await?;
    for kind in pending
        .iter()
        .map(|p| p.kind.clone())
        .chain(placed.iter().filter_map(|p| match p {
            Placed::New { kind, .. } => Some((*kind).to_owned()),
            Placed::Existing { .. } => None,
        }))
    {
        metrics::counter!(telemetry::EVENTS, "type" => kind).increment(1);
    }
    Ok(placed.len())
}

/// The committed events without a position, oldest id first, with each order event's
/// status before it (its previous event's).
async fn read_pending(
    tx: &mut Transaction<'_, Postgres>,
    batch_max: i64,
) -> Result<Vec<Pending>, StoreError> {
    let rows = sqlx::query(
        "SELECT e.id, e.type, e.deal_id, e.order_id IS NOT NULL AS of_order, e.status,
                e.quantity, p.status AS previous
           FROM (SELECT * FROM events WHERE position IS NULL ORDER BY id LIMIT $1) e
           LEFT JOIN events p ON p.order_id = e.order_id AND p.sequence = e.sequence - 1
          ORDER BY e.id",
    )
    .bind(batch_max)
    .fetch_all(&mut **tx)
    .await?;
    Ok(rows
        .iter()
        .map(|row| Pending {
            id: row.get("id"),
            kind: row.get("type"),
            deal_id: row.get("deal_id"),
            order: row.get::<bool, _>("of_order").then(|| OrderChange {
                quantity: i64::from(row.get::<Option<i32>, _>("quantity").unwrap_or(0)),
                held_before: holds(row.get::<Option<String>, _>("previous").as_deref()),
                held_after: holds(row.get::<Option<String>, _>("status").as_deref()),
            }),
        })
        .collect())
}

/// Each deal of the round: its available units before the round (now, less what the
/// round's order events did), what was last announced, and its next deal sequence.
async fn start_walks(
    tx: &mut Transaction<'_, Postgres>,
    pending: &[Pending],
) -> Result<BTreeMap<String, DealWalk>, StoreError> {
    let ids: BTreeSet<&str> = pending.iter().map(|p| p.deal_id.as_str()).collect();
    let mut walks = BTreeMap::new();
    for deal in ids {
        let row = sqlx::query(
            "SELECT (SELECT coalesce(sum(b.available), 0)::bigint FROM inventory_buckets b
                      WHERE b.deal_id = $1) AS available,
                    coalesce((SELECT d.paused FROM deals d WHERE d.id = $1), false) AS paused,
                    coalesce((SELECT e.type = 'deal.sold_out' FROM events e
                               WHERE e.order_id IS NULL AND e.deal_id = $1
                                 AND e.type IN ('deal.sold_out', 'deal.reopened')
                                 AND e.sequence IS NOT NULL
                               ORDER BY e.sequence DESC LIMIT 1), false) AS announced_out,
                    coalesce((SELECT max(e.sequence) FROM events e
                               WHERE e.order_id IS NULL AND e.deal_id = $1), 0) + 1 AS next",
        )
        .bind(deal)
        .fetch_one(&mut **tx)
        .await?;
        let freed: i64 = pending
            .iter()
            .filter(|p| p.deal_id == deal)
            .filter_map(|p| p.order.as_ref().map(OrderChange::freed))
            .sum();
        let available: i64 = row.get("available");
        walks.insert(
            deal.to_owned(),
            DealWalk {
                available: available - freed,
                announced_out: row.get("announced_out"),
                paused: row.get("paused"),
                next_sequence: row.get("next"),
            },
        );
    }
    Ok(walks)
}

/// The feed order of the round: each event, and after an order event that took its deal's
/// available units to zero (or back from zero) the deal event announcing it.
fn place(pending: &[Pending], deals: &mut BTreeMap<String, DealWalk>) -> Vec<Placed> {
    let mut placed = Vec::with_capacity(pending.len());
    for event in pending {
        let walk = deals
            .get_mut(&event.deal_id)
            .expect("every deal of the round is walked");
        let Some(change) = &event.order else {
            placed.push(Placed::Existing {
                id: event.id,
                sequence: Some(walk.next_sequence),
            });
            walk.next_sequence += 1;
            continue;
        };
        placed.push(Placed::Existing {
            id: event.id,
            sequence: None,
        });
        walk.available += change.freed();
        let kind = match (walk.available <= 0, walk.announced_out) {
            (true, false) => "deal.sold_out",
            (false, true) => "deal.reopened",
            _ => continue,
        };
        walk.announced_out = !walk.announced_out;
        placed.push(Placed::New {
            kind,
            deal: event.deal_id.clone(),
            sequence: walk.next_sequence,
            paused: walk.paused,
            available: walk.available.max(0),
        });
        walk.next_sequence += 1;
    }
    placed
}

/// Gives the positions after `top` in `placed`'s order, and writes the new deal events.
async fn write(
    tx: &mut Transaction<'_, Postgres>,
    top: i64,
    placed: &[Placed],
) -> Result<(), StoreError> {
    let (mut ids, mut positions, mut sequences) = (Vec::new(), Vec::new(), Vec::new());
    let (mut new_positions, mut kinds, mut deals, mut new_sequences, mut paused, mut available) = (
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
    );
    for (n, row) in placed.iter().enumerate() {
        let position = top + 1 + n as i64;
        match row {
            Placed::Existing { id, sequence } => {
                ids.push(*id);
                positions.push(position);
                sequences.push(*sequence);
            }
            Placed::New {
                kind,
                deal,
                sequence,
                paused: p,
                available: a,
            } => {
                new_positions.push(position);
                kinds.push(*kind);
                deals.push(deal.as_str());
                new_sequences.push(*sequence);
                paused.push(*p);
                available.push(*a);
            }
        }
    }
    sqlx::query(
        "UPDATE events e SET position = x.position, sequence = coalesce(x.sequence, e.sequence)
           FROM unnest($1::bigint[], $2::bigint[], $3::int[]) AS x(id, position, sequence)
          WHERE e.id = x.id",
    )
    .bind(&ids)
    .bind(&positions)
    .bind(&sequences)
    .execute(&mut **tx)
    .await?;
    sqlx::query(
        "INSERT INTO events (position, type, deal_id, sequence, paused, available)
         SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::int[], $5::bool[],
                              $6::bigint[])",
    )
    .bind(&new_positions)
    .bind(&kinds)
    .bind(&deals)
    .bind(&new_sequences)
    .bind(&paused)
    .bind(&available)
    .execute(&mut **tx)
    .await?;
    Ok(())
}
