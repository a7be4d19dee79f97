//! Idempotency-Key: replays return the stored answer, conflicts are refused, and concurrent
//! duplicates still create one order.

use std::collections::BTreeSet;
use std::time::Duration;

use flashgate::admission::soldout::{Flag, SoldOut};
use flashgate::clock::Clock;
use flashgate::redis_link::RedisHandle;
use serde_json::json;
use sqlx::postgres::PgPoolOptions;

use crate::helpers::{
    EVENTUALLY, base_database_url, db_snapshot, new_deal, order_count, spawn_app, test_settings,
    unique_suffix, wait_until,
};

#[tokio::test(flavor = "multi_thread")]
async fn replay_returns_the_same_answer_and_reserves_once() {
    // Arrange
    let app = spawn_app().await;
    let id = app.given_deal(&new_deal("i1", 10, 2)).await;
    let token = app.token("alice");
    let first = app.place_order(&token, &id, "key-1", 2).await;
    let first_body = first.expect(201);
    let after_first = db_snapshot(&app.db, &id).await;

    // Act
    let replay = app.place_order(&token, &id, "key-1", 2).await;

    // Assert
    assert_eq!(replay.status, 201, "{}", replay.text);
    assert_eq!(
        replay.json(),
        first_body,
        "a replay must return the stored body"
    );
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(
        db_snapshot(&app.db, &id).await,
        after_first,
        "a replay changed the database"
    );
    assert_eq!(app.inventory(&id).await["reserved"], 2);
    app.assert_invariants(&id).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn same_key_with_another_body_is_a_conflict() {
    let app = spawn_app().await;
    let id = app.given_deal(&new_deal("i2", 10, 2)).await;
    let token = app.token("alice");
    app.place_order(&token, &id, "key-1", 1).await.expect(201);
    let before = db_snapshot(&app.db, &id).await;

    let conflict = app.place_order(&token, &id, "key-1", 2).await;

    conflict.expect_problem(422, "idempotency-conflict");
    assert_eq!(
        db_snapshot(&app.db, &id).await,
        before,
        "a conflict changed the database"
    );
    app.assert_invariants(&id).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reused_key_is_a_conflict_before_any_other_check() {
    // Arrange: alice used her key for 2 units, her whole limit, and the deal then sold out.
    let app = spawn_app().await;
    let mut deal = new_deal("i2b", 3, 2);
    deal["per_user_limit"] = json!(2);
    let id = app.given_deal(&deal).await;
    let token = app.token("alice");
    app.place_order(&token, &id, "key-1", 2).await.expect(201);
    app.order("bob", &id, 1).await.expect(201);
    let before = db_snapshot(&app.db, &id).await;

    // Act: the same key with 3 units, over the limit and more than is left.
    let conflict = app.place_order(&token, &id, "key-1", 3).await;

    // Assert: the reuse is named first, and nothing changed.
    conflict.expect_problem(422, "idempotency-conflict");
    assert_eq!(db_snapshot(&app.db, &id).await, before);
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reused_key_is_a_conflict_before_the_quantity_range() {
    let app = spawn_app().await;
    let id = app.given_deal(&new_deal("i2c", 10, 2)).await;
    let token = app.token("alice");
    app.place_order(&token, &id, "key-1", 2).await.expect(201);
    let above_max = i64::from(app.settings.orders.quantity_max) + 1;

    let reused = app.place_order(&token, &id, "key-1", above_max).await;
    let fresh = app.place_order(&token, &id, "key-2", above_max).await;

    reused.expect_problem(422, "idempotency-conflict");
    fresh.expect_problem(400, "invalid-request");
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replay_after_a_cancel_returns_the_original_answer() {
    let app = spawn_app().await;
    let id = app.given_deal(&new_deal("i2d", 10, 2)).await;
    let token = app.token("alice");
    let first = app.place_order(&token, &id, "key-1", 1).await.expect(201);
    let order_id = first["order_id"].as_str().unwrap();
    app.cancel_order(&token, order_id).await.expect(200);

    let replay = app.place_order(&token, &id, "key-1", 1).await;

    assert_eq!(replay.expect(201), first);
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(replay.header("vary"), Some("authorization"));
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn same_key_on_another_deal_is_a_conflict() {
    let app = spawn_app().await;
    let first = app.given_deal(&new_deal("i3a", 10, 2)).await;
    let second = app.given_deal(&new_deal("i3b", 10, 2)).await;
    let token = app.token("alice");
    app.place_order(&token, &first, "key-1", 1)
        .await
        .expect(201);
    let before = db_snapshot(&app.db, &second).await;

    let conflict = app.place_order(&token, &second, "key-1", 1).await;

    conflict.expect_problem(422, "idempotency-conflict");
    assert_eq!(
        db_snapshot(&app.db, &second).await,
        before,
        "a conflict changed the database"
    );
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn keys_are_scoped_per_user() {
    let app = spawn_app().await;
    let id = app.given_deal(&new_deal("i4", 10, 2)).await;

    let alice = app
        .place_order(&app.token("alice"), &id, "shared-key", 1)
        .await
        .expect(201);
    let bob = app
        .place_order(&app.token("bob"), &id, "shared-key", 1)
        .await
        .expect(201);

    assert_ne!(alice["order_id"], bob["order_id"]);
    assert_eq!(order_count(&app.db).await, 2);
    app.assert_invariants(&id).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_duplicates_create_one_order() {
    // Arrange
    let app = spawn_app().await;
    let id = app.given_deal(&new_deal("i5", 10, 2)).await;
    let token = app.token("alice");

    // Act: 20 identical requests at once.
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..20 {
        let (api, token, id) = (app.api.clone(), token.clone(), id.clone());
        tasks.spawn(async move { api.place_order_retrying(&token, &id, "same-key", 1).await });
    }
    let replies = tasks.join_all().await;

    // Assert
    let mut order_ids = BTreeSet::new();
    for reply in &replies {
        let body = reply.expect(201);
        order_ids.insert(body["order_id"].as_str().unwrap().to_owned());
    }
    assert_eq!(
        order_ids.len(),
        1,
        "more than one order for one key: {order_ids:?}"
    );
    let replayed = replies
        .iter()
        .filter(|r| r.header("idempotent-replayed") == Some("true"))
        .count();
    assert_eq!(
        replayed, 19,
        "all but the first answer must be marked as replays"
    );
    assert_eq!(order_count(&app.db).await, 1);
    assert_eq!(app.inventory(&id).await["reserved"], json!(1));
    app.assert_invariants(&id).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn replay_after_the_deal_sold_out_returns_the_stored_order() {
    // Arrange: alice's order takes the last unit.
    let app = spawn_app().await;
    let id = app.given_deal(&new_deal("i6", 1, 1)).await;
    let token = app.token("alice");
    let first = app.place_order(&token, &id, "key-1", 1).await.expect(201);
    app.wait_for_deal_state(&id, "sold_out").await;

    // Act: her client retries, e.g. after losing the first response.
    let replay = app.place_order(&token, &id, "key-1", 1).await;

    // Assert
    assert_eq!(
        replay.status, 201,
        "a retry of a successful order: {}",
        replay.text
    );
    assert_eq!(replay.json(), first);
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sell_out_seen_as_the_database_goes_away_still_lets_holders_replay() {
    // Arrange: a mirror whose database is unreachable, as when PostgreSQL stops between
    // the batch that sold the last units and the read of who holds them.
    let settings = test_settings(&base_database_url());
    let redis = RedisHandle::from_settings(&settings.redis);
    let unreachable = PgPoolOptions::new()
        .acquire_timeout(Duration::from_millis(300))
        .connect_lazy("postgres://postgres@127.0.0.1:9/unreachable")
        .unwrap();
    let sold_out = SoldOut::new(redis, 1_000, Duration::from_secs(60), Clock::system());
    let deal = format!("deal-{}", unique_suffix());

    // Act
    sold_out.mark(&unreachable, &deal).await;

    // Assert: flagged, yet whoever may hold an order still reaches PostgreSQL to replay it.
    assert_eq!(sold_out.flag(&deal), Flag::SoldOutWithHolders);
    assert!(sold_out.may_replay(&deal, "buyer-of-the-last-units"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_mirror_on_another_instance_learns_who_ordered_while_the_stock_went_round() {
    // Arrange: one unit, sold to alice through the gateway; a second instance's mirror
    // flags the deal and reads its holders.
    let app = spawn_app().await;
    let deal = app.given_deal(&new_deal("round", 1, 1)).await;
    let alice = app.order("alice", &deal, 1).await.expect(201);
    let redis = RedisHandle::from_settings(&app.settings.redis);
    redis.connect().await;
    let other = SoldOut::new(redis, 1_000, Duration::from_secs(3_600), Clock::system());
    other.refresh(&app.db).await.unwrap();
    assert!(other.may_replay(&deal, "alice") && !other.may_replay(&deal, "bob"));

    // Act: the unit goes back and is sold to bob before the other instance looks again,
    // so the deal is sold out at each of its refreshes.
    let cancelled = app
        .cancel_order(&app.token("alice"), alice["order_id"].as_str().unwrap())
        .await;
    cancelled.expect(200);
    app.order("bob", &deal, 1).await.expect(201);
    other.refresh(&app.db).await.unwrap();

    // Assert: a retry of bob's order there reaches PostgreSQL instead of a sold-out answer.
    assert_eq!(other.flag(&deal), Flag::SoldOutWithHolders);
    assert!(other.may_replay(&deal, "bob"));
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn holders_read_while_units_were_left_are_read_again() {
    // Arrange: a mirror flags a deal whose last unit is still there (its flag came from a
    // read that went stale), and reads its holders: nobody yet.
    let app = spawn_app().await;
    let deal = app.given_deal(&new_deal("stale", 1, 1)).await;
    let redis = RedisHandle::from_settings(&app.settings.redis);
    redis.connect().await;
    let other = SoldOut::new(redis, 1_000, Duration::from_secs(3_600), Clock::system());
    other.mark(&app.db, &deal).await;
    assert!(!other.may_replay(&deal, "bob"));

    // Act: bob takes the last unit, without any unit being freed.
    app.order("bob", &deal, 1).await.expect(201);

    // Assert: the mirror's next refreshes read the holders again. The gateway's own mirror
    // may meanwhile have cleared the stale flag in Redis (a unit was left when it looked)
    // and set it again once bob took the unit, so the flag is awaited, not read once.
    wait_until("the holders read again", EVENTUALLY, || async {
        other.refresh(&app.db).await.unwrap();
        other.flag(&deal) == Flag::SoldOutWithHolders
    })
    .await;
    assert!(other.may_replay(&deal, "bob"));
    app.cleanup().await;
}
