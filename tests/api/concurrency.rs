//! Real concurrency against one deal: no oversell, no lost unit, limits hold under races.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde_json::json;
use tokio::sync::Semaphore;
use uuid::Uuid;

use crate::helpers::{Api, EVENTUALLY, Reply, buckets, new_deal, poll_every, spawn_app_with};

/// One attempt of the stampede and what it got.
pub struct Attempt {
    pub user: String,
    pub reply: Reply,
}

/// Fires `(user, key)` orders of one unit with at most `in_flight` requests open at once,
/// spreading them round-robin over `gateways`.
pub async fn stampede(
    gateways: &[Api],
    deal: &str,
    attempts: Vec<(String, String)>,
    in_flight: usize,
) -> Vec<Attempt> {
    let permits = Arc::new(Semaphore::new(in_flight));
    let mut tokens = BTreeMap::new();
    let mut tasks = tokio::task::JoinSet::new();
    for (n, (user, key)) in attempts.into_iter().enumerate() {
        let api = &gateways[n % gateways.len()];
        let token = tokens
            .entry(user.clone())
            .or_insert_with(|| api.token(&user))
            .clone();
        let (api, deal, permits) = (api.clone(), deal.to_owned(), permits.clone());
        tasks.spawn(async move {
            let _permit = permits.acquire_owned().await.unwrap();
            let reply = api.place_order_retrying(&token, &deal, &key, 1).await;
            Attempt { user, reply }
        });
    }
    tasks.join_all().await
}

#[tokio::test(flavor = "multi_thread")]
async fn stampede_of_2000_orders_reserves_exactly_the_stock() {
    // Arrange: 100 units over 8 buckets, two per user; 500 users try 4 times each.
    let app = spawn_app_with(|s| s.database.acquire_timeout_ms = 2000).await;
    let id = app.given_deal(&new_deal("stampede", 100, 8)).await;
    let attempts: Vec<(String, String)> = (0..4)
        .flat_map(|round| {
            (0..500).map(move |user| (format!("user-{user}"), format!("key-{round}")))
        })
        .collect();

    // Act
    let results = stampede(std::slice::from_ref(&app.api), &id, attempts, 200).await;

    // Assert: the responses.
    let mut created = BTreeMap::new();
    let mut units_per_user: BTreeMap<&str, i64> = BTreeMap::new();
    for attempt in &results {
        if attempt.reply.status == 201 {
            let body = attempt.reply.json();
            created.insert(
                body["order_id"].as_str().unwrap().to_owned(),
                attempt.user.clone(),
            );
            *units_per_user.entry(&attempt.user).or_default() += 1;
        } else {
            let slug = attempt.reply.problem_slug();
            assert!(
                attempt.reply.status == 409
                    && matches!(slug.as_deref(), Some("sold-out" | "per-user-limit")),
                "unexpected reply: {} {}",
                attempt.reply.status,
                attempt.reply.text
            );
        }
    }
    assert_eq!(created.len(), 100, "201 answers");
    assert!(
        units_per_user.values().all(|&units| units <= 2),
        "a user got more than 2 units"
    );

    // Assert: the database agrees with the answers.
    let rows: Vec<(Uuid, String, i32)> =
        sqlx::query_as("SELECT id, user_id, quantity FROM orders WHERE deal_id = $1")
            .bind(&id)
            .fetch_all(&app.db)
            .await
            .unwrap();
    let in_db: BTreeMap<String, String> = rows
        .iter()
        .map(|(id, user, _)| (id.to_string(), user.clone()))
        .collect();
    assert_eq!(
        in_db, created,
        "orders in the database differ from the 201 answers"
    );
    assert_eq!(rows.iter().map(|(_, _, q)| i64::from(*q)).sum::<i64>(), 100);
    let rows = buckets(&app.db, &id).await;
    assert_eq!(
        rows.iter().map(|b| b.reserved).sum::<i64>(),
        100,
        "{rows:?}"
    );
    assert_eq!(rows.iter().map(|b| b.available).sum::<i64>(), 0, "{rows:?}");
    app.assert_invariants(&id).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn one_user_racing_50_orders_gets_exactly_the_per_user_limit() {
    // Arrange
    let app = spawn_app_with(|s| s.database.acquire_timeout_ms = 2000).await;
    let mut deal = new_deal("greedy", 100, 4);
    deal["per_user_limit"] = json!(3);
    let id = app.given_deal(&deal).await;
    let attempts = (0..50)
        .map(|n| ("alice".to_owned(), format!("key-{n}")))
        .collect();

    // Act
    let results = stampede(std::slice::from_ref(&app.api), &id, attempts, 50).await;

    // Assert
    let created: BTreeSet<String> = results
        .iter()
        .filter(|a| a.reply.status == 201)
        .map(|a| a.reply.json()["order_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(created.len(), 3, "201 answers");
    for attempt in results.iter().filter(|a| a.reply.status != 201) {
        attempt.reply.expect_problem(409, "per-user-limit");
    }
    let held: i64 = sqlx::query_scalar(
        "SELECT coalesce(sum(quantity), 0)::BIGINT FROM orders WHERE deal_id = $1 AND user_id = 'alice'",
    )
    .bind(&id)
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(held, 3);
    assert_eq!(app.inventory(&id).await["reserved"], 3);
    app.assert_invariants(&id).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn stock_adjustments_racing_orders_keep_the_books_balanced() {
    // Arrange: 100 units; 300 order attempts and 20 adjustments will run together.
    let app = spawn_app_with(|s| s.database.acquire_timeout_ms = 2000).await;
    let id = app.given_deal(&new_deal("adjusted", 100, 8)).await;
    let attempts: Vec<(String, String)> = (0..2)
        .flat_map(|round| {
            (0..150).map(move |user| (format!("user-{user}"), format!("key-{round}")))
        })
        .collect();
    let deltas: Vec<i64> = (0..20).map(|n| if n % 2 == 0 { -7 } else { 5 }).collect();

    // Act
    // One admin adjusts stock step by step while the orders run.
    let (api, deal) = (app.api.clone(), id.clone());
    let adjuster = tokio::spawn(async move {
        let mut applied = 0;
        for delta in deltas {
            // The admin API shares the small background pool: 503 means "not done, retry".
            let every = std::time::Duration::from_millis(50);
            let adjusted = poll_every(every, EVENTUALLY, || async {
                let reply = api.adjust_stock(&deal, delta).await;
                if reply.status == 503 {
                    Err(reply.text)
                } else {
                    Ok(reply)
                }
            })
            .await;
            let reply = adjusted.unwrap_or_else(|seen| panic!("adjust {delta}: still {seen}"));
            assert!(
                matches!(reply.status, 200 | 409),
                "adjust {delta}: {} {}",
                reply.status,
                reply.text
            );
            if reply.status == 200 {
                applied += delta;
            }
        }
        applied
    });
    let orders = stampede(std::slice::from_ref(&app.api), &id, attempts, 100).await;
    let applied = adjuster.await.unwrap();

    // Assert: stock_total moved by exactly the accepted adjustments, and every unit is accounted for.
    let created = orders.iter().filter(|a| a.reply.status == 201).count() as i64;
    let inventory = app.inventory(&id).await;
    assert_eq!(
        inventory["stock_total"],
        json!(100 + applied),
        "{inventory}"
    );
    assert_eq!(inventory["reserved"], json!(created), "{inventory}");
    for attempt in orders.iter().filter(|a| a.reply.status != 201) {
        let slug = attempt.reply.problem_slug();
        assert!(
            attempt.reply.status == 409
                && matches!(slug.as_deref(), Some("sold-out" | "per-user-limit")),
            "unexpected reply: {} {}",
            attempt.reply.status,
            attempt.reply.text
        );
    }
    app.assert_invariants(&id).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn multi_unit_orders_and_cancels_never_deadlock_or_lose_units() {
    // Arrange: 60 units over 16 small buckets, so orders of 3 or 4 units soon have to span
    // buckets while other orders take single ones and cancels return units.
    let app = spawn_app_with(|s| s.database.acquire_timeout_ms = 2000).await;
    let mut deal = new_deal("spread", 60, 16);
    deal["per_user_limit"] = json!(4);
    let id = app.given_deal(&deal).await;

    // Act: 120 users each order 1-4 units; every third user cancels right away.
    let mut tasks = tokio::task::JoinSet::new();
    for user in 0..120 {
        let (api, id) = (app.api.clone(), id.clone());
        tasks.spawn(async move {
            let token = api.token(&format!("spread-{user}"));
            let quantity = 1 + user % 4;
            let reply = api
                .place_order_retrying(&token, &id, &format!("k-{user}"), quantity)
                .await;
            if reply.status == 201 && user % 3 == 0 {
                let order_id = reply.json()["order_id"].as_str().unwrap().to_owned();
                let cancelled = api.cancel_order(&token, &order_id).await;
                assert_eq!(cancelled.status, 200, "{}", cancelled.text);
                return (reply.status, 0);
            }
            (reply.status, if reply.status == 201 { quantity } else { 0 })
        });
    }
    let outcomes = tasks.join_all().await;

    // Assert: only 201 or 409 (never a 5xx from a deadlock), and every held unit is reserved.
    for (status, _) in &outcomes {
        assert!(matches!(status, 201 | 409), "unexpected status {status}");
    }
    let held: i64 = outcomes.iter().map(|(_, units)| units).sum();
    let inventory = app.inventory(&id).await;
    assert_eq!(inventory["reserved"], json!(held), "{inventory}");
    assert_eq!(inventory["stock_total"], json!(60), "{inventory}");
    app.assert_invariants(&id).await;
    app.cleanup().await;
}
