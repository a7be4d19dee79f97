//! This instance's share of every user's shared budget, spent in memory.
//!
//! A buyer sends a handful of requests in a sale and every buyer is new to it, so checking
//! each purchase against the user's budget in Redis costs a round trip per purchase and
//! nothing can be cached. Instead each user's budget (rate r, burst B) is split: an
//! instance spends a share of it in memory (`user_share_percent` of the budget divided by
//! the N live instances of the heartbeat), and every check beyond the shares takes from
//! the pool in Redis, which any instance may reach.
//!
//! The shares and the pool never add up to more than the budget, whatever the instances
//! believe N to be: each instance publishes in its heartbeat the part of the budget its
//! share may spend (in millionths), and sizes the pool it asks Redis for as what the
//! others' published shares and its own leave. It starts spending a share only once every
//! other live instance has heartbeated since it published it, so their pools leave room
//! for it; it keeps publishing a share it stopped spending until those requests have
//! drained (a bucket refills in `burst / rate`); and a share stays published past the
//! instance's last heartbeat for the instance ttl and a drain, because an instance that
//! stops cannot say what it spent after. Pools taken by different instances meet in one
//! Redis key, which stays within its budget whatever the sizes asked (each request costs
//! its pool's share of the key's time), so only shares need this care.
//!
//! A share is published once the count has held for `SHARE_AFTER_BEATS` heartbeat
//! intervals (a heartbeat interval short of `instance_ttl_ms` for an instance that counts
//! itself alone), so that the shares of instances starting together do not cut the
//! others' pools for a moment. An instance whose heartbeat is older than `instance_ttl_ms`
//! spends no share.
//!
//! State per user: the GCRA's theoretical arrival time, keyed by a keyed hash of the user
//! id (a collision makes two users share one share, stricter, never looser), with the
//! count it was spent under: when the share changes, what is outstanding is kept in
//! requests, not in time.

use std::hash::{BuildHasher, RandomState};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dashmap::DashMap;

use super::RateSettings;
use super::limits::MAP_SHARDS;
use crate::clock::Clock;

/// Heartbeat intervals a count must hold before this instance publishes the share it
/// gives: by then the instances that started with it have counted it, and it them.
const SHARE_AFTER_BEATS: u32 = 2;

/// The whole budget, in the millionths shares are published in.
pub const WHOLE_PPM: u32 = 1_000_000;

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

/// Each instance's share of `rate` when `percent` of it is divided among `instances`: none
/// when it would hold fewer than `SHARE_BURST_MIN` requests at once.
pub fn share(rate: RateSettings, percent: u32, instances: u32) -> Option<Budget> {
    let n = u64::from(instances.max(1));
    let percent = u64::from(percent.min(100));
    let burst = u64::from(rate.burst) * percent / (100 * n);
    if burst < SHARE_BURST_MIN {
        return None;
    }
    Some(Budget {
        interval_us: interval_us(u64::from(rate.rate_per_second) * percent, 100 * n),
        burst: u32::try_from(burst).unwrap_or(u32::MAX),
    })
}

/// The part of `rate` a share of `instances` spends, in millionths rounded up (0: none).
pub fn share_ppm(rate: RateSettings, percent: u32, instances: u32) -> u32 {
    if instances == 0 || share(rate, percent, instances).is_none() {
        return 0;
    }
    let ppm = u64::from(percent.min(100)) * 10_000;
    u32::try_from(ppm.div_ceil(u64::from(instances))).unwrap_or(WHOLE_PPM)
}

/// What one user spent of this instance's share.
#[derive(Clone, Copy)]
struct Spent {
    tat_us: u64,
    instances: u32,
}

/// What this instance publishes in a heartbeat: the part of every user's budget its share
/// may spend (millionths; 0: none), kept for `hold` more unless republished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Published {
    pub share_ppm: u32,
    pub hold: Duration,
}

/// A heartbeat's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Answer {
    /// Live instances.
    pub instances: u32,
    /// The shares the other instances published, and those of stopped ones not yet drained.
    pub others_ppm: u32,
    /// Every other live instance heartbeated since this one published its share.
    pub acknowledged: bool,
}

/// The heartbeat's side of the state.
struct Placement {
    last_counted: Option<Instant>,
    instances: u32,
    /// When the count last changed, or this presence began.
    held_since: Instant,
    /// The count whose share the last heartbeat published (0: none): the one it means to
    /// spend, or a larger one spent before while its spends drain.
    published: u32,
    /// The count whose share it means to spend (0: none yet).
    intended: u32,
    /// The count of the share spent last (0: none), owed until its spends drain.
    spent_by: u32,
}

/// This instance's shares of every user's budget.
pub struct UserShares {
    rate: RateSettings,
    percent: u32,
    heartbeat_interval: Duration,
    instance_ttl: Duration,
    /// How long a bucket emptied by spends takes to refill: spends older are gone.
    drain: Duration,
    clock: Clock,
    /// The clock's reading that `*_us` times count from.
    epoch: Instant,
    spent: DashMap<u64, Spent>,
    hasher: RandomState,
    placement: Mutex<Placement>,
    /// The count whose share is spent now (0: none).
    spending: AtomicU32,
    /// The part of the budget the pool in Redis holds for this instance (millionths).
    pool_ppm: AtomicU32,
    /// Until when (µs since `epoch`) the last heartbeat counts this instance.
    fresh_until_us: AtomicU64,
    last_spend_us: AtomicU64,
}

impl UserShares {
    /// No share is spent, and the pool is what a lone instance's share leaves, until the
    /// heartbeats have placed this instance (`counted`).
    pub fn new(
        rate: RateSettings,
        percent: u32,
        heartbeat_interval: Duration,
        instance_ttl: Duration,
        clock: Clock,
    ) -> Self {
        let epoch = clock.instant();
        let drain_us = (Budget::whole(rate).interval_us + 1) * u64::from(rate.burst.max(1));
        let shares = Self {
            rate,
            percent,
            heartbeat_interval,
            instance_ttl,
            drain: Duration::from_micros(drain_us),
            clock,
            epoch,
            spent: DashMap::with_shard_amount(MAP_SHARDS),
            hasher: RandomState::new(),
            placement: Mutex::new(Placement {
                last_counted: None,
                instances: 0,
                held_since: epoch,
                published: 0,
                intended: 0,
                spent_by: 0,
            }),
            spending: AtomicU32::new(0),
            pool_ppm: AtomicU32::new(WHOLE_PPM),
            fresh_until_us: AtomicU64::new(0),
            last_spend_us: AtomicU64::new(0),
        };
        let lone_share = shares.share_ppm(1);
        shares
            .pool_ppm
            .store(WHOLE_PPM - lone_share, Ordering::Relaxed);
        shares
    }

    fn share_ppm(&self, instances: u32) -> u32 {
        share_ppm(self.rate, self.percent, instances)
    }

    /// The pool in Redis: what the published shares leave of the budget.
    pub fn pool(&self) -> Budget {
        pool_of(self.rate, self.pool_ppm.load(Ordering::Relaxed))
    }

    /// What to publish in the next heartbeat: the share of a count that has held long
    /// enough, or the one spent last while its spends drain, whichever is larger.
    pub fn to_publish(&self) -> Published {
        let now = self.clock.instant();
        let Ok(mut placement) = self.placement.lock() else {
            return Published {
                share_ppm: 0,
                hold: Duration::ZERO,
            };
        };
        let intended = self.intended(&placement, now);
        placement.intended = intended;
        let draining = self.drain_left(now);
        let owed = if draining.is_zero() {
            0
        } else {
            placement.spent_by
        };
        placement.published = if self.share_ppm(owed) > self.share_ppm(intended) {
            owed
        } else {
            intended
        };
        let hold = if intended > 0 {
            self.instance_ttl + self.drain
        } else {
            draining
        };
        Published {
            share_ppm: self.share_ppm(placement.published),
            hold,
        }
    }

    /// The count whose share this instance means to spend (0: none yet).
    fn intended(&self, placement: &Placement, now: Instant) -> u32 {
        let held = now.saturating_duration_since(placement.held_since);
        let beats = self.heartbeat_interval * SHARE_AFTER_BEATS;
        let needed = if placement.instances == 1 {
            beats.max(self.instance_ttl.saturating_sub(self.heartbeat_interval))
        } else {
            beats
        };
        let fresh = placement
            .last_counted
            .is_some_and(|last| now.saturating_duration_since(last) < self.instance_ttl);
        if fresh && held >= needed {
            placement.instances
        } else {
            0
        }
    }

    /// A heartbeat that published `to_publish()` was answered.
    pub fn counted(&self, answer: Answer) {
        let now = self.clock.instant();
        let Ok(mut placement) = self.placement.lock() else {
            return;
        };
        let continued = placement
            .last_counted
            .is_some_and(|last| now.saturating_duration_since(last) < self.instance_ttl);
        if !continued || placement.instances != answer.instances {
            placement.held_since = now;
            placement.intended = 0;
        }
        placement.instances = answer.instances;
        placement.last_counted = Some(now);
        let own = self.share_ppm(placement.published);
        let pool = WHOLE_PPM.saturating_sub(answer.others_ppm.saturating_add(own));
        self.pool_ppm.store(pool, Ordering::Relaxed);
        let spending = if answer.acknowledged {
            placement.intended
        } else {
            0
        };
        if spending > 0 {
            placement.spent_by = spending;
        }
        self.spending.store(spending, Ordering::Relaxed);
        self.fresh_until_us
            .store(self.us(now + self.instance_ttl), Ordering::Relaxed);
    }

    /// The count whose share is spent now; 0 while none.
    pub fn spending(&self) -> u32 {
        self.spending_at(self.us(self.clock.instant()))
    }

    fn spending_at(&self, now_us: u64) -> u32 {
        if now_us < self.fresh_until_us.load(Ordering::Relaxed) {
            self.spending.load(Ordering::Relaxed)
        } else {
            0
        }
    }

    fn drain_left(&self, now: Instant) -> Duration {
        let last_us = self.last_spend_us.load(Ordering::Relaxed);
        if last_us == 0 {
            return Duration::ZERO;
        }
        let until_us =
            last_us.saturating_add(u64::try_from(self.drain.as_micros()).unwrap_or(u64::MAX));
        Duration::from_micros(until_us.saturating_sub(self.us(now)))
    }

    /// Takes one request of `user`'s share; false when the share is spent, there is none,
    /// or this instance may not spend one now.
    pub fn take(&self, user: &str) -> bool {
        let now_us = self.us(self.clock.instant());
        let instances = self.spending_at(now_us);
        if instances == 0 {
            return false;
        }
        let Some(share) = share(self.rate, self.percent, instances) else {
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
        drop(entry);
        // Never zero: zero reads as "never spent".
        self.last_spend_us
            .fetch_max(now_us.max(1), Ordering::Relaxed);
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

/// The pool holding `pool_ppm` millionths of `rate`: its burst rounded down and its
/// interval up, so never more.
fn pool_of(rate: RateSettings, pool_ppm: u32) -> Budget {
    if pool_ppm >= WHOLE_PPM {
        return Budget::whole(rate);
    }
    let ppm = u64::from(pool_ppm);
    let burst = u64::from(rate.burst) * ppm / u64::from(WHOLE_PPM);
    let per_second_ppm = u64::from(rate.rate_per_second) * ppm;
    Budget {
        interval_us: interval_us(per_second_ppm, u64::from(WHOLE_PPM)),
        burst: u32::try_from(burst).unwrap_or(0),
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
mod tests;
