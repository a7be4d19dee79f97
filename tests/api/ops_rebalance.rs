//! Rebalancing a deal's buckets while it sells: 8 → 32 → 8, twice, with orders and cancels
//! running the whole time. The invariant holds at every sample and no unit is lost or
//! created.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use serde_json::json;

use crate::helpers::{
    Api, assert_invariants, buckets, send, spawn_app_with, unique_suffix, wait_until,
};
use crate::ops_cli::flashgate_cli;

const STOCK: i64 = 1000;

/// Places orders of 1 or 2 units as fresh users and cancels three in four, until `stop`,
/// so units keep moving between available and reserved without selling out.
async fn shop(api: Api, deal: String, stop: Arc<AtomicBool>, placed: Arc<AtomicI64>) {
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let user = format!("shopper-{}", unique_suffix());
        let token = api.token(&user);
        let quantity = 1 + (n % 2) as i64;
        let reply = api
            .place_order_retrying(&token, &deal, &unique_suffix(), quantity)
            .await;
        match reply.status {
            201 => {
                placed.fetch_add(1, Ordering::Relaxed);
                if !n.is_multiple_of(4) {
                    let id = reply.json()["order_id"].as_str().unwrap().to_owned();
                    api.cancel_order(&token, &id).await.expect(200);
                }
            }
            _ => {
                reply.expect_problem(409, "sold-out");
                // A shopper's pause before trying again: load, not a wait for an outcome.
                crate::helpers::pace(Duration::from_millis(20)).await;
            }
        }
    }
}

/// Samples the admin inventory and the full audit until `stop`; every sample must hold.
async fn watch(api: Api, deal: String, stop: Arc<AtomicBool>) -> usize {
    let mut samples = 0;
    while !stop.load(Ordering::Relaxed) {
        let inventory = api.inventory(&deal).await;
        assert_eq!(inventory["invariant_holds"], json!(true), "{inventory}");
        assert_eq!(inventory["stock_total"], json!(STOCK), "{inventory}");
        let held = inventory["available"].as_i64().unwrap()
            + inventory["reserved"].as_i64().unwrap()
            + inventory["sold"].as_i64().unwrap();
        assert_eq!(held, STOCK, "units lost or created: {inventory}");
        let audit = send(
            api.client
                .get(api.url("/admin/audit"))
                .bearer_auth(&api.admin_token),
        )
        .await
        .expect(200);
        assert_eq!(audit["findings"], json!([]), "{audit}");
        samples += 1;
        // Sampled at a steady pace for as long as the sale runs.
        crate::helpers::pace(Duration::from_millis(20)).await;
    }
    samples
}

/// Waits until the shoppers have placed a few more orders, so each rebalance meets a sale
/// in progress.
async fn orders_go_through(placed: &AtomicI64) {
    let before = placed.load(Ordering::Relaxed);
    wait_until("more orders placed", Duration::from_secs(10), || async {
        placed.load(Ordering::Relaxed) >= before + 5
    })
    .await;
}

async fn rebalance_via_api(api: &Api, deal: &str, buckets: i64) -> serde_json::Value {
    let request = api
        .client
        .post(api.url(&format!("/admin/deals/{deal}/rebalance")))
        .bearer_auth(&api.admin_token)
        .json(&json!({ "buckets": buckets }));
    send(request).await.expect(200)
}

#[tokio::test(flavor = "multi_thread")]
async fn rebalancing_8_to_32_and_back_under_load_keeps_every_unit() {
    // Arrange: 1000 units over 8 buckets, shoppers and an auditor running.
    let app = spawn_app_with(|s| s.database.acquire_timeout_ms = 2000).await;
    let deal = app
        .given_deal(&json!({
            "id": "rebalanced", "name": "Rebalanced", "stock": STOCK, "buckets": 8,
            "unit_price_minor": 100, "currency": "EUR", "per_user_limit": 2,
            "reservation_ttl_seconds": 300,
        }))
        .await;
    let stop = Arc::new(AtomicBool::new(false));
    let placed = Arc::new(AtomicI64::new(0));
    let mut shoppers = tokio::task::JoinSet::new();
    for _ in 0..6 {
        shoppers.spawn(shop(
            app.api.clone(),
            deal.clone(),
            stop.clone(),
            placed.clone(),
        ));
    }
    let watcher = tokio::spawn(watch(app.api.clone(), deal.clone(), stop.clone()));

    // Act: 8 → 32 through the admin API, 32 → 8 through the CLI, twice.
    let mut moved = Vec::new();
    for _ in 0..2 {
        orders_go_through(&placed).await;
        let grown = rebalance_via_api(&app.api, &deal, 32).await;
        assert_eq!(grown["buckets_before"], json!(8));
        assert_eq!(grown["buckets_after"], json!(32));
        moved.push(grown["units_moved"].as_i64().unwrap());
        assert_eq!(buckets(&app.db, &deal).await.len(), 32);
        orders_go_through(&placed).await;
        let shrunk = flashgate_cli(
            &app.settings,
            &["deals", "rebalance", &deal, "--buckets", "8"],
        )
        .await;
        assert!(shrunk.success, "{}", shrunk.stderr);
        assert_eq!(shrunk.json()["buckets_before"], json!(32));
        assert_eq!(shrunk.json()["buckets_after"], json!(8));
    }
    orders_go_through(&placed).await;
    stop.store(true, Ordering::Relaxed);
    shoppers.join_all().await;
    let samples = watcher.await.expect("the invariant held at every sample");

    // Assert: orders went through during the rebalances, and the final state is exact.
    assert!(placed.load(Ordering::Relaxed) > 20, "too few orders placed");
    assert!(samples > 5, "too few invariant samples ({samples})");
    assert!(
        moved.iter().all(|m| *m > 0),
        "growing moved no units: {moved:?}"
    );
    app.assert_invariants(&deal).await;
    let settled = rebalance_via_api(&app.api, &deal, 8).await;
    assert_eq!(settled["buckets_before"], json!(8));
    let rows = buckets(&app.db, &deal).await;
    assert_eq!(
        rows.len(),
        32,
        "rows above the count are kept for their reservation lines"
    );
    assert!(rows[8..].iter().all(|b| b.available == 0), "{rows:?}");
    let kept: Vec<i64> = rows[..8].iter().map(|b| b.available).collect();
    assert!(
        kept.iter().max().unwrap() - kept.iter().min().unwrap() <= 1,
        "{kept:?}"
    );
    let total: i64 = rows.iter().map(|b| b.available + b.reserved + b.sold).sum();
    assert_eq!(total, STOCK);
    let count: i32 = sqlx::query_scalar("SELECT bucket_count FROM deals WHERE id = $1")
        .bind(&deal)
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(count, 8);
    assert_invariants(&app.api, &app.db, &deal).await;
    app.cleanup().await;
}

#[tokio::test]
async fn rebalance_rejects_bad_counts_and_unknown_deals() {
    let app = spawn_app_with(|_| {}).await;
    let deal = app
        .given_deal(&crate::helpers::new_deal("small", 10, 2))
        .await;
    for buckets in [0, 1025, -1] {
        let request = app
            .client
            .post(app.url(&format!("/admin/deals/{deal}/rebalance")))
            .bearer_auth(&app.admin_token)
            .json(&json!({ "buckets": buckets }));
        send(request).await.expect_problem(400, "invalid-request");
    }
    let request = app
        .client
        .post(app.url("/admin/deals/nope/rebalance"))
        .bearer_auth(&app.admin_token)
        .json(&json!({ "buckets": 4 }));
    send(request).await.expect_problem(404, "not-found");
    let request = app
        .client
        .post(app.url(&format!("/admin/deals/{deal}/rebalance")))
        .json(&json!({ "buckets": 4 }));
    send(request).await.expect_problem(401, "unauthorized");
    app.cleanup().await;
}
