//! The kill switch: paused through the CLI while three gateway processes serve load, every
//! instance answers `sale-not-open` within a second and takes no order; resumed, they sell
//! again.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::helpers::{
    Api, TestDb, assert_invariants, delete_redis_keys, eventually, test_settings, unique_suffix,
    wait_until,
};
use crate::multi_process::{spawn_gateway, wait_until_healthy};
use crate::ops_cli::flashgate_cli;

/// What one load request got, and when it was sent.
struct Sent {
    gateway: usize,
    at: Instant,
    status: u16,
    slug: Option<String>,
}

/// Orders one unit at a time through `api` until `stop`, each as a new user.
async fn keep_ordering(gateway: usize, api: Api, deal: String, stop: Arc<AtomicBool>) -> Vec<Sent> {
    let mut sent = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let at = Instant::now();
        let reply = api
            .order(&format!("load-{}", unique_suffix()), &deal, 1)
            .await;
        sent.push(Sent {
            gateway,
            at,
            status: reply.status,
            slug: reply.problem_slug(),
        });
        // A client's pace: the load, not a wait for an outcome.
        crate::helpers::pace(Duration::from_millis(5)).await;
    }
    sent
}

async fn orders_in_db(db: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(db)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn pausing_through_the_cli_stops_every_instance_within_a_second() {
    // Arrange: three gateways, one deal with far more stock than the load can buy.
    let database = TestDb::create().await;
    let settings = test_settings(&database.url);
    let mut gateways = Vec::new();
    let mut apis = Vec::new();
    for _ in 0..3 {
        let api = Api::on_free_ports(&settings);
        gateways.push(spawn_gateway(&settings, &api));
        apis.push(api);
    }
    for (gateway, api) in gateways.iter_mut().zip(&apis) {
        wait_until_healthy(gateway, api).await;
    }
    let deal = apis[0]
        .given_deal(&json!({
            "id": "paused-sale", "name": "Paused sale", "stock": 1_000_000, "buckets": 8,
            "unit_price_minor": 500, "currency": "EUR", "per_user_limit": 5,
            "reservation_ttl_seconds": 300,
        }))
        .await;
    let db = database.connect(2).await;
    let stop = Arc::new(AtomicBool::new(false));
    let mut load = tokio::task::JoinSet::new();
    for (n, api) in apis.iter().enumerate() {
        for _ in 0..3 {
            load.spawn(keep_ordering(n, api.clone(), deal.clone(), stop.clone()));
        }
    }
    wait_until("the load to sell", Duration::from_secs(10), || async {
        orders_in_db(&db).await >= 30
    })
    .await;

    // Act: pause through the CLI while the load runs.
    let paused = flashgate_cli(&settings, &["deals", "pause", &deal]).await;
    let paused_at = Instant::now();
    assert!(paused.success, "deals pause failed: {}", paused.stderr);
    assert_eq!(paused.json()["paused"], json!(true), "{}", paused.stdout);
    // The promise spans time (its subject): a second for the pause to reach every
    // instance, then a while in which nothing sells.
    let mut counted = Vec::new();
    for span in [Duration::from_millis(1000), Duration::from_millis(700)] {
        tokio::time::sleep(span).await;
        counted.push(orders_in_db(&db).await);
    }
    let (orders_a_second_after, orders_later) = (counted[0], counted[1]);
    stop.store(true, Ordering::Relaxed);
    let sent: Vec<Sent> = load.join_all().await.into_iter().flatten().collect();

    // Assert: sales went through before the pause, and every instance refused them within a
    // second of it, each with sale-not-open and nothing else.
    for gateway in 0..apis.len() {
        let before = sent
            .iter()
            .filter(|s| s.gateway == gateway && s.at < paused_at && s.status == 201)
            .count();
        assert!(
            before > 0,
            "gateway {gateway} sold nothing before the pause"
        );
        let late: Vec<&Sent> = sent
            .iter()
            .filter(|s| s.gateway == gateway && s.at >= paused_at + Duration::from_secs(1))
            .collect();
        assert!(
            late.len() >= 3,
            "gateway {gateway} got too little load after the pause"
        );
        for s in late {
            assert!(
                s.status == 409 && s.slug.as_deref() == Some("sale-not-open"),
                "gateway {gateway} answered {} {:?} {:?} after the pause",
                s.status,
                s.slug,
                s.at - paused_at
            );
        }
    }
    assert_eq!(
        orders_a_second_after, orders_later,
        "orders were written while the deal was paused"
    );

    // Resume through the CLI: every instance sells again.
    let resumed = flashgate_cli(&settings, &["deals", "resume", &deal]).await;
    assert!(resumed.success, "deals resume failed: {}", resumed.stderr);
    assert_eq!(resumed.json()["paused"], json!(false));
    for (n, api) in apis.iter().enumerate() {
        let sold = eventually(Duration::from_secs(1), || async {
            let reply = api
                .order(&format!("after-{}", unique_suffix()), &deal, 1)
                .await;
            (reply.status == 201).then_some(())
        })
        .await;
        assert!(
            sold.is_some(),
            "gateway {n} still refuses orders a second after resume"
        );
    }
    for api in &apis {
        assert_invariants(api, &db, &deal).await;
    }
    let check = flashgate_cli(&settings, &["check"]).await;
    assert!(
        check.success,
        "flashgate check: {}\n{}",
        check.stdout, check.stderr
    );

    for gateway in &mut gateways {
        let status = gateway.terminate(Duration::from_secs(15)).await;
        assert!(
            status.is_some_and(|s| s.success()),
            "gateway did not stop cleanly"
        );
    }
    db.close().await;
    delete_redis_keys(&settings.redis.url, &settings.redis.key_prefix).await;
    database.drop_database().await;
}
