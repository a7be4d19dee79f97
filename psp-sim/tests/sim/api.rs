//! Authentication, idempotent creation and bad input.

use reqwest::Method;
use serde_json::json;

use crate::helpers::{Sim, status_json};

#[tokio::test]
async fn create_replays_the_same_key_and_body_and_refuses_a_different_body() {
    let sim = Sim::start(None).await;
    let body = json!({
        "amount_minor": 4999, "currency": "EUR", "reference": "order-1",
        "capture_method": "manual", "expires_in_seconds": 600, "metadata": {"order_id": "o-1"}
    });

    let first = sim.create("key-1", body.clone()).await;
    assert_eq!(first.status(), 200);
    assert!(first.headers().get("idempotent-replayed").is_none());
    let first: serde_json::Value = first.json().await.unwrap();
    let replay = sim.create("key-1", body.clone()).await;
    assert_eq!(replay.status(), 200);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    let replay: serde_json::Value = replay.json().await.unwrap();
    let mut changed = body.clone();
    changed["amount_minor"] = json!(5000);
    let (conflict_status, conflict) = status_json(sim.create("key-1", changed).await).await;

    let id = first["id"].as_str().unwrap();
    assert!(id.starts_with("pi_") && id.len() == 35, "{id}");
    assert_eq!(replay, first);
    assert_eq!(first["object"], "payment_intent");
    assert_eq!(first["status"], "requires_payment");
    assert_eq!(first["amount_minor"], 4999);
    assert_eq!(first["currency"], "EUR");
    assert_eq!(first["reference"], "order-1");
    assert_eq!(first["capture_method"], "manual");
    assert_eq!(first["amount_refunded_minor"], 0);
    assert_eq!(first["metadata"], json!({"order_id": "o-1"}));
    assert_eq!(first["checkout_url"], sim.url(&format!("/checkout/{id}")));
    let created = first["created"].as_i64().unwrap();
    assert_eq!(first["expires_at"].as_i64().unwrap(), created + 600);
    assert_eq!(conflict_status, 409);
    assert_eq!(conflict["error"]["type"], "idempotency_conflict");
    let (_, all) = sim.get("/control/payment_intents").await;
    assert_eq!(all["data"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn defaults_apply_and_keys_are_independent() {
    let sim = Sim::start(None).await;
    let a = sim.create_ok("a", json!({})).await;
    let b = sim.create_ok("b", json!({})).await;
    assert_ne!(a["id"], b["id"]);
    assert_eq!(a["capture_method"], "automatic");
    assert_eq!(a["metadata"], json!({}));
    let ttl = a["expires_at"].as_i64().unwrap() - a["created"].as_i64().unwrap();
    assert_eq!(ttl, 900);
    let (status, got) = sim
        .get(&format!(
            "/v1/payment_intents/{}",
            a["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(status, 200);
    assert_eq!(got, a);
}

#[tokio::test]
async fn api_calls_need_the_bearer_key() {
    let sim = Sim::start(None).await;
    let body = json!({"amount_minor": 100, "currency": "EUR", "reference": "r"});
    for auth in [
        None,
        Some("Bearer wrong"),
        Some("test-api-key"),
        Some("Basic dGVzdA=="),
    ] {
        let mut request = sim
            .http
            .post(sim.url("/v1/payment_intents"))
            .header("Idempotency-Key", "k")
            .json(&body);
        if let Some(auth) = auth {
            request = request.header("Authorization", auth);
        }
        let (status, error) = status_json(request.send().await.unwrap()).await;
        assert_eq!(status, 401, "{auth:?}");
        assert_eq!(error["error"]["type"], "authentication_error");
    }
    let (status, _) = status_json(
        sim.http
            .get(sim.url("/v1/payment_intents/pi_x"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 401);
    let (_, all) = sim.get("/control/payment_intents").await;
    assert_eq!(all["data"], json!([]));
}

#[tokio::test]
async fn bad_input_is_a_4xx_json_error() {
    let sim = Sim::start(None).await;
    let no_key = sim
        .api(Method::POST, "/v1/payment_intents")
        .json(&json!({"amount_minor": 100, "currency": "EUR", "reference": "r"}))
        .send()
        .await
        .unwrap();
    let (status, error) = status_json(no_key).await;
    assert_eq!(status, 400);
    assert_eq!(error["error"]["type"], "invalid_request");

    let bad_bodies = [
        json!({"amount_minor": -1, "currency": "EUR", "reference": "r"}),
        json!({"amount_minor": "100", "currency": "EUR", "reference": "r"}),
        json!({"amount_minor": 100, "currency": "EURO", "reference": "r"}),
        json!({"amount_minor": 100, "currency": "EUR"}),
        json!({"amount_minor": 100, "currency": "EUR", "reference": "r", "expires_in_seconds": 86401}),
        json!({"amount_minor": 100, "currency": "EUR", "reference": "r", "metadata": [1]}),
        json!("not an object"),
    ];
    for (n, body) in bad_bodies.into_iter().enumerate() {
        let (status, error) =
            status_json(sim.create(&format!("bad-{n}"), body.clone()).await).await;
        assert_eq!(status, 400, "{body}");
        assert_eq!(error["error"]["type"], "invalid_request", "{body}");
        assert!(error["error"]["message"].is_string());
    }
    let not_json = sim
        .api(Method::POST, "/v1/payment_intents")
        .header("Idempotency-Key", "garbage")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(not_json.status(), 400);
    let huge = sim
        .api(Method::POST, "/v1/payment_intents")
        .header("Idempotency-Key", "huge")
        .body(vec![b' '; 100_000])
        .send()
        .await;
    // The server answers before reading the whole body, so the client may see the
    // connection reset instead of the 413.
    if let Ok(huge) = huge {
        assert_eq!(huge.status(), 413);
    }

    let (status, error) = sim.get("/v1/payment_intents/pi_unknown").await;
    assert_eq!(
        (status, &error["error"]["type"]),
        (404, &json!("not_found"))
    );
    let (status, _) = sim.get("/v1/refunds/re_unknown").await;
    assert_eq!(status, 404);
    let (status, _) = sim.post("/checkout/pi_unknown/pay", json!({})).await;
    assert_eq!(status, 404);
    let (status, _) = sim.get("/nowhere").await;
    assert_eq!(status, 404);
    let (status, error) = sim.get("/v1/refunds").await;
    assert_eq!(
        (status, &error["error"]["type"]),
        (405, &json!("method_not_allowed"))
    );
    let (status, health) = sim.get("/healthz").await;
    assert_eq!((status, health), (200, json!({"status": "ok"})));
}
