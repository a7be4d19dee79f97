//! Releasing reservations: cancel and expiry return units to the buckets they came from and
//! clear the sold-out flag.

use std::collections::BTreeMap;

use serde_json::json;

use crate::helpers::{
    EVENTUALLY, available_by_bucket, db_snapshot, eventually, new_deal, order_holdings,
    order_status, spawn_app, spawn_app_with,
};

#[tokio::test(flavor = "multi_thread")]
async fn cancel_returns_units_to_their_original_buckets() {
    // Arrange: 10 units over 4 buckets; alice holds 3.
    let app = spawn_app().await;
    let mut deal = new_deal("c1", 10, 4);
    deal["per_user_limit"] = json!(5);
    let id = app.given_deal(&deal).await;
    let initial = available_by_bucket(&app.db, &id).await;
    let token = app.token("alice");
    let order = app.place_order(&token, &id, "k1", 3).await.expect(201);
    let order_id = order["order_id"].as_str().unwrap();
    let lines = order_holdings(&app.db, order_id).await;
    let reserved = available_by_bucket(&app.db, &id).await;
    let expected: BTreeMap<i32, i64> = initial
        .iter()
        .map(|(b, a)| (*b, a - lines.get(b).copied().unwrap_or(0)))
        .collect();
    assert_eq!(
        reserved, expected,
        "the reservation lines name the buckets that were decremented"
    );

    // Act
    let cancelled = app.cancel_order(&token, order_id).await;

    // Assert
    let body = cancelled.expect(200);
    assert_eq!(body["status"], "CANCELLED");
    assert_eq!(body["order_id"], order["order_id"]);
    assert_eq!(
        available_by_bucket(&app.db, &id).await,
        initial,
        "units went back to other buckets"
    );
    assert_eq!(order_status(&app.db, order_id).await, "CANCELLED");
    assert_eq!(
        app.get_order(&token, order_id).await.expect(200)["status"],
        "CANCELLED"
    );
    app.assert_invariants(&id).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn only_a_pending_order_of_ones_own_can_be_cancelled() {
    let app = spawn_app().await;
    let id = app.given_deal(&new_deal("c2", 10, 2)).await;
    let alice = app.token("alice");
    let order = app.place_order(&alice, &id, "k1", 1).await.expect(201);
    let order_id = order["order_id"].as_str().unwrap();

    let by_bob = app.cancel_order(&app.token("bob"), order_id).await;
    assert!(
        matches!(by_bob.status, 403 | 404),
        "bob cancelled alice's order: {}",
        by_bob.text
    );
    assert_eq!(order_status(&app.db, order_id).await, "PENDING_PAYMENT");
    app.cancel_order(&alice, &uuid::Uuid::now_v7().to_string())
        .await
        .expect_problem(404, "not-found");

    app.cancel_order(&alice, order_id).await.expect(200);
    let before = db_snapshot(&app.db, &id).await;
    let again = app.cancel_order(&alice, order_id).await;

    assert_eq!(again.status, 409, "{}", again.text);
    assert_eq!(
        db_snapshot(&app.db, &id).await,
        before,
        "a second cancel changed the database"
    );
    app.assert_invariants(&id).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cancel_clears_sold_out_and_frees_the_per_user_units() {
    // Arrange: two units over two buckets, both sold.
    let app = spawn_app().await;
    let mut deal = new_deal("c3", 2, 2);
    deal["per_user_limit"] = json!(1);
    let id = app.given_deal(&deal).await;
    let alice = app.token("alice");
    let order = app.place_order(&alice, &id, "k1", 1).await.expect(201);
    app.order("bob", &id, 1).await.expect(201);
    app.wait_for_deal_state(&id, "sold_out").await;
    app.order("carol", &id, 1)
        .await
        .expect_problem(409, "sold-out");

    // Act
    app.cancel_order(&alice, order["order_id"].as_str().unwrap())
        .await
        .expect(200);

    // Assert: orderable again within about a second, then sold out again.
    app.wait_for_deal_state(&id, "open").await;
    app.order_eventually("carol", &id, 1).await;
    app.order("dave", &id, 1)
        .await
        .expect_problem(409, "sold-out");
    app.wait_for_deal_state(&id, "sold_out").await;
    app.assert_invariants(&id).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cancelled_units_count_no_more_against_the_per_user_limit() {
    let app = spawn_app().await;
    let id = app.given_deal(&new_deal("c4", 10, 2)).await;
    let alice = app.token("alice");
    let order = app.place_order(&alice, &id, "k1", 2).await.expect(201);
    app.place_order(&alice, &id, "k2", 1)
        .await
        .expect_problem(409, "per-user-limit");

    app.cancel_order(&alice, order["order_id"].as_str().unwrap())
        .await
        .expect(200);

    app.place_order(&alice, &id, "k3", 2).await.expect(201);
    app.assert_invariants(&id).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn expired_reservations_return_to_their_buckets_and_clear_sold_out() {
    // Arrange: two units over two buckets, one second to pay.
    let app = spawn_app_with(|s| s.sweeper.interval_ms = 100).await;
    let mut deal = new_deal("e1", 2, 2);
    deal["per_user_limit"] = json!(1);
    deal["reservation_ttl_seconds"] = json!(1);
    let id = app.given_deal(&deal).await;
    let initial = available_by_bucket(&app.db, &id).await;
    let alice = app.token("alice");
    let order = app.place_order(&alice, &id, "k1", 1).await.expect(201);
    let order_id = order["order_id"].as_str().unwrap().to_owned();
    app.order("bob", &id, 1).await.expect(201);
    app.order("carol", &id, 1)
        .await
        .expect_problem(409, "sold-out");

    // Act: wait for the sweeper.
    let db = &app.db;
    let expired = eventually(EVENTUALLY + EVENTUALLY, || {
        let order_id = order_id.clone();
        async move { (order_status(db, &order_id).await == "EXPIRED").then_some(()) }
    })
    .await;

    // Assert
    assert!(
        expired.is_some(),
        "order still {} after 6 s",
        order_status(db, &order_id).await
    );
    let read = app.get_order(&alice, &order_id).await.expect(200);
    assert_eq!(read["status"], "EXPIRED");
    // Both orders expire; every unit is back where it was taken from.
    let (deal_id, initial_ref) = (id.as_str(), &initial);
    let back = eventually(EVENTUALLY, || async move {
        (available_by_bucket(db, deal_id).await == *initial_ref).then_some(())
    })
    .await;
    assert!(
        back.is_some(),
        "buckets {:?}, initially {initial:?}",
        available_by_bucket(db, &id).await
    );
    let late_cancel = app.cancel_order(&alice, &order_id).await;
    assert_eq!(
        late_cancel.status, 409,
        "cancelling an expired order: {}",
        late_cancel.text
    );
    app.wait_for_deal_state(&id, "open").await;
    app.order_eventually("carol", &id, 1).await;
    app.assert_invariants(&id).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_cancels_release_an_order_once() {
    // Arrange
    let app = spawn_app().await;
    let id = app.given_deal(&new_deal("c5", 10, 2)).await;
    let alice = app.token("alice");
    let order = app.place_order(&alice, &id, "k1", 2).await.expect(201);
    let order_id = order["order_id"].as_str().unwrap().to_owned();

    // Act: ten cancels at once.
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..10 {
        let (api, alice, order_id) = (app.api.clone(), alice.clone(), order_id.clone());
        tasks.spawn(async move { api.cancel_order(&alice, &order_id).await });
    }
    let replies = tasks.join_all().await;

    // Assert
    let cancelled = replies.iter().filter(|r| r.status == 200).count();
    assert_eq!(cancelled, 1, "cancels answered 200");
    assert!(
        replies.iter().all(|r| matches!(r.status, 200 | 409)),
        "{replies:?}"
    );
    assert_eq!(app.inventory(&id).await["available"], 10);
    app.assert_invariants(&id).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cancels_racing_the_sweeper_release_each_order_once() {
    // Arrange: 30 one-unit orders that expire after one second.
    let app = spawn_app().await;
    let mut deal = new_deal("race", 30, 4);
    deal["per_user_limit"] = json!(1);
    deal["reservation_ttl_seconds"] = json!(1);
    let id = app.given_deal(&deal).await;
    let mut orders = Vec::new();
    for n in 0..30 {
        let user = format!("user-{n}");
        let order = app.order(&user, &id, 1).await.expect(201);
        orders.push((
            app.token(&user),
            order["order_id"].as_str().unwrap().to_owned(),
        ));
    }

    // Act: cancel everything just as the reservations expire.
    let last_expiry: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT max(expires_at) FROM orders")
            .fetch_one(&app.db)
            .await
            .unwrap();
    let wait = (last_expiry - chrono::Utc::now())
        .to_std()
        .unwrap_or_default();
    tokio::time::sleep(wait).await; // deliberately racing the sweeper
    let mut tasks = tokio::task::JoinSet::new();
    for (token, order_id) in orders {
        let api = app.api.clone();
        tasks.spawn(async move { api.cancel_order(&token, &order_id).await });
    }
    let replies = tasks.join_all().await;

    // Assert: every order ended once, as CANCELLED (answered 200) or EXPIRED (answered 409).
    assert!(
        replies.iter().all(|r| matches!(r.status, 200 | 409)),
        "{replies:?}"
    );
    let db = &app.db;
    let settled = eventually(EVENTUALLY, || async move {
        let pending: i64 =
            sqlx::query_scalar("SELECT count(*) FROM orders WHERE status = 'PENDING_PAYMENT'")
                .fetch_one(db)
                .await
                .unwrap();
        (pending == 0).then_some(())
    })
    .await;
    assert!(settled.is_some(), "orders still pending");
    let cancelled: i64 =
        sqlx::query_scalar("SELECT count(*) FROM orders WHERE status = 'CANCELLED'")
            .fetch_one(db)
            .await
            .unwrap();
    let answered_ok = replies.iter().filter(|r| r.status == 200).count();
    assert_eq!(
        cancelled, answered_ok as i64,
        "CANCELLED rows vs 200 answers"
    );
    let inventory = app.inventory(&id).await;
    assert_eq!(
        (
            inventory["available"].as_i64(),
            inventory["reserved"].as_i64()
        ),
        (Some(30), Some(0))
    );
    app.assert_invariants(&id).await;
    app.cleanup().await;
}
