//! The `manual_review` late-payment policy against the real simulator: late money parks
//! its order in MANUAL_REVIEW holding no units, an operator sees the queue (admin API, CLI)
//! and fulfils (only while units are left) or refunds, each through the guarded moves.

use serde_json::{Value, json};

use crate::helpers::{
    PayApp, SETTLE, attempts_of, metric_value, new_deal, refunds, send, spawn_pay_app, stock,
    wait_until,
};
use crate::ops_cli::flashgate_cli;

/// Places one unit for `user`, lets it expire, then has the provider take the money late.
pub async fn held_for_review(app: &PayApp, user: &str, deal: &str) -> String {
    let token = app.token(user);
    let order = app.place_order(&token, deal, user, 1).await.expect(201);
    let order_id = order["order_id"].as_str().unwrap().to_owned();
    let intent = crate::helpers::intent_id(&order);
    app.wait_for_order(&token, &order_id, &["EXPIRED"], SETTLE)
        .await;
    app.sim.force_succeed(&intent).await;
    app.wait_for_order(&token, &order_id, &["MANUAL_REVIEW"], SETTLE)
        .await;
    order_id
}

async fn review_action(app: &PayApp, order_id: &str, action: &str) -> (u16, Value) {
    let path = format!("/admin/orders/{order_id}/review/{action}");
    let reply = send(
        app.client
            .post(app.url(&path))
            .bearer_auth(&app.admin_token),
    )
    .await;
    (reply.status, reply.json())
}

async fn queue(app: &PayApp) -> Vec<Value> {
    let request = app.client.get(app.url("/admin/payments/review"));
    let reply = send(request.bearer_auth(&app.admin_token)).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    reply.json()["orders"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Waits until the review gauge reads `wanted`.
async fn wait_review_gauge(app: &PayApp, wanted: f64) -> String {
    wait_until(
        &format!("the review gauge to read {wanted}"),
        SETTLE,
        || async {
            let metrics = app.metrics().await;
            if metric_value(&metrics, "flashgate_manual_review_orders", "") == wanted {
                Ok(metrics)
            } else {
                Err(metrics)
            }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn late_money_waits_for_an_operator_who_fulfils_while_stock_lasts_or_refunds() {
    let app = spawn_pay_app().await;
    let mut deal = new_deal("rev1", 3, 1);
    deal["reservation_ttl_seconds"] = json!(1);
    deal["late_payment_policy"] = json!("manual_review");
    let deal = app.given_deal(&deal).await;

    let alice = held_for_review(&app, "alice", &deal).await;
    let bob = held_for_review(&app, "bob", &deal).await;
    assert_eq!(
        stock(&app.db, &deal).await,
        (3, 0, 0),
        "review holds no units"
    );
    assert!(
        refunds(&app.db).await.is_empty(),
        "nothing refunded by itself"
    );
    let listed = queue(&app).await;
    let ids: Vec<_> = listed
        .iter()
        .map(|o| o["order_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        [alice.as_str(), bob.as_str()],
        "oldest first: {listed:?}"
    );
    assert_eq!(listed[0]["amount_minor"], 1000);
    let metrics = wait_review_gauge(&app, 2.0).await;
    let oldest = metric_value(&metrics, "flashgate_manual_review_oldest_seconds", "");
    assert!(oldest >= 0.0, "{metrics}");

    // Bob is fulfilled: units taken again, the order PAID, the money kept.
    let (status, body) = review_action(&app, &bob, "fulfil").await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("PAID")),
        "{body}"
    );
    assert_eq!(stock(&app.db, &deal).await, (2, 0, 1));
    let attempts = attempts_of(&app.db, &bob).await;
    assert!(attempts[0].accepted, "{attempts:?}");

    // Dave buys what is left; fulfilling Alice is then refused and changes nothing.
    let dave = app.token("dave");
    let mut bigger = app.place_order(&dave, &deal, "d", 1).await.expect(201);
    let intent = crate::helpers::intent_id(&bigger);
    assert_eq!(app.sim.pay(&intent).await.0, 200);
    let dave_id = bigger["order_id"].as_str().unwrap().to_owned();
    app.wait_for_order(&dave, &dave_id, &["PAID"], SETTLE).await;
    let carol = app.token("carol");
    bigger = app.place_order(&carol, &deal, "c", 1).await.expect(201);
    let intent = crate::helpers::intent_id(&bigger);
    assert_eq!(app.sim.pay(&intent).await.0, 200);
    let carol_id = bigger["order_id"].as_str().unwrap().to_owned();
    app.wait_for_order(&carol, &carol_id, &["PAID"], SETTLE)
        .await;
    assert_eq!(stock(&app.db, &deal).await, (0, 0, 3));
    let (status, body) = review_action(&app, &alice, "fulfil").await;
    assert_eq!(status, 409, "no units left: {body}");
    let token = app.token("alice");
    let order = app.get_order(&token, &alice).await.expect(200);
    assert_eq!(order["status"], "MANUAL_REVIEW");

    // Alice is refunded from the command line; the money goes back at the provider.
    let out = flashgate_cli(&app.settings, &["review", "refund", &alice]).await;
    assert!(out.success, "{}", out.stderr);
    assert_eq!(out.json()["status"], "REFUND_PENDING");
    app.wait_for_order(&token, &alice, &["REFUNDED"], SETTLE)
        .await;
    let rows = refunds(&app.db).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].reason, "manual_review");
    assert_eq!(rows[0].status, "SUCCEEDED");

    // Nothing is left to review, and a second action is refused.
    let out = flashgate_cli(&app.settings, &["review", "list"]).await;
    assert!(out.success, "{}", out.stderr);
    assert_eq!(out.json()["orders"], json!([]));
    let (status, _) = review_action(&app, &alice, "refund").await;
    assert_eq!(status, 409);
    let out = flashgate_cli(&app.settings, &["review", "fulfil", &bob]).await;
    assert!(!out.success, "bob is PAID, not in review");
    wait_review_gauge(&app, 0.0).await;
    assert_eq!(stock(&app.db, &deal).await, (0, 0, 3));
    app.assert_invariants(&deal).await;
    app.cleanup().await;
}
