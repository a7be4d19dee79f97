//! Checkout, decline, manual capture, cancel, expiry and forced success, each with its
//! signed webhook.

use serde_json::json;

use crate::helpers::{ARRIVAL, QUIET, Receiver, SECRET, Sim, assert_event, signature_valid};

#[tokio::test]
async fn paying_at_checkout_succeeds_and_sends_a_signed_webhook() {
    let receiver = Receiver::start().await;
    let sim = Sim::start(Some(&receiver.url)).await;
    let intent = sim.create_ok("order-7", json!({})).await;
    let id = intent["id"].as_str().unwrap();

    let page = sim
        .http
        .get(intent["checkout_url"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    assert!(
        page.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );
    let page = page.text().await.unwrap();
    let (status, paid) = sim.post(&format!("/checkout/{id}/pay"), json!({})).await;
    let (again_status, again) = sim.post(&format!("/checkout/{id}/pay"), json!({})).await;
    let deliveries = receiver.wait_for(1, ARRIVAL).await;
    receiver.assert_total(1, QUIET).await;

    for needle in [
        "49.99",
        "EUR",
        "order-7",
        &format!("/checkout/{id}/pay"),
        &format!("/checkout/{id}/decline"),
    ] {
        assert!(page.contains(needle), "{needle} missing from {page}");
    }
    assert_eq!(status, 200);
    assert_eq!(paid["status"], "succeeded");
    assert_eq!((again_status, &again), (200, &paid));
    assert_event(&deliveries[0], "payment_intent.succeeded", id);
    assert_eq!(deliveries[0].event["data"]["object"], paid);
    assert!(!signature_valid(
        "another-secret",
        &deliveries[0].signature,
        &deliveries[0].body
    ));
    let mut tampered = deliveries[0].body.to_vec();
    tampered[10] ^= 1;
    assert!(!signature_valid(
        SECRET,
        &deliveries[0].signature,
        &tampered
    ));
    let (_, now) = sim.get(&format!("/v1/payment_intents/{id}")).await;
    assert_eq!(now["status"], "succeeded");
}

#[tokio::test]
async fn a_browser_gets_html_back_from_pay() {
    let sim = Sim::start(None).await;
    let intent = sim.create_ok("browser", json!({})).await;
    let id = intent["id"].as_str().unwrap();
    let response = sim
        .http
        .post(sim.url(&format!("/checkout/{id}/pay")))
        .header("Accept", "text/html,application/xhtml+xml")
        .header("Content-Type", "application/x-www-form-urlencoded")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );
    assert!(response.text().await.unwrap().contains("Paid"));
    let (_, now) = sim.get(&format!("/v1/payment_intents/{id}")).await;
    assert_eq!(now["status"], "succeeded");
}

#[tokio::test]
async fn declining_fails_the_payment_for_good() {
    let receiver = Receiver::start().await;
    let sim = Sim::start(Some(&receiver.url)).await;
    let id = sim.create_ok("declined", json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();

    let (status, failed) = sim
        .post(&format!("/checkout/{id}/decline"), json!({}))
        .await;
    let (pay_status, pay_error) = sim.post(&format!("/checkout/{id}/pay"), json!({})).await;
    let deliveries = receiver.wait_for(1, ARRIVAL).await;
    receiver.assert_total(1, QUIET).await;

    assert_eq!((status, &failed["status"]), (200, &json!("failed")));
    assert_eq!(pay_status, 409);
    assert_eq!(pay_error["error"]["type"], "invalid_state");
    assert_event(&deliveries[0], "payment_intent.payment_failed", &id);
    assert_eq!(deliveries[0].event["data"]["object"]["status"], "failed");
}

#[tokio::test]
async fn manual_capture_authorises_then_captures() {
    let receiver = Receiver::start().await;
    let sim = Sim::start(Some(&receiver.url)).await;
    let id = sim
        .create_ok("manual", json!({"capture_method": "manual"}))
        .await["id"]
        .as_str()
        .unwrap()
        .to_owned();

    let (capture_early, _) = sim
        .post(&format!("/v1/payment_intents/{id}/capture"), json!({}))
        .await;
    let (_, authorised) = sim.post(&format!("/checkout/{id}/pay"), json!({})).await;
    let (_, captured) = sim
        .post(&format!("/v1/payment_intents/{id}/capture"), json!({}))
        .await;
    let (again_status, again) = sim
        .post(&format!("/v1/payment_intents/{id}/capture"), json!({}))
        .await;
    let (cancel_status, _) = sim
        .post(&format!("/v1/payment_intents/{id}/cancel"), json!({}))
        .await;
    let deliveries = receiver.wait_for(2, ARRIVAL).await;
    receiver.assert_total(2, QUIET).await;

    assert_eq!(capture_early, 409);
    assert_eq!(authorised["status"], "requires_capture");
    assert_eq!(captured["status"], "succeeded");
    assert_eq!((again_status, &again), (200, &captured));
    assert_eq!(cancel_status, 409);
    assert_event(
        &deliveries[0],
        "payment_intent.amount_capturable_updated",
        &id,
    );
    assert_event(&deliveries[1], "payment_intent.succeeded", &id);
}

#[tokio::test]
async fn cancel_voids_and_a_forced_success_still_arrives() {
    let receiver = Receiver::start().await;
    let sim = Sim::start(Some(&receiver.url)).await;
    let id = sim.create_ok("cancel", json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let held = sim
        .create_ok("held", json!({"capture_method": "manual"}))
        .await["id"]
        .as_str()
        .unwrap()
        .to_owned();

    let (_, canceled) = sim
        .post(&format!("/v1/payment_intents/{id}/cancel"), json!({}))
        .await;
    let (again, _) = sim
        .post(&format!("/v1/payment_intents/{id}/cancel"), json!({}))
        .await;
    let (pay, _) = sim.post(&format!("/checkout/{id}/pay"), json!({})).await;
    let (capture, _) = sim
        .post(&format!("/v1/payment_intents/{id}/capture"), json!({}))
        .await;
    let (_, forced) = sim
        .post(&format!("/control/payment_intents/{id}/succeed"), json!({}))
        .await;
    sim.post(&format!("/checkout/{held}/pay"), json!({})).await;
    let (_, voided) = sim
        .post(&format!("/v1/payment_intents/{held}/cancel"), json!({}))
        .await;
    let deliveries = receiver.wait_for(4, ARRIVAL).await;
    receiver.assert_total(4, QUIET).await;

    assert_eq!(canceled["status"], "canceled");
    assert_eq!((again, pay, capture), (200, 409, 409));
    assert_eq!(forced["status"], "succeeded");
    assert_eq!(voided["status"], "canceled");
    assert_event(&deliveries[0], "payment_intent.canceled", &id);
    assert_event(&deliveries[1], "payment_intent.succeeded", &id);
    assert_event(
        &deliveries[2],
        "payment_intent.amount_capturable_updated",
        &held,
    );
    assert_event(&deliveries[3], "payment_intent.canceled", &held);
}

#[tokio::test]
async fn an_unpaid_intent_expires_when_the_clock_passes_expires_at() {
    let receiver = Receiver::start().await;
    let sim = Sim::start(Some(&receiver.url)).await;
    let short = sim
        .create_ok("short", json!({"expires_in_seconds": 60}))
        .await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let long = sim
        .create_ok("long", json!({"expires_in_seconds": 120}))
        .await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let paid = sim
        .create_ok("paid", json!({"expires_in_seconds": 60}))
        .await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    sim.post(&format!("/checkout/{paid}/pay"), json!({})).await;

    let (status, _) = sim
        .post("/control/clock/advance", json!({"seconds": 61}))
        .await;
    let (_, short_now) = sim.get(&format!("/v1/payment_intents/{short}")).await;
    let (_, long_now) = sim.get(&format!("/v1/payment_intents/{long}")).await;
    let (_, paid_now) = sim.get(&format!("/v1/payment_intents/{paid}")).await;
    let (pay_status, _) = sim.post(&format!("/checkout/{short}/pay"), json!({})).await;
    let (_, forced) = sim
        .post(
            &format!("/control/payment_intents/{short}/succeed"),
            json!({}),
        )
        .await;
    let deliveries = receiver.wait_for(3, ARRIVAL).await;
    receiver.assert_total(3, QUIET).await;

    assert_eq!(status, 200);
    assert_eq!(short_now["status"], "expired");
    assert_eq!(long_now["status"], "requires_payment");
    assert_eq!(paid_now["status"], "succeeded");
    assert_eq!(pay_status, 409);
    assert_eq!(forced["status"], "succeeded");
    assert_event(&deliveries[0], "payment_intent.succeeded", &paid);
    assert_event(&deliveries[1], "payment_intent.expired", &short);
    assert_event(&deliveries[2], "payment_intent.succeeded", &short);
    let (bad, _) = sim
        .post("/control/clock/advance", json!({"seconds": -5}))
        .await;
    assert_eq!(bad, 400);
}
