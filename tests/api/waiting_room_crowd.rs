//! A line's Redis load against the crowd's size when a quarter of the crowd far from the
//! front ignores the check-in window and polls its ticket anyway (showing its signed
//! position, as a client written from the API reference does): measured on a private
//! `redis-server` through `INFO commandstats` for a crowd of 1,000 and one of 10,000, the
//! line's commands (in all and per second) stay within twice each other and its Redis CPU per
//! second within `CPU_GROWTH_MAX`, because a far poll is answered from memory and only the
//! front's check-ins reach Redis.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::json;

use crate::helpers::{Api, redis_connection, send, spawn_app_with};
use crate::redis_outage::start_redis;
use crate::waiting_room::{join, room_deal};
use crate::waiting_room_idle::commands_and_cpu;

/// The crowds compared: ten times apart.
const SMALL: usize = 1_000;
const LARGE: usize = 10_000;

/// The line's pace: 1 admission a second and a 60 s check-in window (and abandon grace), so
/// 60 tickets are within the window however large the crowd, and no ticket is skipped as
/// abandoned while the crowd is still taking its tickets.
const ADMIT_PER_SECOND: u64 = 1;
const CHECKIN_WINDOW_SECONDS: u64 = 60;

/// How often the front checks in during the measurement, a second apart.
const FRONT_ROUNDS: u32 = 3;

/// The shortest measured window; a slower run is measured over the time it took.
const MEASURED: Duration = Duration::from_secs(3);

/// Most the Redis CPU a second may grow from the small crowd to the large one. The commands
/// are counted, but the CPU is timed: on two cores shared with the rest of a test run, the
/// same commands cost Redis up to twice the CPU in one window as in the next (measured ×1.06
/// to ×1.48 on a quiet machine, ×2.09 in a full run). A far poll reaching Redis would grow
/// both ten times with the crowd.
const CPU_GROWTH_MAX: f64 = 3.0;

/// Joins and far polls in flight at once.
const CONCURRENCY: usize = 32;

/// One ticket as its holder keeps it.
struct Held {
    user: String,
    ticket: String,
    token: String,
    position: u64,
}

/// What the line cost Redis over the measured window, and how long that was.
#[derive(Debug, Clone, Copy)]
struct Load {
    commands: f64,
    cpu_usec: f64,
    seconds: f64,
}

/// A poll of `held`'s ticket showing its signed position; the answer's `checked_in`.
async fn poll_showing(api: &Api, deal: &str, held: &Held) -> bool {
    let url = api.url(&format!("/v1/deals/{deal}/queue/{}", held.ticket));
    let request = api
        .client
        .get(url)
        .bearer_auth(api.token(&held.user))
        .header("Flashgate-Position", held.token.as_str());
    send(request).await.expect(200)["checked_in"] == true
}

/// `crowd` tickets in one line on a fresh gateway and Redis; then, over the window, the
/// front checks in every second and a quarter of the rest polls once.
async fn line_load(crowd: usize) -> Load {
    let (_redis_server, port) = start_redis().await;
    let url = format!("redis://127.0.0.1:{port}");
    let app = Arc::new(
        spawn_app_with(|s| {
            s.redis.url = url.clone();
            // A loaded machine answers slowly at times; a join must not fail on it.
            s.redis.command_timeout_ms = 1000;
            s.waiting_room.refresh_after_seconds_max = 1;
            s.waiting_room.abandon_after_seconds = CHECKIN_WINDOW_SECONDS;
            s.waiting_room.checkin_window_seconds = CHECKIN_WINDOW_SECONDS;
        })
        .await,
    );
    let room = json!({"admit_per_second": ADMIT_PER_SECOND, "max_active": 100_000,
                      "pass_ttl_seconds": 60});
    let deal = app
        .given_deal(&room_deal(
            &format!("wrcrowd{crowd}"),
            100_000,
            room,
            json!({}),
        ))
        .await;
    let held: Vec<Held> = futures_util::stream::iter(0..crowd)
        .map(|i| {
            let (app, deal) = (app.clone(), deal.clone());
            async move {
                let user = format!("c{i}");
                let body = join(&app, &user, &deal).await.expect(201);
                Held {
                    ticket: body["ticket"].as_str().unwrap().to_owned(),
                    token: body["position_token"].as_str().unwrap().to_owned(),
                    position: body["position"].as_u64().unwrap(),
                    user,
                }
            }
        })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    let through = crate::waiting_room::line(&app, &deal).await["admitted_through"]
        .as_u64()
        .unwrap();
    let window = ADMIT_PER_SECOND * CHECKIN_WINDOW_SECONDS;
    // The front: within the window now. The far quarter: beyond where the window can reach
    // while measured, every fourth ticket.
    let front: Vec<&Held> = held
        .iter()
        .filter(|h| h.position > through && h.position <= through + window)
        .collect();
    let reach = through + window + ADMIT_PER_SECOND * 2 * MEASURED.as_secs();
    let far: Vec<&Held> = held
        .iter()
        .filter(|h| h.position > reach && h.position % 4 == 0)
        .collect();
    let mut redis = redis_connection(&url).await.unwrap();

    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut redis)
        .await
        .unwrap();
    let started = Instant::now();
    let front_rounds = async {
        for round in 0..FRONT_ROUNDS {
            let polls = front.iter().map(|h| poll_showing(&app, &deal, h));
            futures_util::future::join_all(polls).await;
            let next = Duration::from_secs(u64::from(round) + 1);
            crate::helpers::pace(next.saturating_sub(started.elapsed())).await;
        }
    };
    let far_polls = futures_util::stream::iter(&far)
        .map(|h| poll_showing(&app, &deal, h))
        .buffer_unordered(CONCURRENCY)
        .collect::<Vec<bool>>();
    let ((), checked_in) = tokio::join!(front_rounds, far_polls);
    // The measured window is at least `MEASURED`: the rates compare like with like.
    crate::helpers::measure_for(MEASURED.saturating_sub(started.elapsed())).await;
    let elapsed = started.elapsed().as_secs_f64();
    let (commands, cpu_usec) = commands_and_cpu(&mut redis).await;

    assert!(
        checked_in.iter().all(|c| !c),
        "a far poll was taken as a check-in"
    );
    eprintln!(
        "crowd {crowd}: {} at the front, {} far polls; {commands} commands, {cpu_usec} µs of Redis CPU in {elapsed:.1} s",
        front.len(),
        far.len()
    );
    drop(redis);
    Arc::into_inner(app)
        .expect("all tasks done")
        .cleanup()
        .await;
    Load {
        commands: commands as f64,
        cpu_usec: cpu_usec as f64,
        seconds: elapsed,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_quarter_of_the_crowd_polling_from_far_back_leaves_the_lines_redis_load_flat() {
    // Arrange / Act: the same line at two crowd sizes, ten times apart.
    let small = line_load(SMALL).await;
    let large = line_load(LARGE).await;

    // Assert: flat per second, and the commands in all too (a larger crowd's far polls may
    // take longer than the window, which would thin its rates out; a far poll that reached
    // Redis would add commands whatever the window). Redis's CPU is compared per second
    // only: it includes Redis's own housekeeping, which goes on for as long as the window
    // lasts (the incremental rehashing of the line's larger hashes, expiry).
    let ratio = |of: fn(&Load) -> f64| of(&large) / of(&small);
    let per_second =
        |of: fn(&Load) -> f64| (of(&large) / large.seconds) / (of(&small) / small.seconds);
    let (commands, cpu) = (ratio(|l| l.commands), ratio(|l| l.cpu_usec));
    let (commands_rate, cpu_rate) = (per_second(|l| l.commands), per_second(|l| l.cpu_usec));
    eprintln!(
        "{SMALL} → {LARGE} waiting: {small:?} → {large:?}: commands ×{commands:.2} (×{commands_rate:.2}/s), Redis CPU ×{cpu:.2} (×{cpu_rate:.2}/s)"
    );
    for (what, grew, bound) in [
        ("commands", commands, 2.0),
        ("commands/s", commands_rate, 2.0),
        ("CPU/s", cpu_rate, CPU_GROWTH_MAX),
    ] {
        assert!(grew <= bound, "Redis {what} grew ×{grew:.2}");
    }
}
