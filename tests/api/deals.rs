//! Public deal reads and the sale window.

use chrono::{Duration, Utc};
use serde_json::json;

use crate::helpers::{db_snapshot, new_deal, spawn_app};

#[tokio::test(flavor = "multi_thread")]
async fn get_deal_returns_public_fields_and_cache_control() {
    let app = spawn_app().await;
    let mut deal = new_deal("public-1", 10, 2);
    deal["unit_price_minor"] = json!(1999);
    deal["currency"] = json!("USD");
    let id = app.given_deal(&deal).await;

    let reply = app.get_deal(&id).await;

    let body = reply.expect(200);
    assert_eq!(body["id"], "public-1");
    assert_eq!(body["name"], "Deal public-1");
    assert_eq!(body["state"], "open");
    assert_eq!(body["unit_price_minor"], 1999);
    assert_eq!(body["currency"], "USD");
    assert!(
        body.get("starts_at").is_some() && body.get("ends_at").is_some(),
        "{body}"
    );
    let cache_control = reply.header("cache-control").unwrap_or_default();
    assert!(
        cache_control.contains("max-age"),
        "cache-control {cache_control:?}"
    );
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_deal_is_not_found() {
    let app = spawn_app().await;

    let reply = app.get_deal("no-such-deal").await;

    reply.expect_problem(404, "not-found");
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn deal_before_its_window_is_upcoming_and_refuses_orders() {
    let app = spawn_app().await;
    let mut deal = new_deal("later", 10, 2);
    deal["starts_at"] = json!((Utc::now() + Duration::hours(1)).to_rfc3339());
    deal["ends_at"] = json!((Utc::now() + Duration::hours(2)).to_rfc3339());
    let id = app.given_deal(&deal).await;
    let before = db_snapshot(&app.db, &id).await;

    let reply = app.order("alice", &id, 1).await;

    reply.expect_problem(409, "sale-not-open");
    assert_eq!(app.deal_state(&id).await, "upcoming");
    assert_eq!(
        db_snapshot(&app.db, &id).await,
        before,
        "a refused order changed the database"
    );
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn deal_after_its_window_is_ended_and_refuses_orders() {
    let app = spawn_app().await;
    let mut deal = new_deal("over", 10, 2);
    deal["starts_at"] = json!((Utc::now() - Duration::hours(2)).to_rfc3339());
    deal["ends_at"] = json!((Utc::now() - Duration::hours(1)).to_rfc3339());
    let id = app.given_deal(&deal).await;
    let before = db_snapshot(&app.db, &id).await;

    let reply = app.order("alice", &id, 1).await;

    reply.expect_problem(409, "sale-not-open");
    assert_eq!(app.deal_state(&id).await, "ended");
    assert_eq!(
        db_snapshot(&app.db, &id).await,
        before,
        "a refused order changed the database"
    );
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn deal_inside_its_window_is_open_and_sells() {
    let app = spawn_app().await;
    let mut deal = new_deal("now", 10, 2);
    deal["starts_at"] = json!((Utc::now() - Duration::minutes(5)).to_rfc3339());
    deal["ends_at"] = json!((Utc::now() + Duration::hours(1)).to_rfc3339());
    let id = app.given_deal(&deal).await;

    let reply = app.order("alice", &id, 1).await;

    reply.expect(201);
    assert_eq!(app.deal_state(&id).await, "open");
    app.assert_invariants(&id).await;
    app.cleanup().await;
}
