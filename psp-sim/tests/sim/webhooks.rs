//! Webhook delivery faults: duplicates, reordering, drops, delays, and retries.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::helpers::{ARRIVAL, QUIET, Receiver, Sim, assert_event};
use crate::wait::wait_until;

async fn paid_intent(sim: &Sim, key: &str) -> String {
    let id = sim.create_ok(key, json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, _) = sim.post(&format!("/checkout/{id}/pay"), json!({})).await;
    assert_eq!(status, 200);
    id
}

#[tokio::test]
async fn duplicates_repeat_the_same_event_id() {
    let receiver = Receiver::start().await;
    let sim = Sim::start(Some(&receiver.url)).await;
    sim.faults(json!({"webhook_duplicates": 2})).await;

    let id = paid_intent(&sim, "dup").await;
    let deliveries = receiver.wait_for(3, ARRIVAL).await;
    receiver.assert_total(3, QUIET).await;

    for delivery in &deliveries {
        assert_event(delivery, "payment_intent.succeeded", &id);
        assert_eq!(delivery.body, deliveries[0].body);
    }
    let records = sim
        .events_when("payment_intent.succeeded", |r| {
            r.first().is_some_and(|e| e["successful_deliveries"] == 3)
        })
        .await;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0]["deliveries"], 3);
    assert_eq!(records[0]["delivered"], true);
    assert_eq!(records[0]["event"], deliveries[0].event);
}

#[tokio::test]
async fn reorder_holds_a_batch_and_sends_it_newest_first() {
    let receiver = Receiver::start().await;
    let sim = Sim::start(Some(&receiver.url)).await;
    sim.faults(json!({"webhook_reorder": true})).await;

    let first = paid_intent(&sim, "first").await;
    let second = paid_intent(&sim, "second").await;
    receiver.assert_total(0, QUIET).await;
    sim.post("/control/webhooks/flush", json!({})).await;
    let flushed = receiver.wait_for(2, ARRIVAL).await;
    let third = paid_intent(&sim, "third").await;
    let fourth = paid_intent(&sim, "fourth").await;
    let held_since = Instant::now();
    let released = receiver.wait_for(4, ARRIVAL).await;

    assert_event(&flushed[0], "payment_intent.succeeded", &second);
    assert_event(&flushed[1], "payment_intent.succeeded", &first);
    assert_event(&released[2], "payment_intent.succeeded", &fourth);
    assert_event(&released[3], "payment_intent.succeeded", &third);
    let waited = released[2].at.duration_since(held_since);
    assert!(
        waited >= Duration::from_millis(800),
        "released after {waited:?}"
    );
}

#[tokio::test]
async fn dropped_webhooks_are_recorded_but_never_sent() {
    let receiver = Receiver::start().await;
    let sim = Sim::start(Some(&receiver.url)).await;
    sim.faults(json!({"webhook_drop": true})).await;

    let dropped = paid_intent(&sim, "dropped").await;
    receiver.assert_total(0, QUIET).await;
    let (status, _) = sim.get("/control/faults").await;
    assert_eq!(status, 200);
    let reset = sim
        .http
        .delete(sim.url("/control/faults"))
        .send()
        .await
        .unwrap();
    assert_eq!(reset.status(), 200);
    let sent = paid_intent(&sim, "sent").await;
    let deliveries = receiver.wait_for(1, ARRIVAL).await;

    assert_event(&deliveries[0], "payment_intent.succeeded", &sent);
    let records = sim
        .events_when("payment_intent.succeeded", |r| {
            r.get(1).is_some_and(|e| e["delivered"] == true)
        })
        .await;
    assert_eq!(
        records[0]["event"]["data"]["object"]["id"],
        dropped.as_str()
    );
    assert_eq!(records[0]["deliveries"], 0);
    assert_eq!(records[0]["delivered"], false);
    assert_eq!(records[0]["dropped"], true);
    assert_eq!(records[1]["delivered"], true);
}

#[tokio::test]
async fn failed_deliveries_are_retried_with_the_same_event_and_a_fresh_signature() {
    let receiver = Receiver::start().await;
    let sim = Sim::start(Some(&receiver.url)).await;
    receiver.answer_next(&[500, 503]);

    let started = Instant::now();
    let id = paid_intent(&sim, "retry").await;
    let deliveries = receiver.wait_for(3, ARRIVAL).await;
    receiver.assert_total(3, QUIET).await;

    for delivery in &deliveries {
        assert_event(delivery, "payment_intent.succeeded", &id);
        assert_eq!(delivery.event["id"], deliveries[0].event["id"]);
    }
    assert!(deliveries[2].at.duration_since(started) >= Duration::from_millis(700));
    let records = sim
        .events_when("payment_intent.succeeded", |r| {
            r.first().is_some_and(|e| e["delivered"] == true)
        })
        .await;
    assert_eq!(records[0]["deliveries"], 3);
    assert_eq!(records[0]["successful_deliveries"], 1);
}

#[tokio::test]
async fn an_unreachable_endpoint_is_retried_until_it_answers() {
    // Reserve a port, start the simulator against it, and only then start listening.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let sim = Sim::start(Some(&format!("http://127.0.0.1:{port}/hook"))).await;
    let id = paid_intent(&sim, "late-endpoint").await;
    wait_until("a delivery to the closed port", ARRIVAL, || async {
        let records = sim.events_of("payment_intent.succeeded").await;
        records.first().is_some_and(|e| e["deliveries"] != 0)
    })
    .await;
    let receiver = Receiver::start().await;
    sim.post("/control/webhook_url", json!({"url": receiver.url}))
        .await;

    let deliveries = receiver.wait_for(1, ARRIVAL).await;

    assert_event(&deliveries[0], "payment_intent.succeeded", &id);
    let records = sim
        .events_when("payment_intent.succeeded", |r| {
            r.first().is_some_and(|e| e["delivered"] == true)
        })
        .await;
    assert!(records[0]["deliveries"].as_u64().unwrap() >= 2);
    assert_eq!(records[0]["delivered"], true);
}

#[tokio::test]
async fn delayed_webhooks_arrive_late_and_in_order() {
    let receiver = Receiver::start().await;
    let sim = Sim::start(None).await;
    let (status, url) = sim
        .post("/control/webhook_url", json!({"url": receiver.url}))
        .await;
    assert_eq!((status, &url["url"]), (200, &json!(receiver.url)));
    sim.faults(json!({"webhook_delay_ms": 400})).await;

    let started = Instant::now();
    let a = paid_intent(&sim, "a").await;
    let b = paid_intent(&sim, "b").await;
    let deliveries = receiver.wait_for(2, ARRIVAL).await;

    assert!(deliveries[0].at.duration_since(started) >= Duration::from_millis(400));
    assert_event(&deliveries[0], "payment_intent.succeeded", &a);
    assert_event(&deliveries[1], "payment_intent.succeeded", &b);
    let (bad, _) = sim
        .post(
            "/control/webhook_url",
            json!({"url": "https://example.com/x"}),
        )
        .await;
    assert_eq!(bad, 400);
}
