//! Unknown deal ids are answered from memory: a scan of made-up ids costs a bounded, small
//! number of PostgreSQL transactions, the 404 is briefly cacheable, and a deal created on
//! another instance is known at once.

use std::time::Duration;

use flashgate::app::Application;
use sqlx::PgPool;

use crate::helpers::{
    Api, EVENTUALLY, eventually, new_deal, send, spawn_app_with, unique_suffix, wait_until,
};

/// Transactions committed or rolled back in the current database, as far as flushed.
async fn transactions(db: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database
          WHERE datname = current_database()",
    )
    .fetch_one(db)
    .await
    .unwrap()
}

/// The gateway's sessions on the test's database (it names itself `flashgate`).
async fn gateway_sessions(db: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
          WHERE datname = current_database() AND application_name = 'flashgate'",
    )
    .fetch_one(db)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn thousands_of_unknown_ids_cost_a_few_transactions() {
    // Arrange: background work slowed down, so the count is about requests.
    let mut app = spawn_app_with(|s| {
        s.sweeper.interval_ms = 10_000;
        s.soldout.refresh_interval_ms = 10_000;
        s.deals.metrics_interval_ms = 60_000;
    })
    .await;
    app.given_deal(&new_deal("real", 5, 1)).await;
    let token = app.token("scanner");
    // PostgreSQL publishes a running session's counts at most once a second; what the
    // set-up spent must be in the baseline, and nothing marks when it is.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let before = transactions(&app.db).await;

    // Act: 4,000 reads and orders of ids that do not exist.
    let mut workers = tokio::task::JoinSet::new();
    for worker in 0..32 {
        let api = app.api.clone();
        let token = token.clone();
        workers.spawn(async move {
            let mut replies = Vec::new();
            for i in 0..125 {
                let id = format!("nope-{}", unique_suffix());
                let read = i % 2 == 0;
                let reply = if read {
                    api.get_deal(&id).await
                } else {
                    api.place_order(&token, &id, &format!("k{worker}-{i}"), 1)
                        .await
                };
                let cache = reply.header("cache-control").map(str::to_owned);
                replies.push((
                    reply.status,
                    read && cache.as_deref() == Some("public, max-age=1"),
                ));
            }
            replies
        });
    }
    let replies: Vec<(u16, bool)> = workers.join_all().await.concat();
    // Stopping closes the gateway's connections, and PostgreSQL counts a session's
    // transactions at the latest when it ends.
    app.stop().await.expect("stops");
    wait_until("the gateway's sessions to end", EVENTUALLY, || async {
        gateway_sessions(&app.db).await == 0
    })
    .await;
    let spent = transactions(&app.db).await - before;

    // Assert
    assert!(replies.iter().all(|(status, _)| *status == 404));
    let cacheable = replies.iter().filter(|(_, cacheable)| *cacheable).count();
    assert_eq!(cacheable, 32 * 63, "every GET 404 may be cached briefly");
    assert!(
        spent < 100,
        "4,000 unknown-id requests cost {spent} transactions"
    );
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deal_created_on_another_instance_is_known_at_once() {
    // Arrange: a second instance on the same database whose cache would keep a miss for
    // a minute; it has already answered 404 for the id.
    let first = spawn_app_with(|s| s.deals.cache_ttl_ms = 60_000).await;
    let mut settings = first.settings.clone();
    settings.redis.key_prefix = format!("fgtest:{}:", unique_suffix());
    let second = Application::build(settings.clone()).await.unwrap();
    let second_api = Api::new(
        &format!("http://{}", second.local_addr()),
        &format!("http://{}", second.ops_addr()),
        &settings,
    );
    let stop = second.shutdown_token();
    let server = tokio::spawn(second.run());
    second_api
        .get_deal("announced")
        .await
        .expect_problem(404, "not-found");

    // Act
    first.given_deal(&new_deal("announced", 5, 1)).await;

    // Assert
    let known = eventually(EVENTUALLY, || {
        let api = second_api.clone();
        async move { (api.get_deal("announced").await.status == 200).then_some(()) }
    })
    .await;
    assert!(known.is_some(), "the second instance still answers 404");
    let order = send(
        second_api
            .client
            .post(second_api.url("/v1/deals/announced/orders"))
            .bearer_auth(second_api.token("alice"))
            .header("Idempotency-Key", "k")
            .json(&serde_json::json!({ "quantity": 1 })),
    )
    .await;
    order.expect(201);
    stop.cancel();
    let _ = server.await;
    first.cleanup().await;
}
