//! Redis only accelerates: without it the gateway is slower, never wrong.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::helpers::{
    ChildGuard, EVENTUALLY, TestApp, eventually, free_port, new_deal, redis_reported_down,
    redis_reported_up, spawn_app_with, test_log, wait_for_port,
};

/// Starts a throwaway `redis-server` without persistence on a free port.
pub async fn start_redis() -> (ChildGuard, u16) {
    let port = free_port();
    (start_redis_on(port).await, port)
}

/// Starts a throwaway `redis-server` without persistence on `port`.
pub async fn start_redis_on(port: u16) -> ChildGuard {
    let output = || {
        if test_log() {
            Stdio::inherit()
        } else {
            Stdio::null()
        }
    };
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(output())
        .stderr(output())
        .spawn()
        .expect("start redis-server (is it on PATH?)");
    let guard = ChildGuard { child };
    assert!(
        wait_for_port(port, Duration::from_secs(5)).await,
        "redis-server did not listen on {port}"
    );
    guard
}

/// Waits until `/readyz` answers 200 with Redis in the wanted state.
async fn wait_for_readyz(app: &TestApp, redis_up: bool) {
    let api = &app.api;
    let seen = eventually(EVENTUALLY, || async move {
        let reply = api.get("/readyz").await;
        assert_eq!(reply.status, 200, "readyz: {}", reply.text);
        let body = reply.json();
        let matches = if redis_up {
            redis_reported_up(&body)
        } else {
            redis_reported_down(&body)
        };
        matches.then_some(())
    })
    .await;
    let last = app.get("/readyz").await.text;
    assert!(
        seen.is_some(),
        "readyz never reported redis {}: {last}",
        if redis_up { "up" } else { "down" }
    );
}

/// Sells out a two-unit deal, cancels one order and checks the unit sells again, exactly once.
async fn sell_out_cancel_and_resell(app: &TestApp, deal: &str) {
    let order = app.order("alice", deal, 1).await.expect(201);
    app.order("bob", deal, 1).await.expect(201);
    app.order("carol", deal, 1)
        .await
        .expect_problem(409, "sold-out");
    app.wait_for_deal_state(deal, "sold_out").await;

    app.cancel_order(&app.token("alice"), order["order_id"].as_str().unwrap())
        .await
        .expect(200);

    app.order_eventually("carol", deal, 1).await;
    app.order("dave", deal, 1)
        .await
        .expect_problem(409, "sold-out");
    app.assert_invariants(deal).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn gateway_works_without_redis() {
    // Arrange: nothing listens on port 1.
    let app = spawn_app_with(|s| s.redis.url = "redis://127.0.0.1:1".into()).await;
    let deal = app.given_deal(&new_deal("no-redis", 2, 2)).await;

    // Act + Assert
    wait_for_readyz(&app, false).await;
    sell_out_cancel_and_resell(&app, &deal).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn gateway_stays_correct_when_redis_dies_mid_sale() {
    // Arrange: a private Redis, a deal sold out while Redis is up.
    let (mut redis, port) = start_redis().await;
    let app = spawn_app_with(|s| s.redis.url = format!("redis://127.0.0.1:{port}")).await;
    wait_for_readyz(&app, true).await;
    let deal = app.given_deal(&new_deal("redis-dies", 2, 2)).await;
    let alice = app.token("alice");
    let order = app.place_order(&alice, &deal, "k1", 1).await.expect(201);
    app.order("bob", &deal, 1).await.expect(201);
    app.wait_for_deal_state(&deal, "sold_out").await;
    app.order("carol", &deal, 1)
        .await
        .expect_problem(409, "sold-out");

    // Act: Redis goes away while the deal is sold out.
    redis.kill();

    // Assert: still sold out, a cancel makes exactly one unit orderable again.
    app.order("carol", &deal, 1)
        .await
        .expect_problem(409, "sold-out");
    app.cancel_order(&alice, order["order_id"].as_str().unwrap())
        .await
        .expect(200);
    app.order_eventually("carol", &deal, 1).await;
    app.order("dave", &deal, 1)
        .await
        .expect_problem(409, "sold-out");
    app.assert_invariants(&deal).await;
    wait_for_readyz(&app, false).await;
    let api = &app.api;
    let counted = eventually(EVENTUALLY, || async move {
        api.metrics()
            .await
            .contains("flashgate_redis_errors_total")
            .then_some(())
    })
    .await;
    assert!(
        counted.is_some(),
        "flashgate_redis_errors_total missing:\n{}",
        app.metrics().await
    );

    // A second deal, created and sold entirely without Redis.
    let second = app.given_deal(&new_deal("after-redis", 2, 2)).await;
    sell_out_cancel_and_resell(&app, &second).await;
    app.cleanup().await;
}
