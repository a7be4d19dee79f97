//! The sequencer: gives committed events their feed position, in the order it first sees
//! them committed, under an advisory lock so one sequencer runs at a time.
//!
//! Ids are taken when a row is written, so a transaction holding a lower id may commit after
//! one holding a higher id; a reader following ids would step past it for good. Positions
//! are given only to rows already committed (nothing uncommitted is visible here), each
//! above every position given before, so a reader following positions never misses one.
//! Two changes of one order are serialised by its row lock: the later one writes its event
//! after the earlier committed, with the higher id, and a set that holds it holds the
//! earlier too (or an earlier set did); rows are positioned in id order, so an order's
//! events keep their sequence.
//!
//! Which events wait is told by snapshots, not by a mark on each row: every event carries
//! the id of the transaction that wrote it, and `event_sequencer.done` is a snapshot in
//! which every visible writer's events have their positions. A round takes the snapshot it
//! runs in as `seen` and positions the events whose writer is visible in `seen` but not in
//! `done`: those in `done`'s in-progress list or at or above its `xmax`, found through the
//! index on the writer. Then `seen` becomes `done`. A set larger than `batch_max` is taken
//! over several rounds in id order, each going on after the last id it positioned; no
//! event row is written again, and a position is one narrow row in `event_positions`.
//!
//! Deal events are numbered here, as they are positioned. `deal.sold_out` and
//! `deal.reopened` are written here too: a round reads, in one snapshot, the events it
//! positions and the deals' available units, walks the units back to before the round by
//! each order event's effect (an order holds its units while `PENDING_PAYMENT` or `PAID`),
//! then forward again, and announces every crossing of zero right after the order event
//! that caused it. They are positioned by the round that writes them, so the sets leave
//! them out.

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
    // Index lookups whatever the statistics say: a set is a handful of the events kept.
    sqlx::raw_sql(
        "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ;
         SET LOCAL enable_seqscan = off; SET LOCAL enable_hashjoin = off;
         SET LOCAL enable_mergejoin = off; SET LOCAL jit = off",
    )
    .execute(&mut *tx)
    .await?;
    let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1)")
        .bind(LOCK_KEY)
        .fetch_one(&mut *tx)
        .await?;
    if !locked {
        return Ok(0);
    }
    let set = Set::read(&mut tx).await?;
    let pending = read_pending(&mut tx, &set, batch_max).await?;
    if pending.is_empty() {
        if set.resume_after.is_some() {
            set.advance(&mut tx, None).await?;
            tx.commit().await?;
        }
        return Ok(0);
    }
    let mut deals = start_walks(&mut tx, &pending).await?;
    let placed = place(&pending, &mut deals);
    let top: i64 = sqlx::query_scalar("SELECT coalesce(max(position), 0) FROM event_positions")
        .fetch_one(&mut *tx)
        .await?;
    write(&mut tx, top, &placed).await?;
    let full = i64::try_from(pending.len()).is_ok_and(|n| n >= batch_max);
    set.advance(&mut tx, full.then(|| pending[pending.len() - 1].id))
        .await?;
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

/// A new set's events: those of the writers `done` ($1) saw in progress, and of the writers
/// that began at or after its end. Read in the snapshot the set is bounded by, which hides
/// the writers still in progress and those that began after it. Two lookups of the index on
/// the writer, kept apart from the ordering by id, so that no plan walks the events already
/// positioned.
const NEW_SET: &str = "(SELECT * FROM events e
                         WHERE e.xact >= pg_snapshot_xmax($1::pg_snapshot)
                        UNION ALL
                        SELECT * FROM events e
                         WHERE e.xact = ANY(ARRAY(SELECT pg_snapshot_xip($1::pg_snapshot))))";

/// The rest of a set taken over several rounds, read in a later snapshot: ids after the
/// last one positioned ($3) up to the set's highest ($4), in id order, whose writers are
/// visible in `seen` ($2) and not in `done` ($1), each snapshot read once.
const REST_OF_SET: &str = "(SELECT * FROM events e
                             WHERE e.id > $3 AND e.id <= $4
                               AND pg_visible_in_snapshot(e.xact, (SELECT $2::pg_snapshot))
                               AND NOT pg_visible_in_snapshot(e.xact, (SELECT $1::pg_snapshot)))";

/// The sequencer's own announcements are positioned by the round that writes them.
const NOT_ANNOUNCED_HERE: &str = "type NOT IN ('deal.sold_out', 'deal.reopened')";

/// Where the sequencer stands: the snapshot every positioned writer is visible in, and the
/// set of writers this round takes from.
struct Set {
    done: String,
    /// The set's bound: the round's own snapshot for a new set.
    seen: String,
    /// The last id positioned, when the set is taken over several rounds.
    resume_after: Option<i64>,
    /// The set's highest id, when it is taken over several rounds.
    last_id: Option<i64>,
}

impl Set {
    async fn read(tx: &mut Transaction<'_, Postgres>) -> Result<Set, StoreError> {
        let row = sqlx::query(
            "SELECT done::text AS done, coalesce(seen, pg_current_snapshot())::text AS seen,
                    resume_after, last_id
               FROM event_sequencer",
        )
        .fetch_one(&mut **tx)
        .await?;
        Ok(Set {
            done: row.get("done"),
            seen: row.get("seen"),
            resume_after: row.get("resume_after"),
            last_id: row.get("last_id"),
        })
    }

    /// Records the round: the set goes on after `resume_after` (a full round), or it is
    /// done and its bound becomes `done`.
    async fn advance(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        resume_after: Option<i64>,
    ) -> Result<(), StoreError> {
        let Some(resume_after) = resume_after else {
            sqlx::query(
                "UPDATE event_sequencer
                    SET done = $1::pg_snapshot, seen = NULL, resume_after = NULL, last_id = NULL",
            )
            .bind(&self.seen)
            .execute(&mut **tx)
            .await?;
            return Ok(());
        };
        let last_id = match self.last_id {
            Some(id) => id,
            None => {
                sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                    "WITH s AS MATERIALIZED {NEW_SET}
                     SELECT coalesce(max(s.id), 0) FROM s WHERE s.{NOT_ANNOUNCED_HERE}"
                )))
                .bind(&self.done)
                .bind(&self.seen)
                .fetch_one(&mut **tx)
                .await?
            }
        };
        sqlx::query(
            "UPDATE event_sequencer SET seen = $1::pg_snapshot, resume_after = $2, last_id = $3",
        )
        .bind(&self.seen)
        .bind(resume_after)
        .bind(last_id)
        .execute(&mut **tx)
        .await?;
        Ok(())
    }
}

/// The set's next committed events without a position, oldest id first, with each order
/// event's status before it (its previous event's).
async fn read_pending(
    tx: &mut Transaction<'_, Postgres>,
    set: &Set,
    batch_max: i64,
) -> Result<Vec<Pending>, StoreError> {
    // A new set is gathered whole through the index on the writer, then ordered; the rest
    // of a set is read along the ids, where the limit stops the scan.
    let (with, from) = if set.resume_after.is_some() {
        (String::new(), REST_OF_SET)
    } else {
        (format!("WITH s AS MATERIALIZED {NEW_SET}"), "s")
    };
    let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
        "{with}
         SELECT e.id, e.type, e.deal_id, e.order_id IS NOT NULL AS of_order, e.status,
                e.quantity,
                CASE WHEN e.sequence > 1 THEN
                    (SELECT p.status FROM events p
                      WHERE p.order_id = e.order_id AND p.sequence = e.sequence - 1)
                END AS previous
           FROM (SELECT * FROM {from} s WHERE s.{NOT_ANNOUNCED_HERE} ORDER BY s.id LIMIT $5) e
          ORDER BY e.id"
    )))
    .bind(&set.done)
    .bind(&set.seen)
    .bind(set.resume_after.unwrap_or(0))
    .bind(set.last_id.unwrap_or(i64::MAX))
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

/// Writes the new deal events and numbers the round's deal events, then gives the
/// positions after `top` in `placed`'s order.
async fn write(
    tx: &mut Transaction<'_, Postgres>,
    top: i64,
    placed: &[Placed],
) -> Result<(), StoreError> {
    let mut ids = Vec::with_capacity(placed.len());
    let (mut numbered, mut sequences) = (Vec::new(), Vec::new());
    for row in placed {
        match row {
            Placed::Existing { id, sequence } => {
                ids.push(*id);
                if let Some(sequence) = sequence {
                    numbered.push(*id);
                    sequences.push(*sequence);
                }
            }
            Placed::New {
                kind,
                deal,
                sequence,
                paused,
                available,
            } => {
                let id: i64 = sqlx::query_scalar(
                    "INSERT INTO events (type, deal_id, sequence, paused, available)
                     VALUES ($1, $2, $3, $4, $5) RETURNING id",
                )
                .bind(kind)
                .bind(deal)
                .bind(sequence)
                .bind(paused)
                .bind(available)
                .fetch_one(&mut **tx)
                .await?;
                ids.push(id);
            }
        }
    }
    if !numbered.is_empty() {
        sqlx::query(
            "UPDATE events e SET sequence = x.sequence
               FROM unnest($1::bigint[], $2::int[]) AS x(id, sequence)
              WHERE e.id = x.id",
        )
        .bind(&numbered)
        .bind(&sequences)
        .execute(&mut **tx)
        .await?;
    }
    sqlx::query(
        "INSERT INTO event_positions (position, event_id)
         SELECT $1 + x.n, x.id FROM unnest($2::bigint[]) WITH ORDINALITY AS x(id, n)",
    )
    .bind(top)
    .bind(&ids)
    .execute(&mut **tx)
    .await?;
    Ok(())
}
