//! What an idle gateway, and the requests it can refuse, cost Redis, measured on a private
//! `redis-server` through `INFO commandstats`: with waiting rooms configured but nobody in
//! line, or a hundred lines whose buyers were all admitted or gone, the advancer and the
//! revocation follower send next to no commands, and a line still advances promptly once
//! someone joins; a join with a wrong, missing or forged proof and a poll from far outside
//! the check-in window send none.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

use flashgate::config::Settings;
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::helpers::{Api, Reply, TestRedis, redis_connection, send, spawn_app_with, wait_until};
use crate::redis_outage::start_redis;
use crate::waiting_room::{join, poll_until, room_deal};
use crate::waiting_room_edge::ticket_of;

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
pub async fn commands(redis: &mut TestRedis) -> BTreeMap<String, u64> {
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

/// Every command Redis ran since the last `CONFIG RESETSTAT` (the test's own `INFO` and
/// `CONFIG` left out), and the microseconds of Redis CPU they took.
pub async fn commands_and_cpu(redis: &mut TestRedis) -> (u64, u64) {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(redis)
        .await
        .unwrap();
    let field = |stats: &str, name: &str| -> u64 {
        let value = stats.split(',').find_map(|kv| kv.strip_prefix(name));
        value.and_then(|v| v.parse().ok()).unwrap_or(0)
    };
    info.lines()
        .filter_map(|line| line.strip_prefix("cmdstat_")?.split_once(':'))
        .filter(|(name, _)| !name.starts_with("info") && !name.starts_with("config"))
        .fold((0, 0), |(calls, usec), (_, stats)| {
            (calls + field(stats, "calls="), usec + field(stats, "usec="))
        })
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
    crate::helpers::measure_for(WINDOW).await;
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

/// Deals whose lines had buyers, all admitted (passes outstanding) or gone (revoked).
const SPENT_LINES: usize = 100;

/// How long a window the tests below compare the work's commands with the idle rate over.
const COMPARE: Duration = Duration::from_secs(2);

/// The commands the background loops may send more in one window than in another (a timer
/// firing once more within it: the heartbeat script's 6, a lease renewal's 7, a follower
/// read, a mirror read), so that a request costing even one command shows above it.
const NOISE_COMMANDS_MAX: i64 = 30;

/// Resets the counters and returns the commands sent over `COMPARE` (or the work's time,
/// when longer) while `work` runs within it, less those sent over an idle `COMPARE` just
/// before, scaled to the same length.
async fn commands_above_idle<F: Future<Output = ()>>(redis: &mut TestRedis, work: F) -> i64 {
    let total = |sent: &BTreeMap<String, u64>| sent.values().sum::<u64>() as i64;
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(redis)
        .await
        .unwrap();
    // The idle rate over the window is the baseline.
    crate::helpers::measure_for(COMPARE).await;
    let idle = total(&commands(redis).await);
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(redis)
        .await
        .unwrap();
    let started = Instant::now();
    work.await;
    let spent = started.elapsed();
    // The rest of the same window, so both windows hold the same timer ticks. On a machine
    // slow enough that the work outlasts the window, the window is the work's own length
    // and the idle baseline is scaled to it (the background loops tick at a steady rate).
    let window = spent.max(COMPARE);
    crate::helpers::measure_for(window - spent).await;
    let sent = commands(redis).await;
    let idle = (idle as f64 * window.as_secs_f64() / COMPARE.as_secs_f64()).round() as i64;
    eprintln!("during the work ({spent:?}): {sent:?}; idle over as long: {idle} commands");
    total(&sent) - idle
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hundred_lines_whose_buyers_were_admitted_or_gone_cost_an_idle_gateway_nothing() {
    // Arrange: a private Redis and a hundred lines, each with one buyer admitted; the
    // passes of the first half stay outstanding, the buyers of the other half are gone.
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
    let room = json!({"admit_per_second": 100, "max_active": 5, "pass_ttl_seconds": 600});
    let mut deals = Vec::new();
    for i in 0..SPENT_LINES {
        let deal = room_deal(&format!("wrspent{i}"), 10, room.clone(), json!({}));
        deals.push(app.given_deal(&deal).await);
    }
    for (i, deal) in deals.iter().enumerate() {
        let ticket = ticket_of(&join(&app, "early", deal).await.expect(201));
        poll_until(&app, "early", deal, &ticket, &["admitted"], WINDOW).await;
        if i % 2 == 1 {
            app.revoke_in_line(deal, "early").await;
        }
    }
    let asleep = format!("{}wr:{{advancer}}:asleep", app.settings.redis.key_prefix);
    let mut redis = redis_connection(&url).await.unwrap();
    // Not asserted: a gateway that never sleeps fails on its command rate below.
    let _ = crate::helpers::eventually(WINDOW, || async {
        let mut redis = redis_connection(&url).await.unwrap();
        let marked: i64 = redis::cmd("EXISTS")
            .arg(&asleep)
            .query_async(&mut redis)
            .await
            .unwrap();
        (marked == 1).then_some(())
    })
    .await;

    // Act 1: watch the idle gateway.
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut redis)
        .await
        .unwrap();
    let started = Instant::now();
    crate::helpers::measure_for(WINDOW).await;
    let sent = commands(&mut redis).await;
    let rate = sent.values().sum::<u64>() as f64 / started.elapsed().as_secs_f64();

    // Act 2: someone joins the line whose buyer still holds a pass.
    let joined_at = Instant::now();
    let ticket = ticket_of(&join(&app, "alice", &deals[0]).await.expect(201));
    poll_until(&app, "alice", &deals[0], &ticket, &["admitted"], WINDOW).await;
    let admitted_after = joined_at.elapsed();

    // Assert
    eprintln!(
        "{SPENT_LINES} spent lines: {rate:.1} commands/s {sent:?}; admitted {admitted_after:?} after joining"
    );
    assert!(
        rate <= IDLE_COMMANDS_PER_SECOND_MAX,
        "a gateway with {SPENT_LINES} spent lines sent {rate:.1} Redis commands/s: {sent:?}"
    );
    assert!(
        admitted_after < ADMITTED_WITHIN,
        "admitted {admitted_after:?} after joining a sleeping line"
    );
    app.cleanup().await;
}

/// `POST /v1/deals/{deal}/queue` as `user`, with the given `Flashgate-Pow` and
/// `Flashgate-Position` headers.
async fn join_showing(
    api: &Api,
    user: &str,
    deal: &str,
    pow: Option<&str>,
    position: Option<&str>,
) -> Reply {
    let mut request = api
        .client
        .post(api.url(&format!("/v1/deals/{deal}/queue")))
        .bearer_auth(api.token(user));
    if let Some(pow) = pow {
        request = request.header("Flashgate-Pow", pow);
    }
    if let Some(position) = position {
        request = request.header("Flashgate-Position", position);
    }
    send(request).await
}

/// A solution of the deal's current challenge for `user`.
async fn solved(api: &Api, user: &str, deal: &str) -> String {
    let url = api.url(&format!("/v1/deals/{deal}/queue/challenge"));
    let issued = send(api.client.get(url).bearer_auth(api.token(user)))
        .await
        .expect(200);
    let challenge = issued["challenge"].as_str().unwrap().to_owned();
    let bits = issued["difficulty_bits"].as_u64().unwrap() as u32;
    let nonce = (0u64..)
        .find(|n| {
            let hash = Sha256::digest(format!("{challenge}:{n}").as_bytes());
            let zeros = hash
                .iter()
                .position(|b| *b != 0)
                .map_or(256, |i| i as u32 * 8 + hash[i].leading_zeros());
            zeros >= bits
        })
        .unwrap();
    format!("{challenge}:{nonce}")
}

/// Bad joins of each kind sent while commands are counted.
const BAD_JOINS_EACH: usize = 100;

#[tokio::test(flavor = "multi_thread")]
async fn wrong_missing_or_forged_proofs_cost_redis_nothing_and_a_returning_buyer_needs_none() {
    // Arrange: a private Redis; a deal asking a proof of work; alice pays for her place.
    let (_redis_server, port) = start_redis().await;
    let url = format!("redis://127.0.0.1:{port}");
    let app = spawn_app_with(|s| s.redis.url = url.clone()).await;
    let room =
        json!({"admit_per_second": 1, "max_active": 1, "pass_ttl_seconds": 60, "pow_bits": 4});
    let deal = app
        .given_deal(&room_deal("wrpowcost", 10, room, json!({})))
        .await;
    let first = join_showing(
        &app,
        "alice",
        &deal,
        Some(&solved(&app, "alice", &deal).await),
        None,
    )
    .await;
    let first = first.expect(201);
    let token = first["position_token"].as_str().unwrap().to_owned();
    let bob_solution = solved(&app, "bob", &deal).await;
    let wrong = format!("{}:x", bob_solution.rsplit_once(':').unwrap().0);
    // Alice is admitted and the advancer falls asleep: both windows below are idle.
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

    // Act: bob sends bad joins of each kind; carol shows alice's token.
    let extra = commands_above_idle(&mut redis, async {
        for _ in 0..BAD_JOINS_EACH {
            for (user, pow, position) in [
                ("bob", None, None),
                ("bob", Some(wrong.as_str()), None),
                ("bob", Some("not a solution"), Some("forged.token")),
                ("carol", None, Some(token.as_str())),
            ] {
                join_showing(&app, user, &deal, pow, position)
                    .await
                    .expect_problem(403, "challenge-required");
            }
        }
    })
    .await;
    let again = join_showing(&app, "alice", &deal, None, Some(&token)).await;

    // Assert: no command above the idle rate; alice keeps her place without a new proof.
    let per_join = extra as f64 / (4 * BAD_JOINS_EACH) as f64;
    eprintln!(
        "{} bad joins: {extra} Redis commands above idle ({per_join:.3} each)",
        4 * BAD_JOINS_EACH
    );
    assert!(
        extra <= NOISE_COMMANDS_MAX,
        "bad proofs cost Redis {extra} commands ({per_join:.3} each)"
    );
    let again = again.expect(201);
    assert_eq!(again["ticket"], first["ticket"]);
    assert_eq!(again["position"], first["position"]);
    join_showing(&app, "alice", &deal, None, None)
        .await
        .expect_problem(403, "challenge-required");
    app.cleanup().await;
}

/// Far-off polls sent while commands are counted.
const FAR_POLLS: usize = 300;

#[tokio::test(flavor = "multi_thread")]
async fn a_poll_from_far_outside_the_window_is_answered_from_memory_and_told_when_to_come_back() {
    // Arrange: a private Redis; a line of 40 that does not move (another advancer holds the
    // lease), with a check-in window of 5 tickets; the line state is read once and kept.
    let (_redis_server, port) = start_redis().await;
    let url = format!("redis://127.0.0.1:{port}");
    let app = spawn_app_with(|s| {
        s.redis.url = url.clone();
        s.waiting_room.refresh_after_seconds_max = 1;
        s.waiting_room.abandon_after_seconds = 5;
        s.waiting_room.checkin_window_seconds = 5;
        s.waiting_room.line_state_refresh_ms = 10_000;
    })
    .await;
    let mut redis = redis_connection(&url).await.unwrap();
    let lease = format!("{}wr:{{advancer}}:lease", app.settings.redis.key_prefix);
    let _: () = redis::cmd("SET")
        .arg(&lease)
        .arg("elsewhere")
        .arg("PX")
        .arg(60_000)
        .query_async(&mut redis)
        .await
        .unwrap();
    let room = json!({"admit_per_second": 1, "max_active": 1, "pass_ttl_seconds": 60});
    let deal = app
        .given_deal(&room_deal("wrfar", 10, room, json!({})))
        .await;
    let mut tickets = Vec::new();
    for i in 0..40 {
        tickets.push(join(&app, &format!("u{i}"), &deal).await.expect(201));
    }
    let far = &tickets[39];
    let (ticket, token) = (
        ticket_of(far),
        far["position_token"].as_str().unwrap().to_owned(),
    );
    let far_poll = || {
        let url = app.url(&format!("/v1/deals/{deal}/queue/{ticket}"));
        let request = app.client.get(url).bearer_auth(app.token("u39"));
        send(request.header("Flashgate-Position", token.as_str()))
    };
    far_poll().await.expect(200);
    let refusal = || {
        let url = app.url(&format!("/v1/deals/{deal}/queue/{ticket}"));
        send(
            app.client
                .get(url)
                .bearer_auth(app.token("u39"))
                .header("Flashgate-Position", "forged.token"),
        )
    };

    // Act: the far ticket polls in a loop; a forged token is refused; then the front polls.
    let mut answers = Vec::new();
    let mut far_time = Duration::ZERO;
    let mut refusal_time = Duration::ZERO;
    let extra = commands_above_idle(&mut redis, async {
        for _ in 0..FAR_POLLS {
            let at = Instant::now();
            answers.push(far_poll().await);
            far_time += at.elapsed();
            let at = Instant::now();
            refusal().await.expect_problem(403, "forbidden");
            refusal_time += at.elapsed();
        }
    })
    .await;
    let front = &tickets[1];
    let near = app
        .client
        .get(app.url(&format!("/v1/deals/{deal}/queue/{}", ticket_of(front))))
        .bearer_auth(app.token("u1"))
        .header(
            "Flashgate-Position",
            front["position_token"].as_str().unwrap(),
        );
    let near = send(near).await.expect(200);
    let other = app
        .client
        .get(app.url(&format!("/v1/deals/{deal}/queue/{}", ticket_of(front))))
        .bearer_auth(app.token("u1"))
        .header("Flashgate-Position", token.as_str());

    // Assert: no command above the idle rate, about a refusal's time, and when to come back.
    eprintln!(
        "{FAR_POLLS} far polls: {extra} Redis commands above idle; {far_time:?} against {refusal_time:?} for as many refusals"
    );
    assert!(
        extra <= NOISE_COMMANDS_MAX,
        "far polls cost Redis {extra} commands"
    );
    assert!(
        far_time < refusal_time * 3,
        "far polls took {far_time:?}, refusals {refusal_time:?}"
    );
    for answer in &answers {
        let body = answer.expect(200);
        assert_eq!(
            (body["state"].as_str(), body["checked_in"].as_bool()),
            (Some("waiting"), Some(false))
        );
        assert_eq!(
            (body["position"].as_u64(), body["ahead"].as_u64()),
            (Some(40), Some(39))
        );
        let refresh = body["refresh_after_seconds"].as_u64().unwrap();
        // 35 tickets outside the window at 1 a second: back in half that.
        assert_eq!(refresh, 18, "{body}");
        assert_eq!(answer.header("retry-after"), Some("18"));
    }
    assert_eq!(near["checked_in"], true, "{near}");
    send(other).await.expect_problem(403, "forbidden");
    // The public state tells a reader further back to come back later.
    for (behind, told) in [("0", 1), ("32", 14), ("1024", 60)] {
        let public = app
            .get(&format!("/v1/deals/{deal}/queue?behind={behind}"))
            .await;
        assert_eq!(
            public.expect(200)["refresh_after_seconds"],
            told,
            "behind {behind}"
        );
    }
    let odd = app.get(&format!("/v1/deals/{deal}/queue?behind=3")).await;
    odd.expect_problem(400, "invalid-request");
    app.cleanup().await;
}
