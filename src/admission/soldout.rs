//! The sold-out flag: shared through Redis, mirrored in each instance's memory.
//!
//! A sold-out deal may draw a million more clicks. The mirror answers them from memory, with
//! no Redis or PostgreSQL round trip. PostgreSQL stays the truth: the flag is set only after
//! PostgreSQL showed zero units, cleared whenever units return, and every refresh drops
//! flags that PostgreSQL no longer backs. When Redis is down the refresh rebuilds the
//! mirror from PostgreSQL, so the gateway is slower but never wrong.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashSet;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::redis_link::RedisHandle;
use crate::store::StoreError;
use crate::telemetry;

const SET_KEY: &str = "soldout";

#[derive(Clone)]
pub struct SoldOut {
    mirror: Arc<DashSet<Box<str>>>,
    redis: RedisHandle,
}

impl SoldOut {
    pub fn new(redis: RedisHandle) -> Self {
        Self {
            mirror: Arc::new(DashSet::new()),
            redis,
        }
    }

    /// Memory only: the hot-path check.
    pub fn is_sold_out(&self, deal_id: &str) -> bool {
        self.mirror.contains(deal_id)
    }

    /// PostgreSQL just showed the deal has no units left.
    pub async fn mark(&self, deal_id: &str) {
        self.mirror.insert(deal_id.into());
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
    pub async fn record(&self, deal_id: &str, available: i64) {
        if available == 0 {
            self.mark(deal_id).await;
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
        self.mirror.retain(|deal| flagged.contains(&**deal));
        for deal in flagged {
            self.mirror.insert(deal.into_boxed_str());
        }
        metrics::gauge!(telemetry::SOLD_OUT_DEALS).set(self.mirror.len() as f64);
        Ok(())
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
