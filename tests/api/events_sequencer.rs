//! The sequencer against a real database: a writer that commits after others is positioned
//! after them and never missed, a set larger than a round is taken over several rounds with
//! dense positions, and the retention deletes only positioned events, with their positions.

use flashgate::events::{feed, sequencer};
use sqlx::{PgPool, Postgres, Transaction};

use crate::helpers::TestDb;

/// Writes one order event, as an order's change would, inside `tx`; returns its id.
async fn write_event(tx: &mut Transaction<'_, Postgres>, order: u128, sequence: i32) -> i64 {
    sqlx::query_scalar(
        "INSERT INTO events (type, order_id, deal_id, sequence, status, user_id, quantity)
         VALUES ('order.reserved', $1, 'deal', $2, 'PENDING_PAYMENT', 'buyer', 1)
         RETURNING id",
    )
    .bind(uuid::Uuid::from_u128(order))
    .bind(sequence)
    .fetch_one(&mut **tx)
    .await
    .unwrap()
}

async fn committed_event(db: &PgPool, order: u128, sequence: i32) -> i64 {
    let mut tx = db.begin().await.unwrap();
    let id = write_event(&mut tx, order, sequence).await;
    tx.commit().await.unwrap();
    id
}

/// A fresh database with the events' deal in stock, so no event sells it out.
async fn database() -> (TestDb, PgPool) {
    let test_db = TestDb::create().await;
    let db = test_db.connect(4).await;
    sqlx::query(
        "INSERT INTO deals (id, name, stock_total, bucket_count, unit_price_minor, currency,
                            per_user_limit, reservation_ttl_seconds)
         VALUES ('deal', 'Deal', 1000, 1, 100, 'EUR', 1, 60)",
    )
    .execute(&db)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO inventory_buckets (deal_id, bucket, available) VALUES ('deal', 0, 1000)",
    )
    .execute(&db)
    .await
    .unwrap();
    (test_db, db)
}

/// The feed's order events in position order, and whether the positions of all its events
/// are 1, 2, 3...
async fn feed_ids(db: &PgPool) -> (Vec<i64>, bool) {
    let rows: Vec<(i64, i64, bool)> = sqlx::query_as(
        "SELECT p.position, p.event_id, e.order_id IS NOT NULL
           FROM event_positions p JOIN events e ON e.id = p.event_id ORDER BY p.position",
    )
    .fetch_all(db)
    .await
    .unwrap();
    let dense = rows
        .iter()
        .zip(1..)
        .all(|((position, ..), n)| *position == n);
    let orders = rows.into_iter().filter(|row| row.2).map(|row| row.1);
    (orders.collect(), dense)
}

#[tokio::test]
async fn a_writer_committing_after_others_is_positioned_after_them_and_never_missed() {
    // Arrange: a writer takes the lower id and stays open while a second one commits.
    let (test_db, db) = database().await;
    let mut late = db.begin().await.unwrap();
    let late_id = write_event(&mut late, 1, 1).await;
    let early_id = committed_event(&db, 2, 1).await;
    assert!(late_id < early_id);

    // Act: a round while the first is open, then one after it commits.
    let first = sequencer::round(&db, 100).await.unwrap();
    late.commit().await.unwrap();
    let second = sequencer::round(&db, 100).await.unwrap();
    let third = sequencer::round(&db, 100).await.unwrap();

    // Assert: the committed one first, the late one next, nothing twice.
    assert_eq!((first, second, third), (1, 1, 0));
    assert_eq!(feed_ids(&db).await, (vec![early_id, late_id], true));
    db.close().await;
    test_db.drop_database().await;
}

#[tokio::test]
async fn a_set_larger_than_a_round_is_taken_over_several_in_id_order() {
    // Arrange: 25 committed events, and a writer open across the rounds.
    let (test_db, db) = database().await;
    let mut open = db.begin().await.unwrap();
    let open_id = write_event(&mut open, 100, 1).await;
    let mut ids = Vec::new();
    for order in 0..25 {
        ids.push(committed_event(&db, order, 1).await);
    }

    // Act: rounds of ten; events written while the set is taken wait for the next set.
    let mut taken = vec![sequencer::round(&db, 10).await.unwrap()];
    let during = committed_event(&db, 200, 1).await;
    open.commit().await.unwrap();
    for _ in 0..4 {
        taken.push(sequencer::round(&db, 10).await.unwrap());
    }

    // Assert: 10, 10, 5, then the two that committed during the set, in id order.
    assert_eq!(taken, vec![10, 10, 5, 2, 0]);
    ids.extend([open_id, during]);
    ids[25..].sort_unstable();
    assert_eq!(feed_ids(&db).await, (ids, true));
    db.close().await;
    test_db.drop_database().await;
}

#[tokio::test]
async fn the_retention_deletes_old_positioned_events_with_their_positions_and_keeps_the_last() {
    // Arrange: an order with two old events, positioned, and an old one still waiting.
    let (test_db, db) = database().await;
    let first = committed_event(&db, 1, 1).await;
    let last = committed_event(&db, 1, 2).await;
    sequencer::round(&db, 100).await.unwrap();
    let mut waiting = db.begin().await.unwrap();
    let unpositioned = write_event(&mut waiting, 2, 1).await;
    write_event(&mut waiting, 2, 2).await;
    waiting.commit().await.unwrap();
    sqlx::query("UPDATE events SET occurred_at = now() - interval '3 hours'")
        .execute(&db)
        .await
        .unwrap();

    // Act
    let deleted = feed::expire(&db, 1, 100).await.unwrap();

    // Assert: only the positioned order's older event went, and its position with it.
    assert_eq!(deleted, 1);
    let kept: Vec<i64> = sqlx::query_scalar("SELECT id FROM events ORDER BY id")
        .fetch_all(&db)
        .await
        .unwrap();
    assert!(!kept.contains(&first) && kept.contains(&last) && kept.contains(&unpositioned));
    assert_eq!(feed_ids(&db).await.0, vec![last]);
    db.close().await;
    test_db.drop_database().await;
}
