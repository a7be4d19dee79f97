//! Faults between the gateway and a receiver that verifies with the Standard Webhooks
//! reference library: it answers 500 for a while, hangs past the timeout, has its port
//! closed, or gets a rotated secret in the middle of the sale. Each time nothing is lost
//! and every order's events arrive in sequence; an endpoint failing past its limit is marked
//! failing, keeps its events and gets them on a replay.
//!
//! The 500s last ten seconds of wall time, not a minute: with `events.retry_max_ms` at half
//! a second the gateway retries as many times in ten seconds as it would in minutes with
//! the defaults, and the outcome asserted (nothing lost, order kept) does not depend on how
//! long the receiver failed.

use std::time::Duration;

use serde_json::{Value, json};

use crate::events_delivery::{check_against_database, fast_events, subscribe, wait_delivered};
use crate::helpers::{Receiver, TestApp, new_deal, send, spawn_app_with, wait_until};

const DELIVERED: Duration = Duration::from_secs(60);

/// Some sale traffic: each user reserves one unit and every other one cancels.
async fn traffic(app: &TestApp, deal: &str, users: std::ops::Range<u32>) {
    for n in users {
        let user = format!("u{n}");
        let order = app.order(&user, deal, 1).await.expect(201);
        if n % 2 == 0 {
            let id = order["order_id"].as_str().unwrap();
            app.cancel_order(&app.token(&user), id).await.expect(200);
        }
    }
}

async fn admin(app: &TestApp, method: reqwest::Method, path: &str, body: Value) -> Value {
    let request = app
        .client
        .request(method, app.url(path))
        .bearer_auth(&app.admin_token);
    let reply = send(request.json(&body)).await;
    assert!(
        reply.status < 300,
        "{path}: {} {}",
        reply.status,
        reply.text
    );
    serde_json::from_str(&reply.text).unwrap_or(Value::Null)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_receiver_failing_hanging_or_closed_loses_nothing() {
    let app = spawn_app_with(fast_events).await;
    let mut receiver = Receiver::start(&[]).await;
    let (_, secret) = subscribe(&app, &receiver).await;
    let deal = app.given_deal(&new_deal("ev-faults", 1000, 4)).await;
    traffic(&app, &deal, 0..10).await;

    receiver.fail().await;
    traffic(&app, &deal, 10..20).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    receiver.heal().await;
    wait_delivered(&app, &receiver, DELIVERED).await;

    receiver.control(json!({"mode": "hang"})).await;
    traffic(&app, &deal, 20..30).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    receiver.stop().await;
    traffic(&app, &deal, 30..40).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    receiver.restart(&[&secret]).await;

    let received = wait_delivered(&app, &receiver, DELIVERED).await;
    let events = check_against_database(&app, &received).await;
    assert_eq!(events, 60, "forty reservations and twenty cancellations");
    let metrics = app.metrics().await;
    for outcome in ["accepted", "refused", "timeout", "unreachable"] {
        assert!(
            metrics
                .lines()
                .any(|l| l.starts_with("flashgate_event_deliveries_total")
                    && l.contains(&format!("outcome=\"{outcome}\""))),
            "no {outcome} delivery counted"
        );
    }
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rotated_secret_signs_beside_the_old_one_during_the_overlap_only() {
    let app = spawn_app_with(fast_events).await;
    let receiver = Receiver::start(&[]).await;
    let (id, old) = subscribe(&app, &receiver).await;
    let deal = app.given_deal(&new_deal("ev-rotate", 1000, 2)).await;
    traffic(&app, &deal, 0..4).await;
    wait_delivered(&app, &receiver, DELIVERED).await;

    let overlap = 4;
    let rotated = admin(
        &app,
        reqwest::Method::POST,
        &format!("/admin/event-endpoints/{id}/rotate-secret"),
        json!({"overlap_seconds": overlap}),
    )
    .await;
    let new = rotated["secret"].as_str().unwrap().to_owned();
    receiver.control(json!({"secrets": [old, new]})).await;
    traffic(&app, &deal, 4..8).await;
    let during = wait_delivered(&app, &receiver, DELIVERED).await;
    tokio::time::sleep(Duration::from_secs(overlap + 1)).await;
    traffic(&app, &deal, 8..12).await;
    let after = wait_delivered(&app, &receiver, DELIVERED).await;

    let first = 6;
    let overlapping: Vec<&Value> = during[first..].iter().collect();
    assert!(!overlapping.is_empty());
    for delivery in overlapping {
        assert_eq!(delivery["signatures"], 2, "{delivery}");
        assert_eq!(
            delivery["verified_by"],
            json!([0, 1]),
            "both secrets verify during the overlap: {delivery}"
        );
    }
    for delivery in &after[during.len()..] {
        assert_eq!(delivery["signatures"], 1, "{delivery}");
        assert_eq!(
            delivery["verified_by"],
            json!([1]),
            "only the new secret after it: {delivery}"
        );
    }
    assert_eq!(check_against_database(&app, &after).await, 18);
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_endpoint_failing_past_its_limit_is_marked_failing_and_replayed() {
    let app = spawn_app_with(|s| {
        fast_events(s);
        s.events.failing_after_seconds = 2;
    })
    .await;
    let receiver = Receiver::start(&[]).await;
    let (id, _) = subscribe(&app, &receiver).await;
    receiver.fail().await;
    let deal = app.given_deal(&new_deal("ev-failing", 1000, 2)).await;
    traffic(&app, &deal, 0..6).await;
    let path = format!("/admin/event-endpoints/{id}");
    let failing = wait_until("the endpoint to be marked failing", DELIVERED, || async {
        let view = admin(&app, reqwest::Method::GET, &path, Value::Null).await;
        if view["state"] == "failing" {
            Ok(view)
        } else {
            Err(view.to_string())
        }
    })
    .await;
    assert_eq!(failing["pending"], 9, "its events are kept: {failing}");
    assert!(failing["last_error"].as_str().unwrap().contains("500"));
    wait_until("the failing gauge", DELIVERED, || async {
        let metrics = app.metrics().await;
        metrics.contains(&format!(
            "flashgate_event_endpoint_failing{{endpoint=\"{id}\"}} 1"
        ))
    })
    .await;
    receiver.heal().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        receiver.received().await.is_empty(),
        "a failing endpoint is not tried"
    );

    let replayed = admin(
        &app,
        reqwest::Method::POST,
        &format!("{path}/replay"),
        json!({}),
    )
    .await;
    assert_eq!(replayed["state"], "active");
    let received = wait_delivered(&app, &receiver, DELIVERED).await;
    assert_eq!(check_against_database(&app, &received).await, 9);
    app.cleanup().await;
}
