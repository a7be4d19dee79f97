//! The sold-out flag: shared through Redis, mirrored in each instance's memory.
//!
//! A sold-out deal may draw a million more clicks. The mirror answers them from memory, with
//! no Redis or PostgreSQL round trip. PostgreSQL stays the truth: the flag is set only after
//! PostgreSQL showed zero units, cleared whenever units return, and every refresh drops
//! flags that PostgreSQL no longer backs. When Redis is down the refresh rebuilds the
//! mirror from PostgreSQL, so the gateway is slower but never wrong.
//!
//! Each flagged deal also carries the users who ever ordered it: their retries may be
//! idempotent replays of an order they already hold, so those (and only those) are let
//! through to PostgreSQL, where the stored order is found and replayed.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dashmap::DashMap;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::redis_link::RedisHandle;
use crate::store::StoreError;
use crate::telemetry;

const SET_KEY: &str = "soldout";

/// Users who have ordered a flagged deal, as read from PostgreSQL at `loaded_at`.
struct Holders {
    users: Arc<HashSet<String>>,
    loaded_at: Instant,
}

#[derive(Clone)]
pub struct SoldOut {
    mirror: Arc<DashMap<Box<str>, Holders>>,
    redis: RedisHandle,
    holders_max: usize,
    holders_ttl: Duration,
}

impl SoldOut {
    /// `holders_max` bounds the users remembered per deal (beyond it, replays after the
    /// sell-out are answered sold out); `holders_ttl` is how often they are re-read.
    pub fn new(redis: RedisHandle, holders_max: usize, holders_ttl: Duration) -> Self {
        Self {
            mirror: Arc::new(DashMap::new()),
            redis,
            holders_max,
            holders_ttl,
        }
    }

    /// Memory only: the hot-path check.
    pub fn is_sold_out(&self, deal_id: &str) -> bool {
        self.mirror.contains_key(deal_id)
    }

    /// Memory only: whether `user_id` ordered this sold-out deal before and so may be
    /// retrying an order it holds.
    pub fn may_replay(&self, deal_id: &str, user_id: &str) -> bool {
        self.mirror
            .get(deal_id)
            .is_some_and(|holders| holders.users.contains(user_id))
    }

    /// PostgreSQL just showed the deal has no units left.
    pub async fn mark(&self, pool: &PgPool, deal_id: &str) {
        if !self.mirror.contains_key(deal_id) {
            self.load_holders(pool, deal_id).await;
        }
        let cmd = redis::cmd("SADD")
            .arg(self.redis.key(SET_KEY))
            .arg(deal_id)
            .clone();
        if let Err(error) = self.redis.run::<i64>(&cmd).await {
            tracing::debug!(%error, deal_id, "sold-out flag not shared");
        }
    }

    /// Units came back: clear here at once, everywhere else at the next refresh.
    pub async fn clear(&self, deal_id: &str) {
        self.mirror.remove(deal_id);
        let cmd = redis::cmd("SREM")
            .arg(self.redis.key(SET_KEY))
            .arg(deal_id)
            .clone();
        if let Err(error) = self.redis.run::<i64>(&cmd).await {
            tracing::debug!(%error, deal_id, "sold-out flag not cleared in redis");
        }
    }

    /// Sets or clears the flag to match `available` units just read from PostgreSQL.
    pub async fn record(&self, pool: &PgPool, deal_id: &str, available: i64) {
        if available == 0 {
            self.mark(pool, deal_id).await;
        } else if self.is_sold_out(deal_id) {
            self.clear(deal_id).await;
        }
    }

    /// One refresh: copy the shared set, minus flags PostgreSQL contradicts.
    pub async fn refresh(&self, pool: &PgPool) -> Result<(), StoreError> {
        let cmd = redis::cmd("SMEMBERS").arg(self.redis.key(SET_KEY)).clone();
        let flagged: HashSet<String> = match self.redis.run::<Vec<String>>(&cmd).await {
            Ok(members) => {
                let stale = with_stock(pool, &members).await?;
                if !stale.is_empty() {
                    let srem = redis::cmd("SREM")
                        .arg(self.redis.key(SET_KEY))
                        .arg(&stale)
                        .clone();
                    let _ = self.redis.run::<i64>(&srem).await;
                }
                members.into_iter().filter(|m| !stale.contains(m)).collect()
            }
            Err(_) => sold_out_in_postgres(pool).await?,
        };
        self.mirror.retain(|deal, _| flagged.contains(&**deal));
        for deal in flagged {
            let fresh = self
                .mirror
                .get(deal.as_str())
                .is_some_and(|h| h.loaded_at.elapsed() < self.holders_ttl);
            if !fresh {
                self.load_holders(pool, &deal).await;
            }
        }
        metrics::gauge!(telemetry::SOLD_OUT_DEALS).set(self.mirror.len() as f64);
        Ok(())
    }

    /// (Re)reads who ordered `deal_id` and flags the deal in memory.
    async fn load_holders(&self, pool: &PgPool, deal_id: &str) {
        let users = match holders(pool, deal_id, self.holders_max).await {
            Ok(users) => users,
            Err(error) => {
                tracing::debug!(%error, deal_id, "holders of a sold-out deal not loaded");
                HashSet::new()
            }
        };
        let holders = Holders {
            users: Arc::new(users),
            loaded_at: Instant::now(),
        };
        self.mirror.insert(deal_id.into(), holders);
    }

    /// Refreshes every `interval` until `shutdown`.
    pub async fn keep_fresh(self, pool: PgPool, interval: Duration, shutdown: CancellationToken) {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = ticker.tick() => {}
            }
            if let Err(error) = self.refresh(&pool).await {
                tracing::warn!(%error, "sold-out refresh failed");
            }
        }
    }
}

/// Of `deal_ids`, those that PostgreSQL says still have units.
async fn with_stock(pool: &PgPool, deal_ids: &[String]) -> Result<Vec<String>, StoreError> {
    if deal_ids.is_empty() {
        return Ok(Vec::new());
    }
    Ok(sqlx::query_scalar(
        "SELECT deal_id FROM inventory_buckets WHERE deal_id = ANY($1)
          GROUP BY deal_id HAVING sum(available) > 0",
    )
    .bind(deal_ids)
    .fetch_all(pool)
    .await?)
}

/// Users who ever ordered `deal_id`; empty when there are more than `users_max`.
async fn holders(
    pool: &PgPool,
    deal_id: &str,
    users_max: usize,
) -> Result<HashSet<String>, StoreError> {
    let limit = i64::try_from(users_max).unwrap_or(i64::MAX - 1) + 1;
    let users: Vec<String> =
        sqlx::query_scalar("SELECT DISTINCT user_id FROM orders WHERE deal_id = $1 LIMIT $2")
            .bind(deal_id)
            .bind(limit)
            .fetch_all(pool)
            .await?;
    if users.len() > users_max {
        return Ok(HashSet::new());
    }
    Ok(users.into_iter().collect())
}

/// Every deal that is still on sale or upcoming and has no units left.
async fn sold_out_in_postgres(pool: &PgPool) -> Result<HashSet<String>, StoreError> {
    let ids: Vec<String> = sqlx::query_scalar(
        "SELECT b.deal_id FROM inventory_buckets b JOIN deals d ON d.id = b.deal_id
          WHERE d.ends_at IS NULL OR d.ends_at > now()
          GROUP BY b.deal_id HAVING sum(b.available) = 0",
    )
    .fetch_all(pool)
    .await?;
    Ok(ids.into_iter().collect())
}
