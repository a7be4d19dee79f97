//! Where a reservation is kept: an order that took a single bucket keeps it in its own row
//! (no reservation line), one spread over several buckets has a line per bucket, and giving
//! the units back clears the row's bucket exactly once.

use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

use crate::helpers::{available_by_bucket, new_deal, order_holdings, spawn_app};

/// The bucket kept in the order's row and the number of its reservation lines.
async fn kept(db: &PgPool, order_id: &str) -> (Option<i32>, i64) {
    let id: Uuid = order_id.parse().expect("order_id is a UUID");
    sqlx::query_as(
        "SELECT o.bucket, (SELECT count(*) FROM reservation_lines l WHERE l.order_id = o.id)
           FROM orders o WHERE o.id = $1",
    )
    .bind(id)
    .fetch_one(db)
    .await
    .expect("read the order's reservation")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_single_bucket_order_keeps_its_reservation_in_its_row_until_cancelled() {
    // Arrange
    let app = spawn_app().await;
    let mut deal = new_deal("fold1", 20, 4);
    deal["per_user_limit"] = json!(2);
    let id = app.given_deal(&deal).await;
    let before = available_by_bucket(&app.db, &id).await;
    let token = app.token("alice");

    // Act
    let order = app.place_order(&token, &id, "k1", 2).await.expect(201);
    let order_id = order["order_id"].as_str().unwrap();

    // Assert: the row names the bucket that was decremented, and no line was written.
    let (bucket, lines) = kept(&app.db, order_id).await;
    let bucket = bucket.expect("a two-unit order fits in one five-unit bucket");
    assert_eq!(lines, 0, "no reservation line for a folded reservation");
    let during = available_by_bucket(&app.db, &id).await;
    assert_eq!(during[&bucket], before[&bucket] - 2);
    assert_eq!(
        order_holdings(&app.db, order_id).await,
        [(bucket, 2)].into_iter().collect()
    );
    app.assert_invariants(&id).await;

    // Act: cancel, then cancel again.
    app.cancel_order(&token, order_id).await.expect(200);
    let again = app.cancel_order(&token, order_id).await;
    assert_eq!(again.status, 409, "{}", again.text);

    // Assert: the units went back once and the row no longer holds them.
    assert_eq!(kept(&app.db, order_id).await, (None, 0));
    assert_eq!(available_by_bucket(&app.db, &id).await, before);
    app.assert_invariants(&id).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_order_spread_over_buckets_keeps_a_line_per_bucket() {
    // Arrange: one unit in each of three buckets.
    let app = spawn_app().await;
    let mut deal = new_deal("fold2", 3, 3);
    deal["per_user_limit"] = json!(3);
    let id = app.given_deal(&deal).await;

    // Act
    let order = app.order("alice", &id, 3).await.expect(201);
    let order_id = order["order_id"].as_str().unwrap();

    // Assert
    assert_eq!(kept(&app.db, order_id).await, (None, 3));
    assert_eq!(
        order_holdings(&app.db, order_id).await,
        [(0, 1), (1, 1), (2, 1)].into_iter().collect()
    );
    app.assert_invariants(&id).await;
    app.cleanup().await;
}
