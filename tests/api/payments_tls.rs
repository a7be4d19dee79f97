//! The provider over TLS: the simulator serves HTTPS with a certificate authority made in
//! the test, and the gateway speaks to it through rustls, trusting that authority through
//! `payments.ca_file`. A certificate the gateway does not trust is a connection refused:
//! nothing was created, nothing is sent in cleartext, and the order expires as usual.

use serde_json::json;

use crate::helpers::{
    SETTLE, Sim, TestCerts, attempts_of, metric_value, new_deal, spawn_pay_app_at, stock,
    wait_until,
};

#[tokio::test(flavor = "multi_thread")]
async fn payments_create_pay_and_void_over_tls_with_a_generated_certificate() {
    let certs = TestCerts::generate();
    let sim = Sim::start_tls(&certs).await;
    assert!(sim.base.starts_with("https://"), "{}", sim.base);
    let ca = certs.ca_path.clone();
    let app = spawn_pay_app_at(sim, move |s| s.payments.ca_file = ca).await;
    let deal = app.given_deal(&new_deal("tls1", 10, 2)).await;
    let alice = app.token("alice");

    let paid = app
        .place_order(&alice, &deal, "k-paid", 1)
        .await
        .expect(201);
    let paid_id = paid["order_id"].as_str().unwrap();
    let checkout = paid["payment"]["checkout_url"].as_str().unwrap_or_default();
    assert!(checkout.starts_with("https://"), "created over TLS: {paid}");
    let intent = crate::helpers::intent_id(&paid);
    assert_eq!(app.sim.pay(&intent).await.0, 200);
    app.wait_for_order(&alice, paid_id, &["PAID"], SETTLE).await;

    // Cancelling voids the open checkout session at the provider, over TLS too.
    let open = app
        .place_order(&alice, &deal, "k-open", 1)
        .await
        .expect(201);
    let open_id = open["order_id"].as_str().unwrap();
    let open_intent = crate::helpers::intent_id(&open);
    app.cancel_order(&alice, open_id).await.expect(200);
    wait_until("the session to be voided", SETTLE, || async {
        app.sim.intent(&open_intent).await["status"] == "canceled"
    })
    .await;
    assert_eq!(stock(&app.db, &deal).await, (9, 0, 1));
    let metrics = app.metrics().await;
    let refused = metric_value(&metrics, "flashgate_provider_errors_total", "");
    assert_eq!(refused, 0.0, "no provider call failed:\n{metrics}");
    app.assert_invariants(&deal).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_untrusted_provider_certificate_creates_nothing_and_the_order_expires() {
    let certs = TestCerts::generate();
    let stranger = TestCerts::generate();
    let sim = Sim::start_tls(&certs).await;
    let ca = stranger.ca_path.clone();
    let app = spawn_pay_app_at(sim, move |s| {
        s.payments.ca_file = ca;
        s.sweeper.interval_ms = 100;
    })
    .await;
    let mut deal = new_deal("tls2", 2, 1);
    deal["reservation_ttl_seconds"] = json!(2);
    let deal = app.given_deal(&deal).await;
    let alice = app.token("alice");

    let order = app.place_order(&alice, &deal, "k1", 2).await.expect(201);
    let order_id = order["order_id"].as_str().unwrap();
    assert!(
        order["payment"]["checkout_url"].is_null(),
        "no session without a trusted certificate: {order}"
    );
    assert!(
        app.sim.intents().await.is_empty(),
        "nothing reached the provider"
    );
    let metrics = app.metrics().await;
    let refused = metric_value(
        &metrics,
        "flashgate_provider_errors_total",
        "kind=\"refused\"",
    );
    assert!(
        refused >= 1.0,
        "the handshake failure counts as refused:\n{metrics}"
    );

    app.wait_for_order(&alice, order_id, &["EXPIRED"], SETTLE)
        .await;
    let attempts = attempts_of(&app.db, order_id).await;
    assert_eq!(attempts[0].status, "EXPIRED", "{attempts:?}");
    assert_eq!(stock(&app.db, &deal).await, (2, 0, 0), "units back on sale");
    assert!(
        app.sim.intents().await.is_empty(),
        "still nothing at the provider"
    );
    app.cleanup().await;
}
