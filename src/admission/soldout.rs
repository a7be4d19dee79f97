//! The sold-out flag: shared through Redis, mirrored in each instance's memory.
//!
//! A sold-out deal may draw a million more clicks. The mirror answers them from memory, with
//! no Redis or PostgreSQL round trip. PostgreSQL stays the truth: the flag is set only after
//! PostgreSQL showed zero units, cleared whenever units return, and every refresh drops
//! flags that PostgreSQL no longer backs (stock came back, or the sale ended). When Redis is
//! down the refresh rebuilds the mirror from PostgreSQL, so the gateway is slower but never
//! wrong; when Redis returns, the flags PostgreSQL backs are shared again.
//!
//! Each flagged deal also carries the users who ever ordered it: their retries may be
//! idempotent replays of an order they hold, so those (and only those) are let through to
//! PostgreSQL, where the stored order is found and replayed.
//!
//! A refresh reads Redis and PostgreSQL, then replaces the mirror's flags with what it
//! read. A mark or a clear made here while it was reading is newer than that read, so the
//! refresh keeps it (`changes`, `cleared`): without that, a refresh that began just before
//! a sell-out erased the fresh flag, and the flood reached PostgreSQL again until the next.
//!
//! Each instance refreshes on its own schedule, and also at once when another one announces
//! that it set or cleared a flag (a Redis channel; [`RedisHandle::follow`]). Without that, a
//! unit given back and sold again through one instance left the others a refresh behind:
//! the buyer's retry of the order, sent to one of them, met the old list of holders and
//! was answered sold out.
//!
//! The request path reads a copy of the mirror, made after every change and swapped in
//! whole (`Published`): reading the shared map takes a lock whose word every core writes,
//! and under a flood of refusals that cache line would travel between the cores on every
//! request. Loading the latest copy writes only to the reading thread's own slot.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use dashmap::mapref::entry::Entry;
use dashmap::{DashMap, DashSet};
use sqlx::PgPool;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::clock::{Clock, elapsed_since, monotonic};
use crate::inventory;
use crate::redis_link::RedisHandle;
use crate::shutdown::Every;
use crate::store::StoreError;
use crate::telemetry;

/// The channel (under the key prefix) on which an instance announces a flag it set or
/// cleared in Redis.
const CHANGES: &str = "soldout:changes";

/// Users who ordered a flagged deal. `None` until first read: meanwhile every
/// authenticated user may be replaying, and PostgreSQL decides.
#[derive(Default)]
struct Holders {
    users: Option<Arc<HashSet<String>>>,
    loaded_at: Option<Instant>,
    /// The deal's freed units (see `inventory::Totals`), read with `users` while nothing
    /// was available. While PostgreSQL shows the same count, nobody can have ordered since;
    /// once it moved, stock went round (given back, sold again, perhaps through another
    /// instance whose answer was lost) and the users are read again at the next refresh.
    /// `None` when units were left at that read: buyers may follow unseen, so read again.
    freed: Option<i64>,
    /// The change number of the mark that flagged it here (0: flagged by a refresh).
    marked: u64,
}

/// The flags a refresh read: each flagged deal with its freed units, and the number of the
/// last mark or clear made here before the read began.
pub struct FlagsRead {
    flagged: HashMap<String, i64>,
    after_change: u64,
}

/// What the mirror says about orders for a deal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flag {
    /// Not flagged: PostgreSQL decides.
    Clear,
    /// Sold out, and nobody is known to have ordered it: every order is refused.
    SoldOut,
    /// Sold out, but some users (or, until they are read, anyone) ordered it and may be
    /// retrying: see `may_replay`.
    SoldOutWithHolders,
}

/// A copy of the mirror: the flagged deals and who ordered each (`None`: not read yet).
type Snapshot = HashMap<Box<str>, Option<Arc<HashSet<String>>>>;

/// The latest copy of the mirror, swapped in whole; readers never wait for a writer.
#[derive(Default)]
struct Published {
    latest: ArcSwap<Snapshot>,
    /// Copies are made one at a time, each after the change it follows, so the last one
    /// stored holds every change.
    publishing: Mutex<()>,
}

impl Published {
    /// Copies `mirror` and makes the copy the latest.
    fn publish(&self, mirror: &DashMap<Box<str>, Holders>) {
        let _turn = self
            .publishing
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let copy = mirror
            .iter()
            .map(|entry| (entry.key().clone(), entry.users.clone()))
            .collect();
        self.latest.store(Arc::new(copy));
    }

    /// `read` applied to the latest copy; `read` must not read the mirror again.
    fn read<R>(&self, read: impl FnOnce(&Snapshot) -> R) -> R {
        read(&self.latest.load())
    }
}

#[derive(Clone)]
pub struct SoldOut {
    mirror: Arc<DashMap<Box<str>, Holders>>,
    /// Deals whose stock is being checked off the request path, one check per deal at a time.
    checking: Arc<DashSet<Box<str>>>,
    /// The mirror as the request path reads it.
    published: Arc<Published>,
    /// Whether the last refresh could read Redis; a false-to-true change re-shares flags.
    redis_healthy: Arc<AtomicBool>,
    /// Counts the marks and clears made here, so a refresh knows which came after its read.
    changes: Arc<AtomicU64>,
    /// Deals cleared here, each with its clear's change number, until a refresh that read
    /// after it: an older read must not flag them again.
    cleared: Arc<DashMap<Box<str>, u64>>,
    /// Woken when another instance announces a change, or this one's listener reconnects.
    heard: Arc<Notify>,
    redis: RedisHandle,
    holders_max: usize,
    holders_ttl: Duration,
    /// What the holders' age is measured on.
    clock: Clock,
}

impl SoldOut {
    /// `holders_max` bounds the users remembered per deal (beyond it, replays after the
    /// sell-out are answered sold out); `holders_ttl` is how often they are re-read, on
    /// `clock`.
    pub fn new(
        redis: RedisHandle,
        holders_max: usize,
        holders_ttl: Duration,
        clock: Clock,
    ) -> Self {
        Self {
            mirror: Arc::new(DashMap::new()),
            checking: Arc::new(DashSet::new()),
            published: Arc::default(),
            redis_healthy: Arc::new(AtomicBool::new(false)),
            changes: Arc::new(AtomicU64::new(0)),
            cleared: Arc::new(DashMap::new()),
            heard: Arc::new(Notify::new()),
            redis,
            holders_max,
            holders_ttl,
            clock,
        }
    }

    /// Memory only: the hot-path check.
    pub fn is_sold_out(&self, deal_id: &str) -> bool {
        self.flag(deal_id) != Flag::Clear
    }

    /// Memory only: whether the deal is flagged, and whether anyone may be replaying.
    pub fn flag(&self, deal_id: &str) -> Flag {
        self.published.read(|mirror| match mirror.get(deal_id) {
            None => Flag::Clear,
            Some(Some(users)) if users.is_empty() => Flag::SoldOut,
            Some(_) => Flag::SoldOutWithHolders,
        })
    }

    /// Memory only: whether `user_id` may be retrying an order it holds in this sold-out deal.
    pub fn may_replay(&self, deal_id: &str, user_id: &str) -> bool {
        self.published.read(|mirror| {
            mirror
                .get(deal_id)
                .is_some_and(|users| users.as_ref().is_none_or(|u| u.contains(user_id)))
        })
    }

    fn publish(&self) {
        self.published.publish(&self.mirror);
    }

    /// PostgreSQL just showed the deal has no units left. Only the first caller shares the
    /// flag and reads the holders; concurrent callers return at once.
    pub async fn mark(&self, pool: &PgPool, deal_id: &str) {
        match self.mirror.entry(deal_id.into()) {
            Entry::Occupied(_) => return,
            Entry::Vacant(vacant) => {
                vacant.insert(Holders {
                    marked: self.next_change(),
                    ..Holders::default()
                });
                self.cleared.remove(deal_id);
            }
        }
        self.publish();
        self.change_shared_set("SADD", deal_id).await;
        // Numbered again once shared: a refresh that read Redis before the SADD landed
        // began before this number too, and keeps the flag.
        if let Some(mut holders) = self.mirror.get_mut(deal_id) {
            holders.marked = self.next_change();
        }
        self.load_holders(pool, deal_id).await;
    }

    /// Units came back: clear here at once, everywhere else at the next refresh.
    pub async fn clear(&self, deal_id: &str) {
        self.cleared.insert(deal_id.into(), self.next_change());
        self.mirror.remove(deal_id);
        self.publish();
        self.change_shared_set("SREM", deal_id).await;
        // Numbered again once removed from Redis, as a mark is once shared.
        if !self.mirror.contains_key(deal_id) {
            self.cleared.insert(deal_id.into(), self.next_change());
        }
    }

    /// Adds (`SADD`) or removes (`SREM`) `deal_id` in the shared set and, when that changed
    /// the set, announces it to the other instances.
    async fn change_shared_set(&self, command: &str, deal_id: &str) {
        let change = redis::cmd(command)
            .arg(self.redis.sold_out_key())
            .arg(deal_id)
            .clone();
        match self.redis.run::<i64>(&change).await {
            Ok(0) => {}
            Ok(_) => self.redis.announce(CHANGES, deal_id).await,
            Err(error) => {
                tracing::debug!(%error, deal_id, command, "sold-out set not changed in redis")
            }
        }
    }

    /// The number of a mark or clear made now, above every number given before.
    fn next_change(&self) -> u64 {
        self.changes.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Sets or clears the flag to match `available` units just read from PostgreSQL.
    pub async fn record(&self, pool: &PgPool, deal_id: &str, available: i64) {
        if available == 0 {
            self.mark(pool, deal_id).await;
        } else if self.is_sold_out(deal_id) {
            self.clear(deal_id).await;
        }
    }

    /// A bucket of `deal_id` just emptied: check, off the request path and at most once at a
    /// time per deal, whether the whole deal did.
    pub fn check_soon(&self, pool: &PgPool, deal_id: &str) {
        if !self.checking.insert(deal_id.into()) {
            return;
        }
        let (this, pool, deal_id) = (self.clone(), pool.clone(), deal_id.to_owned());
        tokio::spawn(async move {
            match inventory::available(&pool, &deal_id).await {
                Ok(available) => this.record(&pool, &deal_id, available).await,
                Err(error) => tracing::debug!(%error, "sold-out check skipped"),
            }
            this.checking.remove(deal_id.as_str());
        });
    }

    /// One refresh: the shared set minus flags PostgreSQL contradicts, or, without Redis,
    /// the set PostgreSQL implies.
    pub async fn refresh(&self, pool: &PgPool) -> Result<(), StoreError> {
        let read = self.read_flags(pool).await?;
        self.apply(pool, read).await;
        Ok(())
    }

    /// The first half of a refresh: the flags as Redis and PostgreSQL show them now.
    pub async fn read_flags(&self, pool: &PgPool) -> Result<FlagsRead, StoreError> {
        let after_change = self.changes.load(Ordering::SeqCst);
        let smembers = redis::cmd("SMEMBERS")
            .arg(self.redis.sold_out_key())
            .clone();
        let flagged: HashMap<String, i64> = match self.redis.run::<Vec<String>>(&smembers).await {
            Ok(members) => {
                if !self.redis_healthy.swap(true, Ordering::Relaxed) {
                    self.share_all(pool).await?;
                }
                self.drop_stale(pool, members).await?
            }
            Err(_) => {
                self.redis_healthy.store(false, Ordering::Relaxed);
                sold_out_in_postgres(pool).await?
            }
        };
        Ok(FlagsRead {
            flagged,
            after_change,
        })
    }

    /// The second half: the mirror made to match `read`, except for the marks and clears
    /// made here since it was read, which are newer.
    pub async fn apply(&self, pool: &PgPool, read: FlagsRead) {
        let FlagsRead {
            flagged,
            after_change,
        } = read;
        self.mirror
            .retain(|deal, holders| flagged.contains_key(&**deal) || holders.marked > after_change);
        for deal in flagged.keys() {
            let cleared_since = self
                .cleared
                .get(deal.as_str())
                .is_some_and(|change| *change > after_change);
            if !cleared_since {
                self.mirror.entry(deal.as_str().into()).or_default();
            }
        }
        self.cleared.retain(|_, change| *change > after_change);
        self.publish();
        metrics::gauge!(telemetry::SOLD_OUT_DEALS).set(self.mirror.len() as f64);
        self.reload_holders(pool, &flagged).await;
    }

    /// Removes from Redis the flags PostgreSQL no longer backs; returns the rest, each
    /// with its freed units.
    async fn drop_stale(
        &self,
        pool: &PgPool,
        members: Vec<String>,
    ) -> Result<HashMap<String, i64>, StoreError> {
        if members.is_empty() {
            return Ok(HashMap::new());
        }
        let backed = sold_out_among(pool, Some(&members)).await?;
        let stale: Vec<&String> = members
            .iter()
            .filter(|m| !backed.contains_key(*m))
            .collect();
        if !stale.is_empty() {
            let srem = redis::cmd("SREM")
                .arg(self.redis.sold_out_key())
                .arg(&stale)
                .clone();
            let _ = self.redis.run::<i64>(&srem).await;
        }
        Ok(backed)
    }

    /// Redis came (back) up: share every flag PostgreSQL backs, since marks made while it
    /// was away never reached it.
    async fn share_all(&self, pool: &PgPool) -> Result<(), StoreError> {
        let sold_out = sold_out_in_postgres(pool).await?;
        if !sold_out.is_empty() {
            let sadd = redis::cmd("SADD")
                .arg(self.redis.sold_out_key())
                .arg(Vec::from_iter(sold_out.into_keys()))
                .clone();
            let _ = self.redis.run::<i64>(&sadd).await;
        }
        Ok(())
    }

    /// Reads again the holders of flagged deals read long ago, or whose stock went round
    /// since (`freed_now`: each flagged deal's freed units, just read).
    async fn reload_holders(&self, pool: &PgPool, freed_now: &HashMap<String, i64>) {
        let due: Vec<String> = self
            .mirror
            .iter()
            .filter(|entry| {
                entry.loaded_at.is_none_or(|at| {
                    self.clock.instant().saturating_duration_since(at) >= self.holders_ttl
                }) || entry.freed != freed_now.get(&**entry.key()).copied()
            })
            .map(|entry| entry.key().to_string())
            .collect();
        for deal_id in due {
            self.load_holders(pool, &deal_id).await;
        }
    }

    /// (Re)reads who ordered `deal_id`, if it is still flagged. A read that fails changes
    /// nothing: the users known before (or, if none were read yet, anyone) may still replay,
    /// and the next refresh reads again. Taking the failure for "nobody" would refuse as
    /// sold out the retry of an order placed just before PostgreSQL went away.
    async fn load_holders(&self, pool: &PgPool, deal_id: &str) {
        let read = match inventory::holders(pool, deal_id, self.holders_max).await {
            Ok(read) => read,
            Err(error) => {
                tracing::debug!(%error, deal_id, "holders of a sold-out deal not read");
                return;
            }
        };
        // Beyond the cap nobody is remembered, and every retry is answered sold out.
        let users = if read.users.len() > self.holders_max {
            HashSet::new()
        } else {
            read.users.into_iter().collect()
        };
        if let Some(mut holders) = self.mirror.get_mut(deal_id) {
            holders.users = Some(Arc::new(users));
            holders.loaded_at = Some(self.clock.instant());
            holders.freed = (read.available == 0).then_some(read.freed);
        }
        self.publish();
    }

    /// Refreshes every `pace.interval` until `shutdown`, and as soon as another instance
    /// announces a change, but then at most once every `pace.heard_gap`.
    pub async fn keep_fresh(self, pool: PgPool, pace: RefreshPace, shutdown: CancellationToken) {
        let listening = self.redis.clone().follow(
            CHANGES,
            self.heard.clone(),
            pace.reconnect,
            shutdown.clone(),
        );
        tokio::join!(listening, self.refresh_until(&pool, pace, &shutdown));
    }

    /// Refreshes on every tick of `pace.interval` and after every change heard, keeping
    /// `pace.heard_gap` between a refresh and the next one a change asks for.
    async fn refresh_until(&self, pool: &PgPool, pace: RefreshPace, shutdown: &CancellationToken) {
        let mut every = Every::new(pace.interval, shutdown.clone());
        let mut last: Option<Instant> = None;
        loop {
            tokio::select! {
                alive = every.tick() => if !alive { return },
                () = self.heard.notified() => {
                    let since = last.map_or(pace.heard_gap, elapsed_since);
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        () = tokio::time::sleep(pace.heard_gap.saturating_sub(since)) => {}
                    }
                }
            }
            last = Some(monotonic());
            if let Err(error) = self.refresh(pool).await {
                tracing::warn!(%error, "sold-out refresh failed");
            }
        }
    }
}

/// When the mirror refreshes (see [`SoldOut::keep_fresh`]).
#[derive(Clone, Copy, Debug)]
pub struct RefreshPace {
    /// Between two refreshes at the latest.
    pub interval: Duration,
    /// Between two refreshes at the least, when they follow announced changes.
    pub heard_gap: Duration,
    /// Between two attempts to listen for announced changes.
    pub reconnect: Duration,
}

/// Of `deals` (every deal when `None`), those still on sale (or upcoming) with no units
/// left, each with its freed units. Unknown deals, deals whose sale ended and deals with
/// units available again are absent.
async fn sold_out_among(
    pool: &PgPool,
    deals: Option<&[String]>,
) -> Result<HashMap<String, i64>, StoreError> {
    let on_sale: Vec<String> = sqlx::query_scalar(
        "SELECT id FROM deals
          WHERE (ends_at IS NULL OR ends_at > now()) AND ($1::text[] IS NULL OR id = ANY($1))",
    )
    .bind(deals)
    .fetch_all(pool)
    .await?;
    let totals = inventory::totals(pool, &on_sale).await?;
    Ok(totals
        .into_iter()
        .filter(|(_, t)| t.available == 0)
        .map(|(deal, t)| (deal, t.freed))
        .collect())
}

/// Every deal still on sale (or upcoming) with no units left.
async fn sold_out_in_postgres(pool: &PgPool) -> Result<HashMap<String, i64>, StoreError> {
    sold_out_among(pool, None).await
}
