//! Each instance spends its share of every user's budget from memory: a new buyer costs
//! Redis nothing for the per-user limit, and the shares and the pool in Redis together never
//! let a user past the budget, whatever instance the requests reach and while instances
//! join and leave.

use std::time::Duration;

use flashgate::admission::global::GlobalLimits;
use flashgate::admission::{LimitSettings, RateSettings};
use flashgate::clock::{Clock, ManualClock};
use flashgate::redis_link::{RedisHandle, RedisTimeouts};

use crate::helpers::{delete_redis_keys, redis_connection, redis_url, unique_suffix};
use crate::redis_outage::start_redis;
use crate::waiting_room_idle::commands;

/// A handle on `url` under `prefix`, connected.
async fn redis_on(url: &str, prefix: &str) -> RedisHandle {
    let redis = RedisHandle::new(
        url,
        prefix,
        RedisTimeouts {
            command: Duration::from_secs(2),
            unresponsive_after: Duration::from_secs(5),
        },
        Duration::from_secs(60),
    );
    redis.connect().await;
    assert!(redis.is_connected().await, "Redis at {url} answers");
    redis
}

/// The shipped limits, shared, with `per_user` for the user's budget.
fn limits(per_user: RateSettings, local_share: bool) -> LimitSettings {
    let mut limits = flashgate::config::Settings::defaults().limits;
    limits.per_user = per_user;
    limits.global.enabled = true;
    limits.global.user_local_share = local_share;
    limits
}

/// Every command the Redis on `port` served, summed.
async fn commands_served(port: u16) -> u64 {
    let mut redis = redis_connection(&format!("redis://127.0.0.1:{port}"))
        .await
        .unwrap();
    commands(&mut redis).await.values().sum()
}

/// Per-user checks for `buyers` new buyers (one each) after the instance settled: what
/// passed, and the Redis commands they cost.
async fn new_buyers(local_share: bool, buyers: usize) -> (usize, u64) {
    let (_redis, port) = start_redis().await;
    let redis = redis_on(&format!("redis://127.0.0.1:{port}"), "shares:").await;
    let settings = limits(
        flashgate::config::Settings::defaults().limits.per_user,
        local_share,
    );
    let global = GlobalLimits::new(&settings, redis, Clock::system());
    global.settle().await;
    let before = commands_served(port).await;
    let mut passed = 0;
    for buyer in 0..buyers {
        passed += usize::from(global.check_user(&format!("buyer-{buyer}")).await.is_ok());
    }
    (passed, commands_served(port).await - before)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_buyer_costs_redis_no_command_for_the_per_user_limit() {
    // Arrange, Act: 500 new buyers, one check each, with the shipped settings.
    let (passed, spent) = new_buyers(true, 500).await;

    // Assert: every one passed from the instance's share, without a command.
    assert_eq!(passed, 500);
    assert_eq!(spent, 0, "{spent} Redis commands for 500 new buyers");

    // And the same checks asking Redis every time cost at least a call per batch.
    let (passed, spent) = new_buyers(false, 500).await;
    assert_eq!(passed, 500);
    assert!(
        spent >= 500,
        "only {spent} commands when every check asks Redis"
    );
}

/// `n` limiters on one Redis key prefix, all on `clock`.
async fn instances(
    n: usize,
    per_user: RateSettings,
    clock: &ManualClock,
) -> (Vec<GlobalLimits>, String) {
    let prefix = format!("fgtest:{}:", unique_suffix());
    let redis = redis_on(&redis_url(), &prefix).await;
    let settings = limits(per_user, true);
    let all = (0..n)
        .map(|_| GlobalLimits::new(&settings, redis.clone(), clock.clock()))
        .collect();
    (all, prefix)
}

#[tokio::test(flavor = "multi_thread")]
async fn ten_tries_through_three_instances_with_one_per_window_let_exactly_one_through() {
    // Arrange: one request per window of a second. The first instance alone holds the
    // unit when the user first comes; then two more join and the shares are cut again.
    let clock = ManualClock::starting_now();
    let one = RateSettings {
        rate_per_second: 1,
        burst: 1,
    };
    let (three, prefix) = instances(3, one, &clock).await;
    three[0].settle().await;

    // Act: ten tries round robin, 50 ms apart.
    let mut passed = 0;
    for attempt in 0..10 {
        if attempt == 1 {
            three[1].settle().await;
            three[2].settle().await;
            three[0].heartbeat().await;
        }
        let instance = &three[attempt % 3];
        passed += usize::from(instance.check_user("one").await.is_ok());
        clock.advance(Duration::from_millis(50));
    }

    // Assert
    assert_eq!(
        passed, 1,
        "{passed} of 10 tries passed a budget of 1 per window"
    );
    delete_redis_keys(&redis_url(), &prefix).await;
}

/// xorshift64*: a schedule from a seed, the same on every run.
struct Schedule(u64);

impl Schedule {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// The most requests let through in any window `[t_i, t_j]` beyond what a bucket of `burst`
/// and `rate`/s allows there (at most 0 when the budget held).
fn excess(grants: &[Duration], rate: f64, burst: f64) -> f64 {
    let mut worst = f64::MIN;
    for (i, first) in grants.iter().enumerate() {
        for (j, last) in grants.iter().enumerate().skip(i) {
            let allowed = burst + rate * (*last - *first).as_secs_f64();
            worst = worst.max((j - i + 1) as f64 - allowed);
        }
    }
    worst
}

/// One seed: a user sending faster than the budget through the live instances while they
/// come and go (a newcomer is a new process: a new id, nothing in memory). Every live
/// instance beats at least once a second of the clock, as its task would.
async fn come_and_go(seed: u64, budget: RateSettings) -> (Vec<Duration>, usize) {
    let mut schedule = Schedule(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let clock = ManualClock::starting_now();
    let (mut live, prefix) = instances(1, budget, &clock).await;
    live[0].heartbeat().await;
    let settings = limits(budget, true);
    let redis = redis_on(&redis_url(), &prefix).await;
    let (mut now, mut beats) = (Duration::ZERO, vec![Duration::ZERO]);
    let (mut grants, mut sent) = (Vec::new(), 0);
    for _ in 0..300 {
        let step = Duration::from_millis(schedule.below(120));
        clock.advance(step);
        now += step;
        match schedule.below(100) {
            0..=69 => {
                let i = schedule.below(live.len() as u64) as usize;
                sent += 1;
                if live[i].check_user("edge").await.is_ok() {
                    grants.push(now);
                }
            }
            70..=74 if live.len() < 4 => {
                live.push(GlobalLimits::new(&settings, redis.clone(), clock.clock()));
                beats.push(now);
                live.last().unwrap().heartbeat().await;
            }
            75..=77 if live.len() > 1 => {
                let i = schedule.below(live.len() as u64) as usize;
                live.remove(i);
                beats.remove(i);
            }
            _ => {}
        }
        for (instance, beat) in live.iter().zip(beats.iter_mut()) {
            if now - *beat >= Duration::from_millis(700 + schedule.below(300)) {
                instance.heartbeat().await;
                *beat = now;
            }
        }
    }
    delete_redis_keys(&redis_url(), &prefix).await;
    (grants, sent)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_user_at_the_edge_of_the_budget_never_exceeds_it_while_instances_come_and_go() {
    // 4 a second and a burst of 6 (a window of 1.5 s), sent at about 12 a second.
    let budget = RateSettings {
        rate_per_second: 4,
        burst: 6,
    };
    for seed in 1..=12 {
        let (grants, sent) = come_and_go(seed, budget).await;
        let over = excess(&grants, 4.0, 6.0);
        eprintln!(
            "seed {seed}: {} of {sent} passed, most over the budget {over:.3}",
            grants.len()
        );
        assert!(over <= 1e-9, "seed {seed}: {over} requests over the budget");
        assert!(
            grants.len() >= 6,
            "seed {seed}: only {} passed",
            grants.len()
        );
    }
}
