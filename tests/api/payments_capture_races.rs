//! A capture waiting for its retry must not take money for an order cancelled meanwhile:
//! the capture re-checks its order, and capture and void of one payment never race.

use std::time::Duration;

use serde_json::json;

use crate::helpers::{SETTLE, attempts_of, intent_id, new_deal, refunds, spawn_pay_app, stock};

#[tokio::test(flavor = "multi_thread")]
async fn a_cancelled_manual_capture_order_is_voided_not_captured_when_the_provider_heals() {
    let app = spawn_pay_app().await;
    let mut deal = new_deal("capture-cancel", 3, 1);
    deal["capture_method"] = json!("manual");
    let deal = app.given_deal(&deal).await;
    let alice = app.token("alice");
    let order = app.place_order(&alice, &deal, "k1", 1).await.expect(201);
    let order_id = order["order_id"].as_str().unwrap().to_owned();
    let intent = intent_id(&order);

    // The provider's API fails; the payer authorises at the checkout, so the capture is
    // queued and fails, waiting in the outbox for its retry.
    app.sim.faults(json!({"api_fail_status": 503})).await;
    assert_eq!(app.sim.pay(&intent).await.0, 200);
    app.wait_db("capture failed once", SETTLE, |db| async move {
        sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT 1 FROM outbox WHERE kind = 'capture' AND last_error IS NOT NULL)",
        )
        .fetch_one(&db)
        .await
        .unwrap()
    })
    .await;

    // The buyer cancels; the void that queues fails too, so it is due after the capture's
    // retry. Then the provider heals.
    let cancelled = app.cancel_order(&alice, &order_id).await.expect(200);
    assert_eq!(cancelled["status"], "CANCELLED");
    assert_eq!(stock(&app.db, &deal).await, (3, 0, 0));
    app.wait_db("void failed once", SETTLE, |db| async move {
        sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT 1 FROM outbox WHERE kind = 'void' AND last_error IS NOT NULL)",
        )
        .fetch_one(&db)
        .await
        .unwrap()
    })
    .await;
    app.sim.reset_faults().await;

    // Every queued side effect runs; the authorisation ends voided, the order cancelled.
    app.wait_db("outbox drained", Duration::from_secs(20), |db| async move {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM outbox WHERE done_at IS NULL")
            .fetch_one(&db)
            .await
            .unwrap()
            == 0
    })
    .await;
    assert_eq!(app.sim.intent(&intent).await["status"], "canceled");
    let order = app.get_order(&alice, &order_id).await.expect(200);
    assert_eq!(order["status"], "CANCELLED", "{order}");
    assert_eq!(
        stock(&app.db, &deal).await,
        (3, 0, 0),
        "no unit taken again"
    );
    let attempts = attempts_of(&app.db, &order_id).await;
    assert!(
        attempts
            .iter()
            .all(|a| !a.accepted && a.status != "SUCCEEDED"),
        "{attempts:?}"
    );
    assert!(refunds(&app.db).await.is_empty());
    app.assert_invariants(&deal).await;
    app.cleanup().await;
}
