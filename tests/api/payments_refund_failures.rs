//! Money that must go back and a provider that will not take the call: a refused refund is
//! retried with backoff a bounded number of times, then surfaced; a create whose connection
//! was refused made nothing, and its order expires like any other.

use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use crate::helpers::{
    SETTLE, attempts_of, free_port, intent_id, new_deal, refunds, spawn_app_with,
    spawn_pay_app_with, stock,
};

#[tokio::test(flavor = "multi_thread")]
async fn a_refund_the_provider_keeps_refusing_is_given_up_after_bounded_tries_and_surfaced() {
    let app = spawn_pay_app_with(|s| s.payments.refund_tries_max = 2).await;
    let mut deal = new_deal("refund-fail", 5, 1);
    deal["reservation_ttl_seconds"] = json!(1);
    deal["late_payment_policy"] = json!("refund");
    let deal = app.given_deal(&deal).await;
    let alice = app.token("alice");
    let order = app.place_order(&alice, &deal, "k1", 1).await.expect(201);
    let order_id = order["order_id"].as_str().unwrap().to_owned();
    let intent = intent_id(&order);
    app.wait_for_order(&alice, &order_id, &["EXPIRED"], SETTLE)
        .await;

    // Money arrives late; every refund call is refused.
    app.sim.faults(json!({"api_fail_status": 500})).await;
    app.sim.force_succeed(&intent).await;
    app.wait_for_order(&alice, &order_id, &["REFUND_PENDING"], SETTLE)
        .await;
    app.wait_db(
        "refund given up",
        Duration::from_secs(20),
        |db| async move { refunds(&db).await.iter().any(|r| r.status == "FAILED") },
    )
    .await;
    let (tries, error): (i32, Option<String>) =
        sqlx::query_as("SELECT tries, last_error FROM refunds")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(tries, 2);
    assert!(error.is_some_and(|e| e.contains("500")));
    // Nothing retries it any more (the outbox closes its entry right after the refund is
    // marked, in a write of its own), and it is visible: metric and reconcile output.
    app.wait_db(
        "the refund's outbox entry closed",
        SETTLE,
        |db| async move {
            let pending: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM outbox WHERE kind = 'refund' AND done_at IS NULL",
            )
            .fetch_one(&db)
            .await
            .unwrap();
            pending == 0
        },
    )
    .await;
    assert_eq!(app.counter("flashgate_refunds_failed_total", "").await, 1.0);
    app.sim.reset_faults().await;
    let findings = reconcile(&app.settings);
    let failed: Vec<&Value> = findings
        .iter()
        .filter(|f| f["kind"] == "refund_failed")
        .collect();
    assert_eq!(failed.len(), 1, "{findings:?}");
    assert_eq!(failed[0]["detail"]["order_id"], order_id.as_str());
    assert!(app.sim.refunds_of(&intent).await.is_empty());
    app.cleanup().await;
}

/// `flashgate reconcile` against the test's database and simulator; its JSON findings.
fn reconcile(settings: &flashgate::config::Settings) -> Vec<Value> {
    let output = Command::new(env!("CARGO_BIN_EXE_flashgate"))
        .arg("reconcile")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("RUST_LOG", "error")
        .env("DATABASE_URL", &settings.database.url)
        .env("DATABASE_DIRECT_URL", &settings.database.direct_url)
        .env(
            "FLASHGATE__DATABASE__TRANSACTION_POOLER",
            settings.database.transaction_pooler.to_string(),
        )
        .env("FLASHGATE__PAYMENTS__ENABLED", "true")
        .env("FLASHGATE__PAYMENTS__BASE_URL", &settings.payments.base_url)
        .env("FLASHGATE__PAYMENTS__API_KEY", &settings.payments.api_key)
        .env(
            "FLASHGATE__PAYMENTS__WEBHOOK_SECRET",
            &settings.payments.webhook_secret,
        )
        .output()
        .expect("run flashgate reconcile");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("reconcile prints JSON findings")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_create_whose_connection_was_refused_follows_the_normal_expiry() {
    // Nothing listens where the provider should be: every create is refused.
    let nowhere = format!("http://127.0.0.1:{}", free_port());
    let app = spawn_app_with(move |s| {
        crate::helpers::payment_settings(s, &nowhere);
        s.payments.expiry_grace_seconds = 30;
    })
    .await;
    let mut deal = new_deal("refused", 5, 1);
    deal["reservation_ttl_seconds"] = json!(1);
    let deal = app.given_deal(&deal).await;
    let alice = app.token("alice");
    let order = app.place_order(&alice, &deal, "k1", 1).await.expect(201);
    let order_id = order["order_id"].as_str().unwrap().to_owned();
    assert!(order["payment"]["checkout_url"].is_null(), "{order}");

    // Well before the 30-second grace for payments that may exist, the order expires.
    crate::helpers::eventually(Duration::from_secs(5), || {
        let (app, alice, order_id) = (&app, &alice, &order_id);
        async move {
            let order = app.get_order(alice, order_id).await.expect(200);
            (order["status"] == "EXPIRED").then_some(())
        }
    })
    .await
    .expect("the order expired with its reservation");
    let attempts = attempts_of(&app.db, &order_id).await;
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].status, "EXPIRED");
    assert_eq!(stock(&app.db, &deal).await, (5, 0, 0));
    app.assert_invariants(&deal).await;
    app.cleanup().await;
}
