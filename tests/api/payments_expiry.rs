//! Payments meeting reservation expiry: money that arrives after the order gave its units
//! back, and the webhook racing the sweeper on the same order.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{Value, json};
use uuid::Uuid;

use crate::helpers::{
    PayApp, SETTLE, all_attempts, attempts_of, holds_for, new_deal, order_status, refunds,
    spawn_pay_app, stock,
};

/// A deal whose reservations last one second.
fn short_deal(id: &str, stock: i64, policy: &str) -> Value {
    let mut deal = new_deal(id, stock, 2);
    deal["reservation_ttl_seconds"] = json!(1);
    deal["late_payment_policy"] = json!(policy);
    deal
}

/// Places an order of one unit and waits until it has expired; returns its id and intent.
async fn expired_order(app: &PayApp, user: &str, deal: &str) -> (String, String) {
    let token = app.token(user);
    let order = app.place_order(&token, deal, user, 1).await.expect(201);
    let order_id = order["order_id"].as_str().unwrap().to_owned();
    let intent_id = crate::helpers::intent_id(&order);
    app.wait_for_order(&token, &order_id, &["EXPIRED"], SETTLE)
        .await;
    // Before expiring the order the gateway closed the checkout session.
    assert_eq!(app.sim.intent(&intent_id).await["status"], "canceled");
    (order_id, intent_id)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_late_payment_takes_the_units_again_when_stock_is_left() {
    let app = spawn_pay_app().await;
    let deal = app
        .given_deal(&short_deal("late1", 5, "reserve_or_refund"))
        .await;
    let (order_id, intent_id) = expired_order(&app, "alice", &deal).await;
    assert_eq!(stock(&app.db, &deal).await, (5, 0, 0), "units released");

    let forced = app.sim.force_succeed(&intent_id).await;
    assert_eq!(forced["status"], "succeeded");

    app.wait_for_order(&app.token("alice"), &order_id, &["PAID"], SETTLE)
        .await;
    assert_eq!(
        stock(&app.db, &deal).await,
        (4, 0, 1),
        "re-reserved and sold"
    );
    let attempts = attempts_of(&app.db, &order_id).await;
    assert_eq!(attempts.len(), 1);
    assert!(attempts[0].accepted && attempts[0].status == "SUCCEEDED");
    assert!(refunds(&app.db).await.is_empty());
    assert!(app.sim.refunds_of(&intent_id).await.is_empty());
    app.assert_invariants(&deal).await;
    app.cleanup().await;
}

/// Waits for REFUNDED and checks the money went back at the simulator.
async fn assert_refunded(app: &PayApp, user: &str, order_id: &str, intent_id: &str) {
    app.wait_for_order(&app.token(user), order_id, &["REFUNDED"], SETTLE)
        .await;
    let at_sim = app.sim.refunds_of(intent_id).await;
    assert_eq!(at_sim.len(), 1, "{at_sim:?}");
    assert_eq!(at_sim[0]["amount_minor"], 1000);
    assert_eq!(
        app.sim.intent(intent_id).await["amount_refunded_minor"],
        1000
    );
    let order_id: Uuid = order_id.parse().unwrap();
    let rows: Vec<_> = refunds(&app.db)
        .await
        .into_iter()
        .filter(|r| r.order_id == order_id)
        .collect();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].status, "SUCCEEDED");
    assert_eq!(rows[0].reason, "late_payment");
    assert_eq!(
        rows[0].provider_refund_id.as_deref(),
        at_sim[0]["id"].as_str()
    );
    let attempts = attempts_of(&app.db, &order_id.to_string()).await;
    assert!(attempts.iter().all(|a| !a.accepted), "{attempts:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_late_payment_is_refunded_under_the_refund_policy() {
    let app = spawn_pay_app().await;
    let deal = app.given_deal(&short_deal("late2", 5, "refund")).await;
    let (order_id, intent_id) = expired_order(&app, "alice", &deal).await;
    // Slow the refund down so the intermediate state can be seen.
    app.sim.faults(json!({"api_delay_ms": 500})).await;

    app.sim.force_succeed(&intent_id).await;

    app.wait_for_order(
        &app.token("alice"),
        &order_id,
        &["REFUND_PENDING", "REFUNDED"],
        SETTLE,
    )
    .await;
    app.sim.reset_faults().await;
    assert_refunded(&app, "alice", &order_id, &intent_id).await;
    assert_eq!(stock(&app.db, &deal).await, (5, 0, 0), "nothing sold");
    app.assert_invariants(&deal).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_late_payment_is_refunded_when_no_stock_is_left() {
    let app = spawn_pay_app().await;
    let deal = app
        .given_deal(&short_deal("late3", 1, "reserve_or_refund"))
        .await;
    let (order_id, intent_id) = expired_order(&app, "alice", &deal).await;
    // Bob takes and pays for the only unit.
    let bob = app.token("bob");
    let bobs = app.order_eventually("bob", &deal, 1).await;
    let bobs_id = bobs["order_id"].as_str().unwrap();
    assert_eq!(app.sim.pay(&crate::helpers::intent_id(&bobs)).await.0, 200);
    app.wait_for_order(&bob, bobs_id, &["PAID"], SETTLE).await;

    app.sim.force_succeed(&intent_id).await;

    assert_refunded(&app, "alice", &order_id, &intent_id).await;
    assert_eq!(order_status(&app.db, bobs_id).await, "PAID");
    assert_eq!(stock(&app.db, &deal).await, (0, 0, 1), "sold once, to bob");
    app.assert_invariants(&deal).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn webhooks_racing_the_sweeper_leave_each_order_in_one_state_consistent_with_money() {
    const ORDERS: usize = 20;
    let app = spawn_pay_app().await;
    // Plenty of stock; late money is refunded, so a lost race shows as a refund.
    let deal = app.given_deal(&short_deal("race1", 100, "refund")).await;

    // Each payment lands near its order's expiry: some just before, some just after.
    // Even orders pay at the checkout (refused once the session is closed), odd orders
    // are forced through at the provider (money that always arrives).
    let mut placed = Vec::new();
    let mut tasks = Vec::new();
    for i in 0..ORDERS {
        let user = format!("racer{i}");
        let token = app.token(&user);
        let order = app.place_order(&token, &deal, &user, 1).await.expect(201);
        let sim = app.sim.client.clone();
        let intent_id = crate::helpers::intent_id(&order);
        let expires_at: chrono::DateTime<chrono::Utc> =
            order["expires_at"].as_str().unwrap().parse().unwrap();
        let offset_ms = (i as i64 % 7) * 60 - 180;
        tasks.push(tokio::spawn(async move {
            let at = expires_at + chrono::Duration::milliseconds(offset_ms);
            // Paying just before or just after the expiry is the race under test.
            let wait = (at - chrono::Utc::now()).to_std().unwrap_or_default();
            tokio::time::sleep(wait).await;
            if i % 2 == 0 {
                let (status, body) = sim.pay(&intent_id).await;
                assert!(status == 200 || status == 409, "pay {status}: {body}");
                (intent_id, status == 200)
            } else {
                sim.force_succeed(&intent_id).await;
                (intent_id, true)
            }
        }));
        placed.push((token, order));
    }
    let mut paid_at_sim = HashMap::new();
    for task in tasks {
        let (intent_id, paid) = task.await.expect("payment task");
        paid_at_sim.insert(intent_id, paid);
    }

    // Every order settles in the final state its money allows, and no refund stays
    // pending. An order that expired before its money's webhook came is not settled yet:
    // the webhook will make it refunded.
    for (token, order) in &placed {
        let order_id = order["order_id"].as_str().unwrap();
        let finals: &[&str] = if paid_at_sim[&crate::helpers::intent_id(order)] {
            &["PAID", "REFUNDED"]
        } else {
            &["EXPIRED", "CANCELLED"]
        };
        app.wait_for_order(token, order_id, finals, SETTLE).await;
    }
    app.wait_db("no refund pending", SETTLE, |db| async move {
        refunds(&db).await.iter().all(|r| r.status == "SUCCEEDED")
    })
    .await;

    let attempts = all_attempts(&app.db).await;
    let refund_rows = refunds(&app.db).await;
    let mut outcomes: HashMap<&str, usize> = HashMap::new();
    let mut settled = HashMap::new();
    for (_, order) in &placed {
        let order_id = order["order_id"].as_str().unwrap();
        let intent_id = crate::helpers::intent_id(order);
        let status = order_status(&app.db, order_id).await;
        settled.insert(order_id.to_owned(), status.clone());
        let intent = app.sim.intent(&intent_id).await;
        let succeeded = intent["status"] == "succeeded";
        assert_eq!(succeeded, paid_at_sim[&intent_id], "{intent}");
        let attempt = attempts
            .iter()
            .find(|a| a.provider_payment_id.as_deref() == Some(intent_id.as_str()))
            .unwrap_or_else(|| panic!("no attempt for {intent_id}"));
        let refund = refund_rows.iter().find(|r| r.attempt_id == attempt.id);
        let refunded_minor = intent["amount_refunded_minor"].as_i64().unwrap();
        let case = match status.as_str() {
            "PAID" => {
                assert!(succeeded, "PAID without money: {intent}");
                assert!(attempt.accepted, "{attempt:?}");
                assert!(refund.is_none(), "PAID and refunded: {refund:?}");
                assert_eq!(refunded_minor, 0, "PAID and refunded: {intent}");
                "paid"
            }
            "REFUNDED" => {
                assert!(succeeded, "REFUNDED without money: {intent}");
                assert!(!attempt.accepted, "{attempt:?}");
                assert_eq!(refund.map(|r| r.status.as_str()), Some("SUCCEEDED"));
                assert_eq!(refunded_minor, 1000, "{intent}");
                "refunded"
            }
            "EXPIRED" | "CANCELLED" => {
                assert!(!succeeded, "money kept for an {status} order: {intent}");
                assert!(!attempt.accepted && refund.is_none());
                "expired"
            }
            other => panic!("order {order_id} ended {other}"),
        };
        *outcomes.entry(case).or_default() += 1;
    }
    eprintln!("race outcomes: {outcomes:?}");
    let paid = outcomes.get("paid").copied().unwrap_or(0) as i64;
    assert_eq!(stock(&app.db, &deal).await, (100 - paid, 0, paid));
    // Through two reconciler passes (500 ms apart) and any late webhook, nothing moves.
    holds_for(
        "settled orders and stock stay put",
        Duration::from_millis(1_200),
        || async {
            for (_, order) in &placed {
                let order_id = order["order_id"].as_str().unwrap();
                if order_status(&app.db, order_id).await != settled[order_id] {
                    return false;
                }
            }
            stock(&app.db, &deal).await == (100 - paid, 0, paid)
        },
    )
    .await;
    app.assert_invariants(&deal).await;
    app.cleanup().await;
}
