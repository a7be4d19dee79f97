//! API faults: slow answers, injected failures before and after the effect.

use std::time::Duration;

use serde_json::json;

use crate::helpers::{Sim, status_json};

fn body(reference: &str) -> serde_json::Value {
    json!({"amount_minor": 1500, "currency": "EUR", "reference": reference})
}

async fn intent_count(sim: &Sim) -> usize {
    let (_, all) = sim.get("/control/payment_intents").await;
    all["data"].as_array().unwrap().len()
}

#[tokio::test]
async fn a_slow_create_times_out_but_a_retry_with_the_same_key_finds_it() {
    let sim = Sim::start(None).await;
    sim.faults(json!({"api_delay_ms": 1500})).await;

    let timed_out = sim
        .api(reqwest::Method::POST, "/v1/payment_intents")
        .header("Idempotency-Key", "slow")
        .json(&body("slow"))
        .timeout(Duration::from_millis(300))
        .send()
        .await;
    let reset = sim
        .http
        .delete(sim.url("/control/faults"))
        .send()
        .await
        .unwrap();
    let retry = sim.create("slow", body("slow")).await;

    assert!(timed_out.is_err_and(|e| e.is_timeout()));
    assert_eq!(reset.status(), 200);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(intent_count(&sim).await, 1);
}

#[tokio::test]
async fn a_failure_before_the_effect_changes_nothing_and_runs_out() {
    let sim = Sim::start(None).await;
    sim.faults(json!({"api_fail_status": 503, "api_fail_count": 2}))
        .await;

    let (first, error) = status_json(sim.create("k", body("r")).await).await;
    let (second, _) = sim.get("/v1/payment_intents/pi_whatever").await;
    let after_failing = intent_count(&sim).await;
    let third = sim.create("k", body("r")).await;

    assert_eq!(first, 503);
    assert_eq!(error["error"]["type"], "injected_fault");
    assert_eq!(second, 503);
    assert_eq!(after_failing, 0);
    assert_eq!(third.status(), 200);
    assert!(third.headers().get("idempotent-replayed").is_none());
    let (_, faults) = sim.get("/control/faults").await;
    assert_eq!(faults["api_fail_status"], serde_json::Value::Null);
}

#[tokio::test]
async fn a_failure_after_the_effect_keeps_the_effect() {
    let sim = Sim::start(None).await;
    let paid = sim.create_ok("paid", json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    sim.post(&format!("/checkout/{paid}/pay"), json!({})).await;
    sim.faults(json!({"api_fail_status": 500, "api_fail_after_effect": true}))
        .await;

    let (create_status, _) = status_json(sim.create("k", body("r")).await).await;
    let refund = sim
        .api(reqwest::Method::POST, "/v1/refunds")
        .header("Idempotency-Key", "refund-1")
        .json(&json!({"payment_intent": paid}))
        .send()
        .await
        .unwrap();
    let (checkout_status, _) = sim.get(&format!("/checkout/{paid}")).await;
    sim.faults(json!({"api_fail_status": null})).await;
    let replay = sim.create("k", body("r")).await;
    let (_, intent) = sim.get(&format!("/v1/payment_intents/{paid}")).await;

    assert_eq!(create_status, 500);
    assert_eq!(refund.status(), 500);
    assert_eq!(checkout_status, 200, "the checkout page is not an API call");
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(intent_count(&sim).await, 2);
    assert_eq!(intent["amount_refunded_minor"], 4999);
}

#[tokio::test]
async fn fault_settings_are_checked() {
    let sim = Sim::start(None).await;
    for bad in [
        json!({"api_fail_status": 200}),
        json!({"webhook_duplicates": -1}),
        json!({"no_such_fault": true}),
        json!({"api_delay_ms": 10_000_000}),
    ] {
        let (status, error) = sim.post("/control/faults", bad.clone()).await;
        assert_eq!(status, 400, "{bad}");
        assert_eq!(error["error"]["type"], "invalid_request");
    }
    let (status, faults) = sim
        .post("/control/faults", json!({"webhook_reorder": true}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        faults,
        json!({
            "webhook_delay_ms": 0, "webhook_duplicates": 0, "webhook_reorder": true,
            "webhook_drop": false, "api_delay_ms": 0, "api_fail_status": null,
            "api_fail_after_effect": false, "api_fail_count": 0
        })
    );
}
