//! Per-user and per-deal limits shared by every instance.
//!
//! The local token buckets (`limits`) are per process, so N gateways would allow N times
//! the rate. Behind them this module keeps one budget per user and per deal in Redis: a
//! GCRA (generic cell rate algorithm) whose whole state is one timestamp per key, updated
//! by one script on Redis's clock, so instances with skewed clocks still agree.
//!
//! - Per user every check is exact to the request. Checks waiting at once share one script
//!   call (group-commit style, no timer): while a call is in flight new checks queue, and
//!   the next call takes all of them, at most `user_batch_max`, their keys grouped so that
//!   one call touches one Redis Cluster slot.
//! - Per deal an instance takes a slice of requests per call and spends it locally; an
//!   unused slice is dropped after `slice_ttl_ms`, so the instances together stay within
//!   the burst plus rate × (elapsed + slice_ttl).
//! - Redis down (or slow past its command timeout): each instance falls back to a local
//!   bucket holding 1/N of the budget, N the live instances it last counted in Redis.
//!   Requests Redis granted drain that bucket too, so an outage starts from what the
//!   instance already used rather than from a fresh burst. Never no limit.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use futures_util::future::join_all;
use redis::cluster_routing::Slot;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::limits::{Limited, Scope, SharedLimiter};
use crate::config::{GlobalLimitSettings, LimitSettings, RateSettings};
use crate::redis_link::{RedisError, RedisHandle, Script};
use crate::telemetry;

/// GCRA over each key in turn. ARGV: emission interval (µs per request), burst, requests
/// wanted per key. Grants each key up to the wanted number that fit now and answers
/// `{granted, wait_us}` per key, flattened: the wait until one more would fit when nothing
/// was granted. A key listed twice is charged twice, in order.
const GCRA: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local out = {}
for i, key in ipairs(KEYS) do
  local tat = tonumber(redis.call('GET', key) or '0')
  if tat < now then tat = now end
  local free = math.floor((now + burst * interval - tat) / interval)
  if free < 1 then
    out[2 * i - 1] = 0
    out[2 * i] = tat - burst * interval + interval - now
  else
    local granted = math.min(free, want)
    tat = tat + granted * interval
    redis.call('SET', key, string.format('%.0f', tat), 'PX', math.floor((tat - now) / 1000) + 1)
    out[2 * i - 1] = granted
    out[2 * i] = 0
  end
end
return out
"#;

/// Announces this instance and counts the live ones. ARGV: instance id, ttl (ms).
const HEARTBEAT: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - ttl)
redis.call('PEXPIRE', KEYS[1], ttl)
return redis.call('ZCARD', KEYS[1])
"#;

/// Requests of a deal's budget this instance took and has not spent yet.
struct Slice {
    left: u32,
    expires: Instant,
}

/// One shared limit: its Redis keys, its slices and its fallback share.
struct SharedScope {
    scope: Scope,
    rate: RateSettings,
    /// Requests taken per Redis round trip.
    slice: u32,
    /// Checks waiting at once share one call (per user: each call takes one request).
    together: bool,
    slices: DashMap<String, Slice>,
    /// The local share used while Redis cannot answer, rebuilt when the count changes.
    fallback: RwLock<(u32, Arc<SharedLimiter>)>,
}

impl SharedScope {
    fn new(scope: Scope, rate: RateSettings, slice: u32, instances: u32) -> Self {
        Self {
            scope,
            rate,
            slice,
            together: scope == Scope::User,
            slices: DashMap::new(),
            fallback: RwLock::new((instances, Arc::new(share(scope, rate, instances)))),
        }
    }

    /// Spends one request of an unexpired local slice, if there is one.
    fn take_from_slice(&self, key: &str) -> bool {
        let Some(mut slice) = self.slices.get_mut(key) else {
            return false;
        };
        if slice.left == 0 || slice.expires <= Instant::now() {
            return false;
        }
        slice.left -= 1;
        true
    }

    fn keep_slice(&self, key: &str, left: u32, ttl: Duration) {
        if left > 0 {
            let expires = Instant::now() + ttl;
            self.slices.insert(key.to_owned(), Slice { left, expires });
        }
    }

    fn limited(&self, wait: Duration) -> Limited {
        Limited {
            scope: self.scope,
            retry_after_seconds: super::limits::whole_seconds_at_least_one(wait),
            quota: self.rate.burst,
            window_seconds: u64::from(self.rate.burst.div_ceil(self.rate.rate_per_second)),
        }
    }

    /// Admissions granted by Redis drain the local share too, so that a Redis outage
    /// starts from what this instance already used, not from a fresh burst.
    fn spend_share(&self, key: &str, instances: u32) {
        let _already_empty = self.fallback(instances).check(&key.to_owned());
    }

    /// The local share, rebuilt first when the instance count changed.
    fn fallback(&self, instances: u32) -> Arc<SharedLimiter> {
        if let Ok(current) = self.fallback.read()
            && current.0 == instances
        {
            return current.1.clone();
        }
        let fresh = Arc::new(share(self.scope, self.rate, instances));
        if let Ok(mut current) = self.fallback.write() {
            *current = (instances, fresh.clone());
        }
        fresh
    }
}

/// 1/N of a budget, rounded up so that no share is zero.
fn share(scope: Scope, rate: RateSettings, instances: u32) -> SharedLimiter {
    let n = instances.max(1);
    SharedLimiter::new(
        scope,
        RateSettings {
            rate_per_second: rate.rate_per_second.div_ceil(n),
            burst: rate.burst.div_ceil(n),
        },
    )
}

/// The shared per-user and per-deal limits of this instance.
#[derive(Clone)]
pub struct GlobalLimits {
    inner: Arc<Inner>,
}

struct Inner {
    redis: RedisHandle,
    settings: GlobalLimitSettings,
    gcra: Arc<Script>,
    heartbeat: Script,
    /// Per-user checks waiting for the next shared call; the task serving them starts with
    /// the first check and ends when this sender is dropped.
    user_checks: OnceLock<mpsc::Sender<UserCheck>>,
    user: SharedScope,
    deal: SharedScope,
    /// Live instances, as last counted in Redis.
    instances: AtomicU32,
    /// This process in the instance count.
    id: String,
}

impl GlobalLimits {
    pub fn new(settings: &LimitSettings, redis: RedisHandle) -> Self {
        let g = settings.global;
        let n = g.instances_assumed;
        Self {
            inner: Arc::new(Inner {
                redis,
                settings: g,
                gcra: Arc::new(Script::new(GCRA)),
                heartbeat: Script::new(HEARTBEAT),
                user_checks: OnceLock::new(),
                user: SharedScope::new(Scope::User, settings.per_user, 1, n),
                deal: SharedScope::new(
                    Scope::Deal,
                    settings.per_deal,
                    g.deal_slice.min(settings.per_deal.burst),
                    n,
                ),
                instances: AtomicU32::new(n),
                id: hex::encode(rand::random::<[u8; 8]>()),
            }),
        }
    }

    pub fn enabled(&self) -> bool {
        self.inner.settings.enabled
    }

    /// Live instances as last counted (the divisor of the fallback share).
    pub fn instances(&self) -> u32 {
        self.inner.instances.load(Ordering::Relaxed)
    }

    pub async fn check_user(&self, user_id: &str) -> Result<(), Limited> {
        self.check(&self.inner.user, "user:", user_id).await
    }

    pub async fn check_deal(&self, deal_id: &str) -> Result<(), Limited> {
        self.check(&self.inner.deal, "deal:", deal_id).await
    }

    async fn check(&self, scope: &SharedScope, kind: &str, id: &str) -> Result<(), Limited> {
        if !self.enabled() {
            return Ok(());
        }
        if scope.take_from_slice(id) {
            count(scope.scope, "slice");
            scope.spend_share(id, self.instances());
            return Ok(());
        }
        let key = self.inner.redis.key(&format!("limit:{kind}{id}"));
        let answer = if scope.together {
            self.take_with_others(key).await
        } else {
            self.take_alone(scope, key).await
        };
        match answer {
            Some((granted, _)) if granted > 0 => {
                count(scope.scope, "redis");
                let ttl = Duration::from_millis(self.inner.settings.slice_ttl_ms);
                scope.keep_slice(id, granted - 1, ttl);
                scope.spend_share(id, self.instances());
                Ok(())
            }
            Some((_, wait_us)) => {
                count(scope.scope, "redis");
                Err(scope.limited(Duration::from_micros(wait_us)))
            }
            None => {
                count(scope.scope, "fallback");
                scope.fallback(self.instances()).check(&id.to_owned())
            }
        }
    }

    /// Up to a slice of the budget at `key`, in a call of its own: `(granted, wait_us)`, or
    /// `None` when Redis did not answer.
    async fn take_alone(&self, scope: &SharedScope, key: String) -> Option<(u32, u64)> {
        let (redis, gcra) = (&self.inner.redis, &self.inner.gcra);
        let answers = take(redis, gcra, &[key], scope.rate, scope.slice).await;
        answers.ok()?.first().copied()
    }

    /// One request of the per-user budget at `key`, taken in the next call shared with the
    /// other checks waiting: `(granted, wait_us)`, or `None` when Redis did not answer or
    /// too many checks already wait (the local share decides then).
    async fn take_with_others(&self, key: String) -> Option<(u32, u64)> {
        let queue = self
            .inner
            .user_checks
            .get_or_init(|| self.start_user_checks());
        let (answer, answered) = oneshot::channel();
        queue.try_send(UserCheck { key, answer }).ok()?;
        answered.await.ok().flatten()
    }

    fn start_user_checks(&self) -> mpsc::Sender<UserCheck> {
        let g = self.inner.settings;
        let (queue, checks) = mpsc::channel(g.user_queue_max as usize);
        tokio::spawn(run_user_checks(
            checks,
            self.inner.redis.clone(),
            self.inner.gcra.clone(),
            self.inner.user.rate,
            g.user_batch_max as usize,
        ));
        queue
    }

    /// Announces this instance and refreshes the count, until `shutdown`.
    pub async fn keep_counted(self, shutdown: CancellationToken) {
        let interval = Duration::from_millis(self.inner.settings.heartbeat_interval_ms);
        loop {
            self.heartbeat().await;
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(interval) => {}
            }
        }
    }

    /// One announcement; a failure keeps the last count.
    pub async fn heartbeat(&self) {
        if !self.enabled() {
            return;
        }
        let keys = [self.inner.redis.key("instances")];
        let args = (&self.inner.id, self.inner.settings.instance_ttl_ms);
        let counted = self
            .inner
            .redis
            .eval::<u32, _, _>(&self.inner.heartbeat, &keys, &args);
        if let Ok(n) = counted.await {
            self.inner.instances.store(n.max(1), Ordering::Relaxed);
        }
    }

    /// Drops spent and expired slices; run periodically.
    pub fn forget_idle(&self) {
        let now = Instant::now();
        for scope in [&self.inner.user, &self.inner.deal] {
            scope.slices.retain(|_, s| s.left > 0 && s.expires > now);
            if let Ok(current) = scope.fallback.read() {
                current.1.forget_idle();
            }
        }
    }
}

/// A per-user check waiting for the next shared script call.
struct UserCheck {
    key: String,
    answer: oneshot::Sender<Option<(u32, u64)>>,
}

/// Answers the queued per-user checks: every round takes all that wait (at most
/// `batch_max`) and makes one call per script group, the groups side by side.
async fn run_user_checks(
    mut queue: mpsc::Receiver<UserCheck>,
    redis: RedisHandle,
    gcra: Arc<Script>,
    rate: RateSettings,
    batch_max: usize,
) {
    let mut checks = Vec::with_capacity(batch_max);
    while queue.recv_many(&mut checks, batch_max).await > 0 {
        let mut groups: HashMap<Option<Slot>, Vec<UserCheck>> = HashMap::new();
        for check in checks.drain(..) {
            let group = redis.script_group(&check.key);
            groups.entry(group).or_default().push(check);
        }
        let calls = groups
            .into_values()
            .map(|group| answer_group(&redis, &gcra, rate, group));
        join_all(calls).await;
    }
}

/// One call for `group` (keys of one script group); every check gets its own answer.
async fn answer_group(
    redis: &RedisHandle,
    gcra: &Script,
    rate: RateSettings,
    group: Vec<UserCheck>,
) {
    let keys: Vec<&str> = group.iter().map(|check| check.key.as_str()).collect();
    let answers = take(redis, gcra, &keys, rate, 1).await.ok();
    for (i, check) in group.into_iter().enumerate() {
        let answer = answers.as_ref().and_then(|answers| answers.get(i).copied());
        let _gone = check.answer.send(answer);
    }
}

/// Up to `want` requests of the budget at each of `keys` (one script group), in order:
/// `(granted, wait_us)` per key.
async fn take<K: redis::ToRedisArgs>(
    redis: &RedisHandle,
    gcra: &Script,
    keys: &[K],
    rate: RateSettings,
    want: u32,
) -> Result<Vec<(u32, u64)>, RedisError> {
    let interval_us = 1_000_000u64
        .div_ceil(u64::from(rate.rate_per_second))
        .max(1);
    let flat: Vec<i64> = redis
        .eval(gcra, keys, &(interval_us, rate.burst, want))
        .await?;
    if flat.len() != 2 * keys.len() {
        let unexpected = (redis::ErrorKind::Parse, "GCRA answered for other keys");
        return Err(RedisError::Command(unexpected.into()));
    }
    let answers = flat.chunks_exact(2).map(|pair| {
        let granted = u32::try_from(pair[0].clamp(0, i64::from(want))).unwrap_or(0);
        (granted, u64::try_from(pair[1].max(0)).unwrap_or(0))
    });
    Ok(answers.collect())
}

fn count(scope: Scope, source: &'static str) {
    metrics::counter!(
        telemetry::GLOBAL_LIMIT_CHECKS,
        "scope" => scope.as_str(),
        "source" => source
    )
    .increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn share_rounds_up_and_never_reaches_zero() {
        let rate = RateSettings {
            rate_per_second: 10,
            burst: 4,
        };
        let limiter = share(Scope::User, rate, 3);
        // ceil(4 / 3) = 2 at once, then limited.
        limiter.check(&"u".to_owned()).unwrap();
        limiter.check(&"u".to_owned()).unwrap();
        assert!(limiter.check(&"u".to_owned()).is_err());
        let lone = share(Scope::User, rate, 100);
        lone.check(&"u".to_owned()).unwrap();
    }

    #[test]
    fn slices_are_spent_then_expire() {
        let rate = RateSettings {
            rate_per_second: 10,
            burst: 10,
        };
        let scope = SharedScope::new(Scope::Deal, rate, 4, 1);
        assert!(!scope.take_from_slice("d"));
        scope.keep_slice("d", 2, Duration::from_secs(60));
        assert!(scope.take_from_slice("d"));
        assert!(scope.take_from_slice("d"));
        assert!(!scope.take_from_slice("d"));
        scope.keep_slice("d", 2, Duration::ZERO);
        assert!(!scope.take_from_slice("d"), "an expired slice is not spent");
    }
}
