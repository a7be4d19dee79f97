//! The order's snapshot of its deal: name, late-payment policy and capture method as they
//! were when the order was placed. Changing the deal afterwards reaches neither the order
//! view, nor the receipt notice, nor the handling of a late payment.

use serde_json::{Value, json};

use crate::helpers::{SETTLE, new_deal, refunds, spawn_pay_app, stock};

#[tokio::test(flavor = "multi_thread")]
async fn a_changed_deal_reaches_neither_orders_placed_nor_their_payments() {
    let app = spawn_pay_app().await;
    let mut deal = new_deal("snap1", 5, 1);
    deal["name"] = json!("Summer concert, row A");
    deal["reservation_ttl_seconds"] = json!(2);
    deal["late_payment_policy"] = json!("refund");
    let deal = app.given_deal(&deal).await;
    let (alice, carol) = (app.token("alice"), app.token("carol"));

    let late = app.place_order(&alice, &deal, "a", 1).await.expect(201);
    let late_id = late["order_id"].as_str().unwrap().to_owned();
    let late_intent = crate::helpers::intent_id(&late);
    let paid = app.place_order(&carol, &deal, "c", 1).await.expect(201);
    let paid_id = paid["order_id"].as_str().unwrap().to_owned();
    let paid_intent = crate::helpers::intent_id(&paid);

    // The deal changes name and policy after both orders were placed.
    sqlx::query(
        "UPDATE deals SET name = 'Renamed', late_payment_policy = 'reserve_or_refund'
          WHERE id = $1",
    )
    .bind(&deal)
    .execute(&app.db)
    .await
    .unwrap();

    let shown = app.get_order(&alice, &late_id).await.expect(200);
    assert_eq!(shown["deal_name"], "Summer concert, row A", "{shown}");

    // Carol pays: the receipt notice names the deal as her order knew it.
    assert_eq!(app.sim.pay(&paid_intent).await.0, 200);
    app.wait_for_order(&carol, &paid_id, &["PAID"], SETTLE)
        .await;
    let payload: Value = sqlx::query_scalar(
        "SELECT payload FROM outbox WHERE kind = 'order_paid' AND payload->>'order_id' = $1",
    )
    .bind(&paid_id)
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(payload["deal_name"], "Summer concert, row A", "{payload}");

    // Alice pays late: her order's policy (refund) decides, not the deal's new one.
    app.wait_for_order(&alice, &late_id, &["EXPIRED"], SETTLE)
        .await;
    app.sim.force_succeed(&late_intent).await;
    app.wait_for_order(&alice, &late_id, &["REFUND_PENDING", "REFUNDED"], SETTLE)
        .await;
    let rows = refunds(&app.db).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].reason, "late_payment");
    assert_eq!(
        stock(&app.db, &deal).await,
        (4, 0, 1),
        "units not taken again"
    );

    // A new order takes the deal as it is now.
    let bob = app.token("bob");
    let fresh = app.place_order(&bob, &deal, "b", 1).await.expect(201);
    let fresh_id = fresh["order_id"].as_str().unwrap();
    let fresh = app.get_order(&bob, fresh_id).await.expect(200);
    assert_eq!(fresh["deal_name"], "Renamed", "{fresh}");
    app.assert_invariants(&deal).await;
    app.cleanup().await;
}
