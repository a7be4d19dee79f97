//! Liveness, readiness and metrics.

use serde_json::json;

use crate::helpers::{EVENTUALLY, eventually, new_deal, redis_reported_up, send, spawn_app};

#[tokio::test(flavor = "multi_thread")]
async fn healthz_answers_200() {
    let app = spawn_app().await;

    let reply = app.get("/healthz").await;

    assert_eq!(reply.status, 200, "{}", reply.text);
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn readyz_is_ready_and_reports_redis_up() {
    let app = spawn_app().await;

    // The Redis connection is made in the background, so give it a moment.
    let api = &app.api;
    let body = eventually(EVENTUALLY, || async move {
        let reply = api.get("/readyz").await;
        assert_eq!(reply.status, 200, "{}", reply.text);
        let body = reply.json();
        redis_reported_up(&body).then_some(body)
    })
    .await;

    assert!(
        body.is_some(),
        "readyz never reported redis up: {}",
        app.get("/readyz").await.text
    );
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_count_requests_reservations_and_rejections() {
    // Arrange: a deal of one unit.
    let app = spawn_app().await;
    let deal = app.given_deal(&new_deal("metrics", 1, 1)).await;

    // Act: an anonymous order, a sale, an order turned away as sold out, then a scrape.
    let anonymous = app
        .client
        .post(app.url(&format!("/v1/deals/{deal}/orders")));
    let anonymous = anonymous
        .header("Idempotency-Key", "k")
        .json(&json!({"quantity": 1}));
    send(anonymous).await.expect_problem(401, "unauthorized");
    app.order("alice", &deal, 1).await.expect(201);
    app.wait_for_deal_state(&deal, "sold_out").await;
    app.order("bob", &deal, 1)
        .await
        .expect_problem(409, "sold-out");
    let metrics = app.get("/metrics").await;

    // Assert
    assert_eq!(metrics.status, 200);
    let content_type = metrics.header("content-type").unwrap_or_default();
    assert!(
        content_type.starts_with("text/plain"),
        "content-type {content_type:?}"
    );
    for name in [
        "flashgate_http_requests_total",
        "flashgate_reservations_total",
        "flashgate_admission_rejections_total",
    ] {
        assert!(
            metrics.text.contains(name),
            "{name} missing from /metrics:\n{}",
            metrics.text
        );
    }
    app.cleanup().await;
}
