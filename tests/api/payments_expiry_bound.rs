//! A reservation has one end: no payment attempt is accepted at or after `expires_at`, an
//! order takes a bounded number of attempts, and whatever the provider and its webhooks do,
//! an order whose reservation ended reads EXPIRED and is counted as expired.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use crate::helpers::{
    PayApp, Reply, SETTLE, attempts_of, new_deal, order_status, send, spawn_pay_app_with, stock,
    wait_until,
};

async fn start_payment(app: &PayApp, token: &str, order_id: &str, key: &str) -> Reply {
    send(
        app.client
            .post(app.url(&format!("/v1/orders/{order_id}/payments")))
            .bearer_auth(token)
            .header("Idempotency-Key", key),
    )
    .await
}

fn expires_at(order: &Value) -> DateTime<Utc> {
    order["expires_at"].as_str().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn payment_attempts_stop_at_expiry_and_cannot_hold_units_past_it() {
    let app = spawn_pay_app_with(|s| {
        s.payments.attempts_per_order_max = 100;
        s.payments.expiry_grace_seconds = 2;
    })
    .await;
    let mut deal = new_deal("hold1", 2, 2);
    deal["reservation_ttl_seconds"] = json!(2);
    let deal = app.given_deal(&deal).await;
    let alice = app.token("alice");
    let order = app.place_order(&alice, &deal, "k1", 2).await.expect(201);
    let order_id = order["order_id"].as_str().unwrap().to_owned();
    let ends = expires_at(&order);
    let hold_ends: DateTime<Utc> = order["hold_ends_at"].as_str().unwrap().parse().unwrap();
    assert_eq!(hold_ends - ends, chrono::Duration::seconds(2), "{order}");

    // A new attempt every 100 ms, until well past the longest hold.
    let mut refused_after_expiry = 0;
    let mut i = 0;
    while Utc::now() < hold_ends + chrono::Duration::seconds(2) {
        i += 1;
        let sent_at = Utc::now();
        let reply = start_payment(&app, &alice, &order_id, &format!("again-{i}")).await;
        if sent_at >= ends + chrono::Duration::milliseconds(50) {
            assert_eq!(reply.status, 409, "attempt after expiry: {}", reply.text);
            let slug = reply.problem_slug();
            assert!(
                matches!(
                    slug.as_deref(),
                    Some("reservation-expired" | "order-not-pending")
                ),
                "{}",
                reply.text
            );
            refused_after_expiry += 1;
        }
        // Attempts at a steady pace across the expiry: each is a sample of the outcome.
        crate::helpers::pace(Duration::from_millis(100)).await;
    }
    assert!(refused_after_expiry >= 10, "{refused_after_expiry}");

    // The units came back by the advertised end of the hold (plus a sweeper pass).
    let reached = app
        .wait_for_order(&alice, &order_id, &["EXPIRED"], Duration::from_secs(1))
        .await;
    assert_eq!(reached["status"], "EXPIRED");
    assert_eq!(stock(&app.db, &deal).await, (2, 0, 0));
    let late: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM payment_attempts a JOIN orders o ON o.id = a.order_id
          WHERE o.id = $1::uuid AND a.created_at >= o.expires_at",
    )
    .bind(&order_id)
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(late, 0, "attempts recorded at or after expires_at");
    app.assert_invariants(&deal).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_order_takes_at_most_the_configured_number_of_attempts() {
    let app = spawn_pay_app_with(|s| s.payments.attempts_per_order_max = 3).await;
    let deal = app.given_deal(&new_deal("cap1", 5, 2)).await;
    let alice = app.token("alice");
    let order = app.place_order(&alice, &deal, "k1", 1).await.expect(201);
    let order_id = order["order_id"].as_str().unwrap();

    // The order's first attempt counts: two more are accepted, the next is refused.
    start_payment(&app, &alice, order_id, "a2")
        .await
        .expect(201);
    start_payment(&app, &alice, order_id, "a3")
        .await
        .expect(201);
    let refused = start_payment(&app, &alice, order_id, "a4").await;
    assert_eq!(refused.status, 409, "{}", refused.text);
    assert_eq!(
        refused.problem_slug().as_deref(),
        Some("payment-attempts-exhausted")
    );
    // A key used before is still answered with its attempt.
    let replay = start_payment(&app, &alice, order_id, "a2").await;
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    replay.expect(201);
    assert_eq!(attempts_of(&app.db, order_id).await.len(), 3);
    assert_eq!(app.sim.intents().await.len(), 3);
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn expiry_reads_expired_whichever_of_sweeper_and_cancel_webhook_lands_first() {
    const BATCH: usize = 20;
    let app = spawn_pay_app_with(|_| {}).await;
    let mut deal = new_deal("expiry-race", 100, 1);
    deal["reservation_ttl_seconds"] = json!(1);
    let deal = app.given_deal(&deal).await;
    let expired_before = app.counter("flashgate_orders_expired_total", "").await;
    // The provider acts at once but answers slowly, so the `canceled` event of a session
    // the gateway closes lands before the gateway has heard back from its own cancel
    // call; for the second batch webhooks are also held and delivered out of order, so
    // they land after it.
    let mut placed = Vec::new();
    for (batch, faults) in [
        json!({"api_delay_ms": 500, "webhook_reorder": false}),
        json!({"api_delay_ms": 500, "webhook_reorder": true}),
    ]
    .into_iter()
    .enumerate()
    {
        app.sim.faults(faults).await;
        let tasks: Vec<_> = (0..BATCH)
            .map(|i| {
                let (api, deal) = (app.api.clone(), deal.clone());
                tokio::spawn(async move {
                    let user = format!("u{batch}-{i}");
                    let order = api.order(&user, &deal, 1).await.expect(201);
                    (user, order["order_id"].as_str().unwrap().to_owned())
                })
            })
            .collect();
        let mut batch_orders = Vec::new();
        for task in tasks {
            batch_orders.push(task.await.expect("order task"));
        }
        // This batch expires under its faults before the next one starts.
        wait_until("the batch to end", SETTLE, || async {
            for (_, order_id) in &batch_orders {
                let status = order_status(&app.db, order_id).await;
                if !matches!(status.as_str(), "EXPIRED" | "CANCELLED") {
                    return Err(format!("{order_id} {status}"));
                }
            }
            Ok(())
        })
        .await;
        placed.extend(batch_orders);
    }
    let orders_total = placed.len();

    let started = Instant::now();
    for (user, order_id) in &placed {
        let left = SETTLE.saturating_sub(started.elapsed());
        app.wait_for_order(
            &app.token(user),
            order_id,
            &["EXPIRED", "CANCELLED"],
            left + Duration::from_secs(5),
        )
        .await;
    }
    app.sim.reset_faults().await;
    app.sim.flush_webhooks().await;
    // The late webhooks land (each answered by the gateway), and change nothing.
    wait_until("every held webhook to be answered", SETTLE, || async {
        let events = app.sim.events().await;
        let pending = events.iter().filter(|e| e["delivered"] != true).count();
        if pending == 0 {
            Ok(())
        } else {
            Err(format!("{pending} not delivered"))
        }
    })
    .await;
    for (_, order_id) in &placed {
        assert_eq!(
            order_status(&app.db, order_id).await,
            "EXPIRED",
            "{order_id}"
        );
        let attempts = attempts_of(&app.db, order_id).await;
        assert!(
            attempts.iter().all(|a| a.status != "PENDING"),
            "{attempts:?}"
        );
    }
    for intent in app.sim.intents().await {
        assert_eq!(intent["status"], "canceled", "{intent}");
    }
    let expired_after = app.counter("flashgate_orders_expired_total", "").await;
    assert!(
        expired_after - expired_before >= orders_total as f64,
        "{expired_before} -> {expired_after}"
    );
    assert_eq!(stock(&app.db, &deal).await, (100, 0, 0));
    app.assert_invariants(&deal).await;
    app.cleanup().await;
}
