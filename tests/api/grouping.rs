//! Batch reservation: a batch of requests is answered exactly as if each had run alone, in
//! arrival order, and one failure never fails the others.

use flashgate::deals;
use flashgate::deals::Deal;
use flashgate::orders::batch::{BatchOptions, Request, place_batch};
use flashgate::orders::{OrderError, Placed, fingerprint};
use serde_json::json;

use crate::helpers::{new_deal, spawn_app, spawn_app_with};

fn request(deal: &str, user: &str, key: &str, quantity: i32) -> Request {
    Request {
        user_id: user.into(),
        key: key.into(),
        quantity,
        fingerprint: fingerprint(deal, quantity as u32),
    }
}

/// What a result looks like, for comparing with the expectation.
fn outcome(result: &Result<Placed, OrderError>) -> String {
    match result {
        Ok(placed) if placed.replayed => format!("replayed:{}", placed.order.quantity),
        Ok(placed) => format!("reserved:{}", placed.order.quantity),
        Err(OrderError::SoldOut { .. }) => "sold-out".into(),
        Err(OrderError::PerUserLimit { .. }) => "per-user-limit".into(),
        Err(OrderError::IdempotencyConflict) => "conflict".into(),
        Err(other) => format!("error:{other}"),
    }
}

/// Places `requests` as one batch that may take any bucket.
async fn place_group(
    db: &sqlx::PgPool,
    deal: &Deal,
    requests: &[Request],
) -> Vec<Result<Placed, OrderError>> {
    place_batch(db, deal, requests, &BatchOptions::default())
        .await
        .expect("the batch commits")
        .results
}

#[tokio::test(flavor = "multi_thread")]
async fn a_mixed_group_is_answered_as_if_each_request_ran_alone() {
    // Arrange: 3 units over 2 buckets, two per user; carol already holds an order.
    let app = spawn_app().await;
    let id = app.given_deal(&new_deal("group", 3, 2)).await;
    let carol = app.token("carol");
    app.place_order(&carol, &id, "carol-1", 1).await.expect(201);
    let deal: Deal = deals::load(&app.db, &id).await.unwrap().unwrap();
    let group = vec![
        request(&id, "alice", "a-1", 1), // reserves, 1 left after carol's and this
        request(&id, "alice", "a-1", 1), // the same key again: the same order
        request(&id, "bob", "b-1", 3),   // over bob's limit of 2
        request(&id, "dave", "d-1", 2),  // more than the 1 left
        request(&id, "erin", "e-1", 1),  // takes the last unit: sold out inside the group
        request(&id, "frank", "f-1", 1), // sold out
        request(&id, "carol", "carol-1", 1), // replay of carol's earlier order
        request(&id, "carol", "carol-1", 2), // carol's key with another body
        request(&id, "alice", "a-1", 2), // alice's key with another body
    ];

    // Act
    let results = place_group(&app.db, &deal, &group).await;

    // Assert
    let outcomes: Vec<String> = results.iter().map(outcome).collect();
    assert_eq!(
        outcomes,
        vec![
            "reserved:1",
            "replayed:1",
            "per-user-limit",
            "sold-out",
            "reserved:1",
            "sold-out",
            "replayed:1",
            "conflict",
            "conflict",
        ]
    );
    let first = results[0].as_ref().unwrap();
    let again = results[1].as_ref().unwrap();
    assert_eq!(
        first.order.id, again.order.id,
        "the duplicate key names the same order"
    );
    let inventory = app.inventory(&id).await;
    assert_eq!(
        (
            inventory["available"].clone(),
            inventory["reserved"].clone()
        ),
        (json!(0), json!(3)),
        "{inventory}"
    );
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(orders, 3, "losers leave no order behind");
    app.assert_invariants(&id).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn per_user_limits_count_across_the_group_and_earlier_orders() {
    let app = spawn_app().await;
    let mut deal_body = new_deal("limits", 20, 4);
    deal_body["per_user_limit"] = json!(3);
    let id = app.given_deal(&deal_body).await;
    app.place_order(&app.token("alice"), &id, "earlier", 2)
        .await
        .expect(201);
    let deal: Deal = deals::load(&app.db, &id).await.unwrap().unwrap();
    let group = vec![
        request(&id, "alice", "k1", 1), // 2 + 1 = 3: allowed
        request(&id, "alice", "k2", 1), // 4: refused
        request(&id, "bob", "k1", 2),   // keys are per user: allowed
        request(&id, "bob", "k2", 1),   // 3: allowed
        request(&id, "bob", "k3", 1),   // 4: refused
    ];

    let results = place_group(&app.db, &deal, &group).await;

    let outcomes: Vec<String> = results.iter().map(outcome).collect();
    assert_eq!(
        outcomes,
        vec![
            "reserved:1",
            "per-user-limit",
            "reserved:2",
            "reserved:1",
            "per-user-limit"
        ]
    );
    assert_eq!(app.inventory(&id).await["reserved"], json!(6));
    app.assert_invariants(&id).await;
    app.cleanup().await;
}

/// `flashgate_reservation_batches_rechecked_total` as `/metrics` gives it.
async fn rechecked(app: &crate::helpers::TestApp) -> f64 {
    crate::helpers::metric_value(
        &app.metrics().await,
        "flashgate_reservation_batches_rechecked_total",
        "",
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_batch_that_meets_an_existing_key_or_buyer_is_decided_again_and_counted() {
    // Arrange: alice already holds 1 of her 2 units.
    let app = spawn_app().await;
    let mut deal_body = new_deal("recheck", 10, 2);
    deal_body["per_user_limit"] = json!(2);
    let id = app.given_deal(&deal_body).await;
    app.place_order(&app.token("alice"), &id, "a-1", 1)
        .await
        .expect(201);
    let deal: Deal = deals::load(&app.db, &id).await.unwrap().unwrap();
    let before = rechecked(&app).await;

    // Act: new keys of new buyers; then a replay; then a known buyer's new key, met only
    // after the batch's orders were written.
    let new_only = place_group(
        &app.db,
        &deal,
        &[
            request(&id, "bob", "b-1", 1),
            request(&id, "carol", "c-1", 1),
        ],
    )
    .await;
    let after_new = rechecked(&app).await;
    let with_replay = place_group(
        &app.db,
        &deal,
        &[
            request(&id, "dave", "d-1", 1),
            request(&id, "alice", "a-1", 1),
        ],
    )
    .await;
    let after_replay = rechecked(&app).await;
    let with_buyer = place_group(
        &app.db,
        &deal,
        &[
            request(&id, "erin", "e-1", 1),
            request(&id, "alice", "a-2", 1),
            request(&id, "alice", "a-3", 1),
        ],
    )
    .await;
    let after_buyer = rechecked(&app).await;

    // Assert: each answer as if alone; only the last two batches took the careful way,
    // and the first try of each left nothing behind.
    let outcomes = |results: &[Result<Placed, OrderError>]| -> Vec<String> {
        results.iter().map(outcome).collect()
    };
    assert_eq!(outcomes(&new_only), vec!["reserved:1", "reserved:1"]);
    assert_eq!(outcomes(&with_replay), vec!["reserved:1", "replayed:1"]);
    assert_eq!(
        outcomes(&with_buyer),
        vec!["reserved:1", "reserved:1", "per-user-limit"]
    );
    assert_eq!(
        (
            after_new - before,
            after_replay - before,
            after_buyer - before
        ),
        (0.0, 1.0, 2.0)
    );
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders WHERE deal_id = $1")
        .bind(&id)
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(
        orders, 6,
        "one order per reserved request, none for the refused"
    );
    let alice: i32 = sqlx::query_scalar(
        "SELECT units FROM user_deal_units WHERE deal_id = $1 AND user_id = 'alice'",
    )
    .bind(&id)
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(alice, 2);
    assert_eq!(app.inventory(&id).await["reserved"], json!(6));
    app.assert_invariants(&id).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn after_a_recheck_the_deals_next_batches_check_from_the_start() {
    // Arrange: one lane, so every order of the deal goes through the same backoff.
    let app = spawn_app_with(|s| {
        s.orders.lanes = 1;
        s.orders.careful_after_recheck = 2;
    })
    .await;
    let mut deal_body = new_deal("backoff", 10, 2);
    deal_body["per_user_limit"] = json!(5);
    let id = app.given_deal(&deal_body).await;
    let bob = app.token("bob");
    app.place_order(&bob, &id, "b-1", 1).await.expect(201);

    // Act: a replay is decided again; bob's next two new keys would be too, but go the
    // careful way at once; the third is plain again, and decided again.
    let replay = app.place_order(&bob, &id, "b-1", 1).await;
    let after_replay = rechecked(&app).await;
    for key in ["b-2", "b-3"] {
        app.place_order(&bob, &id, key, 1).await.expect(201);
    }
    let after_careful = rechecked(&app).await;
    app.place_order(&bob, &id, "b-4", 1).await.expect(201);
    let after_plain = rechecked(&app).await;

    // Assert
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!((after_replay, after_careful, after_plain), (1.0, 1.0, 2.0));
    assert_eq!(app.inventory(&id).await["reserved"], json!(4));
    app.assert_invariants(&id).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_closed_sale_window_refuses_the_whole_group_but_replays_still_answer() {
    let app = spawn_app().await;
    let mut deal_body = new_deal("window", 5, 1);
    deal_body["starts_at"] = json!("2999-01-01T00:00:00Z");
    let id = app.given_deal(&deal_body).await;
    let deal: Deal = deals::load(&app.db, &id).await.unwrap().unwrap();

    let results = place_group(&app.db, &deal, &[request(&id, "alice", "k", 1)]).await;

    assert!(
        matches!(results[0], Err(OrderError::SaleNotOpen)),
        "{:?}",
        results[0].as_ref().err()
    );
    assert_eq!(app.inventory(&id).await["available"], json!(5));
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stampede_forms_groups_and_still_sells_exactly_the_stock() {
    // One lane makes batches of more than one certain even on a loaded machine.
    let app = spawn_app_with(|s| {
        s.orders.lanes = 1;
        s.database.acquire_timeout_ms = 2000;
    })
    .await;
    let id = app.given_deal(&new_deal("grouped", 60, 8)).await;
    let attempts: Vec<(String, String)> = (0..300)
        .map(|u| (format!("user-{u}"), "k".to_owned()))
        .collect();

    let results =
        crate::concurrency::stampede(std::slice::from_ref(&app.api), &id, attempts, 100).await;

    let created = results.iter().filter(|a| a.reply.status == 201).count();
    assert_eq!(created, 60);
    assert!(results.iter().all(|a| matches!(a.reply.status, 201 | 409)));
    let metrics = app.metrics().await;
    let grouped: f64 = metrics
        .lines()
        .find_map(|line| {
            line.strip_prefix("flashgate_grouped_orders_total ")?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0.0);
    assert!(grouped > 0.0, "no order went through a group");
    app.assert_invariants(&id).await;
    app.cleanup().await;
}
