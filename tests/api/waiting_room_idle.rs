//! What an idle gateway costs Redis: with waiting rooms configured but nobody in line, the
//! advancer and the revocation follower send next to no commands, measured on a private
//! `redis-server` through `INFO commandstats`; and a line still advances promptly once
//! someone joins.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use flashgate::config::Settings;
use serde_json::json;

use crate::helpers::{TestRedis, redis_connection, spawn_app_with, wait_until};
use crate::redis_outage::start_redis;
use crate::waiting_room::{join, poll_until, room_deal};

/// The most Redis commands per second an idle gateway may send at the default settings:
/// about 21 are expected, none of them per line (docs/WAITING_ROOM.md, "What an idle gateway
/// costs Redis", counts them).
const IDLE_COMMANDS_PER_SECOND_MAX: f64 = 25.0;

/// How often the sleeping advancer looks for joins elsewhere, here: far longer than the
/// admission below may take, so a prompt admission shows the joining instance woke its own
/// advancer at once.
const IDLE_CHECK_MS: u64 = 5000;

/// How soon after joining the idle gateway the buyer must be admitted.
const ADMITTED_WITHIN: Duration = Duration::from_millis(2500);

/// How long the idle gateway is watched.
const WINDOW: Duration = Duration::from_secs(4);

/// Deals with a waiting room and nobody in line during the measurement.
const LINES: usize = 5;

/// Every command Redis ran since the last `CONFIG RESETSTAT`, by name, including those run
/// inside scripts (Redis counts both), without the test's own `INFO` and `CONFIG`.
async fn commands(redis: &mut TestRedis) -> BTreeMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(redis)
        .await
        .unwrap();
    info.lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = stats.strip_prefix("calls=")?.split(',').next()?;
            Some((name.to_owned(), calls.parse().ok()?))
        })
        .filter(|(name, _)| !name.starts_with("info") && !name.starts_with("config"))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idle_gateway_leaves_redis_alone_and_wakes_when_someone_joins() {
    // Arrange: a private Redis; a gateway with the default timers (but a slow sleep check)
    // and five waiting rooms, one of which has held a sale that is over (its only buyer's
    // pass ran out).
    let (_redis_server, port) = start_redis().await;
    let url = format!("redis://127.0.0.1:{port}");
    let defaults = Settings::defaults();
    let app = spawn_app_with(|s| {
        s.redis.url = url.clone();
        s.soldout.refresh_interval_ms = defaults.soldout.refresh_interval_ms;
        s.sweeper.interval_ms = defaults.sweeper.interval_ms;
        s.waiting_room.idle_check_ms = IDLE_CHECK_MS;
    })
    .await;
    // A pass carries whole seconds, so a 2 s pass reads admitted for at least a second.
    let room = json!({"admit_per_second": 10, "max_active": 10, "pass_ttl_seconds": 2});
    let mut deals = Vec::new();
    for i in 0..LINES {
        let deal = room_deal(&format!("wridle{i}"), 10, room.clone(), json!({}));
        deals.push(app.given_deal(&deal).await);
    }
    let ticket = join(&app, "early", &deals[0]).await.expect(201);
    let ticket = ticket["ticket"].as_str().unwrap().to_owned();
    let states = ["admitted", "expired"];
    poll_until(&app, "early", &deals[0], &ticket, &states, WINDOW).await;
    // Its pass runs out; after that nothing is left to do anywhere.
    poll_until(&app, "early", &deals[0], &ticket, &["expired"], WINDOW).await;
    let asleep = format!("{}wr:{{advancer}}:asleep", app.settings.redis.key_prefix);
    wait_until("the advancer to fall asleep", WINDOW, || async {
        let mut redis = redis_connection(&url).await.unwrap();
        let marked: i64 = redis::cmd("EXISTS")
            .arg(&asleep)
            .query_async(&mut redis)
            .await
            .unwrap();
        marked == 1
    })
    .await;
    let mut redis = redis_connection(&url).await.unwrap();

    // Act 1: watch the idle gateway.
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut redis)
        .await
        .unwrap();
    let started = Instant::now();
    // Watched for a fixed window: the command rate over it is the outcome.
    tokio::time::sleep(WINDOW).await;
    let sent = commands(&mut redis).await;
    let rate = sent.values().sum::<u64>() as f64 / started.elapsed().as_secs_f64();

    // Act 2: someone joins a line.
    let joined_at = Instant::now();
    let ticket = join(&app, "alice", &deals[LINES - 1]).await.expect(201);
    let ticket = ticket["ticket"].as_str().unwrap().to_owned();
    let admitted = poll_until(
        &app,
        "alice",
        &deals[LINES - 1],
        &ticket,
        &["admitted"],
        WINDOW,
    );
    admitted.await;
    let admitted_after = joined_at.elapsed();

    // Assert
    eprintln!("idle: {rate:.1} commands/s {sent:?}; admitted {admitted_after:?} after joining");
    assert!(
        rate <= IDLE_COMMANDS_PER_SECOND_MAX,
        "an idle gateway sent {rate:.1} Redis commands/s: {sent:?}"
    );
    assert!(
        admitted_after < ADMITTED_WITHIN,
        "admitted {admitted_after:?} after joining an idle line"
    );
    app.cleanup().await;
}
