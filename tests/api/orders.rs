//! Placing and reading orders: the happy path, ownership, per-user limits and sold out.

use chrono::{DateTime, Duration, Utc};
use serde_json::{Value, json};

use crate::helpers::{db_snapshot, new_deal, order_holdings, order_status, spawn_app};

fn timestamp(value: &Value) -> DateTime<Utc> {
    let text = value
        .as_str()
        .unwrap_or_else(|| panic!("timestamp is not a string: {value}"));
    DateTime::parse_from_rfc3339(text)
        .expect("RFC 3339 timestamp")
        .with_timezone(&Utc)
}

#[tokio::test(flavor = "multi_thread")]
async fn order_is_created_pending_with_price_snapshot_and_reserves_units() {
    // Arrange
    let app = spawn_app().await;
    let mut deal = new_deal("o1", 10, 2);
    deal["unit_price_minor"] = json!(1250);
    let id = app.given_deal(&deal).await;

    // Act
    let reply = app.order("alice", &id, 2).await;

    // Assert: the response
    let order = reply.expect(201);
    assert_ne!(
        reply.header("idempotent-replayed"),
        Some("true"),
        "a first request is no replay"
    );
    let order_id = order["order_id"].as_str().expect("order_id");
    assert!(
        order_id.parse::<uuid::Uuid>().is_ok(),
        "order_id {order_id:?} is not a UUID"
    );
    assert_eq!(order["deal_id"], "o1");
    assert_eq!(order["status"], "PENDING_PAYMENT");
    assert_eq!(order["quantity"], 2);
    assert_eq!(order["amount_minor"], 2500);
    assert_eq!(order["currency"], "EUR");
    let expires_in = timestamp(&order["expires_at"]) - Utc::now();
    assert!(
        expires_in > Duration::seconds(280) && expires_in <= Duration::seconds(310),
        "expires_at should be about reservation_ttl_seconds (300 s) away, is {expires_in}"
    );
    // Assert: the database
    assert_eq!(order_status(&app.db, order_id).await, "PENDING_PAYMENT");
    assert_eq!(
        order_holdings(&app.db, order_id)
            .await
            .values()
            .sum::<i64>(),
        2
    );
    let inventory = app.inventory(&id).await;
    assert_eq!(
        (
            inventory["available"].as_i64(),
            inventory["reserved"].as_i64()
        ),
        (Some(8), Some(2))
    );
    app.assert_invariants(&id).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn order_is_visible_to_its_owner_only() {
    let app = spawn_app().await;
    let id = app.given_deal(&new_deal("o2", 10, 2)).await;
    let created = app.order("alice", &id, 1).await.expect(201);
    let order_id = created["order_id"].as_str().unwrap();

    let own = app.get_order(&app.token("alice"), order_id).await;
    let foreign = app.get_order(&app.token("bob"), order_id).await;
    let unknown = app
        .get_order(&app.token("alice"), &uuid::Uuid::now_v7().to_string())
        .await;
    let malformed = app.get_order(&app.token("alice"), "not-a-uuid").await;
    let anonymous =
        crate::helpers::send(app.client.get(app.url(&format!("/v1/orders/{order_id}")))).await;

    let own = own.expect(200);
    for field in [
        "order_id",
        "deal_id",
        "status",
        "quantity",
        "amount_minor",
        "currency",
    ] {
        assert_eq!(
            own[field], created[field],
            "{field} differs between create and read"
        );
    }
    assert_eq!(
        timestamp(&own["expires_at"]),
        timestamp(&created["expires_at"])
    );
    let created_at = timestamp(&own["created_at"]);
    assert!(
        (Utc::now() - created_at).num_seconds().abs() < 60,
        "created_at {created_at}"
    );
    foreign.expect_problem(404, "not-found");
    unknown.expect_problem(404, "not-found");
    malformed.expect_problem(404, "not-found");
    anonymous.expect_problem(401, "unauthorized");
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn per_user_limit_counts_units_across_orders() {
    // Arrange: three units per user.
    let app = spawn_app().await;
    let mut deal = new_deal("o3", 100, 4);
    deal["per_user_limit"] = json!(3);
    let id = app.given_deal(&deal).await;

    // Act + Assert, step by step.
    app.order("alice", &id, 4)
        .await
        .expect_problem(409, "per-user-limit");
    app.order("alice", &id, 2).await.expect(201);
    let before = db_snapshot(&app.db, &id).await;
    app.order("alice", &id, 2)
        .await
        .expect_problem(409, "per-user-limit");
    assert_eq!(
        db_snapshot(&app.db, &id).await,
        before,
        "a refused order changed the database"
    );
    app.order("alice", &id, 1).await.expect(201);
    app.order("alice", &id, 1)
        .await
        .expect_problem(409, "per-user-limit");
    app.order("bob", &id, 3).await.expect(201);

    assert_eq!(app.inventory(&id).await["reserved"], 6);
    app.assert_invariants(&id).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn deal_sells_out_and_refuses_further_orders() {
    let app = spawn_app().await;
    let mut deal = new_deal("o4", 3, 2);
    deal["per_user_limit"] = json!(3);
    let id = app.given_deal(&deal).await;

    app.order("alice", &id, 2).await.expect(201);
    let before = db_snapshot(&app.db, &id).await;
    app.order("bob", &id, 2)
        .await
        .expect_problem(409, "sold-out");
    assert_eq!(
        db_snapshot(&app.db, &id).await,
        before,
        "a refused order changed the database"
    );
    app.order("bob", &id, 1).await.expect(201);
    app.order("carol", &id, 1)
        .await
        .expect_problem(409, "sold-out");

    app.wait_for_deal_state(&id, "sold_out").await;
    app.order("dave", &id, 1)
        .await
        .expect_problem(409, "sold-out");
    let inventory = app.inventory(&id).await;
    assert_eq!(
        (
            inventory["available"].as_i64(),
            inventory["reserved"].as_i64()
        ),
        (Some(0), Some(3))
    );
    app.assert_invariants(&id).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn order_larger_than_one_bucket_draws_from_several() {
    // Arrange: four units, one per bucket.
    let app = spawn_app().await;
    let mut deal = new_deal("o5", 4, 4);
    deal["per_user_limit"] = json!(4);
    let id = app.given_deal(&deal).await;

    // Act
    let order = app.order("alice", &id, 3).await.expect(201);

    // Assert
    let lines = order_holdings(&app.db, order["order_id"].as_str().unwrap()).await;
    assert_eq!(lines.values().sum::<i64>(), 3, "lines: {lines:?}");
    app.order("bob", &id, 1).await.expect(201);
    app.order("carol", &id, 1)
        .await
        .expect_problem(409, "sold-out");
    app.assert_invariants(&id).await;
    app.cleanup().await;
}
