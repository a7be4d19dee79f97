//! The circuit breaker on provider calls, against the real simulator: failures in a row open
//! it, calls are then refused before anything is sent and orders wait as on a timeout
//! (never cancelled for it), and after the open time one probe closes it again.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::helpers::{
    SETTLE, attempts_of, metric_value, new_deal, spawn_pay_app_with, stock, wait_until,
};

async fn breaker_state(app: &crate::helpers::PayApp) -> f64 {
    metric_value(&app.metrics().await, "flashgate_provider_breaker_state", "")
}

#[tokio::test(flavor = "multi_thread")]
async fn failures_open_the_breaker_orders_wait_and_a_probe_closes_it() {
    let app = spawn_pay_app_with(|s| {
        s.payments.breaker_failures_max = 2;
        s.payments.breaker_open_ms = 4_000;
    })
    .await;
    let deal = app.given_deal(&new_deal("brk1", 10, 2)).await;
    assert_eq!(breaker_state(&app).await, 0.0, "closed at start");

    // Two creates fail (503 after every retry): the breaker opens during the second, so
    // not before that order was sent.
    app.sim.faults(json!({"api_fail_status": 503})).await;
    let mut second_failure_sent_at = Instant::now();
    for user in ["alice", "bob"] {
        second_failure_sent_at = Instant::now();
        let token = app.token(user);
        let order = app.place_order(&token, &deal, "k1", 1).await.expect(201);
        assert!(order["payment"]["checkout_url"].is_null(), "{order}");
    }
    assert_eq!(breaker_state(&app).await, 2.0, "open after two failures");
    let opened_at = Instant::now();

    // The provider is healthy again, but while the breaker is open nothing is sent: the
    // order waits for the provider, exactly as after a timeout.
    app.sim.reset_faults().await;
    let carol = app.token("carol");
    let order = app.place_order(&carol, &deal, "k1", 1).await.expect(201);
    let order_id = order["order_id"].as_str().unwrap().to_owned();
    assert_eq!(order["status"], "PENDING_PAYMENT");
    assert!(order["payment"]["checkout_url"].is_null(), "{order}");
    assert!(
        opened_at.elapsed() < Duration::from_millis(4_000),
        "the test outran the open time; nothing shown"
    );
    assert!(
        app.sim.intents().await.is_empty(),
        "no call reached the provider"
    );
    let metrics = app.metrics().await;
    let refused = metric_value(
        &metrics,
        "flashgate_provider_errors_total",
        "kind=\"circuit_open\"",
    );
    assert!(refused >= 1.0, "refusals counted:\n{metrics}");
    assert_eq!(
        stock(&app.db, &deal).await,
        (7, 3, 0),
        "units held, none cancelled"
    );
    let attempts = attempts_of(&app.db, &order_id).await;
    assert_eq!(attempts[0].status, "PENDING", "{attempts:?}");

    // After the open time the next call is the probe: it succeeds and closes the breaker.
    let limit = SETTLE + Duration::from_secs(4);
    let replay = wait_until("the breaker to let a probe through", limit, || async {
        let replay = app.place_order(&carol, &deal, "k1", 1).await.expect(201);
        if replay["payment"]["checkout_url"].is_null() {
            Err(replay)
        } else {
            Ok(replay)
        }
    })
    .await;
    assert!(
        second_failure_sent_at.elapsed() >= Duration::from_millis(4_000),
        "not before the open time"
    );
    assert_eq!(breaker_state(&app).await, 0.0, "closed by the probe");
    let intent = crate::helpers::intent_id(&replay);
    assert_eq!(app.sim.pay(&intent).await.0, 200);
    app.wait_for_order(&carol, &order_id, &["PAID"], SETTLE)
        .await;
    app.assert_invariants(&deal).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn timeouts_open_the_breaker_like_failures() {
    let app = spawn_pay_app_with(|s| {
        s.payments.breaker_failures_max = 2;
        s.payments.breaker_open_ms = 60_000;
        s.payments.request_timeout_ms = 300;
        s.payments.retries_max = 0;
    })
    .await;
    let deal = app.given_deal(&new_deal("brk2", 10, 2)).await;

    // The provider answers only after the gateway stopped waiting: two creates time out.
    app.sim.faults(json!({"api_delay_ms": 3_000})).await;
    for user in ["dave", "erin"] {
        let token = app.token(user);
        let order = app.place_order(&token, &deal, "k1", 1).await.expect(201);
        assert!(order["payment"]["checkout_url"].is_null(), "{order}");
    }
    assert_eq!(breaker_state(&app).await, 2.0, "open after two timeouts");

    // Open: the next order sends nothing, keeps its units and waits for the provider.
    app.sim.reset_faults().await;
    let frank = app.token("frank");
    let order = app.place_order(&frank, &deal, "k1", 1).await.expect(201);
    let order_id = order["order_id"].as_str().unwrap().to_owned();
    assert_eq!(order["status"], "PENDING_PAYMENT");
    assert!(order["payment"]["checkout_url"].is_null(), "{order}");
    let metrics = app.metrics().await;
    let refused = metric_value(
        &metrics,
        "flashgate_provider_errors_total",
        "kind=\"circuit_open\"",
    );
    assert!(refused >= 1.0, "refusals counted:\n{metrics}");
    let attempts = attempts_of(&app.db, &order_id).await;
    assert_eq!(attempts[0].status, "PENDING", "{attempts:?}");
    assert_eq!(stock(&app.db, &deal).await.1, 3, "three units held");
    app.assert_invariants(&deal).await;
    app.cleanup().await;
}
