//! The per-user and per-deal limits hold across three gateway processes: a client sending
//! as fast as it can through all three gets the configured rate plus its burst, not three
//! times that; with Redis gone each process falls back to its share, never to no limit. A
//! deal's budget is spent on requests, not lost to unspent slices, whatever the traffic.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use flashgate::admission::RateSettings;
use flashgate::admission::global::GlobalLimits;
use flashgate::clock::{Clock, ManualClock};
use flashgate::redis_link::{RedisHandle, RedisTimeouts};
use serde_json::json;

use crate::helpers::{
    Api, ChildGuard, TestDb, delete_redis_keys, eventually, new_deal, test_settings, unique_suffix,
    wait_until,
};
use crate::multi_process::{spawn_gateway_with, wait_until_healthy};
use crate::redis_outage::start_redis;

/// How long each client floods the gateways.
const FLOOD: Duration = Duration::from_secs(3);
/// Requests in flight at once, spread over the three gateways.
const IN_FLIGHT: usize = 12;

/// Three gateways on one database and `redis_url`, with `extra` settings on top.
async fn three_gateways(
    database: &TestDb,
    redis_url: &str,
    extra: &[(&str, &str)],
) -> (Vec<ChildGuard>, Vec<Api>, flashgate::config::Settings) {
    let mut settings = test_settings(&database.url);
    settings.redis.url = redis_url.to_owned();
    // A loaded machine must not turn a slow answer into a Redis outage mid-measurement.
    let mut env = vec![
        ("FLASHGATE__LIMITS__GLOBAL__HEARTBEAT_INTERVAL_MS", "200"),
        ("FLASHGATE__REDIS__COMMAND_TIMEOUT_MS", "1000"),
    ];
    env.extend_from_slice(extra);
    let mut gateways = Vec::new();
    let mut apis = Vec::new();
    for _ in 0..3 {
        let api = Api::on_free_ports(&settings);
        gateways.push(spawn_gateway_with(&settings, &api, &env));
        apis.push(api);
    }
    for (gateway, api) in gateways.iter_mut().zip(&apis) {
        wait_until_healthy(gateway, api).await;
    }
    (gateways, apis, settings)
}

/// A deal that neither sells out nor hits its per-user quantity during a flood.
async fn roomy_deal(api: &Api, name: &str) -> String {
    let mut deal = new_deal(name, 100_000, 8);
    deal["per_user_limit"] = json!(100_000);
    api.given_deal(&deal).await
}

/// What a flood let through: requests not refused with 429, and the time it took.
struct Flood {
    passed: usize,
    limited: usize,
    elapsed: Duration,
}

/// Orders as fast as possible for `FLOOD`, round robin over `apis`; `user_of(n)` names the
/// user of the n-th request.
async fn flood(apis: &[Api], deal: &str, user_of: fn(usize) -> String) -> Flood {
    let passed = Arc::new(AtomicUsize::new(0));
    let limited = Arc::new(AtomicUsize::new(0));
    let sent = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..IN_FLIGHT {
        let (apis, deal) = (apis.to_vec(), deal.to_owned());
        let (passed, limited, sent) = (passed.clone(), limited.clone(), sent.clone());
        tasks.spawn(async move {
            while start.elapsed() < FLOOD {
                let n = sent.fetch_add(1, Ordering::Relaxed);
                let api = &apis[n % apis.len()];
                let token = api.token(&user_of(n));
                let reply = api.place_order(&token, &deal, &unique_suffix(), 1).await;
                let counter = if reply.status == 429 {
                    &limited
                } else {
                    &passed
                };
                counter.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    tasks.join_all().await;
    if crate::helpers::test_log() {
        for api in apis {
            let metrics = api.metrics().await;
            for line in metrics.lines().filter(|l| l.contains("global_limit")) {
                eprintln!("{} {line}", api.base);
            }
        }
    }
    Flood {
        passed: passed.load(Ordering::Relaxed),
        limited: limited.load(Ordering::Relaxed),
        elapsed: start.elapsed(),
    }
}

/// Most requests a bucket of `rate`/s and `burst` lets through in `elapsed`, plus `slack`.
fn allowance(rate: f64, burst: f64, elapsed: Duration, slack: f64) -> usize {
    (burst + rate * elapsed.as_secs_f64() + slack).floor() as usize
}

async fn stop(mut gateways: Vec<ChildGuard>, settings: &flashgate::config::Settings, db: TestDb) {
    for gateway in &mut gateways {
        gateway.kill();
    }
    delete_redis_keys(&settings.redis.url, &settings.redis.key_prefix).await;
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn one_user_through_three_gateways_gets_one_rate_plus_burst() {
    // Arrange: 5 per second and a burst of 10 per user; per instance that would be 3 × 25.
    let database = TestDb::create().await;
    let extra = [
        ("FLASHGATE__LIMITS__PER_USER__RATE_PER_SECOND", "5"),
        ("FLASHGATE__LIMITS__PER_USER__BURST", "10"),
    ];
    let redis = crate::helpers::redis_url();
    let (gateways, apis, settings) = three_gateways(&database, &redis, &extra).await;
    let deal = roomy_deal(&apis[0], "global-user").await;

    // Act
    let flood = flood(&apis, &deal, |_| "greedy".to_owned()).await;

    // Assert: one request of slack for a refill landing at the edge of the window.
    let most = allowance(5.0, 10.0, flood.elapsed, 1.0);
    eprintln!(
        "per-user over 3 gateways: {} passed, {} limited in {:?} (allowed {most})",
        flood.passed, flood.limited, flood.elapsed
    );
    assert!(
        flood.passed <= most,
        "{} passed, at most {most}",
        flood.passed
    );
    assert!(
        flood.passed >= 10 + 5 * (FLOOD.as_secs() as usize - 1),
        "{} passed: the shared budget is not being granted",
        flood.passed
    );
    assert!(flood.limited > 0, "the flood was never limited");
    stop(gateways, &settings, database).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn many_users_through_three_gateways_get_one_deal_rate_plus_burst() {
    // Arrange: 20 orders per second and a burst of 20 for the deal, taken in slices of 5.
    let database = TestDb::create().await;
    let extra = [
        ("FLASHGATE__LIMITS__PER_DEAL__RATE_PER_SECOND", "20"),
        ("FLASHGATE__LIMITS__PER_DEAL__BURST", "20"),
        ("FLASHGATE__LIMITS__GLOBAL__DEAL_SLICE", "5"),
    ];
    let redis = crate::helpers::redis_url();
    let (gateways, apis, settings) = three_gateways(&database, &redis, &extra).await;
    let deal = roomy_deal(&apis[0], "global-deal").await;

    // Act: every request from another user, so only the deal's budget applies.
    let flood = flood(&apis, &deal, |n| format!("buyer-{n}")).await;

    // Assert: slices add at most rate × slice_ttl (1 request at 50 ms) to the allowance.
    let most = allowance(20.0, 20.0, flood.elapsed, 2.0);
    eprintln!(
        "per-deal over 3 gateways: {} passed, {} limited in {:?} (allowed {most})",
        flood.passed, flood.limited, flood.elapsed
    );
    assert!(
        flood.passed <= most,
        "{} passed, at most {most}",
        flood.passed
    );
    assert!(
        flood.passed >= 20 + 20 * (FLOOD.as_secs() as usize - 1) * 3 / 4,
        "{} passed: the deal's budget is not being granted",
        flood.passed
    );
    stop(gateways, &settings, database).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn without_redis_each_gateway_keeps_its_share_of_the_user_budget() {
    // Arrange: a private Redis the gateways count each other in, then lose.
    let (mut redis, port) = start_redis().await;
    let redis_url = format!("redis://127.0.0.1:{port}");
    let database = TestDb::create().await;
    let extra = [
        ("FLASHGATE__LIMITS__PER_USER__RATE_PER_SECOND", "6"),
        ("FLASHGATE__LIMITS__PER_USER__BURST", "12"),
    ];
    let (gateways, apis, settings) = three_gateways(&database, &redis_url, &extra).await;
    let deal = roomy_deal(&apis[0], "global-fallback").await;
    let counted = eventually(Duration::from_secs(10), || {
        let url = redis_url.clone();
        let key = format!("{}instances", settings.redis.key_prefix);
        async move {
            let mut conn = crate::helpers::redis_connection(&url).await.ok()?;
            let n: u32 = redis::cmd("ZCARD")
                .arg(key)
                .query_async(&mut conn)
                .await
                .ok()?;
            (n == 3).then_some(())
        }
    })
    .await;
    assert!(
        counted.is_some(),
        "the three gateways never counted each other"
    );
    // One more heartbeat each, so every gateway has read the count of three: a heartbeat
    // stamps its member with Redis's time and returns the count in one script.
    let key = format!("{}instances", settings.redis.key_prefix);
    let beats = |url: String, key: String| async move {
        let mut conn = crate::helpers::redis_connection(&url).await.unwrap();
        redis::cmd("ZRANGE")
            .arg(key)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query_async::<Vec<(String, f64)>>(&mut conn)
            .await
            .unwrap()
    };
    let counted_at = beats(redis_url.clone(), key.clone())
        .await
        .into_iter()
        .map(|(_, at)| at)
        .fold(0.0, f64::max);
    wait_until(
        "every gateway to beat again",
        Duration::from_secs(10),
        || async {
            let now = beats(redis_url.clone(), key.clone()).await;
            now.len() == 3 && now.iter().all(|(_, at)| *at > counted_at)
        },
    )
    .await;
    redis.kill();

    // Act
    let flood = flood(&apis, &deal, |_| "greedy".to_owned()).await;

    // Assert: each gateway allows a third (2/s, burst 4): together the budget, not 3 × it.
    let most = allowance(6.0, 12.0, flood.elapsed, 3.0);
    eprintln!(
        "per-user over 3 gateways without Redis: {} passed, {} limited in {:?} (allowed {most})",
        flood.passed, flood.limited, flood.elapsed
    );
    assert!(
        flood.passed <= most,
        "{} passed, at most {most}",
        flood.passed
    );
    assert!(
        flood.passed >= 12,
        "{} passed: the fallback refuses everything",
        flood.passed
    );
    assert!(
        flood.limited > 0,
        "without Redis the user was not limited at all"
    );
    stop(gateways, &settings, database).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn per_user_checks_waiting_together_share_script_calls_and_stay_exact() {
    // Arrange: a private Redis, so that its command counts are this test's alone; every
    // user may take 3 requests at once, then 1 a second.
    const USERS: usize = 100;
    const CHECKS_PER_USER: usize = 5;
    let (_redis, port) = start_redis().await;
    let redis = RedisHandle::new(
        &format!("redis://127.0.0.1:{port}"),
        "batched:",
        RedisTimeouts {
            command: Duration::from_secs(2),
            unresponsive_after: Duration::from_secs(5),
        },
        Duration::from_secs(60),
    );
    redis.connect().await;
    assert!(redis.is_connected().await, "the private Redis answers");
    let mut limits = flashgate::config::Settings::defaults().limits;
    limits.per_user = RateSettings {
        rate_per_second: 1,
        burst: 3,
    };
    limits.global.enabled = true;
    let global = GlobalLimits::new(&limits, redis, Clock::system());

    // Act: every check of every user at once.
    let started = Instant::now();
    let checks = (0..USERS * CHECKS_PER_USER).map(|n| {
        let global = global.clone();
        tokio::spawn(async move {
            let user = format!("user-{}", n % USERS);
            (n % USERS, global.check_user(&user).await.is_ok())
        })
    });
    let mut passed = [0usize; USERS];
    for check in checks.collect::<Vec<_>>() {
        let (user, ok) = check.await.unwrap();
        passed[user] += usize::from(ok);
    }
    let elapsed = started.elapsed();

    // Assert: each user got its burst (plus what the rate refilled meanwhile), and the
    // checks shared far fewer script calls than there were checks.
    let refilled = elapsed.as_secs() as usize + 1;
    for (user, &n) in passed.iter().enumerate() {
        assert!(
            (3..=3 + refilled).contains(&n),
            "user-{user} passed {n} of {CHECKS_PER_USER} checks in {elapsed:?}"
        );
    }
    let calls = script_calls(port).await;
    assert!(
        calls <= USERS * CHECKS_PER_USER / 2,
        "{calls} script calls for {} checks",
        USERS * CHECKS_PER_USER
    );
}

/// `EVAL` and `EVALSHA` calls the Redis on `port` has served.
async fn script_calls(port: u16) -> usize {
    let mut redis = crate::helpers::redis_connection(&format!("redis://127.0.0.1:{port}"))
        .await
        .unwrap();
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut redis)
        .await
        .unwrap();
    stats
        .lines()
        .filter(|line| line.starts_with("cmdstat_eval:") || line.starts_with("cmdstat_evalsha:"))
        .filter_map(|line| {
            line.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<usize>()
                .ok()
        })
        .sum()
}

/// The deal budget of the slice tests: 20 a second, a burst of 20, slices of up to 16.
const DEAL_RATE: u32 = 20;
const DEAL_BURST: u32 = 20;

/// The test Redis under `prefix`, connected.
async fn test_redis(prefix: &str) -> RedisHandle {
    let redis = RedisHandle::new(
        &crate::helpers::redis_url(),
        prefix,
        RedisTimeouts {
            command: Duration::from_secs(2),
            unresponsive_after: Duration::from_secs(5),
        },
        Duration::from_secs(60),
    );
    redis.connect().await;
    assert!(redis.is_connected().await, "the test Redis answers");
    redis
}

/// Three limiter instances sharing the test Redis under one fresh key prefix, and the clock
/// they all run on.
async fn three_limiters() -> (Vec<GlobalLimits>, ManualClock, String) {
    let prefix = format!("fgtest:{}:", unique_suffix());
    let redis = test_redis(&prefix).await;
    let mut limits = flashgate::config::Settings::defaults().limits;
    limits.per_deal = RateSettings {
        rate_per_second: DEAL_RATE,
        burst: DEAL_BURST,
    };
    limits.global.enabled = true;
    limits.global.deal_slice = 16;
    limits.global.slice_ttl_ms = 50;
    let clock = ManualClock::starting_now();
    let instances = (0..3)
        .map(|_| GlobalLimits::new(&limits, redis.clone(), clock.clock()))
        .collect();
    (instances, clock, prefix)
}

#[tokio::test(flavor = "multi_thread")]
async fn an_instance_joining_while_another_spends_its_share_never_lets_a_user_past_the_budget() {
    // Arrange: 10 at once per user, then 1 a second; one instance alone spends half of
    // it in memory from the heartbeat that publishes its share.
    let prefix = format!("fgtest:{}:", unique_suffix());
    let redis = test_redis(&prefix).await;
    let mut limits = flashgate::config::Settings::defaults().limits;
    limits.per_user = RateSettings {
        rate_per_second: 1,
        burst: 10,
    };
    limits.global.enabled = true;
    let clock = ManualClock::starting_now();
    let first = GlobalLimits::new(&limits, redis.clone(), clock.clock());
    first.heartbeat().await;
    let g = limits.global;
    clock.advance(Duration::from_millis(
        g.instance_ttl_ms - g.heartbeat_interval_ms,
    ));
    first.heartbeat().await;

    // Act: a second instance starts, its share too small to keep with two, and counts
    // before the first heartbeats again; the user alternates between them.
    let second = GlobalLimits::new(&limits, redis, clock.clock());
    second.heartbeat().await;
    let mut passed = 0;
    for n in 0..40 {
        let via = if n % 2 == 0 { &first } else { &second };
        passed += usize::from(via.check_user("greedy").await.is_ok());
    }

    // Assert: the clock stood still, so nothing refilled: the burst and no more.
    assert_eq!(passed, 10, "{passed} of a burst of 10 passed");
    delete_redis_keys(&crate::helpers::redis_url(), &prefix).await;
}

/// Runs `steps` steps of `STEP`: each step the clock advances, every instance returns its
/// lapsed slices (as its periodic task would), then `arrivals(step)` names the instance of
/// each check. Returns the checks let through, and the budget of the elapsed time.
const STEP: Duration = Duration::from_millis(5);

async fn simulate(steps: u32, arrivals: impl Fn(u32) -> Vec<usize>) -> (usize, usize, usize) {
    let (instances, clock, prefix) = three_limiters().await;
    let (mut passed, mut sent) = (0, 0);
    for step in 0..steps {
        clock.advance(STEP);
        for instance in &instances {
            instance.return_lapsed().await;
        }
        for i in arrivals(step) {
            sent += 1;
            passed += usize::from(instances[i].check_deal("d").await.is_ok());
        }
    }
    delete_redis_keys(&crate::helpers::redis_url(), &prefix).await;
    let elapsed = STEP * steps;
    let budget = DEAL_BURST as usize + (f64::from(DEAL_RATE) * elapsed.as_secs_f64()) as usize;
    (passed, sent, budget)
}

/// At least 0.95 of the budget, never more than it.
fn assert_budget_used(case: &str, passed: usize, budget: usize) {
    eprintln!("{case}: {passed} of a budget of {budget}");
    assert!(passed <= budget, "{case}: {passed} passed, budget {budget}");
    assert!(
        passed * 100 >= budget * 95,
        "{case}: {passed} passed, less than 0.95 of {budget}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sparse_traffic_over_three_instances_wastes_no_deal_budget() {
    // Half the deal's rate, 10 a second, arriving in pairs 10 ms apart on two instances
    // every 200 ms: every one passes.
    let (passed, sent, _) = simulate(2000, |step| {
        let first = (step / 40) as usize % 3;
        match step % 40 {
            0 => vec![first],
            2 => vec![(first + 1) % 3],
            _ => vec![],
        }
    })
    .await;
    assert_eq!(passed, sent, "a user below the deal's rate was limited");

    // 30 a second, each instance every 100 ms, staggered: more than the budget, each
    // instance's slice lapsing between its requests.
    let (passed, _, budget) = simulate(2000, |step| match step % 20 {
        0 => vec![0],
        7 => vec![1],
        14 => vec![2],
        _ => vec![],
    })
    .await;
    assert_budget_used("sparse over three instances", passed, budget);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flood_or_a_mix_uses_the_deal_budget_and_never_exceeds_it() {
    // Every instance three checks every 5 ms, for 3 s.
    let (passed, _, budget) = simulate(600, |_| vec![0, 0, 0, 1, 1, 1, 2, 2, 2]).await;
    assert_budget_used("flood", passed, budget);

    // A flood moving from instance 0 to instance 1 halfway, instance 2 sparse throughout.
    let (passed, _, budget) = simulate(600, |step| {
        let mut arrivals = if step < 300 {
            vec![0, 0, 0]
        } else {
            vec![1, 1, 1]
        };
        if step % 30 == 0 {
            arrivals.push(2);
        }
        arrivals
    })
    .await;
    assert_budget_used("flood moving between instances", passed, budget);

    // A crowd at 150 a second, each instance one request every 20 ms, staggered: fewer
    // than a full slice per instance per slice_ttl_ms.
    let (passed, _, budget) = simulate(600, |step| match step % 4 {
        0 => vec![0],
        1 => vec![1],
        3 => vec![2],
        _ => vec![],
    })
    .await;
    assert_budget_used("crowd over three instances", passed, budget);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_buyer_costs_no_redis_round_trip_and_the_rest_of_the_budget_is_shared() {
    // Arrange: one gateway, alone, so its share of each user's budget is half of it (a
    // burst of 5, refilling at half of 1 a second), published a heartbeat interval before
    // the instance ttl after its first count (the clock is moved past it) and spent from
    // the heartbeat that publishes it.
    let clock = ManualClock::starting_now();
    let app = crate::helpers::spawn_app_on(clock.clock(), |s| {
        s.limits.global.enabled = true;
        s.limits.global.heartbeat_interval_ms = 100;
        s.limits.per_user.rate_per_second = 1;
        s.limits.per_user.burst = 10;
    })
    .await;
    let global = &app.settings.limits.global;
    clock.advance(Duration::from_millis(
        global.instance_ttl_ms - global.heartbeat_interval_ms,
    ));
    wait_until("its share spent", Duration::from_secs(5), || async {
        let metrics = app.metrics().await;
        let name = "flashgate_global_limit_user_share_split";
        let spending = crate::helpers::metric_value(&metrics, name, "");
        (spending == 1.0)
            .then_some(())
            .ok_or(format!("spending by {spending}"))
    })
    .await;
    let mut deal = new_deal("global-share", 1_000, 8);
    deal["per_user_limit"] = json!(1_000);
    let deal = app.given_deal(&deal).await;
    let checks = |source: &'static str| {
        let app = &app;
        async move {
            let label = format!("scope=\"per_user\",source=\"{source}\"");
            crate::helpers::metric_value(
                &app.metrics().await,
                "flashgate_global_limit_checks_total",
                &label,
            )
        }
    };

    // Act: twenty buyers with one order each, then one buyer with twelve.
    for n in 0..20 {
        app.order(&format!("buyer-{n}"), &deal, 1).await.expect(201);
    }
    let (share_first, redis_first) = (checks("share").await, checks("redis").await);
    let mut greedy = 0;
    for _ in 0..12 {
        greedy += usize::from(app.order("greedy", &deal, 1).await.status == 201);
    }

    // Assert: the buyers were decided in memory; the greedy one spent its share there and
    // the rest of its budget through Redis (the clock stood still: nothing refilled).
    assert_eq!((share_first, redis_first), (20.0, 0.0));
    assert_eq!(greedy, 10, "{greedy} of 12 passed");
    assert_eq!(checks("share").await - share_first, 5.0);
    assert!(checks("redis").await >= 5.0);
    app.cleanup().await;
}
