//! Shares of every user's budget that an instance spends from memory.
//!
//! A buyer sends a handful of requests in a sale, so asking Redis for each of them costs a
//! round trip for nothing. The per-user budget (burst B, rate r, so a window of T = B/r) is
//! cut into B units, each good for one request per T. Each instance holds some of the units
//! for every user at once: it asks for B/N of them (N the live instances) in its heartbeat,
//! and checks a user against its units in memory, without Redis. The units nobody holds
//! form the pool, kept per user in Redis; only a user past this instance's units costs a
//! script call, answered from the pool.
//!
//! Summed over the holders the budget holds exactly: a holder of k units lets a user through
//! at most k at once plus k/T a second, and every unit has one holder at a time (the
//! heartbeat script only grants units nobody holds). A unit changes holder only after nobody
//! used it for a window, so its new holder starts with it full:
//! - units an instance gives back stay out of the pool until a window after its last local
//!   grant; units of an instance not heard from for `instance_ttl_ms`, until a window after
//!   it stopped;
//! - units taken from the pool wait until every instance has seen the smaller pool twice
//!   (the second report covers what it granted with the larger one, a pool answer received
//!   after a newer view is asked again) and a window has passed since the pool's last grant.
//!
//! An instance shrinks its share in memory before it reports the smaller one, uses its units
//! only while its heartbeat is fresh (`instance_ttl_ms`), and drops them with its view of the
//! pool when Redis fails it; then the fallback share decides, as before.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dashmap::DashMap;

use super::RateSettings;
use super::slices::shared_now_us;
use crate::clock::Clock;
use crate::redis_link::{RedisError, RedisHandle, Script};

/// The share registry, one hash field per instance:
/// `held pending claimed_at idle_from quarantined quarantine_until expires reported_at
/// view_floor pool_used_at` (times in ms). ARGV: instance id, now (0: Redis's `TIME`), ttl,
/// window T, budget B, units wanted, ms since this instance's last local grant and since its
/// last pool grant (-1: never), 1 when it had no view of the pool. Answers `{held, pool}`.
const SHARES: &str = r#"
local now = tonumber(ARGV[2])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local id, ttl, T, B = ARGV[1], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local want, local_idle, pool_idle = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local names = {'h', 'p', 'c', 'i', 'q', 'qu', 'e', 'r', 'f', 'u'}
local function parse(v)
  local s, n = {}, 1
  for x in string.gmatch(v, '%S+') do s[names[n]] = tonumber(x); n = n + 1 end
  return s
end
local function dump(s)
  local out = {}
  for n, name in ipairs(names) do out[n] = string.format('%.0f', s[name]) end
  return table.concat(out, ' ')
end
local function busy(s)
  local n = 0
  if now < s.e + T then n = n + s.h + s.p end
  if now < s.qu then n = n + s.q end
  return n
end
local others, me = {}, nil
local all = redis.call('HGETALL', KEYS[1])
for k = 1, #all, 2 do
  local s = parse(all[k + 1])
  if all[k] == id then me = s
  elseif now >= s.e + T and now >= s.qu then redis.call('HDEL', KEYS[1], all[k])
  else others[#others + 1] = s end
end
me = me or parse('0 0 0 -1 0 0 0 0 0 0')
local function quarantine(units, until_ms)
  if units <= 0 or until_ms <= now then return end
  if now < me.qu then me.q = me.q + units else me.q = units end
  me.qu = math.max(me.qu, until_ms)
end
if me.e <= now then
  quarantine(me.h, me.e + T)
  me.h, me.p, me.c, me.i = 0, 0, 0, -1
end
local excess = me.h + me.p - want
if excess > 0 then
  local from_pending = math.min(me.p, excess)
  me.p = me.p - from_pending
  me.h = me.h - (excess - from_pending)
  if local_idle >= 0 then quarantine(excess - from_pending, now - local_idle + T) end
end
local taken = 0
for _, s in ipairs(others) do taken = taken + busy(s) end
local mine = me.h + me.p + ((now < me.qu) and me.q or 0)
local grant = math.min(want - me.h - me.p, B - taken - mine)
if grant > 0 then me.p, me.c, me.i = me.p + grant, now, -1 end
if ARGV[9] == '1' then me.f = now else me.f = me.r end
me.r, me.e = now, now + ttl
if pool_idle >= 0 then me.u = now - pool_idle end
if me.p > 0 and me.i < 0 then
  local settled, last = me.f >= me.c, me.u
  for _, s in ipairs(others) do
    if s.f >= me.c then last = math.max(last, s.u)
    elseif s.r + ttl <= now then last = math.max(last, s.r + ttl)
    else settled = false end
  end
  if settled then me.i = math.min(last, now) end
end
if me.p > 0 and me.i >= 0 and now >= me.i + T then
  me.h, me.p, me.c, me.i = me.h + me.p, 0, 0, -1
end
redis.call('HSET', KEYS[1], id, dump(me))
redis.call('PEXPIRE', KEYS[1], ttl + 2 * T)
mine = me.h + me.p + ((now < me.qu) and me.q or 0)
return {me.h, math.max(B - taken - mine, 0)}
"#;

/// The pool's part of each user's budget: a token bucket of `pool` units refilled at
/// `pool`/T, its state `tokens time_us` per key. ARGV: pool units, T (µs), now (µs; 0:
/// Redis's `TIME`). Answers `{granted, wait_us}` per key, flattened.
const POOL: &str = r#"
local now = tonumber(ARGV[3])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local k, T = tonumber(ARGV[1]), tonumber(ARGV[2])
local out = {}
for i, key in ipairs(KEYS) do
  local x = k
  local v = redis.call('GET', key)
  if v then
    local x0, t0 = string.match(v, '^(%S+) (%S+)$')
    x = math.min(k, tonumber(x0) + math.max(now - tonumber(t0), 0) * k / T)
  end
  if k > 0 and x >= 1 then
    x = x - 1
    local px = math.floor((k - x) * T / k / 1000) + 1
    redis.call('SET', key, string.format('%.6f %.0f', x, now), 'PX', px)
    out[2 * i - 1] = 1
    out[2 * i] = 0
  else
    out[2 * i - 1] = 0
    out[2 * i] = (k > 0) and math.ceil((1 - x) * T / k) or T
  end
end
return out
"#;

/// What this instance's units say about a user.
#[derive(Debug, PartialEq)]
pub enum Local {
    /// Let through from this instance's units.
    Granted,
    /// This instance's units for the user are spent; one is back in `wait`.
    Spent { wait: Duration },
    /// No units held (none granted, or the heartbeat is stale).
    Unheld,
}

/// This instance's view of the pool: its units, and which heartbeat told them.
#[derive(Clone, Copy, Debug)]
pub struct PoolView {
    pub units: u32,
    pub epoch: u64,
}

/// One user's tokens on this instance's units, at a time (µs since `origin`).
struct Bucket {
    tokens: f64,
    at_us: u64,
}

/// This instance's share of every user's budget.
pub struct UserShares {
    /// B: units of every user's budget.
    budget: u32,
    /// T: a unit is good for one request per window.
    window_us: u64,
    /// False: this instance holds no units and every check asks the pool.
    spend_locally: bool,
    /// Units and views are used for this long after the heartbeat that gave them was sent.
    lease: Duration,
    clock: Clock,
    origin: Instant,
    held: AtomicU32,
    /// Units the last heartbeat asked for.
    wanted: AtomicU32,
    /// µs since `origin` until which `held` may be spent (0: not at all).
    lease_until_us: AtomicU64,
    pool: AtomicU32,
    view_until_us: AtomicU64,
    /// Bumped whenever the view changes, so a pool answer given under an older one is asked
    /// again.
    epoch: AtomicU64,
    /// µs since `origin` of the last grant from the units and from the pool (0: never).
    last_local_us: AtomicU64,
    last_pool_us: AtomicU64,
    buckets: DashMap<String, Bucket>,
    /// One heartbeat at a time: each shrinks the share before it reports it.
    refreshing: tokio::sync::Mutex<()>,
    registry: Script,
    pool_script: Arc<Script>,
}

impl UserShares {
    pub fn new(rate: RateSettings, spend_locally: bool, lease: Duration, clock: Clock) -> Self {
        let window_us = u64::from(rate.burst) * 1_000_000 / u64::from(rate.rate_per_second.max(1));
        Self {
            budget: rate.burst,
            window_us: window_us.max(1),
            spend_locally,
            lease,
            origin: clock.instant(),
            clock,
            held: AtomicU32::new(0),
            wanted: AtomicU32::new(0),
            lease_until_us: AtomicU64::new(0),
            pool: AtomicU32::new(0),
            view_until_us: AtomicU64::new(0),
            epoch: AtomicU64::new(0),
            last_local_us: AtomicU64::new(0),
            last_pool_us: AtomicU64::new(0),
            buckets: DashMap::new(),
            refreshing: tokio::sync::Mutex::new(()),
            registry: Script::new(SHARES),
            pool_script: Arc::new(Script::new(POOL)),
        }
    }

    /// µs since `origin`, from 1, so that 0 can mean "never".
    fn now_us(&self) -> u64 {
        let since = self.clock.instant().saturating_duration_since(self.origin);
        u64::try_from(since.as_micros()).unwrap_or(u64::MAX - 1) + 1
    }

    /// Units held now (0 when the heartbeat that granted them is stale).
    pub fn held(&self) -> u32 {
        if self.now_us() < self.lease_until_us.load(Ordering::Acquire) {
            self.held.load(Ordering::Acquire)
        } else {
            0
        }
    }

    /// Spends one of the user's tokens on this instance's units, when one is left.
    pub fn take_local(&self, user: &str) -> Local {
        let k = self.held();
        if k == 0 {
            return Local::Unheld;
        }
        let now = self.now_us();
        let k = f64::from(k);
        let mut bucket = self.buckets.entry(user.to_owned()).or_insert(Bucket {
            tokens: k,
            at_us: now,
        });
        let tokens = self.refilled(&bucket, k, now);
        bucket.at_us = now;
        if tokens >= 1.0 {
            bucket.tokens = tokens - 1.0;
            self.last_local_us.store(now, Ordering::Relaxed);
            return Local::Granted;
        }
        bucket.tokens = tokens;
        let wait_us = (1.0 - tokens) * self.window_us as f64 / k;
        Local::Spent {
            wait: Duration::from_micros(wait_us.ceil() as u64),
        }
    }

    /// A bucket's tokens at `now` on `k` units: refilled at k/T, never above k (a share
    /// that shrank caps them; units gained arrive full, nobody having used them for T).
    fn refilled(&self, bucket: &Bucket, k: f64, now: u64) -> f64 {
        let elapsed = now.saturating_sub(bucket.at_us) as f64;
        (bucket.tokens + elapsed * k / self.window_us as f64).min(k)
    }

    /// The pool as the last fresh heartbeat saw it.
    pub fn view(&self) -> Option<PoolView> {
        let epoch = self.epoch.load(Ordering::Acquire);
        (self.now_us() < self.view_until_us.load(Ordering::Acquire)).then(|| PoolView {
            units: self.pool.load(Ordering::Acquire),
            epoch,
        })
    }

    /// True while `view` is still the current one.
    pub fn is_current(&self, view: PoolView) -> bool {
        self.view().is_some_and(|now| now.epoch == view.epoch)
    }

    /// Redis failed a pool call: units and view are dropped until a heartbeat succeeds,
    /// and the fallback share decides meanwhile.
    pub fn suspend(&self) {
        self.lease_until_us.store(0, Ordering::Release);
        self.view_until_us.store(0, Ordering::Release);
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }

    /// A pool answer let a request through.
    pub fn pool_granted(&self) {
        self.last_pool_us.store(self.now_us(), Ordering::Relaxed);
    }

    /// ms since the last grant recorded in `at` (-1: never).
    fn idle_ms(&self, at: &AtomicU64, now: u64) -> i64 {
        match at.load(Ordering::Relaxed) {
            0 => -1,
            at => i64::try_from(now.saturating_sub(at) / 1000).unwrap_or(i64::MAX),
        }
    }

    /// True when the last heartbeat left this instance holding the units it wants.
    pub fn settled(&self) -> bool {
        self.held() >= self.wanted.load(Ordering::Acquire)
    }

    /// Reports this instance to the registry at `key` with the share it wants for
    /// `instances` live instances, and takes the units and the pool it answers: true when
    /// Redis answered. The share shrinks here before the report; units granted are used
    /// from the answer on.
    pub async fn refresh(
        &self,
        redis: &RedisHandle,
        key: String,
        id: &str,
        instances: u32,
    ) -> bool {
        let _one_at_a_time = self.refreshing.lock().await;
        let want = if self.spend_locally {
            self.budget / instances.max(1)
        } else {
            0
        };
        self.wanted.store(want, Ordering::Release);
        self.held.fetch_min(want, Ordering::AcqRel);
        let sent = self.now_us();
        let had_view = sent < self.view_until_us.load(Ordering::Acquire);
        // Answers arriving from here on were given under the view about to be replaced.
        self.epoch.fetch_add(1, Ordering::AcqRel);
        let lease_ms = u64::try_from(self.lease.as_millis()).unwrap_or(u64::MAX);
        let args = (
            id,
            shared_now_us(&self.clock).map_or(0, |us| us / 1000),
            lease_ms,
            self.window_us.div_ceil(1000),
            self.budget,
            want,
            self.idle_ms(&self.last_local_us, sent),
            self.idle_ms(&self.last_pool_us, sent),
            u8::from(!had_view),
        );
        let keys = [key];
        let answer = redis.eval::<(u32, u32), _, _>(&self.registry, &keys, &args);
        let Ok((held, pool)) = answer.await else {
            return false;
        };
        let until = sent + u64::try_from(self.lease.as_micros()).unwrap_or(u64::MAX / 2);
        self.held.store(held.min(want), Ordering::Release);
        self.pool.store(pool, Ordering::Release);
        self.lease_until_us.store(until, Ordering::Release);
        self.view_until_us.store(until, Ordering::Release);
        self.epoch.fetch_add(1, Ordering::AcqRel);
        true
    }

    /// Drops the buckets that are full again (a user without one starts full).
    pub fn forget_idle(&self) {
        let k = f64::from(self.held());
        let now = self.now_us();
        self.buckets
            .retain(|_, bucket| self.refilled(bucket, k, now) < k);
        self.buckets.shrink_to_fit();
    }

    /// One request from the pool for each of `keys` (one script group) under `view`:
    /// `(granted, wait_us)` per key.
    pub async fn take_pool(
        &self,
        redis: &RedisHandle,
        keys: &[&str],
        view: PoolView,
    ) -> Result<Vec<(u32, u64)>, RedisError> {
        let args = (
            view.units,
            self.window_us,
            shared_now_us(&self.clock).unwrap_or(0),
        );
        let flat: Vec<i64> = redis.eval(&self.pool_script, keys, &args).await?;
        if flat.len() != 2 * keys.len() {
            let unexpected = (redis::ErrorKind::Parse, "the pool answered for other keys");
            return Err(RedisError::Command(unexpected.into()));
        }
        let answers = flat.chunks_exact(2).map(|pair| {
            let granted = u32::from(pair[0] > 0);
            (granted, u64::try_from(pair[1].max(0)).unwrap_or(0))
        });
        Ok(answers.collect())
    }
}
