//! What a line did: how many joined, how long they waited, how many gave up, how many passes
//! ran out unused, and how many of the buyers who got a turn ordered and paid.
//!
//! The line's own counts live in its Redis `meta` hash, written by the same scripts that
//! move the line, so every instance adds to one set of figures and a restarted gateway
//! reads them back: `joined` (buyers taking their first place), `expired_unused`, and the
//! wait histogram (`wait_count`, `wait_sum_ms`, `wait_max_ms` and one `w<i>` field per
//! bucket), beside the `seq`, `admitted_total`, `abandoned_total`, `revoked_total` and
//! `drained_total` the scripts already keep. They last as long as the line's keys
//! (`waiting_room.keys_ttl_seconds` after the last join). What the admitted buyers did
//! next is PostgreSQL's: each order placed with a pass is recorded in
//! `waiting_room_orders` (this module is its only writer), joined with the order's status.

use std::time::Duration;

use serde::Serialize;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use super::{Keys, QueueError, WaitingRoom};
use crate::domain::OrderStatus;
use crate::shutdown::Every;
use crate::store::StoreError;
use crate::telemetry;

/// Lua helpers for the line scripts (`scripts`), after the shared prelude: they keep the
/// report's counts in `meta` (KEYS[1]) as the line moves.
pub(super) const PRELUDE: &str = r#"
-- A new place in line: notes when (for its wait; the hash expires with the line's keys,
-- `ttl` ms, from its first entry on) and counts a buyer's first place.
local function record_join(t, now, known, ttl)
  redis.call('HSET', KEYS[13], t, now)
  if redis.call('PTTL', KEYS[13]) < 0 then redis.call('PEXPIRE', KEYS[13], ttl) end
  if not known then redis.call('HINCRBY', KEYS[1], 'joined', 1) end
end
-- The wait histogram's bucket of `ms`: bucket i holds the waits above 1.1^(i-1) ms and up
-- to 1.1^i ms (bucket 0: up to 1 ms), so a quantile read from it is within 10%.
local function wait_bucket(ms)
  if ms <= 1 then return 0 end
  return math.ceil(math.log(ms) / math.log(1.1) - 1e-9)
end
-- Counts the wait of a ticket admitted at `now`; -1 when its join time is unknown.
local function record_wait(t, now)
  local joined = tonumber(redis.call('HGET', KEYS[13], t) or '')
  if not joined then return -1 end
  redis.call('HDEL', KEYS[13], t)
  local ms = math.max(now - joined, 0)
  redis.call('HINCRBY', KEYS[1], 'w' .. wait_bucket(ms), 1)
  redis.call('HINCRBY', KEYS[1], 'wait_count', 1)
  redis.call('HINCRBY', KEYS[1], 'wait_sum_ms', ms)
  if ms > tonumber(redis.call('HGET', KEYS[1], 'wait_max_ms') or '0') then
    redis.call('HSET', KEYS[1], 'wait_max_ms', ms)
  end
  return ms
end
-- Drops the passes that expired by `now` from `active`; those that neither ordered nor had
-- their session ended (no mark in `t_skip`) count as expired unused.
local function expire_passes(now)
  local gone = redis.call('ZRANGEBYSCORE', KEYS[10], '-inf', now)
  if #gone == 0 then return end
  local unused = 0
  for _, t in ipairs(gone) do
    if redis.call('HEXISTS', KEYS[8], t) == 0 then unused = unused + 1 end
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[10], '-inf', now)
  if unused > 0 then redis.call('HINCRBY', KEYS[1], 'expired_unused', unused) end
end
-- Appends to `step` the buyers joined and passes expired unused since the last step that
-- returned them, and marks them returned: each is counted on /metrics exactly once, by
-- whichever instance advanced the line.
local function unpublished(step)
  local m = redis.call('HMGET', KEYS[1], 'joined', 'joined_pub', 'expired_unused', 'expired_pub')
  local j, jp = tonumber(m[1] or '0'), tonumber(m[2] or '0')
  local e, ep = tonumber(m[3] or '0'), tonumber(m[4] or '0')
  if j > jp or e > ep then redis.call('HSET', KEYS[1], 'joined_pub', j, 'expired_pub', e) end
  step[#step + 1] = j - jp
  step[#step + 1] = e - ep
  return step
end
"#;

/// No ARGV. Drops the passes that expired by now (counting the unused ones), then returns
/// {tickets waiting, passes active, then `meta` as field, value pairs}.
pub(super) const READ: &str = r#"
expire_passes(now_ms())
local out = {tostring(redis.call('ZCARD', KEYS[9])), tostring(redis.call('ZCARD', KEYS[10]))}
for _, v in ipairs(redis.call('HGETALL', KEYS[1])) do out[#out + 1] = v end
return out
"#;

/// Growth of the wait histogram's buckets (the Lua `wait_bucket`): each bucket's upper
/// bound is this times the previous one's, in milliseconds.
const WAIT_BUCKET_GROWTH: f64 = 1.1;

/// The waits from join to admission, as the line's scripts bucketed them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Waits {
    /// (bucket, tickets), by bucket.
    buckets: Vec<(u32, u64)>,
    count: u64,
    sum_ms: u64,
    max_ms: u64,
}

impl Waits {
    /// The wait (seconds) `q` of the tickets admitted waited at most: the upper bound of the
    /// bucket holding that rank (within 10% above the exact figure), never above the
    /// longest wait; `None` before anyone was admitted.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        let mut seen = 0;
        let bucket = self.buckets.iter().find_map(|&(bucket, n)| {
            seen += n;
            (seen >= rank).then_some(bucket)
        })?;
        let upper_ms = WAIT_BUCKET_GROWTH.powi(i32::try_from(bucket).unwrap_or(i32::MAX));
        Some(upper_ms.min(self.max_ms as f64) / 1000.0)
    }
}

/// The wait figures of the report, in seconds.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct WaitSeconds {
    /// Tickets admitted whose wait was measured.
    pub count: u64,
    pub mean: Option<f64>,
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub p99: Option<f64>,
    pub max: Option<f64>,
}

impl From<&Waits> for WaitSeconds {
    fn from(waits: &Waits) -> Self {
        let measured = waits.count > 0;
        Self {
            count: waits.count,
            mean: measured.then(|| waits.sum_ms as f64 / waits.count as f64 / 1000.0),
            p50: waits.quantile(0.5),
            p90: waits.quantile(0.9),
            p99: waits.quantile(0.99),
            max: measured.then(|| waits.max_ms as f64 / 1000.0),
        }
    }
}

/// The line's counts, from Redis: the report's first fields.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LineCounts {
    /// Buyers who took a place in line (a buyer whose pass ran out unused and who queued
    /// again counts once).
    pub joined: u64,
    /// Places taken, requeues included.
    pub tickets_issued: u64,
    pub admitted: u64,
    /// Of `admitted`, the priority group's (`waiting_room.priority`); absent until the
    /// group's first admission.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admitted_priority: Option<u64>,
    /// Tickets skipped at the front because their holder had stopped polling.
    pub abandoned: u64,
    pub passes_expired_unused: u64,
    /// Sessions ended by an operator's revocation or by a paid or cancelled order.
    pub sessions_ended: u64,
    /// Tickets still waiting when an operator drained the line.
    pub drained: u64,
    pub waiting: u64,
    pub passes_active: u64,
    /// The wait histogram, reported as `wait_seconds`.
    #[serde(skip)]
    pub waits: Waits,
}

impl LineCounts {
    /// Reads the flat answer of `READ`.
    fn parse(reply: &[String]) -> Result<Self, QueueError> {
        let number = |text: &str| text.parse::<u64>().unwrap_or(0);
        let [waiting, active, meta @ ..] = reply else {
            return Err(QueueError::Unexpected(format!("report {reply:?}")));
        };
        let mut counts = LineCounts {
            waiting: number(waiting),
            passes_active: number(active),
            ..Self::default()
        };
        for pair in meta.chunks_exact(2) {
            let value = number(&pair[1]);
            match pair[0].as_str() {
                "joined" => counts.joined = value,
                "seq" => counts.tickets_issued = value,
                "admitted_total" => counts.admitted = value,
                "admitted_priority_total" => counts.admitted_priority = Some(value),
                "abandoned_total" => counts.abandoned = value,
                "expired_unused" => counts.passes_expired_unused = value,
                "revoked_total" => counts.sessions_ended = value,
                "drained_total" => counts.drained = value,
                "wait_count" => counts.waits.count = value,
                "wait_sum_ms" => counts.waits.sum_ms = value,
                "wait_max_ms" => counts.waits.max_ms = value,
                field => {
                    if let Some(bucket) = field.strip_prefix('w').and_then(|b| b.parse().ok()) {
                        counts.waits.buckets.push((bucket, value));
                    }
                }
            }
        }
        counts.waits.buckets.sort_unstable();
        Ok(counts)
    }
}

/// What the admitted buyers did, from PostgreSQL.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OrderCounts {
    /// Buyers who placed at least one order with a pass.
    pub buyers: u64,
    /// Orders placed with a pass.
    pub orders: u64,
    /// Of those, orders paid (status `PAID` now).
    pub paid: u64,
}

/// `GET /admin/deals/{id}/report` and `flashgate deals report`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Report {
    pub deal_id: String,
    #[serde(flatten)]
    pub line: LineCounts,
    pub admitted_who_ordered: u64,
    pub orders_with_pass: u64,
    pub orders_paid: u64,
    pub wait_seconds: WaitSeconds,
}

impl Report {
    pub fn of(deal_id: &str, line: LineCounts, orders: OrderCounts) -> Self {
        Self {
            deal_id: deal_id.to_owned(),
            wait_seconds: WaitSeconds::from(&line.waits),
            line,
            admitted_who_ordered: orders.buyers,
            orders_with_pass: orders.orders,
            orders_paid: orders.paid,
        }
    }
}

/// Why a report could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error(transparent)]
    Queue(#[from] QueueError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl WaitingRoom {
    /// The line's counts, read from Redis (dropping the passes expired by now first).
    pub async fn counts(&self, deal_id: &str) -> Result<LineCounts, QueueError> {
        let keys = Keys::of(&self.redis, deal_id);
        let reply: Vec<String> = self.eval_keys(&self.scripts.report, &keys.0, &[]).await?;
        LineCounts::parse(&reply)
    }

    /// The deal's report: the line from Redis, the orders from PostgreSQL.
    pub async fn report(&self, pool: &PgPool, deal_id: &str) -> Result<Report, ReportError> {
        let line = self.counts(deal_id).await?;
        let orders = order_counts(pool, deal_id).await?;
        Ok(Report::of(deal_id, line, orders))
    }
}

/// Records that an order was placed with a pass, for the report; counted on /metrics. An
/// order recorded twice (a retry) is kept once.
pub async fn record_order(
    pool: &PgPool,
    order_id: uuid::Uuid,
    deal_id: &str,
    user_id: &str,
    pass_id: &str,
) -> Result<(), StoreError> {
    // In a transaction of its own: behind a transaction pooler, a write straight on the
    // pool would be committed only once the connection went back.
    let mut tx = pool.begin().await?;
    let inserted = sqlx::query(
        "INSERT INTO waiting_room_orders (order_id, deal_id, user_id, pass_id) \
         VALUES ($1, $2, $3, $4) ON CONFLICT (order_id) DO NOTHING",
    )
    .bind(order_id)
    .bind(deal_id)
    .bind(user_id)
    .bind(pass_id)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    tx.commit().await?;
    metrics::counter!(telemetry::WAITING_ROOM_ORDERS, "deal" => deal_id.to_owned())
        .increment(inserted);
    Ok(())
}

/// Counts, every `interval`, the orders placed with a pass and paid since, per deal on sale
/// or ended within `retain_seconds`, into `flashgate_waiting_room_orders_paid`. Read from
/// PostgreSQL, the truth of a payment: money is settled by webhooks and workers on any
/// instance, long after the order, so no instance sees every payment happen.
pub async fn keep_paid_counted(
    pool: PgPool,
    interval: Duration,
    retain_seconds: u64,
    shutdown: CancellationToken,
) {
    let mut every = Every::new(interval, shutdown);
    while every.tick().await {
        if let Err(error) = record_paid(&pool, retain_seconds).await {
            tracing::debug!(%error, "paid orders of the lines not counted");
        }
    }
}

async fn record_paid(pool: &PgPool, retain_seconds: u64) -> Result<(), StoreError> {
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT w.deal_id, count(*) FILTER (WHERE o.status = $2) \
           FROM deals d \
           JOIN waiting_room_orders w ON w.deal_id = d.id \
           JOIN orders o ON o.id = w.order_id \
          WHERE d.ends_at IS NULL OR d.ends_at > now() - make_interval(secs => $1) \
          GROUP BY w.deal_id",
    )
    .bind(retain_seconds as f64)
    .bind(OrderStatus::Paid.as_str())
    .fetch_all(pool)
    .await?;
    for (deal, paid) in rows {
        metrics::gauge!(telemetry::WAITING_ROOM_ORDERS_PAID, "deal" => deal).set(paid as f64);
    }
    Ok(())
}

/// The orders placed with a pass of the deal, and how many of them were paid.
async fn order_counts(pool: &PgPool, deal_id: &str) -> Result<OrderCounts, StoreError> {
    let (buyers, orders, paid): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(DISTINCT w.user_id), count(*), count(*) FILTER (WHERE o.status = $2) \
           FROM waiting_room_orders w JOIN orders o ON o.id = w.order_id \
          WHERE w.deal_id = $1",
    )
    .bind(deal_id)
    .bind(OrderStatus::Paid.as_str())
    .fetch_one(pool)
    .await?;
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    Ok(OrderCounts {
        buyers: count(buyers),
        orders: count(orders),
        paid: count(paid),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waits(buckets: &[(u32, u64)], max_ms: u64) -> Waits {
        Waits {
            buckets: buckets.to_vec(),
            count: buckets.iter().map(|(_, n)| n).sum(),
            sum_ms: 0,
            max_ms,
        }
    }

    #[test]
    fn quantiles_are_bucket_bounds_capped_at_the_longest_wait() {
        // 1.1^73 ms is about 1,059 ms; 1.1^97 about 10,418 ms.
        let waits = waits(&[(73, 90), (97, 10)], 10_000);
        let p50 = waits.quantile(0.5).unwrap();
        assert!((1.0..1.1).contains(&p50), "{p50}");
        assert_eq!(waits.quantile(0.9), Some(p50));
        assert_eq!(waits.quantile(0.99), Some(10.0));
        assert_eq!(Waits::default().quantile(0.5), None);
    }

    #[test]
    fn the_answer_of_the_script_is_read_field_by_field() {
        let reply: Vec<String> = [
            "3",
            "2",
            "joined",
            "7",
            "seq",
            "8",
            "admitted_total",
            "4",
            "abandoned_total",
            "1",
            "expired_unused",
            "2",
            "w0",
            "1",
            "w12",
            "3",
            "wait_count",
            "4",
            "wait_max_ms",
            "3",
            "outflow",
            "5.000",
        ]
        .map(String::from)
        .to_vec();
        let counts = LineCounts::parse(&reply).unwrap();
        assert_eq!(
            (
                counts.waiting,
                counts.passes_active,
                counts.joined,
                counts.tickets_issued
            ),
            (3, 2, 7, 8)
        );
        assert_eq!(
            (
                counts.admitted,
                counts.abandoned,
                counts.passes_expired_unused
            ),
            (4, 1, 2)
        );
        assert_eq!(counts.waits.buckets, vec![(0, 1), (12, 3)]);
        assert!(LineCounts::parse(&["1".to_owned()]).is_err());
    }
}
