//! Keyed token-bucket limits (governor), one limiter per scope.
//!
//! Each check is a lock-free compare-and-swap on a sharded map: cheap enough to sit in
//! front of everything. Keys that stay idle are dropped by `retain_recent`, so a flood of
//! distinct addresses or ids cannot grow memory without bound. That sweep visits every key
//! (about 50 ms for 450,000 users, 80 ms for a million), holding one shard's lock at a
//! time: it runs off the request threads, and the map has many shards so that a request
//! meeting the sweep waits for a small slice of it at most.

use std::hash::Hash;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use dashmap::DashMap;
use governor::clock::{Clock, DefaultClock};
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::DashMapStateStore;
use governor::{Quota, RateLimiter};

use super::{LimitSettings, RateSettings};

/// Which limit turned a request away; also the metric label and the policy name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Ip,
    User,
    Deal,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Ip => "per_ip",
            Scope::User => "per_user",
            Scope::Deal => "per_deal",
        }
    }

    /// The `reason` label of a request this limit turned away: named as a rate, so it
    /// cannot be read as the deal's `per_user_limit` on units.
    pub fn rejection_reason(self) -> &'static str {
        match self {
            Scope::Ip => "rate_per_ip",
            Scope::User => "rate_per_user",
            Scope::Deal => "rate_per_deal",
        }
    }
}

/// A limit was hit: when to retry, and the policy that applied (for the RateLimit headers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limited {
    pub scope: Scope,
    pub retry_after_seconds: u64,
    pub quota: u32,
    pub window_seconds: u64,
}

/// A limiter keyed by user or deal id; also the local share of a shared budget.
pub(crate) type SharedLimiter = Limiter<String>;

/// Shards of each limiter's map (a power of two): the idle sweep holds one shard's lock at a
/// time, so a request whose key falls in that shard waits for 1/`MAP_SHARDS` of the sweep.
pub(crate) const MAP_SHARDS: usize = 128;

/// One keyed token bucket with the policy it reports when it refuses. Its buckets refill
/// on the clock `C`: the process's own, or in tests one they move by hand.
pub(crate) struct Limiter<K: Hash + Eq + Clone, C: Clock = DefaultClock> {
    scope: Scope,
    inner: RateLimiter<K, DashMapStateStore<K>, C, NoOpMiddleware<C::Instant>>,
    quota: u32,
    window_seconds: u64,
}

impl<K: Hash + Eq + Clone> Limiter<K> {
    pub(crate) fn new(scope: Scope, rate: RateSettings) -> Self {
        Self::with_clock(scope, rate, DefaultClock::default())
    }
}

impl<K: Hash + Eq + Clone, C: Clock> Limiter<K, C> {
    pub(crate) fn with_clock(scope: Scope, rate: RateSettings, clock: C) -> Self {
        let per_second = NonZeroU32::new(rate.rate_per_second).expect("validated: rate > 0");
        let burst = NonZeroU32::new(rate.burst).expect("validated: burst > 0");
        Self {
            scope,
            inner: RateLimiter::new(
                Quota::per_second(per_second).allow_burst(burst),
                DashMap::with_shard_amount(MAP_SHARDS),
                clock,
            ),
            quota: rate.burst,
            window_seconds: u64::from(rate.burst.div_ceil(rate.rate_per_second)),
        }
    }

    pub(crate) fn check(&self, key: &K) -> Result<(), Limited> {
        self.inner.check_key(key).map_err(|not_until| {
            // The limiter's own clock: making a new one calibrates it (CPUID and a timing
            // loop), which cost more than the rest of a refusal together.
            let wait = not_until.wait_time_from(self.inner.clock().now());
            Limited {
                scope: self.scope,
                retry_after_seconds: whole_seconds_at_least_one(wait),
                quota: self.quota,
                window_seconds: self.window_seconds,
            }
        })
    }

    /// Drops the keys whose bucket is full again. Blocks for a pass over every key: call it
    /// from a blocking thread, never from a request's task.
    pub(crate) fn forget_idle(&self) {
        self.inner.retain_recent();
        self.inner.shrink_to_fit();
    }
}

pub(crate) fn whole_seconds_at_least_one(wait: Duration) -> u64 {
    wait.as_secs() + u64::from(wait.subsec_nanos() > 0).max(u64::from(wait.as_secs() == 0))
}

/// The three limits of the admission pipeline.
pub struct RateLimits {
    ip: Limiter<IpAddr>,
    user: Limiter<String>,
    deal: Limiter<String>,
}

impl RateLimits {
    pub fn new(settings: &LimitSettings) -> Self {
        Self {
            ip: Limiter::new(Scope::Ip, settings.per_ip),
            user: Limiter::new(Scope::User, settings.per_user),
            deal: Limiter::new(Scope::Deal, settings.per_deal),
        }
    }

    /// IPv6 clients are limited per /64: one host usually owns the whole prefix and could
    /// otherwise rotate through addresses to escape its limit.
    pub fn check_ip(&self, ip: IpAddr) -> Result<(), Limited> {
        let key = match ip {
            IpAddr::V6(v6) => IpAddr::V6((u128::from(v6) & !u128::from(u64::MAX)).into()),
            IpAddr::V4(_) => ip,
        };
        self.ip.check(&key)
    }

    pub fn check_user(&self, user_id: &str) -> Result<(), Limited> {
        self.user.check(&user_id.to_owned())
    }

    pub fn check_deal(&self, deal_id: &str) -> Result<(), Limited> {
        self.deal.check(&deal_id.to_owned())
    }

    /// Drops state for keys that are back at full burst; run periodically.
    pub fn forget_idle(&self) {
        self.ip.forget_idle();
        self.user.forget_idle();
        self.deal.forget_idle();
    }
}

#[cfg(test)]
mod tests {
    use governor::clock::FakeRelativeClock;

    use super::*;

    fn settings(rate: u32, burst: u32) -> LimitSettings {
        let r = RateSettings {
            rate_per_second: rate,
            burst,
        };
        LimitSettings {
            retain_interval_ms: 1000,
            per_ip: r,
            per_user: r,
            per_deal: r,
            global: crate::admission::GlobalLimitSettings {
                enabled: false,
                deal_slice: 1,
                slice_ttl_ms: 50,
                heartbeat_interval_ms: 1000,
                instance_ttl_ms: 5000,
                instances_assumed: 1,
                user_batch_max: 64,
                user_queue_max: 4096,
                user_share_percent: 50,
            },
        }
    }

    #[test]
    fn burst_then_limited_with_retry_after() {
        let limits = RateLimits::new(&settings(1, 3));
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        for _ in 0..3 {
            limits.check_ip(ip).unwrap();
        }
        let limited = limits.check_ip(ip).unwrap_err();
        assert_eq!(limited.scope, Scope::Ip);
        assert_eq!(limited.retry_after_seconds, 1);
        assert_eq!((limited.quota, limited.window_seconds), (3, 3));
        // Another key has its own bucket.
        limits.check_ip("192.0.2.2".parse().unwrap()).unwrap();
    }

    #[test]
    fn ipv6_clients_share_their_64() {
        let limits = RateLimits::new(&settings(1, 1));
        limits.check_ip("2001:db8::1".parse().unwrap()).unwrap();
        assert!(
            limits
                .check_ip("2001:db8::ffff:2".parse().unwrap())
                .is_err()
        );
        limits.check_ip("2001:db8:0:1::1".parse().unwrap()).unwrap();
    }

    /// A per-user limiter on a clock the test moves, and that clock.
    fn on_test_clock(
        rate: u32,
        burst: u32,
    ) -> (Limiter<String, FakeRelativeClock>, FakeRelativeClock) {
        let clock = FakeRelativeClock::default();
        let limiter =
            Limiter::with_clock(Scope::User, settings(rate, burst).per_user, clock.clone());
        (limiter, clock)
    }

    #[test]
    fn idle_keys_are_forgotten() {
        let (limiter, clock) = on_test_clock(1_000, 1);
        for i in 0..100u8 {
            let _ = limiter.check(&format!("user-{i}"));
        }
        limiter.forget_idle();
        assert_eq!(limiter.inner.len(), 100, "kept while their buckets refill");
        clock.advance(Duration::from_millis(5));
        limiter.forget_idle();
        assert_eq!(limiter.inner.len(), 0);
    }

    #[test]
    fn a_spent_burst_comes_back_at_the_rate() {
        let (limiter, clock) = on_test_clock(2, 2);
        let key = "alice".to_owned();
        limiter.check(&key).unwrap();
        limiter.check(&key).unwrap();
        let limited = limiter.check(&key).unwrap_err();
        assert_eq!(limited.retry_after_seconds, 1, "half a second, rounded up");
        clock.advance(Duration::from_millis(450));
        assert!(limiter.check(&key).is_err(), "refused before its time");
        clock.advance(Duration::from_millis(100));
        limiter.check(&key).unwrap();
        assert!(
            limiter.check(&key).is_err(),
            "one request came back, not two"
        );
        clock.advance(Duration::from_secs(10));
        limiter.check(&key).unwrap();
        limiter.check(&key).unwrap();
        assert!(
            limiter.check(&key).is_err(),
            "idle time refills the burst, no more"
        );
    }

    #[test]
    fn retry_after_rounds_up() {
        assert_eq!(whole_seconds_at_least_one(Duration::ZERO), 1);
        assert_eq!(whole_seconds_at_least_one(Duration::from_millis(10)), 1);
        assert_eq!(whole_seconds_at_least_one(Duration::from_millis(1500)), 2);
        assert_eq!(whole_seconds_at_least_one(Duration::from_secs(2)), 2);
    }
}
