//! This instance's share of every user's shared budget, spent in memory.
//!
//! A buyer sends a handful of requests in a sale and every buyer is new to it, so checking
//! each purchase against the user's budget in Redis costs a round trip per purchase and
//! nothing can be cached. Instead each user's budget (rate r, burst B) is split in two:
//! `user_share_percent` of it is divided evenly among the N live instances, each spending
//! its part in memory, and the rest (the pool) stays in Redis for any instance to take.
//! The parts add up to at most the budget, burst and rate alike (shares round down, so
//! the pool keeps what rounding leaves), so instances together never let a user exceed it:
//! a user whose requests spread over the instances gets all of it, and one who only ever
//! reaches one instance gets that instance's share plus the pool.
//!
//! The split follows the instance count of the heartbeat, and a share is only spent while
//! every instance counts the same N, else two shares computed from different counts could
//! overlap. A newcomer is counted by the others at their next heartbeat, and learns of
//! instances that started with it at its own next one, so an instance starts spending its
//! share `SHARE_AFTER_BEATS` heartbeat intervals after it was first counted. One that found
//! itself alone waits a heartbeat interval less than `instance_ttl_ms` instead: instances
//! starting beside it, even slowly, are counted by then, before it spends a share that
//! the others, taking from the whole budget while they find no shares kept, do not know
//! of. It
//! stops when its last heartbeat is older than `instance_ttl_ms`
//! (the others may have counted it out, or it was frozen). Meanwhile its checks go to
//! Redis (to the whole budget while it has counted itself alone), so the budget stays
//! exact, only slower.
//!
//! State per user: the GCRA's theoretical arrival time, keyed by a keyed hash of the user
//! id (a collision makes two users share one share, stricter, never looser), with the
//! count it was spent under: when the count changes, what is outstanding is kept in
//! requests, not in time.

use std::hash::{BuildHasher, RandomState};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dashmap::DashMap;

use super::RateSettings;
use super::limits::MAP_SHARDS;
use crate::clock::Clock;

/// Heartbeat intervals after its first count before an instance spends its share: by then
/// every live instance has heartbeated at least once and counts it, and it counts them.
const SHARE_AFTER_BEATS: u32 = 2;

/// Fewest requests a share holds at once for instances to keep shares at all. Each of the
/// N shares can strand up to a request to rounding in any window, which a share of one or
/// two would make a large part of it: a user spread over the instances would get clearly
/// less than the budget. Below it the whole budget stays in Redis.
const SHARE_BURST_MIN: u64 = 4;

/// A GCRA budget: one request every `interval_us`, `burst` at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    pub interval_us: u64,
    pub burst: u32,
}

impl Budget {
    /// All of `rate`.
    pub fn whole(rate: RateSettings) -> Self {
        Self {
            interval_us: interval_us(u64::from(rate.rate_per_second), 1),
            burst: rate.burst,
        }
    }
}

/// One request every `1 / (per_second / divisor)` seconds, rounded up (so never faster).
fn interval_us(per_second: u64, divisor: u64) -> u64 {
    (1_000_000 * divisor).div_ceil(per_second.max(1)).max(1)
}

/// How `rate` is split among `instances` when `percent` of it is spent in memory: each
/// instance's share (none when it would hold fewer than `SHARE_BURST_MIN` requests at
/// once) and the pool in Redis.
pub fn split(rate: RateSettings, percent: u32, instances: u32) -> (Option<Budget>, Budget) {
    let n = u64::from(instances.max(1));
    let percent = u64::from(percent.min(100));
    let burst = u64::from(rate.burst);
    let share_burst = burst * percent / (100 * n);
    if share_burst < SHARE_BURST_MIN {
        return (None, Budget::whole(rate));
    }
    let per_second = u64::from(rate.rate_per_second);
    let share = Budget {
        interval_us: interval_us(per_second * percent, 100 * n),
        burst: u32::try_from(share_burst).unwrap_or(u32::MAX),
    };
    let pool = Budget {
        interval_us: interval_us(per_second * (100 - percent), 100),
        burst: u32::try_from(burst - n * share_burst).unwrap_or(0),
    };
    (Some(share), pool)
}

/// What one user spent of this instance's share.
#[derive(Clone, Copy)]
struct Spent {
    tat_us: u64,
    instances: u32,
}

/// This instance's shares of every user's budget.
pub struct UserShares {
    rate: RateSettings,
    percent: u32,
    heartbeat_interval: Duration,
    instance_ttl: Duration,
    clock: Clock,
    /// The clock's reading that `*_us` times count from.
    epoch: Instant,
    spent: DashMap<u64, Spent>,
    hasher: RandomState,
    /// This instance's last successful heartbeat: one later than `instance_ttl_ms` after it
    /// starts a new presence, which waits again before spending its share.
    last_counted: Mutex<Option<Instant>>,
    /// From when (µs since `epoch`) the share may be spent, and until when; 0 until: never.
    usable_from_us: AtomicU64,
    usable_until_us: AtomicU64,
}

impl UserShares {
    /// No share is spent until the heartbeats have placed this instance (`counted`).
    pub fn new(
        rate: RateSettings,
        percent: u32,
        heartbeat_interval: Duration,
        instance_ttl: Duration,
        clock: Clock,
    ) -> Self {
        let epoch = clock.instant();
        Self {
            rate,
            percent,
            heartbeat_interval,
            instance_ttl,
            clock,
            epoch,
            spent: DashMap::with_shard_amount(MAP_SHARDS),
            hasher: RandomState::new(),
            last_counted: Mutex::new(None),
            usable_from_us: AtomicU64::new(0),
            usable_until_us: AtomicU64::new(0),
        }
    }

    /// The pool in Redis when `instances` run: what every check beyond a share takes from.
    /// An instance that counted itself alone and may not spend its share yet takes from the
    /// whole budget: no other instance spends a share then (one that started since would
    /// wait for this one's next heartbeat to count it), and an instance that started beside
    /// it, counting it, asks Redis too, so a sale that starts with the instances is not
    /// held to the pool for its first heartbeat.
    pub fn pool(&self, instances: u32) -> Budget {
        let now_us = self.us(self.clock.instant());
        let newly_alone = instances <= 1
            && now_us < self.usable_from_us.load(Ordering::Relaxed)
            && now_us < self.usable_until_us.load(Ordering::Relaxed);
        if newly_alone {
            return Budget::whole(self.rate);
        }
        split(self.rate, self.percent, instances).1
    }

    /// A heartbeat succeeded now, counting `instances`. (The count is also read at each
    /// check: a share is split by the count of the moment.)
    pub fn counted(&self, instances: u32) {
        let now = self.clock.instant();
        let Ok(mut last_counted) = self.last_counted.lock() else {
            return;
        };
        let continued = last_counted
            .is_some_and(|last| now.saturating_duration_since(last) < self.instance_ttl);
        if !continued {
            let beats = self.heartbeat_interval * SHARE_AFTER_BEATS;
            let wait = if instances <= 1 {
                beats.max(self.instance_ttl.saturating_sub(self.heartbeat_interval))
            } else {
                beats
            };
            self.usable_from_us
                .store(self.us(now + wait), Ordering::Relaxed);
        }
        *last_counted = Some(now);
        self.usable_until_us
            .store(self.us(now + self.instance_ttl), Ordering::Relaxed);
    }

    /// Takes one request of `user`'s share when `instances` run; false when the share is
    /// spent, there is none, or this instance may not spend it now.
    pub fn take(&self, user: &str, instances: u32) -> bool {
        let now_us = self.us(self.clock.instant());
        let usable = self.usable_from_us.load(Ordering::Relaxed) <= now_us
            && now_us < self.usable_until_us.load(Ordering::Relaxed);
        if !usable {
            return false;
        }
        let Some(share) = split(self.rate, self.percent, instances).0 else {
            return false;
        };
        let key = self.hasher.hash_one(user);
        let mut entry = self.spent.entry(key).or_insert(Spent {
            tat_us: now_us,
            instances,
        });
        let spent = entry.value_mut();
        let tat_us = outstanding_in(spent, instances, now_us);
        let tolerance_us = share.interval_us * u64::from(share.burst - 1);
        if tat_us > now_us + tolerance_us {
            *spent = Spent { tat_us, instances };
            return false;
        }
        *spent = Spent {
            tat_us: tat_us + share.interval_us,
            instances,
        };
        true
    }

    /// Drops users whose share is whole again; off the request threads (see `limits`).
    pub fn forget_idle(&self) {
        let now_us = self.us(self.clock.instant());
        self.spent.retain(|_, spent| spent.tat_us > now_us);
    }

    fn us(&self, at: Instant) -> u64 {
        let since = at.saturating_duration_since(self.epoch);
        u64::try_from(since.as_micros()).unwrap_or(u64::MAX)
    }
}

/// `spent`'s arrival time when `instances` run now: a share's interval grows with the count,
/// so the requests outstanding are kept and their time scaled.
fn outstanding_in(spent: &Spent, instances: u32, now_us: u64) -> u64 {
    let ahead = spent.tat_us.saturating_sub(now_us);
    if spent.instances == instances || ahead == 0 {
        return spent.tat_us.max(now_us);
    }
    let scaled =
        u128::from(ahead) * u128::from(instances.max(1)) / u128::from(spent.instances.max(1));
    now_us + u64::try_from(scaled).unwrap_or(u64::MAX / 2)
}

#[cfg(test)]
mod tests {
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

    /// A lone instance placed by its heartbeats (4 s after its first count), so
    /// that its share is spent.
    fn counted(clock: &ManualClock) -> UserShares {
        let shares = shares(clock);
        shares.counted(1);
        clock.advance(Duration::from_secs(4));
        shares.counted(1);
        shares
    }

    #[test]
    fn shares_and_pool_never_add_up_to_more_than_the_budget() {
        for percent in [0, 1, 33, 50, 90] {
            for instances in 1..=70 {
                for rate in [
                    RATE,
                    RateSettings {
                        rate_per_second: 3,
                        burst: 7,
                    },
                ] {
                    let (share, pool) = split(rate, percent, instances);
                    let n = u64::from(instances);
                    let (share_burst, share_rate) = share.map_or((0, 0.0), |s| {
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
                    match share {
                        None => assert_eq!(pool, Budget::whole(rate)),
                        Some(share) => assert!(u64::from(share.burst) >= SHARE_BURST_MIN),
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
        assert_eq!(split(small, 50, 3), (None, Budget::whole(small)));
        assert_eq!(split(small, 50, 1).0.map(|share| share.burst), Some(5));
        assert_eq!(split(RATE, 50, 7).0.map(|share| share.burst), Some(4));
        assert_eq!(split(RATE, 50, 8).0, None);
    }

    #[test]
    fn an_instance_alone_spends_its_share_at_once_and_then_refills_at_its_rate() {
        let clock = ManualClock::starting_now();
        let shares = shares(&clock);
        assert!(!shares.take("u", 1), "not counted yet: the pool decides");
        shares.counted(1);
        assert!(
            !shares.take("u", 1),
            "alone: others starting slowly may not be counted yet"
        );
        clock.advance(Duration::from_secs(4));
        shares.counted(1);
        // Half of a burst of 60 on one instance, then one every 0.2 s (5/s).
        let taken = (0..40).filter(|_| shares.take("u", 1)).count();
        assert_eq!(taken, 30);
        clock.advance(Duration::from_millis(199));
        assert!(!shares.take("u", 1));
        clock.advance(Duration::from_millis(1));
        assert!(shares.take("u", 1));
        assert!(shares.take("v", 1), "another user has a share of its own");
    }

    #[test]
    fn an_instance_that_counted_itself_alone_takes_from_the_whole_budget_until_it_spends_its_share()
    {
        let clock = ManualClock::starting_now();
        let shares = shares(&clock);
        let (_, pool) = split(RATE, 50, 1);
        assert_eq!(shares.pool(1), pool, "never counted: only the pool");
        shares.counted(1);
        assert_eq!(shares.pool(1), Budget::whole(RATE));
        assert_eq!(
            shares.pool(3),
            split(RATE, 50, 3).1,
            "others run: their shares count"
        );
        clock.advance(Duration::from_secs(4));
        shares.counted(1);
        assert!(shares.take("u", 1));
        assert_eq!(shares.pool(1), pool, "its share is spent in memory now");
    }

    #[test]
    fn a_newcomer_waits_until_the_others_count_it_and_stops_when_its_count_is_stale() {
        let clock = ManualClock::starting_now();
        let shares = shares(&clock);
        shares.counted(3);
        assert!(!shares.take("u", 3), "the others do not count it yet");
        clock.advance(Duration::from_secs(1));
        shares.counted(3);
        assert!(!shares.take("u", 3));
        clock.advance(Duration::from_secs(1));
        shares.counted(3);
        assert!(
            shares.take("u", 3),
            "two intervals after it was first counted"
        );
        clock.advance(Duration::from_secs(5));
        assert!(!shares.take("u", 3), "no heartbeat for the instance ttl");
        shares.counted(3);
        assert!(!shares.take("u", 3), "counted again as a newcomer");
    }

    #[test]
    fn a_change_of_count_keeps_the_requests_outstanding() {
        let clock = ManualClock::starting_now();
        let shares = counted(&clock);
        // 20 of the 30 a lone instance may take.
        assert_eq!((0..20).filter(|_| shares.take("u", 1)).count(), 20);
        // Two instances now: a share of 15 of which 20 are outstanding, so none is left
        // until six have refilled at 2.5/s.
        assert!(!shares.take("u", 2));
        clock.advance(Duration::from_millis(2_399));
        assert!(!shares.take("u", 2));
        clock.advance(Duration::from_millis(1));
        assert!(shares.take("u", 2));
    }

    #[test]
    fn idle_users_are_forgotten_once_their_share_is_whole() {
        let clock = ManualClock::starting_now();
        let shares = counted(&clock);
        assert!(shares.take("u", 1));
        shares.forget_idle();
        assert_eq!(shares.spent.len(), 1);
        clock.advance(Duration::from_millis(200));
        shares.forget_idle();
        assert_eq!(shares.spent.len(), 0);
    }
}
