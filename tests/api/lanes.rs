//! Lanes on several instances: three `flashgate serve` processes, each running several
//! batches of the same deal side by side over shared buckets, never deadlock (every
//! request is answered 201 or 409, none fails) and never oversell.

use crate::concurrency::stampede;
use crate::helpers::{Api, TestDb, assert_invariants, delete_redis_keys, new_deal, test_settings};
use crate::multi_process::{spawn_gateway_with, wait_until_healthy};

#[tokio::test(flavor = "multi_thread")]
async fn lanes_on_three_instances_selling_one_deal_never_deadlock_or_oversell() {
    // Arrange: three gateways with four lanes each over a deal of 8 buckets, so lanes of
    // different instances share buckets and spill into each other's shares.
    let database = TestDb::create().await;
    let settings = test_settings(&database.url);
    let lanes = [
        ("FLASHGATE__ORDERS__LANES", "4"),
        ("FLASHGATE__ORDERS__BATCH_MAX", "16"),
    ];
    let mut gateways = Vec::new();
    let mut apis = Vec::new();
    for _ in 0..3 {
        let api = Api::on_free_ports(&settings);
        gateways.push(spawn_gateway_with(&settings, &api, &lanes));
        apis.push(api);
    }
    for (gateway, api) in gateways.iter_mut().zip(&apis) {
        wait_until_healthy(gateway, api).await;
    }
    let mut body = new_deal("lanes", 400, 8);
    body["per_user_limit"] = serde_json::json!(3);
    let deal = apis[0].given_deal(&body).await;
    // 900 one-unit orders by 300 users (within their limit of 3): more than the stock.
    let attempts: Vec<(String, String)> = (0..3)
        .flat_map(|round| (0..300).map(move |u| (format!("user-{u}"), format!("key-{round}"))))
        .collect();

    // Act
    let results = stampede(&apis, &deal, attempts, 150).await;

    // Assert: every request decided, exactly the stock sold, the books balanced.
    for attempt in results.iter().filter(|a| a.reply.status != 201) {
        assert_eq!(
            (
                attempt.reply.status,
                attempt.reply.problem_slug().as_deref()
            ),
            (409, Some("sold-out")),
            "{}",
            attempt.reply.text
        );
    }
    let created = results.iter().filter(|a| a.reply.status == 201).count();
    assert_eq!(created, 400, "one unit per order, all 400 sold");
    let db = database.connect(2).await;
    let ordered: i64 = sqlx::query_scalar(
        "SELECT coalesce(sum(quantity), 0)::BIGINT FROM orders WHERE deal_id = $1",
    )
    .bind(&deal)
    .fetch_one(&db)
    .await
    .unwrap();
    assert_eq!(ordered, 400, "units ordered in the database");
    assert_invariants(&apis[0], &db, &deal).await;
    for gateway in &mut gateways {
        let _ = gateway.terminate(std::time::Duration::from_secs(15)).await;
    }
    db.close().await;
    delete_redis_keys(&settings.redis.url, &settings.redis.key_prefix).await;
    database.drop_database().await;
}
