//! A refresh of the sold-out mirror replaces its flags with what it read from Redis and
//! PostgreSQL; a mark or a clear made while it was reading is newer and must survive it.
//! Each test makes the change between the refresh's two halves, the interleaving that
//! erased a fresh sell-out and let the next requests through to PostgreSQL. And a mirror
//! hears another instance's changes at once, not at its next refresh.

use std::time::Duration;

use flashgate::admission::soldout::{Flag, RefreshPace, SoldOut};
use flashgate::clock::Clock;
use flashgate::redis_link::RedisHandle;

use tokio_util::sync::CancellationToken;

use crate::helpers::{EVENTUALLY, TestApp, new_deal, spawn_app, wait_until};

/// A second instance's mirror on the app's Redis, and its Redis handle.
async fn mirror(app: &TestApp) -> (SoldOut, RedisHandle) {
    let redis = RedisHandle::from_settings(&app.settings.redis);
    redis.connect().await;
    let sold_out = SoldOut::new(
        redis.clone(),
        1_000,
        Duration::from_secs(3_600),
        Clock::system(),
    );
    (sold_out, redis)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sell_out_marked_while_a_refresh_reads_stays_flagged() {
    // Arrange: a deal with no units; its flag is not shared yet (as in the moment between
    // the batch that sold the last unit and the mark), and a refresh reads the flags.
    let app = spawn_app().await;
    let (sold_out, redis) = mirror(&app).await;
    sold_out.refresh(&app.db).await.unwrap();
    let deal = app.given_deal(&new_deal("mark-race", 0, 1)).await;
    let unshare = redis::cmd("SREM")
        .arg(redis.sold_out_key())
        .arg(&deal)
        .clone();
    redis.run::<i64>(&unshare).await.unwrap();
    let read = sold_out.read_flags(&app.db).await.unwrap();

    // Act: the sell-out is seen and marked, then the older read is applied.
    sold_out.mark(&app.db, &deal).await;
    assert_eq!(sold_out.flag(&deal), Flag::SoldOut);
    sold_out.apply(&app.db, read).await;

    // Assert: still refused from memory; the next refresh, which reads the shared flag, agrees.
    assert_eq!(sold_out.flag(&deal), Flag::SoldOut);
    sold_out.refresh(&app.db).await.unwrap();
    assert_eq!(sold_out.flag(&deal), Flag::SoldOut);
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn units_back_while_a_refresh_reads_stay_on_sale() {
    // Arrange: one unit, sold to alice and flagged; a refresh reads the flag.
    let app = spawn_app().await;
    let deal = app.given_deal(&new_deal("clear-race", 1, 1)).await;
    let alice = app.order("alice", &deal, 1).await.expect(201);
    let (sold_out, _) = mirror(&app).await;
    sold_out.mark(&app.db, &deal).await;
    let read = sold_out.read_flags(&app.db).await.unwrap();

    // Act: alice cancels, the unit is back and the flag cleared, then the older read applied.
    app.cancel_order(&app.token("alice"), alice["order_id"].as_str().unwrap())
        .await
        .expect(200);
    sold_out.clear(&deal).await;
    sold_out.apply(&app.db, read).await;

    // Assert: on sale here, and after the next refresh too.
    assert_eq!(sold_out.flag(&deal), Flag::Clear);
    sold_out.refresh(&app.db).await.unwrap();
    assert_eq!(sold_out.flag(&deal), Flag::Clear);
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_unit_given_back_and_sold_again_through_one_instance_is_known_by_another_at_once() {
    // Arrange: a second instance whose own refreshes are an hour apart, listening for
    // announced changes; it has read the deal sold out to alice.
    let app = spawn_app().await;
    let deal = app.given_deal(&new_deal("heard", 1, 1)).await;
    let alice = app.order("alice", &deal, 1).await.expect(201);
    let (other, redis) = mirror(&app).await;
    let pace = RefreshPace {
        interval: Duration::from_secs(3_600),
        heard_gap: Duration::from_millis(20),
        reconnect: Duration::from_millis(50),
    };
    let stop = CancellationToken::new();
    let refreshing = tokio::spawn(other.clone().keep_fresh(app.db.clone(), pace, stop.clone()));
    let listeners = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(redis.key("soldout:changes"))
        .clone();
    wait_until(
        "both instances listening and the other's first read",
        EVENTUALLY,
        || async {
            let (_, count): (String, i64) = redis.run(&listeners).await.unwrap();
            // Holders read: until then anyone may replay.
            count == 2 && other.may_replay(&deal, "alice") && !other.may_replay(&deal, "bob")
        },
    )
    .await;

    // Act: the unit comes back and bob buys it, through the app.
    let order = alice["order_id"].as_str().unwrap();
    app.cancel_order(&app.token("alice"), order)
        .await
        .expect(200);
    app.order("bob", &deal, 1).await.expect(201);

    // Assert: the other instance lets bob's retry through long before its next refresh.
    wait_until(
        "bob known as a holder by the other instance",
        EVENTUALLY,
        || async { other.may_replay(&deal, "bob") },
    )
    .await;
    assert_eq!(other.flag(&deal), Flag::SoldOutWithHolders);
    stop.cancel();
    refreshing.await.unwrap();
    app.cleanup().await;
}
