//! The provider's API misbehaving: a create call that times out is an unknown outcome,
//! never a failure, and repeating it must not charge twice.

use std::time::Duration;

use serde_json::json;

use crate::helpers::{
    SETTLE, attempts_of, holds_for, new_deal, pace, spawn_pay_app_with, stock, wait_until,
};

#[tokio::test(flavor = "multi_thread")]
async fn a_timed_out_create_is_repeated_with_the_same_key_and_makes_one_payment() {
    let app = spawn_pay_app_with(|s| {
        s.payments.request_timeout_ms = 300;
        s.payments.retries_max = 2;
    })
    .await;
    // The default five-minute reservation: longer than the shortest provider session.
    let deal = app.given_deal(&new_deal("slow1", 10, 2)).await;
    let alice = app.token("alice");
    // Every create takes effect at the provider but answers after the gateway gave up.
    app.sim.faults(json!({"api_delay_ms": 1000})).await;

    let first = app.place_order(&alice, &deal, "k-slow", 1).await;
    let order = first.expect(201);
    let order_id = order["order_id"].as_str().unwrap().to_owned();
    assert_eq!(order["status"], "PENDING_PAYMENT");
    assert!(
        order["payment"]["checkout_url"].is_null(),
        "no answer from the provider yet: {order}"
    );
    let intents = app.sim.intents().await;
    assert_eq!(intents.len(), 1, "one intent for one attempt: {intents:#?}");
    let attempt_id = order["payment"]["attempt_id"].as_str().unwrap();
    assert_eq!(intents[0]["reference"], attempt_id);

    // The provider recovers; the client retries the same order request a bit later (its
    // pause, while the creates the gateway gave up on still answer, is part of the case).
    app.sim.reset_faults().await;
    pace(Duration::from_millis(1_500)).await;
    let retried = app.place_order(&alice, &deal, "k-slow", 1).await;
    assert_eq!(retried.header("idempotent-replayed"), Some("true"));
    let retried = retried.expect(201);
    assert_eq!(retried["order_id"], order["order_id"]);
    assert_eq!(
        retried["payment"]["attempt_id"],
        order["payment"]["attempt_id"]
    );
    let intent_id = crate::helpers::intent_id(&retried);
    assert_eq!(
        intents[0]["id"], intent_id,
        "the retry found the same payment"
    );
    let intents = app.sim.intents().await;
    assert_eq!(intents.len(), 1, "no second charge: {intents:#?}");

    assert_eq!(app.sim.pay(&intent_id).await.0, 200);
    app.wait_for_order(&alice, &order_id, &["PAID"], SETTLE)
        .await;
    let attempts = attempts_of(&app.db, &order_id).await;
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    assert_eq!(
        attempts[0].provider_payment_id.as_deref(),
        Some(intent_id.as_str())
    );
    assert!(attempts[0].accepted);
    assert_eq!(app.sim.intents().await.len(), 1);
    assert_eq!(stock(&app.db, &deal).await, (9, 0, 1));
    app.assert_invariants(&deal).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_order_whose_create_was_lost_waits_for_the_provider_then_expires_with_its_session_closed()
 {
    let app = spawn_pay_app_with(|s| {
        s.payments.request_timeout_ms = 300;
        s.payments.retries_max = 1;
    })
    .await;
    let mut deal = new_deal("slow2", 5, 2);
    deal["reservation_ttl_seconds"] = json!(1);
    let deal = app.given_deal(&deal).await;
    let alice = app.token("alice");
    app.sim.faults(json!({"api_delay_ms": 1000})).await;

    let order = app
        .place_order(&alice, &deal, "k-lost", 1)
        .await
        .expect(201);
    let order_id = order["order_id"].as_str().unwrap().to_owned();
    assert!(order["payment"]["checkout_url"].is_null(), "{order}");

    // Past its expiry (on PostgreSQL's clock), but the provider cannot say whether it was
    // paid: through the sweeper's checks (100 ms apart) the order waits.
    wait_until("the reservation to run out", SETTLE, || async {
        sqlx::query_scalar::<_, bool>("SELECT expires_at < now() FROM orders WHERE id::text = $1")
            .bind(&order_id)
            .fetch_one(&app.db)
            .await
            .unwrap()
    })
    .await;
    holds_for(
        "the order waits for the provider",
        Duration::from_millis(1_000),
        || async {
            let waiting = app.get_order(&alice, &order_id).await.expect(200);
            waiting["status"] == "PENDING_PAYMENT" && stock(&app.db, &deal).await == (4, 1, 0)
        },
    )
    .await;

    // The provider answers again: the gateway finds the payment its lost create made,
    // closes it, and only then lets the reservation go.
    app.sim.reset_faults().await;
    app.wait_for_order(&alice, &order_id, &["EXPIRED"], SETTLE)
        .await;
    let intents = app.sim.intents().await;
    assert_eq!(intents.len(), 1, "no second payment: {intents:#?}");
    assert_eq!(intents[0]["status"], "canceled", "{intents:#?}");
    assert_eq!(
        intents[0]["reference"], order["payment"]["attempt_id"],
        "{intents:#?}"
    );
    let attempts = attempts_of(&app.db, &order_id).await;
    assert_eq!(attempts.len(), 1);
    // The attempt ends with the order: expired by the sweeper, or failed by the provider's
    // cancellation of its session when that webhook is recorded first.
    assert!(
        ["EXPIRED", "FAILED"].contains(&attempts[0].status.as_str()),
        "{attempts:?}"
    );
    assert_eq!(
        attempts[0].provider_payment_id.as_deref(),
        intents[0]["id"].as_str()
    );
    assert_eq!(stock(&app.db, &deal).await, (5, 0, 0), "units released");
    app.assert_invariants(&deal).await;
    app.cleanup().await;
}
