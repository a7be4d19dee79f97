//! Money is taken only when the provider's amount and currency are the order's: ISO codes
//! compare without regard to case, and a payment the provider holds for another amount is
//! voided (never captured) or refunded, with the order's units released.

use serde_json::json;

use crate::helpers::{
    PayApp, SETTLE, attempts_of, intent_id, new_deal, refunds, spawn_pay_app, stock,
};

async fn amend(app: &PayApp, intent: &str, change: serde_json::Value) {
    let (status, body) = app
        .sim
        .post(&format!("/control/payment_intents/{intent}/amend"), change)
        .await;
    assert_eq!(status, 200, "amend {intent}: {body}");
}

async fn mismatches(app: &PayApp) -> f64 {
    app.counter("flashgate_payment_mismatches_total", "").await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_currency_spelt_in_lower_case_by_the_provider_still_pays_the_order() {
    let app = spawn_pay_app().await;
    let deal = app.given_deal(&new_deal("case1", 5, 1)).await;
    let alice = app.token("alice");
    let order = app.place_order(&alice, &deal, "k1", 1).await.expect(201);
    let order_id = order["order_id"].as_str().unwrap();
    let intent = intent_id(&order);
    amend(&app, &intent, json!({"currency": "eur"})).await;

    assert_eq!(app.sim.pay(&intent).await.0, 200);

    app.wait_for_order(&alice, order_id, &["PAID"], SETTLE)
        .await;
    assert_eq!(stock(&app.db, &deal).await, (4, 0, 1));
    app.assert_invariants(&deal).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_overdue_authorisation_for_another_amount_is_voided_not_captured() {
    let app = spawn_pay_app().await;
    let mut deal = new_deal("amount-manual", 5, 1);
    deal["reservation_ttl_seconds"] = json!(1);
    deal["capture_method"] = json!("manual");
    let deal = app.given_deal(&deal).await;
    let alice = app.token("alice");
    let order = app.place_order(&alice, &deal, "k1", 1).await.expect(201);
    let order_id = order["order_id"].as_str().unwrap();
    let intent = intent_id(&order);
    let before = mismatches(&app).await;
    // The provider holds the authorisation for 1 cent instead of 10 EUR.
    amend(&app, &intent, json!({"amount_minor": 1})).await;
    assert_eq!(app.sim.pay(&intent).await.0, 200);
    assert_eq!(app.sim.intent(&intent).await["status"], "requires_capture");

    let settled = app
        .wait_for_order(&alice, order_id, &["EXPIRED", "CANCELLED"], SETTLE)
        .await;
    assert_eq!(settled["status"], "EXPIRED", "{settled}");
    app.wait_db("authorisation voided", SETTLE, |_| {
        let sim = app.sim.client.clone();
        let intent = intent.clone();
        async move { sim.intent(&intent).await["status"] == "canceled" }
    })
    .await;
    assert_eq!(stock(&app.db, &deal).await, (5, 0, 0), "units released");
    let attempts = attempts_of(&app.db, order_id).await;
    assert!(
        attempts.iter().all(|a| a.status == "FAILED" && !a.accepted),
        "{attempts:?}"
    );
    assert!(mismatches(&app).await > before);
    app.assert_invariants(&deal).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_charge_for_another_amount_is_refunded_and_the_units_released() {
    refunded_for_other_terms("amount-auto", json!({"amount_minor": 500}), 500, "EUR").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_charge_in_another_currency_is_refunded_and_the_units_released() {
    refunded_for_other_terms("currency-auto", json!({"currency": "usd"}), 1000, "usd").await;
}

/// The provider charges the order's payment with `change` applied: the charge is refunded
/// as taken (`amount_minor` in `currency`) and the order gives its unit back.
async fn refunded_for_other_terms(
    deal_id: &str,
    change: serde_json::Value,
    amount_minor: i64,
    currency: &str,
) {
    let app = spawn_pay_app().await;
    let deal = app.given_deal(&new_deal(deal_id, 5, 1)).await;
    let alice = app.token("alice");
    let order = app.place_order(&alice, &deal, "k1", 1).await.expect(201);
    let order_id = order["order_id"].as_str().unwrap();
    let intent = intent_id(&order);
    let before = mismatches(&app).await;
    amend(&app, &intent, change).await;
    assert_eq!(app.sim.pay(&intent).await.0, 200);

    // The webhook is refused; the reconciler asks the provider, which confirms the other
    // terms: the charge is refunded and the order gives its unit back.
    let settled = app
        .wait_for_order(&alice, order_id, &["CANCELLED", "EXPIRED", "PAID"], SETTLE)
        .await;
    assert_eq!(settled["status"], "CANCELLED", "{settled}");
    app.wait_db("refund confirmed", SETTLE, |db| async move {
        refunds(&db).await.iter().any(|r| r.status == "SUCCEEDED")
    })
    .await;
    let at_sim = app.sim.refunds_of(&intent).await;
    assert_eq!(at_sim.len(), 1, "{at_sim:?}");
    assert_eq!(at_sim[0]["amount_minor"], amount_minor);
    let rows = refunds(&app.db).await;
    assert_eq!(rows[0].reason, "amount_mismatch");
    let refunded: String = sqlx::query_scalar("SELECT currency FROM refunds")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(refunded, currency, "refunded in the currency taken");
    assert_eq!(stock(&app.db, &deal).await, (5, 0, 0), "units released");
    assert!(mismatches(&app).await > before);
    app.assert_invariants(&deal).await;
    app.cleanup().await;
}
