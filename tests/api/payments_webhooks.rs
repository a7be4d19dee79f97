//! Webhooks sent straight to the gateway with crafted bodies and signatures: only a
//! correctly signed, fresh event whose amount matches the order takes effect.

use flashgate::payments::signature::sign;
use serde_json::{Value, json};

use crate::helpers::{
    PayApp, Reply, SETTLE, SIM_WEBHOOK_SECRET, attempts_of, new_deal, order_status, payment_events,
    payment_snapshot, send, spawn_pay_app, stock,
};

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// A `payment_intent.succeeded` event about the simulator's `intent`, as the simulator would
/// send it after the payer paid.
fn succeeded_event(event_id: &str, intent: &Value) -> Value {
    let mut object = intent.clone();
    object["status"] = json!("succeeded");
    json!({
        "id": event_id,
        "object": "event",
        "type": "payment_intent.succeeded",
        "created": now(),
        "data": { "object": object },
    })
}

async fn post_webhook(app: &PayApp, signature: Option<&str>, body: &[u8]) -> Reply {
    let mut request = app
        .client
        .post(app.url("/v1/webhooks/sim"))
        .header("content-type", "application/json")
        .body(body.to_vec());
    if let Some(signature) = signature {
        request = request.header("Flashgate-Signature", signature);
    }
    send(request).await
}

#[tokio::test(flavor = "multi_thread")]
async fn forged_tampered_and_stale_webhooks_are_refused_and_change_nothing() {
    let app = spawn_pay_app().await;
    let deal = app.given_deal(&new_deal("sig1", 10, 2)).await;
    let alice = app.token("alice");
    let order = app.place_order(&alice, &deal, "k1", 1).await.expect(201);
    let order_id = order["order_id"].as_str().unwrap();
    let intent = app.sim.intent(&crate::helpers::intent_id(&order)).await;
    let body = succeeded_event("evt_crafted_1", &intent).to_string();
    let secret = SIM_WEBHOOK_SECRET.as_bytes();
    let bad_before = app
        .counter("flashgate_webhook_events_total", "result=\"bad_signature\"")
        .await;
    let stale_before = app
        .counter("flashgate_webhook_events_total", "result=\"stale\"")
        .await;
    let before = payment_snapshot(&app.db, &deal).await;

    let tampered = body.replace("\"amount_minor\":1000", "\"amount_minor\":1");
    assert_ne!(tampered, body, "the tampering changed the body");
    let valid_now = sign(secret, now(), body.as_bytes());
    let forged_hex = valid_now.replace("v1=", "v1=00");
    let unauthorised: Vec<(&str, Option<String>, &str)> = vec![
        ("no signature header", None, &body),
        (
            "signed with another secret",
            Some(sign(b"not-the-secret", now(), body.as_bytes())),
            &body,
        ),
        (
            "body changed after signing",
            Some(valid_now.clone()),
            &tampered,
        ),
        ("not a signature", Some("t=abc,v1=zz".to_owned()), &body),
        ("forged digest", Some(forged_hex), &body),
        (
            "timestamp changed after signing",
            Some(valid_now.replacen("t=", "t=1", 1)),
            &body,
        ),
    ];
    for (case, signature, sent) in &unauthorised {
        let reply = post_webhook(&app, signature.as_deref(), sent.as_bytes()).await;
        assert_eq!(reply.status, 401, "{case}: {}", reply.text);
        reply.expect_problem(401, "unauthorized");
    }
    for (case, t) in [("too old", now() - 301), ("too far ahead", now() + 600)] {
        let reply = post_webhook(
            &app,
            Some(&sign(secret, t, body.as_bytes())),
            body.as_bytes(),
        )
        .await;
        assert_eq!(reply.status, 400, "{case}: {}", reply.text);
        reply.expect_problem(400, "invalid-request");
    }

    assert_eq!(payment_snapshot(&app.db, &deal).await, before);
    assert_eq!(order_status(&app.db, order_id).await, "PENDING_PAYMENT");
    let bad_after = app
        .counter("flashgate_webhook_events_total", "result=\"bad_signature\"")
        .await;
    let stale_after = app
        .counter("flashgate_webhook_events_total", "result=\"stale\"")
        .await;
    assert!(bad_after - bad_before >= 6.0, "{bad_before} -> {bad_after}");
    assert!(
        stale_after - stale_before >= 2.0,
        "{stale_before} -> {stale_after}"
    );

    // The baseline: the very same body, correctly signed now, is accepted and pays the
    // order, so the refusals above were about the signatures alone.
    let accepted = post_webhook(&app, Some(&valid_now), body.as_bytes()).await;
    let answer = accepted.expect(200);
    assert_eq!(answer["duplicate"], false, "{answer}");
    assert_eq!(answer["outcome"], "paid", "{answer}");
    assert_eq!(order_status(&app.db, order_id).await, "PAID");
    assert_eq!(stock(&app.db, &deal).await, (9, 0, 1));
    let replayed = post_webhook(&app, Some(&valid_now), body.as_bytes()).await;
    assert_eq!(replayed.expect(200)["duplicate"], true);
    assert_eq!(payment_events(&app.db).await.len(), 1);
    app.assert_invariants(&deal).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_signed_event_whose_amount_differs_from_the_order_is_refused_and_counted() {
    let app = spawn_pay_app().await;
    let deal = app.given_deal(&new_deal("amt1", 10, 2)).await;
    let alice = app.token("alice");
    let order = app.place_order(&alice, &deal, "k1", 2).await.expect(201);
    let order_id = order["order_id"].as_str().unwrap();
    let intent_id = crate::helpers::intent_id(&order);
    let intent = app.sim.intent(&intent_id).await;
    assert_eq!(intent["amount_minor"], 2000);
    let webhook_before = app
        .counter("flashgate_webhook_events_total", "result=\"mismatch\"")
        .await;
    let outcome_before = app
        .counter("flashgate_payment_outcomes_total", "outcome=\"mismatch\"")
        .await;
    let before = payment_snapshot(&app.db, &deal).await;

    let mut cheaper = succeeded_event("evt_mismatch_amount", &intent);
    cheaper["data"]["object"]["amount_minor"] = json!(1);
    let mut other_currency = succeeded_event("evt_mismatch_currency", &intent);
    other_currency["data"]["object"]["currency"] = json!("USD");
    for event in [&cheaper, &other_currency] {
        let body = event.to_string();
        let signature = sign(SIM_WEBHOOK_SECRET.as_bytes(), now(), body.as_bytes());
        let reply = post_webhook(&app, Some(&signature), body.as_bytes()).await;
        assert_eq!(reply.status, 422, "{event}: {}", reply.text);
    }

    assert_eq!(payment_snapshot(&app.db, &deal).await, before);
    assert_eq!(order_status(&app.db, order_id).await, "PENDING_PAYMENT");
    assert!(payment_events(&app.db).await.is_empty());
    let webhook_after = app
        .counter("flashgate_webhook_events_total", "result=\"mismatch\"")
        .await;
    let outcome_after = app
        .counter("flashgate_payment_outcomes_total", "outcome=\"mismatch\"")
        .await;
    assert!(
        webhook_after - webhook_before >= 2.0,
        "webhook mismatches {webhook_before} -> {webhook_after}"
    );
    assert!(
        outcome_after - outcome_before >= 2.0,
        "payment mismatches {outcome_before} -> {outcome_after}"
    );

    // The order is not poisoned: the genuine payment still goes through.
    assert_eq!(app.sim.pay(&intent_id).await.0, 200);
    app.wait_for_order(&alice, order_id, &["PAID"], SETTLE)
        .await;
    let attempts = attempts_of(&app.db, order_id).await;
    assert!(attempts[0].accepted && attempts[0].status == "SUCCEEDED");
    assert_eq!(stock(&app.db, &deal).await, (8, 0, 2));
    app.assert_invariants(&deal).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_event_for_an_attempt_whose_order_is_missing_is_refused_and_changes_nothing() {
    let app = spawn_pay_app().await;
    let deal = app.given_deal(&new_deal("orphan1", 10, 2)).await;
    let alice = app.token("alice");
    let order = app.place_order(&alice, &deal, "k1", 1).await.expect(201);
    let order_id = order["order_id"].as_str().unwrap();
    let intent = app.sim.intent(&crate::helpers::intent_id(&order)).await;
    // No code path detaches an attempt from its order; the test forges that broken
    // invariant to show a settlement never applies to an order that is not there.
    let detached = sqlx::query(
        "UPDATE payment_attempts SET order_id = gen_random_uuid() WHERE order_id = $1::uuid",
    )
    .bind(order_id)
    .execute(&app.db)
    .await
    .unwrap();
    assert_eq!(detached.rows_affected(), 1);
    let before = payment_snapshot(&app.db, &deal).await;

    let body = succeeded_event("evt_orphan_1", &intent).to_string();
    let signature = sign(SIM_WEBHOOK_SECRET.as_bytes(), now(), body.as_bytes());
    let reply = post_webhook(&app, Some(&signature), body.as_bytes()).await;
    assert!(
        (500..600).contains(&reply.status),
        "the provider is told to retry: {} {}",
        reply.status,
        reply.text
    );

    assert_eq!(payment_snapshot(&app.db, &deal).await, before);
    assert!(payment_events(&app.db).await.is_empty());
    assert_eq!(order_status(&app.db, order_id).await, "PENDING_PAYMENT");
    assert_eq!(stock(&app.db, &deal).await, (9, 1, 0));
    // The gateway is still serving, and the audit names the attempt.
    let other = app.place_order(&app.token("bob"), &deal, "k1", 1).await;
    other.expect(201);
    let audit = app
        .client
        .get(app.url("/admin/audit"))
        .bearer_auth(&app.admin_token);
    let report = send(audit).await.expect(200);
    let findings = report["findings"].as_array().unwrap();
    let orphans: Vec<&Value> = findings
        .iter()
        .filter(|f| f["check"] == "attempt_order")
        .collect();
    assert_eq!(orphans.len(), 1, "{report}");
    assert_eq!(orphans[0]["deal_id"], "");
    assert!(
        orphans[0]["detail"]
            .as_str()
            .unwrap()
            .contains("does not exist"),
        "{report}"
    );
    app.cleanup().await;
}
