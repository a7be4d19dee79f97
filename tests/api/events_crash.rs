//! The event machinery across crashes, with gateway processes and a receiver that verifies
//! with the Standard Webhooks reference library: the gateway SIGKILLed in the middle of
//! deliveries, and PostgreSQL (a private cluster) restarted in the middle of the sale. After
//! each, nothing is lost and every order's events arrive in sequence.

use std::time::Duration;

use serde_json::json;
use sqlx::PgPool;

use crate::events_delivery::{check_on, subscribe, wait_delivered_on};
use crate::helpers::{Api, PrivatePostgres, Receiver, TestDb, new_deal, test_settings, wait_until};
use crate::multi_process::{spawn_gateway_with, wait_until_healthy};

const DELIVERED: Duration = Duration::from_secs(60);

/// The event settings of `events_delivery::fast_events`, as a gateway process's environment.
const FAST_EVENTS: [(&str, &str); 8] = [
    ("FLASHGATE__EVENTS__ENABLED", "true"),
    ("FLASHGATE__EVENTS__ALLOW_PRIVATE_TARGETS", "true"),
    ("FLASHGATE__EVENTS__LEADER_RETRY_MS", "200"),
    ("FLASHGATE__EVENTS__POLL_INTERVAL_MAX_MS", "100"),
    ("FLASHGATE__EVENTS__RETRY_INITIAL_MS", "50"),
    ("FLASHGATE__EVENTS__RETRY_MAX_MS", "500"),
    ("FLASHGATE__EVENTS__REQUEST_TIMEOUT_MS", "2000"),
    ("FLASHGATE__EVENTS__MAINTENANCE_INTERVAL_MS", "200"),
];

/// Each user reserves one unit; every other one cancels.
async fn traffic(api: &Api, deal: &str, users: std::ops::Range<u32>) {
    for n in users {
        let user = format!("u{n}");
        let order = api.order(&user, deal, 1).await.expect(201);
        if n % 2 == 0 {
            let id = order["order_id"].as_str().unwrap();
            api.cancel_order(&api.token(&user), id).await.expect(200);
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_gateway_killed_in_the_middle_of_deliveries_loses_nothing() {
    let database = TestDb::create().await;
    let db = database.connect(2).await;
    let settings = test_settings(&database.url);
    let api = Api::on_free_ports(&settings);
    let mut gateway = spawn_gateway_with(&settings, &api, &FAST_EVENTS);
    wait_until_healthy(&mut gateway, &api).await;
    let receiver = Receiver::start(&[]).await;
    subscribe(&api, &receiver).await;
    // Each answer waits, so deliveries are in flight when the gateway dies.
    receiver.control(json!({"delay_ms": 200})).await;
    let deal = api.given_deal(&new_deal("ev-kill", 1000, 4)).await;
    traffic(&api, &deal, 0..30).await;
    wait_until("some deliveries before the kill", DELIVERED, || async {
        receiver.received().await.len() >= 5
    })
    .await;

    gateway.kill();
    let before = receiver.received().await.len();
    let mut gateway = spawn_gateway_with(&settings, &api, &FAST_EVENTS);
    wait_until_healthy(&mut gateway, &api).await;
    receiver.control(json!({"delay_ms": 0})).await;
    traffic(&api, &deal, 30..40).await;

    let received = wait_delivered_on(&db, &receiver, DELIVERED).await;
    assert!(
        before < 45,
        "the kill came before everything was delivered ({before})"
    );
    assert_eq!(check_on(&api, &db, &received).await, 60);
    drop(gateway);
    db.close().await;
    database.drop_database().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_restarted_in_the_middle_of_the_sale_loses_nothing() {
    let postgres = PrivatePostgres::start().await;
    let settings = test_settings(&postgres.url());
    let api = Api::on_free_ports(&settings);
    let mut gateway = spawn_gateway_with(&settings, &api, &FAST_EVENTS);
    wait_until_healthy(&mut gateway, &api).await;
    let receiver = Receiver::start(&[]).await;
    subscribe(&api, &receiver).await;
    let deal = api.given_deal(&new_deal("ev-restart", 1000, 4)).await;
    traffic(&api, &deal, 0..20).await;

    postgres.down();
    wait_until("the gateway to see PostgreSQL gone", DELIVERED, || async {
        api.get("/readyz").await.status == 503
    })
    .await;
    postgres.up();
    wait_until(
        "orders taken again after the restart",
        DELIVERED,
        || async { api.order("after-restart", &deal, 1).await.status == 201 },
    )
    .await;
    traffic(&api, &deal, 20..30).await;
    wait_until("the admin API after the restart", DELIVERED, || async {
        let request = api.client.get(api.url("/admin/events?limit=1"));
        let answer = request.bearer_auth(&api.admin_token).send().await;
        answer.is_ok_and(|a| a.status() == 200)
    })
    .await;

    let db = PgPool::connect(&postgres.url()).await.unwrap();
    let received = wait_delivered_on(&db, &receiver, DELIVERED).await;
    assert_eq!(check_on(&api, &db, &received).await, 46);
    drop(gateway);
    db.close().await;
}
