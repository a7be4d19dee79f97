//! Payments end to end through the real simulator: the payer pays or declines at the hosted
//! checkout, the simulator sends signed webhooks, and the order and its units follow.

use serde_json::json;

use crate::helpers::{
    SETTLE, attempts_of, new_deal, order_status, payment_events, refunds, send, spawn_pay_app,
    stock, unique_suffix, wait_until,
};

#[tokio::test(flavor = "multi_thread")]
async fn paying_at_the_checkout_makes_the_order_paid_and_sells_its_units() {
    let app = spawn_pay_app().await;
    let deal = app.given_deal(&new_deal("pay1", 10, 2)).await;
    let alice = app.token("alice");

    let order = app.place_order(&alice, &deal, "k1", 2).await.expect(201);
    let order_id = order["order_id"].as_str().unwrap();
    assert_eq!(order["status"], "PENDING_PAYMENT");
    let intent_id = crate::helpers::intent_id(&order);
    let intent = app.sim.intent(&intent_id).await;
    assert_eq!(intent["status"], "requires_payment", "{intent}");
    assert_eq!(intent["amount_minor"], json!(2000), "{intent}");
    assert_eq!(intent["currency"], "EUR");
    assert_eq!(intent["reference"], order["payment"]["attempt_id"]);
    assert_eq!(stock(&app.db, &deal).await, (8, 2, 0));

    let (status, paid) = app.sim.pay(&intent_id).await;
    assert_eq!(status, 200, "{paid}");
    assert_eq!(paid["status"], "succeeded");

    let body = app
        .wait_for_order(&alice, order_id, &["PAID"], SETTLE)
        .await;
    assert_eq!(body["quantity"], 2);
    assert_eq!(order_status(&app.db, order_id).await, "PAID");
    assert_eq!(stock(&app.db, &deal).await, (8, 0, 2), "units sold");
    let attempts = attempts_of(&app.db, order_id).await;
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    assert_eq!(attempts[0].status, "SUCCEEDED");
    assert!(attempts[0].accepted);
    assert_eq!(
        attempts[0].provider_payment_id.as_deref(),
        Some(intent_id.as_str())
    );
    let events = payment_events(&app.db).await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].1, "payment_intent.succeeded");
    assert_eq!(events[0].2, "paid");
    assert!(refunds(&app.db).await.is_empty());
    let inventory = app.inventory(&deal).await;
    assert_eq!(inventory["sold"], 2, "{inventory}");
    assert_eq!(inventory["reserved"], 0, "{inventory}");
    app.assert_invariants(&deal).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn declining_at_the_checkout_cancels_the_order_and_releases_its_units() {
    let app = spawn_pay_app().await;
    let deal = app.given_deal(&new_deal("dec1", 10, 2)).await;
    let alice = app.token("alice");

    let order = app.place_order(&alice, &deal, "k1", 2).await.expect(201);
    let order_id = order["order_id"].as_str().unwrap();
    let intent_id = crate::helpers::intent_id(&order);
    assert_eq!(stock(&app.db, &deal).await, (8, 2, 0));

    let (status, declined) = app.sim.decline(&intent_id).await;
    assert_eq!(status, 200, "{declined}");
    assert_eq!(declined["status"], "failed");

    app.wait_for_order(&alice, order_id, &["CANCELLED"], SETTLE)
        .await;
    assert_eq!(stock(&app.db, &deal).await, (10, 0, 0), "units released");
    let attempts = attempts_of(&app.db, order_id).await;
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].status, "FAILED");
    assert!(!attempts[0].accepted);
    app.assert_invariants(&deal).await;

    // The per-user counter was given back too: alice may take her two units again.
    let again = app.place_order(&alice, &deal, "k2", 2).await.expect(201);
    assert_eq!(again["status"], "PENDING_PAYMENT");
    assert_eq!(stock(&app.db, &deal).await, (8, 2, 0));
    app.assert_invariants(&deal).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn webhooks_delivered_three_times_and_out_of_order_take_effect_once() {
    let app = spawn_pay_app().await;
    let deal = app.given_deal(&new_deal("dup1", 10, 2)).await;
    let (alice, bob) = (app.token("alice"), app.token("bob"));
    let duplicates_before = app
        .counter("flashgate_webhook_events_total", "result=\"duplicate\"")
        .await;

    // Alice's order has two attempts: the second is declined, the first paid. Bob declines.
    let a = app.place_order(&alice, &deal, "ka", 2).await.expect(201);
    let a_id = a["order_id"].as_str().unwrap();
    let second = send(
        app.client
            .post(app.url(&format!("/v1/orders/{a_id}/payments")))
            .bearer_auth(&alice)
            .header("Idempotency-Key", "second-try"),
    )
    .await
    .expect(201);
    let b = app.place_order(&bob, &deal, "kb", 1).await.expect(201);
    let b_id = b["order_id"].as_str().unwrap();

    app.sim
        .faults(json!({"webhook_duplicates": 2, "webhook_reorder": true}))
        .await;
    let (first_intent, second_intent) = (
        crate::helpers::intent_id(&a),
        crate::helpers::intent_id(&second),
    );
    assert_ne!(first_intent, second_intent);
    assert_eq!(app.sim.decline(&second_intent).await.0, 200);
    assert_eq!(app.sim.pay(&first_intent).await.0, 200);
    assert_eq!(app.sim.decline(&crate::helpers::intent_id(&b)).await.0, 200);
    app.sim.flush_webhooks().await;

    app.wait_for_order(&alice, a_id, &["PAID"], SETTLE).await;
    app.wait_for_order(&bob, b_id, &["CANCELLED"], SETTLE).await;
    // Every copy of every event has been answered 2xx before the books are checked.
    let events = wait_until("every copy to be accepted", SETTLE, || async {
        let events = app.sim.events().await;
        if events.iter().all(|e| e["successful_deliveries"] == 3) {
            Ok(events)
        } else {
            Err(format!("{events:#?}"))
        }
    })
    .await;
    assert_eq!(events.len(), 3, "{events:#?}");

    let consumed = payment_events(&app.db).await;
    assert_eq!(consumed.len(), 3, "one row per event: {consumed:?}");
    let mut sent: Vec<String> = events
        .iter()
        .map(|e| e["event"]["id"].as_str().unwrap().to_owned())
        .collect();
    let mut stored: Vec<String> = consumed.iter().map(|(id, _, _)| id.clone()).collect();
    sent.sort();
    stored.sort();
    assert_eq!(sent, stored);

    assert_eq!(order_status(&app.db, a_id).await, "PAID");
    assert_eq!(order_status(&app.db, b_id).await, "CANCELLED");
    let attempts = attempts_of(&app.db, a_id).await;
    let by_intent = |id: &str| {
        attempts
            .iter()
            .find(|a| a.provider_payment_id.as_deref() == Some(id))
            .unwrap_or_else(|| panic!("no attempt for {id}: {attempts:?}"))
    };
    assert_eq!(by_intent(&first_intent).status, "SUCCEEDED");
    assert!(by_intent(&first_intent).accepted);
    assert_eq!(by_intent(&second_intent).status, "FAILED");
    assert!(!by_intent(&second_intent).accepted);
    assert!(refunds(&app.db).await.is_empty(), "nothing to refund");
    assert_eq!(stock(&app.db, &deal).await, (8, 0, 2), "sold == quantity");
    let duplicates_after = app
        .counter("flashgate_webhook_events_total", "result=\"duplicate\"")
        .await;
    assert!(
        duplicates_after - duplicates_before >= 6.0,
        "six copies were duplicates: {duplicates_before} -> {duplicates_after}"
    );
    app.assert_invariants(&deal).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_successful_attempt_is_refunded_and_the_order_paid_once() {
    let app = spawn_pay_app().await;
    let deal = app.given_deal(&new_deal("two1", 10, 2)).await;
    let alice = app.token("alice");

    let order = app.place_order(&alice, &deal, "k1", 1).await.expect(201);
    let order_id = order["order_id"].as_str().unwrap();
    let key = format!("again-{}", unique_suffix());
    let start = || {
        send(
            app.client
                .post(app.url(&format!("/v1/orders/{order_id}/payments")))
                .bearer_auth(&alice)
                .header("Idempotency-Key", &key),
        )
    };
    let second = start().await;
    let second_body = second.expect(201);
    let replay = start().await;
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(replay.expect(201)["attempt_id"], second_body["attempt_id"]);
    let (first_intent, second_intent) = (
        crate::helpers::intent_id(&order),
        crate::helpers::intent_id(&second_body),
    );
    assert_ne!(first_intent, second_intent);

    // Both paid back to back, as a buyer with two tabs does: once the order is PAID the
    // gateway closes its other open sessions, so the second must be paid before that.
    assert_eq!(app.sim.pay(&first_intent).await.0, 200);
    assert_eq!(app.sim.pay(&second_intent).await.0, 200);
    app.wait_for_order(&alice, order_id, &["PAID"], SETTLE)
        .await;

    app.wait_db("the second payment refunded", SETTLE, |db| async move {
        refunds(&db).await.iter().any(|r| r.status == "SUCCEEDED")
    })
    .await;
    let refunded = app.sim.refunds_of(&second_intent).await;
    assert_eq!(refunded.len(), 1, "{refunded:?}");
    assert_eq!(refunded[0]["amount_minor"], 1000);
    assert_eq!(
        app.sim.intent(&second_intent).await["amount_refunded_minor"],
        1000
    );
    assert!(app.sim.refunds_of(&first_intent).await.is_empty());
    assert_eq!(
        app.sim.intent(&first_intent).await["amount_refunded_minor"],
        0
    );

    let rows = refunds(&app.db).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].status, "SUCCEEDED");
    assert_eq!(rows[0].amount_minor, 1000);
    assert_eq!(
        rows[0].provider_refund_id.as_deref(),
        refunded[0]["id"].as_str()
    );
    let attempts = attempts_of(&app.db, order_id).await;
    assert_eq!(attempts.len(), 2);
    assert_eq!(rows[0].attempt_id, attempts[1].id);
    assert!(attempts.iter().all(|a| a.status == "SUCCEEDED"));
    assert_eq!(
        attempts.iter().filter(|a| a.accepted).count(),
        1,
        "{attempts:?}"
    );
    assert!(attempts[0].accepted, "the first payment paid the order");
    assert_eq!(order_status(&app.db, order_id).await, "PAID");
    assert_eq!(stock(&app.db, &deal).await, (9, 0, 1), "sold once");
    // A paid order takes no further attempts.
    send(
        app.client
            .post(app.url(&format!("/v1/orders/{order_id}/payments")))
            .bearer_auth(&alice)
            .header("Idempotency-Key", "third"),
    )
    .await
    .expect(409);
    app.assert_invariants(&deal).await;
    app.cleanup().await;
}
