//! Refunds: idempotent, bounded by what was paid, announced by `charge.refunded`.

use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::{ARRIVAL, QUIET, Receiver, Sim, assert_event, status_json};

async fn refund(sim: &Sim, key: &str, body: Value) -> reqwest::Response {
    sim.api(Method::POST, "/v1/refunds")
        .header("Idempotency-Key", key)
        .json(&body)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn refunds_are_idempotent_and_never_exceed_the_payment() {
    let receiver = Receiver::start().await;
    let sim = Sim::start(Some(&receiver.url)).await;
    let id = sim.create_ok("refund-me", json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (unpaid_status, unpaid) =
        status_json(refund(&sim, "early", json!({"payment_intent": id})).await).await;
    sim.post(&format!("/checkout/{id}/pay"), json!({})).await;

    let partial_body = json!({"payment_intent": id, "amount_minor": 1000});
    let first = refund(&sim, "r-1", partial_body.clone()).await;
    assert_eq!(first.status(), 200);
    let first: Value = first.json().await.unwrap();
    let replay = refund(&sim, "r-1", partial_body).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    let replay: Value = replay.json().await.unwrap();
    let (conflict, conflict_error) = status_json(
        refund(
            &sim,
            "r-1",
            json!({"payment_intent": id, "amount_minor": 999}),
        )
        .await,
    )
    .await;
    let (over, over_error) = status_json(
        refund(
            &sim,
            "r-2",
            json!({"payment_intent": id, "amount_minor": 4000}),
        )
        .await,
    )
    .await;
    let (_, rest) = status_json(refund(&sim, "r-3", json!({"payment_intent": id})).await).await;
    let (nothing_left, _) =
        status_json(refund(&sim, "r-4", json!({"payment_intent": id})).await).await;
    let no_key = sim
        .api(Method::POST, "/v1/refunds")
        .json(&json!({"payment_intent": id}))
        .send()
        .await
        .unwrap();
    let (unknown, _) =
        status_json(refund(&sim, "r-5", json!({"payment_intent": "pi_nope"})).await).await;
    let deliveries = receiver.wait_for(3, ARRIVAL).await;
    receiver.assert_total(3, QUIET).await;

    assert_eq!(unpaid_status, 409);
    assert_eq!(unpaid["error"]["type"], "invalid_state");
    assert!(first["id"].as_str().unwrap().starts_with("re_"));
    assert_eq!(first["object"], "refund");
    assert_eq!(first["payment_intent"], id.as_str());
    assert_eq!(first["amount_minor"], 1000);
    assert_eq!(first["status"], "succeeded");
    assert!(first["created"].is_i64());
    assert_eq!(replay, first);
    assert_eq!(
        (conflict, &conflict_error["error"]["type"]),
        (409, &json!("idempotency_conflict"))
    );
    assert_eq!(over, 409);
    assert_eq!(over_error["error"]["type"], "refund_exceeds_amount");
    assert_eq!(rest["amount_minor"], 3999);
    assert_eq!(nothing_left, 409);
    assert_eq!(no_key.status(), 400);
    assert_eq!(unknown, 404);

    let (_, intent) = sim.get(&format!("/v1/payment_intents/{id}")).await;
    assert_eq!(intent["amount_refunded_minor"], 4999);
    assert_eq!(intent["status"], "succeeded");
    let (_, list) = sim.get(&format!("/v1/payment_intents/{id}/refunds")).await;
    assert_eq!(list["data"], json!([first, rest]));
    let (status, fetched) = sim
        .get(&format!("/v1/refunds/{}", first["id"].as_str().unwrap()))
        .await;
    assert_eq!((status, fetched), (200, first.clone()));
    assert_event(&deliveries[0], "payment_intent.succeeded", &id);
    assert_event(
        &deliveries[1],
        "charge.refunded",
        first["id"].as_str().unwrap(),
    );
    assert_eq!(deliveries[1].event["data"]["object"], first);
    assert_event(
        &deliveries[2],
        "charge.refunded",
        rest["id"].as_str().unwrap(),
    );
}
