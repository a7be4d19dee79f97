//! The split, the publishing of shares and their spending, on a manual clock.

use super::*;
use crate::clock::ManualClock;

const RATE: RateSettings = RateSettings {
    rate_per_second: 10,
    burst: 60,
};

fn shares(clock: &ManualClock) -> UserShares {
    UserShares::new(
        RATE,
        50,
        Duration::from_secs(1),
        Duration::from_secs(5),
        clock.clock(),
    )
}

#[test]
fn shares_and_the_pool_they_leave_never_add_up_to_more_than_the_budget() {
    for percent in [0, 1, 33, 50, 90] {
        for instances in 1..=70 {
            for rate in [
                RATE,
                RateSettings {
                    rate_per_second: 3,
                    burst: 7,
                },
            ] {
                let n = u64::from(instances);
                let ppm = share_ppm(rate, percent, instances);
                let pool = pool_of(rate, WHOLE_PPM - instances * ppm);
                let (share_burst, share_rate) = share(rate, percent, instances)
                    .map_or((0, 0.0), |s| {
                        (u64::from(s.burst), 1e6 / s.interval_us as f64)
                    });
                let burst = n * share_burst + u64::from(pool.burst);
                let per_second = n as f64 * share_rate + 1e6 / pool.interval_us as f64;
                assert!(
                    burst <= u64::from(rate.burst),
                    "{percent}% of {rate:?} over {n}"
                );
                assert!(
                    per_second <= f64::from(rate.rate_per_second) + 1e-9,
                    "{percent}% of {rate:?} over {n}: {per_second}/s"
                );
                assert!(
                    burst + n >= u64::from(rate.burst),
                    "at most a request a share lost to rounding"
                );
                if let Some(share) = share(rate, percent, instances) {
                    assert!(u64::from(share.burst) >= SHARE_BURST_MIN);
                }
            }
        }
    }
}

#[test]
fn a_share_of_fewer_than_four_requests_leaves_the_whole_budget_in_redis() {
    let small = RateSettings {
        rate_per_second: 5,
        burst: 10,
    };
    assert_eq!(share(small, 50, 3), None);
    assert_eq!(share_ppm(small, 50, 3), 0);
    assert_eq!(pool_of(small, WHOLE_PPM), Budget::whole(small));
    assert_eq!(share(small, 50, 1).map(|share| share.burst), Some(5));
    assert_eq!(share(RATE, 50, 7).map(|share| share.burst), Some(4));
    assert_eq!(share(RATE, 50, 8), None);
}

/// Advances the clock a second, then publishes and is answered as a heartbeat would be.
fn beat(shares: &UserShares, clock: &ManualClock, answer: Answer) -> Published {
    clock.advance(Duration::from_secs(1));
    let published = shares.to_publish();
    shares.counted(answer);
    published
}

fn alone() -> Answer {
    Answer {
        instances: 1,
        others_ppm: 0,
        acknowledged: true,
    }
}

/// A lone instance spending its share (four heartbeats: a second short of the ttl).
fn spending_alone(clock: &ManualClock) -> UserShares {
    let shares = shares(clock);
    for _ in 0..5 {
        beat(&shares, clock, alone());
    }
    assert_eq!(shares.spending(), 1);
    shares
}

#[test]
fn a_lone_instance_publishes_its_share_a_heartbeat_short_of_the_ttl_and_spends_it() {
    let clock = ManualClock::starting_now();
    let shares = shares(&clock);
    assert_eq!(
        shares.pool().burst,
        30,
        "a lone instance's share is held back"
    );
    assert!(!shares.take("u"), "not counted yet: the pool decides");
    for _ in 0..4 {
        assert_eq!(beat(&shares, &clock, alone()).share_ppm, 0);
        assert!(!shares.take("u"));
    }
    let published = beat(&shares, &clock, alone());
    assert_eq!(published.share_ppm, 500_000);
    assert!(
        published.hold >= Duration::from_secs(11),
        "the ttl, then a drain"
    );
    // Half of a burst of 60, then one every 0.2 s (5/s); the pool holds the rest.
    assert_eq!((0..40).filter(|_| shares.take("u")).count(), 30);
    assert_eq!(shares.pool().burst, 30);
    clock.advance(Duration::from_millis(199));
    assert!(!shares.take("u"));
    clock.advance(Duration::from_millis(1));
    assert!(shares.take("u"));
    assert!(shares.take("v"), "another user has a share of its own");
}

#[test]
fn a_share_is_spent_only_once_every_other_instance_has_heard_of_it() {
    let clock = ManualClock::starting_now();
    let shares = shares(&clock);
    let three = |acknowledged| Answer {
        instances: 3,
        others_ppm: 333_334,
        acknowledged,
    };
    beat(&shares, &clock, three(false));
    beat(&shares, &clock, three(false));
    assert_eq!(beat(&shares, &clock, three(false)).share_ppm, 166_667);
    assert!(!shares.take("u"), "published, not yet heard of");
    assert_eq!(
        shares.pool().burst,
        29,
        "the pool leaves room for all three shares"
    );
    beat(&shares, &clock, three(true));
    assert!(shares.take("u"));
}

#[test]
fn the_others_shares_come_out_of_the_pool() {
    let clock = ManualClock::starting_now();
    let shares = shares(&clock);
    beat(
        &shares,
        &clock,
        Answer {
            instances: 2,
            others_ppm: 750_000,
            acknowledged: true,
        },
    );
    assert_eq!(
        shares.pool().burst,
        15,
        "others believe fewer instances run"
    );
}

#[test]
fn a_change_of_count_keeps_the_old_share_published_until_its_spends_drain() {
    let clock = ManualClock::starting_now();
    let shares = spending_alone(&clock);
    assert_eq!((0..20).filter(|_| shares.take("u")).count(), 20);
    let two = |acknowledged| Answer {
        instances: 2,
        others_ppm: 0,
        acknowledged,
    };
    // A second instance: no share until the count has held two heartbeats, and the
    // lone share stays published while what it spent drains.
    assert_eq!(beat(&shares, &clock, two(true)).share_ppm, 500_000);
    assert_eq!(shares.spending(), 0);
    assert!(!shares.take("u"));
    beat(&shares, &clock, two(true));
    assert_eq!(beat(&shares, &clock, two(true)).share_ppm, 500_000);
    assert_eq!(shares.spending(), 2);
    // A share of 15, of which 5 are outstanding: 20 spent, 15 refilled in 3 s at 5/s.
    assert_eq!((0..15).filter(|_| shares.take("u")).count(), 10);
    for _ in 0..5 {
        beat(&shares, &clock, two(false));
    }
    assert_eq!(
        beat(&shares, &clock, two(false)).share_ppm,
        250_000,
        "drained"
    );
    assert_eq!(
        shares.spending(),
        0,
        "the smaller share is not heard of yet"
    );
    beat(&shares, &clock, two(true));
    assert!(shares.take("u"));
}

#[test]
fn a_stale_heartbeat_stops_the_share() {
    let clock = ManualClock::starting_now();
    let shares = spending_alone(&clock);
    assert!(shares.take("u"));
    clock.advance(Duration::from_secs(5));
    assert!(!shares.take("u"), "no heartbeat for the instance ttl");
    assert_eq!(shares.spending(), 0);
}

#[test]
fn idle_users_are_forgotten_once_their_share_is_whole() {
    let clock = ManualClock::starting_now();
    let shares = spending_alone(&clock);
    assert!(shares.take("u"));
    shares.forget_idle();
    assert_eq!(shares.spent.len(), 1);
    clock.advance(Duration::from_millis(200));
    shares.forget_idle();
    assert_eq!(shares.spent.len(), 0);
}
