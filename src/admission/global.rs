//! Per-user and per-deal limits shared by every instance.
//!
//! The local token buckets (`limits`) are per process, so N gateways would allow N times
//! the rate. Behind them this module keeps one budget per user and per deal in Redis: a
//! GCRA (generic cell rate algorithm) whose whole state is one timestamp per key, updated
//! by one script on Redis's clock, so instances with skewed clocks still agree.
//!
//! - Per user each instance first spends its share of the user's budget in memory
//!   (`user_share`: `user_share_percent` of it, divided among the live instances), so a
//!   buyer's few requests in a sale cost no Redis round trip. Beyond it a check takes from
//!   the rest of the budget in Redis, exact to the request. Checks waiting at once share
//!   one script call (group-commit style, no timer): while a call is in flight new checks
//!   queue, and the next call takes all of them, at most `user_batch_max`, their keys
//!   grouped so that one call touches one Redis Cluster slot.
//! - Per deal an instance takes a slice of requests per call and spends it locally for up
//!   to `slice_ttl_ms`; slices grow with local demand from one request up to `deal_slice`,
//!   and what a slice leaves unspent goes back to the budget (`slices`). Requests are only
//!   admitted from what Redis granted, so the instances together stay within the burst plus
//!   rate × elapsed, and unspent slices do not eat into it.
//! - Redis down (or slow past its command timeout): each instance falls back to a local
//!   bucket holding 1/N of the budget, N the live instances it last counted in Redis.
//!   Requests Redis granted drain that bucket too, so an outage starts from what the
//!   instance already used rather than from a fresh burst. Never no limit.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

use futures_util::future::join_all;
use redis::cluster_routing::Slot;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::limits::{Limited, Scope, SharedLimiter};
use super::slices::{Need, Slices, shared_now_us};
use super::user_share::{Answer, Budget, UserShares};
use super::{GlobalLimitSettings, LimitSettings, RateSettings};
use crate::clock::Clock;
use crate::redis_link::{RedisError, RedisHandle, Script};
use crate::telemetry;

/// GCRA over each key in turn. ARGV: emission interval (µs per request), burst, requests
/// wanted per key, requests given back per key (unspent, taken earlier), and the time in µs
/// (0: Redis's `TIME`). Gives back first (never past a full bucket), then grants each key up
/// to the wanted number that fit now and answers `{granted, wait_us}` per key, flattened:
/// the wait until one more would fit when nothing was granted. A key listed twice is
/// charged twice, in order. A key's expiry only collects it once its bucket is full again
/// (a missing key reads as a full bucket). Redis expires keys on its own clock, so on a
/// time given by the caller the key is kept a minute longer: the given time may run
/// slower than Redis's, and a key expired early would hand out a full bucket again.
const GCRA: &str = r#"
local now = tonumber(ARGV[5])
local keep_ms = 60000
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  keep_ms = 1
end
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local give = tonumber(ARGV[4])
local out = {}
for i, key in ipairs(KEYS) do
  local tat = tonumber(redis.call('GET', key) or '0') - give * interval
  if tat < now then tat = now end
  local free = math.floor((now + burst * interval - tat) / interval)
  if free < 1 then
    if give > 0 then
      redis.call('SET', key, string.format('%.0f', tat), 'PX', math.floor((tat - now) / 1000) + keep_ms)
    end
    out[2 * i - 1] = 0
    out[2 * i] = tat - burst * interval + interval - now
  else
    local granted = math.min(free, want)
    tat = tat + granted * interval
    redis.call('SET', key, string.format('%.0f', tat), 'PX', math.floor((tat - now) / 1000) + keep_ms)
    out[2 * i - 1] = granted
    out[2 * i] = 0
  end
end
return out
"#;

/// Counts the live instances and keeps the shares they published. KEYS: the live instances
/// (a sorted set of ids by last heartbeat, ms) and the published shares (a hash of id to
/// `ppm:since_ms:until_ms`: the part of every user's budget the share may spend, in
/// millionths, since when it is published unchanged, and until when it stands unless
/// republished). ARGV: this instance's id, the instance ttl (ms), its share (ppm, 0: none)
/// and how long it stands (ms). Answers `{live instances, the other shares standing (ppm),
/// 1 when every other live instance heartbeated since this share was published}`.
const HEARTBEAT: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local me, ttl = ARGV[1], tonumber(ARGV[2])
local ppm, hold = tonumber(ARGV[3]), tonumber(ARGV[4])
redis.call('ZADD', KEYS[1], now, me)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - ttl)
redis.call('PEXPIRE', KEYS[1], ttl)
local live = redis.call('ZCARD', KEYS[1])
local others, since, mine = 0, now, false
local shares = redis.call('HGETALL', KEYS[2])
for i = 1, #shares, 2 do
  local id, value = shares[i], shares[i + 1]
  local a = string.find(value, ':', 1, true)
  local b = string.find(value, ':', a + 1, true)
  local share = tonumber(string.sub(value, 1, a - 1))
  if id == me then
    mine = true
    if share == ppm then since = tonumber(string.sub(value, a + 1, b - 1)) end
  elseif tonumber(string.sub(value, b + 1)) <= now then
    redis.call('HDEL', KEYS[2], id)
  else
    others = others + share
  end
end
if ppm > 0 then
  redis.call('HSET', KEYS[2], me, ppm .. ':' .. since .. ':' .. (now + hold))
  if redis.call('PTTL', KEYS[2]) < hold then
    redis.call('PEXPIRE', KEYS[2], hold)
  end
elseif mine then
  redis.call('HDEL', KEYS[2], me)
end
local seen = 1
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', since, 'LIMIT', 0, 2)) do
  if id ~= me then seen = 0 end
end
return {live, others, seen}
"#;

/// The key of the published shares, in the slot of `instances` on a Redis Cluster: under
/// the same hash tag when the prefix has one, else tagged with the whole key.
fn shares_key(instances: &str) -> String {
    if instances.contains('{') {
        format!("{instances}:shares")
    } else {
        format!("{{{instances}}}:shares")
    }
}

/// One shared limit: its rate and its fallback share.
struct SharedScope {
    scope: Scope,
    rate: RateSettings,
    /// The local share used while Redis cannot answer, rebuilt when the count changes.
    fallback: RwLock<(u32, Arc<SharedLimiter>)>,
}

impl SharedScope {
    fn new(scope: Scope, rate: RateSettings, instances: u32) -> Self {
        Self {
            scope,
            rate,
            fallback: RwLock::new((instances, Arc::new(share(scope, rate, instances)))),
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
    /// This instance's share of every user's budget.
    user_shares: UserShares,
    /// This instance's slices of the per-deal budgets, and the clock of the limits.
    slices: Slices,
    /// Live instances, as last counted in Redis.
    instances: AtomicU32,
    /// This process in the instance count.
    id: String,
}

impl GlobalLimits {
    /// The slices and the shared budget run on `clock`'s time (a test advances it; the
    /// system's clock leaves the budget on Redis's); the fallback share while Redis is down
    /// keeps the process's clock.
    pub fn new(settings: &LimitSettings, redis: RedisHandle, clock: Clock) -> Self {
        let g = settings.global;
        let n = g.instances_assumed;
        let slice_max = g.deal_slice.min(settings.per_deal.burst);
        Self {
            inner: Arc::new(Inner {
                redis,
                settings: g,
                gcra: Arc::new(Script::new(GCRA)),
                heartbeat: Script::new(HEARTBEAT),
                user_checks: OnceLock::new(),
                user: SharedScope::new(Scope::User, settings.per_user, n),
                deal: SharedScope::new(Scope::Deal, settings.per_deal, n),
                user_shares: UserShares::new(
                    settings.per_user,
                    g.user_share_percent,
                    Duration::from_millis(g.heartbeat_interval_ms),
                    Duration::from_millis(g.instance_ttl_ms),
                    clock.clone(),
                ),
                slices: Slices::new(slice_max, Duration::from_millis(g.slice_ttl_ms), clock),
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

    /// Spends this instance's share of the user's budget, or asks Redis for one request of
    /// the rest. A request of the share also drains the fallback share, and is taken only
    /// while that has room, so an outage starts from what this instance already allowed.
    pub async fn check_user(&self, user_id: &str) -> Result<(), Limited> {
        if !self.enabled() {
            return Ok(());
        }
        let scope = &self.inner.user;
        if self.inner.user_shares.take(user_id)
            && scope
                .fallback(self.instances())
                .check(&user_id.to_owned())
                .is_ok()
        {
            count(scope.scope, "share");
            return Ok(());
        }
        let key = self.inner.redis.key(&format!("limit:user:{user_id}"));
        let answer = self.take_with_others(key).await;
        self.decide(scope, user_id, answer).map(drop)
    }

    /// Spends this instance's slice of the deal's budget, or asks Redis for a new one
    /// (returning what a lapsed slice left).
    pub async fn check_deal(&self, deal_id: &str) -> Result<(), Limited> {
        if !self.enabled() {
            return Ok(());
        }
        let scope = &self.inner.deal;
        let (want, give_back) = match self.inner.slices.take(deal_id) {
            Need::Nothing => {
                count(scope.scope, "slice");
                scope.spend_share(deal_id, self.instances());
                return Ok(());
            }
            Need::Call { want, give_back } => (want, give_back),
        };
        let answer = self.take_for_deal(deal_id, want, give_back).await;
        let granted = self.decide(scope, deal_id, answer)?;
        self.inner.slices.keep(deal_id, granted - 1);
        Ok(())
    }

    /// Redis's answer applied: the requests granted (at least one), a refusal, or the local
    /// share's verdict when Redis did not answer.
    fn decide(
        &self,
        scope: &SharedScope,
        id: &str,
        answer: Option<(u32, u64)>,
    ) -> Result<u32, Limited> {
        match answer {
            Some((granted, _)) if granted > 0 => {
                count(scope.scope, "redis");
                scope.spend_share(id, self.instances());
                Ok(granted)
            }
            Some((_, wait_us)) => {
                count(scope.scope, "redis");
                Err(scope.limited(Duration::from_micros(wait_us)))
            }
            None => {
                count(scope.scope, "fallback");
                scope.fallback(self.instances()).check(&id.to_owned())?;
                Ok(1)
            }
        }
    }

    /// Up to `want` requests of the deal's budget after giving `give_back` back, in a call
    /// of its own: `(granted, wait_us)`, or `None` when Redis did not answer.
    async fn take_for_deal(&self, deal_id: &str, want: u32, give_back: u32) -> Option<(u32, u64)> {
        let key = self.inner.redis.key(&format!("limit:deal:{deal_id}"));
        let call = Call {
            budget: Budget::whole(self.inner.deal.rate),
            want,
            give_back,
            now_us: shared_now_us(self.inner.slices.clock()),
        };
        let answers = take(&self.inner.redis, &self.inner.gcra, &[key], call).await;
        answers.ok()?.first().copied()
    }

    /// Returns what lapsed slices left unspent to their deals' budgets; run every
    /// `slice_ttl_ms`, so that a deal whose traffic moved to other instances gets it back.
    pub async fn return_lapsed(&self) {
        if !self.enabled() {
            return;
        }
        for (deal_id, left) in self.inner.slices.lapsed() {
            let _refused_or_returned = self.take_for_deal(&deal_id, 0, left).await;
        }
    }

    /// Runs `return_lapsed` every `slice_ttl_ms` until `shutdown`.
    pub async fn keep_returning_lapsed(self, shutdown: CancellationToken) {
        let interval = Duration::from_millis(self.inner.settings.slice_ttl_ms);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(interval) => {}
            }
            self.return_lapsed().await;
        }
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
            self.inner.clone(),
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
        let instances = self.inner.redis.key("instances");
        let published = shares_key(&instances);
        let keys = [instances, published];
        let shares = &self.inner.user_shares;
        let share = shares.to_publish();
        let hold_ms = u64::try_from(share.hold.as_micros().div_ceil(1000)).unwrap_or(u64::MAX);
        let args = (
            &self.inner.id,
            self.inner.settings.instance_ttl_ms,
            share.share_ppm,
            hold_ms,
        );
        let counted =
            self.inner
                .redis
                .eval::<(u32, u32, u32), _, _>(&self.inner.heartbeat, &keys, &args);
        if let Ok((n, others_ppm, seen)) = counted.await {
            let instances = n.max(1);
            self.inner.instances.store(instances, Ordering::Relaxed);
            shares.counted(Answer {
                instances,
                others_ppm,
                acknowledged: seen == 1,
            });
            let spending = f64::from(shares.spending());
            metrics::gauge!(telemetry::GLOBAL_LIMIT_USER_SHARE_SPLIT).set(spending);
        }
    }

    /// Drops spent and lapsed slices; run periodically.
    pub fn forget_idle(&self) {
        self.inner.slices.forget_idle();
        self.inner.user_shares.forget_idle();
        for scope in [&self.inner.user, &self.inner.deal] {
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
    limits: Arc<Inner>,
    batch_max: usize,
) {
    let mut checks = Vec::with_capacity(batch_max);
    while queue.recv_many(&mut checks, batch_max).await > 0 {
        let mut groups: HashMap<Option<Slot>, Vec<UserCheck>> = HashMap::new();
        for check in checks.drain(..) {
            let group = limits.redis.script_group(&check.key);
            groups.entry(group).or_default().push(check);
        }
        let calls = groups
            .into_values()
            .map(|group| answer_group(&limits, group));
        join_all(calls).await;
    }
}

/// One call for `group` (keys of one script group); every check gets its own answer.
async fn answer_group(limits: &Inner, group: Vec<UserCheck>) {
    let keys: Vec<&str> = group.iter().map(|check| check.key.as_str()).collect();
    let call = Call {
        budget: limits.user_shares.pool(),
        want: 1,
        give_back: 0,
        now_us: shared_now_us(limits.slices.clock()),
    };
    let answers = take(&limits.redis, &limits.gcra, &keys, call).await.ok();
    for (i, check) in group.into_iter().enumerate() {
        let answer = answers.as_ref().and_then(|answers| answers.get(i).copied());
        let _gone = check.answer.send(answer);
    }
}

/// One GCRA call's arguments besides its keys.
struct Call {
    budget: Budget,
    /// Requests wanted per key.
    want: u32,
    /// Unspent requests returned per key first.
    give_back: u32,
    /// The limits' clock, or `None` for Redis's.
    now_us: Option<u64>,
}

/// Up to `call.want` requests of the budget at each of `keys` (one script group), in
/// order: `(granted, wait_us)` per key.
async fn take<K: redis::ToRedisArgs>(
    redis: &RedisHandle,
    gcra: &Script,
    keys: &[K],
    call: Call,
) -> Result<Vec<(u32, u64)>, RedisError> {
    let Call {
        budget,
        want,
        give_back,
        now_us,
    } = call;
    let args = (
        budget.interval_us,
        budget.burst,
        want,
        give_back,
        now_us.unwrap_or(0),
    );
    let flat: Vec<i64> = redis.eval(gcra, keys, &args).await?;
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
        // A share refills one request a second (ceil(3 / 3)): the checks below are far
        // closer together than that, even on a loaded runner.
        let rate = RateSettings {
            rate_per_second: 3,
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
}
