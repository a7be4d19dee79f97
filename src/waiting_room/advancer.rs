//! The advancer: one instance at a time moves every waiting-room line.
//!
//! Every instance runs this task; the one holding the Redis lease (`SET NX PX`, renewed
//! every step, fenced: taking it bumps an epoch, and each line script refuses an epoch older
//! than one that already touched the line) advances. If it dies, the lease
//! runs out after `waiting_room.lease_ttl_ms` and the next instance to try takes over; the
//! admission budget lives in Redis, so the rate carries on where it stopped. Each step, for
//! each deal with a waiting room: pass expiry frees slots, the deal is marked sold out (from
//! the shared sold-out flag, or the stock read through `inventory` at most every
//! `stock_refresh_ms`, and at once when a new line takes its first ticket) or resumed, and
//! up to `admit_per_second × elapsed` tickets are taken from the front (a line that could
//! not admit starts with a full `burst_ms` budget), skipping abandoned ones, while
//! outstanding passes stay within `max_active` and the units that can still be bought:
//! passes outstanding plus passes that ordered since the stock snapshot never exceed
//! `stock_multiple ×` the snapshot's available units (see `scripts::ADVANCE`).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use super::{QueueError, WaitingRoom, shuffle};
use crate::config::millis;
use crate::deals::WaitingRoomTerms;
use crate::inventory;
use crate::redis_link::RedisHandle;
use crate::store::StoreError;
use crate::telemetry;

/// The advancer's keys under `redis.key_prefix`, in the order `RENEW` expects: the lease,
/// the lines version (bumped when a line takes its first ticket, so the advancer reads new
/// lines at once) and the lease epoch. One hash tag: one Redis Cluster slot.
fn lease_keys(redis: &RedisHandle) -> [String; 3] {
    [
        redis.key("wr:{advancer}:lease"),
        lines_version_key(redis),
        redis.key("wr:{advancer}:epoch"),
    ]
}

pub fn lines_version_key(redis: &RedisHandle) -> String {
    redis.key("wr:{advancer}:lines_version")
}

/// Most deals with a waiting room advanced at once.
const LINES_MAX: i64 = 1000;

/// Tickets moved per script while shuffling, so no single script runs long.
const SHUFFLE_CHUNK: u64 = 2000;

/// A deal with a waiting room, and its stock as last read.
#[derive(Debug, Clone, sqlx::FromRow)]
struct Line {
    id: String,
    starts_at: Option<DateTime<Utc>>,
    ends_at: Option<DateTime<Utc>>,
    paused: bool,
    #[sqlx(flatten)]
    terms: WaitingRoomTerms,
    /// Units available in the last snapshot; -1 until read.
    #[sqlx(skip)]
    available: i64,
}

impl Line {
    fn is_open(&self, now: DateTime<Utc>) -> bool {
        self.starts_at.is_none_or(|s| now >= s) && self.ends_at.is_none_or(|e| now < e)
    }
}

/// Outcome of one step of one line.
#[derive(Debug, Clone, Copy)]
struct Step {
    admitted: i64,
    skipped: i64,
    active: i64,
    waiting: i64,
}

/// Admissions counted over about a second, for the rate gauge.
struct RateWindow {
    started: Instant,
    admitted: i64,
}

struct Advancer {
    room: WaitingRoom,
    pool: PgPool,
    token: String,
    /// The lease epoch this advancer holds the lease in; fences the line scripts.
    epoch: String,
    holding: bool,
    lines: Vec<Line>,
    read_at: Option<Instant>,
    /// Redis's clock just before the last snapshot was read (ms).
    snapshot_ms: i64,
    /// The lines version the last snapshot saw.
    version: i64,
    rates: HashMap<String, RateWindow>,
}

/// Runs until `shutdown`, then gives the lease up so another instance takes over at once.
pub async fn run(room: WaitingRoom, pool: PgPool, shutdown: CancellationToken) {
    let interval = millis(room.settings.advance_interval_ms);
    let mut advancer = Advancer {
        room,
        pool,
        token: hex::encode(rand::random::<[u8; 16]>()),
        epoch: String::new(),
        holding: false,
        lines: Vec::new(),
        read_at: None,
        snapshot_ms: 0,
        version: -1,
        rates: HashMap::new(),
    };
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            _ = ticker.tick() => {}
        }
        advancer.tick().await;
    }
    advancer.resign().await;
}

impl Advancer {
    async fn tick(&mut self) {
        let was_holding = self.holding;
        let (holding, version, redis_now_ms, epoch) = self.hold_lease().await;
        self.holding = holding;
        self.epoch = epoch.to_string();
        if self.holding != was_holding {
            tracing::info!(
                holding = self.holding,
                "waiting-room advancer lease changed"
            );
            self.read_at = None;
        }
        if !self.holding {
            return;
        }
        let refresh = millis(self.room.settings.stock_refresh_ms);
        if version != self.version || self.read_at.is_none_or(|at| at.elapsed() >= refresh) {
            match self.read_lines().await {
                Ok(lines) => {
                    self.lines = lines;
                    self.snapshot_ms = redis_now_ms;
                    self.version = version;
                }
                Err(error) => tracing::debug!(%error, "waiting-room lines not re-read"),
            }
            self.read_at = Some(Instant::now());
        }
        let lines = std::mem::take(&mut self.lines);
        let sold_out = self.sold_out().await;
        for line in &lines {
            match self.advance(line, sold_out.contains(&line.id)).await {
                Ok(Some(step)) => self.record(line, step),
                Ok(None) => break,
                Err(error) => tracing::debug!(%error, deal = line.id, "line not advanced"),
            }
        }
        self.lines = lines;
    }

    /// Renews the lease if it is ours, takes it if it is free: (held, lines version, Redis's
    /// clock in ms, lease epoch). A renewal that failed (a Redis timeout) is retried on the
    /// next tick with the same token.
    async fn hold_lease(&self) -> (bool, i64, i64, i64) {
        let ttl = self.room.settings.lease_ttl_ms.to_string();
        let keys = lease_keys(&self.room.redis);
        let held = self
            .room
            .eval_keys::<(i64, i64, i64, i64)>(
                &self.room.scripts.renew,
                &keys,
                &[&self.token, &ttl],
            )
            .await;
        match held {
            Ok((held, version, now_ms, epoch)) => (held == 1, version, now_ms, epoch),
            Err(_) => (false, self.version, 0, 0),
        }
    }

    async fn resign(&self) {
        if self.holding {
            let keys = lease_keys(&self.room.redis);
            let _ = self
                .room
                .eval_keys::<i64>(&self.room.scripts.resign, &keys[..1], &[&self.token])
                .await;
        }
    }

    /// The deals flagged sold out in the shared set; empty when it cannot be read (the
    /// stock snapshot still stops admissions).
    async fn sold_out(&self) -> Vec<String> {
        let redis = &self.room.redis;
        let cmd = redis::cmd("SMEMBERS")
            .arg(redis.key(crate::admission::soldout::SET_KEY))
            .clone();
        redis.run(&cmd).await.unwrap_or_default()
    }

    /// One step of one line; `None` when the lease turned out to be lost.
    async fn advance(&self, line: &Line, sold_out: bool) -> Result<Option<Step>, QueueError> {
        let now = Utc::now();
        let open = line.is_open(now);
        let mut may_admit = open && !line.paused;
        if open && line.terms.is_random() && !self.shuffle(&line.id).await? {
            may_admit = false;
        }
        let s = &self.room.settings;
        let terms = &line.terms;
        let args = [
            self.epoch.clone(),
            u8::from(sold_out).to_string(),
            terms.admit_per_second.to_string(),
            terms.max_active.to_string(),
            line.available.to_string(),
            (i64::from(terms.pass_ttl_seconds) * 1000).to_string(),
            (s.abandon_after_seconds * 1000).to_string(),
            self.snapshot_ms.to_string(),
            s.step_tickets_max.to_string(),
            s.burst_ms.to_string(),
            u8::from(may_admit).to_string(),
            (s.keys_ttl_seconds * 1000).to_string(),
            s.stock_multiple.to_string(),
            s.stock_age_max_ms.to_string(),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let reply: Vec<i64> = self
            .room
            .eval(&self.room.scripts.advance, &line.id, &args)
            .await?;
        let [admitted, skipped, active, waiting] = reply[..] else {
            return Err(QueueError::Unexpected(format!("advance {reply:?}")));
        };
        if admitted < 0 {
            return Ok(None);
        }
        if admitted > 0 && active > i64::from(terms.max_active) {
            tracing::error!(
                deal = line.id,
                active,
                "waiting room admitted past max_active"
            );
        }
        Ok(Some(Step {
            admitted,
            skipped,
            active,
            waiting,
        }))
    }

    /// Shuffles a random-order line's pre-queue once; true when it is done.
    async fn shuffle(&self, deal_id: &str) -> Result<bool, QueueError> {
        let room = &self.room;
        let seed = shuffle::new_seed();
        let hash = shuffle::commitment(&seed);
        let max = room.settings.shuffle_tickets_max.to_string();
        let args = [self.epoch.as_str(), &seed, &hash, &max];
        let (size, seed, shuffled): (i64, String, i64) =
            room.eval(&room.scripts.freeze, deal_id, &args).await?;
        if size < 0 {
            return Ok(false);
        }
        if shuffled == 1 {
            return Ok(true);
        }
        let size = size as u64;
        let positions = shuffle::positions(&seed, size);
        let mut start = 0;
        while start < size {
            let stop = (start + SHUFFLE_CHUNK).min(size) - 1;
            let range = [self.epoch.clone(), start.to_string(), stop.to_string()];
            let range: Vec<&str> = range.iter().map(String::as_str).collect();
            let tickets: Option<Vec<String>> =
                room.eval(&room.scripts.issued, deal_id, &range).await?;
            let Some(tickets) = tickets else {
                return Ok(false);
            };
            let mut args = vec![self.epoch.clone()];
            for (k, ticket) in tickets.into_iter().enumerate() {
                args.push(positions[start as usize + k].to_string());
                args.push(ticket);
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            if room
                .eval::<i64>(&room.scripts.place, deal_id, &args)
                .await?
                < 0
            {
                return Ok(false);
            }
            start = stop + 1;
        }
        let done: i64 = room
            .eval(&room.scripts.shuffled, deal_id, &[&self.epoch])
            .await?;
        if done == 0 {
            tracing::info!(deal_id, size, "pre-queue shuffled; seed published");
        }
        Ok(done == 0)
    }

    fn record(&mut self, line: &Line, step: Step) {
        let deal = line.id.clone();
        let rate = f64::from(line.terms.admit_per_second);
        metrics::gauge!(telemetry::WAITING_ROOM_QUEUE_LENGTH, "deal" => deal.clone())
            .set(step.waiting as f64);
        metrics::gauge!(telemetry::WAITING_ROOM_PASSES_ACTIVE, "deal" => deal.clone())
            .set(step.active as f64);
        metrics::gauge!(telemetry::WAITING_ROOM_ESTIMATED_WAIT, "deal" => deal.clone())
            .set(step.waiting as f64 / rate);
        metrics::counter!(telemetry::WAITING_ROOM_ADMITTED, "deal" => deal.clone())
            .increment(step.admitted as u64);
        metrics::counter!(telemetry::WAITING_ROOM_ABANDONED, "deal" => deal.clone())
            .increment(step.skipped as u64);
        let window = self.rates.entry(deal.clone()).or_insert(RateWindow {
            started: Instant::now(),
            admitted: 0,
        });
        window.admitted += step.admitted;
        let elapsed = window.started.elapsed();
        if elapsed >= Duration::from_secs(1) {
            metrics::gauge!(telemetry::WAITING_ROOM_ADMISSION_RATE, "deal" => deal)
                .set(window.admitted as f64 / elapsed.as_secs_f64());
            window.started = Instant::now();
            window.admitted = 0;
        }
    }
}

impl Advancer {
    /// Deals with a waiting room still on sale, with their available units (read through
    /// `inventory`, the owner of the stock). The same snapshot says which holders of
    /// outstanding passes have already ordered: those slots are freed here, so a pass whose
    /// release was lost (a Redis timeout after the order) cannot hold a unit back from the
    /// line until it expires.
    async fn read_lines(&self) -> Result<Vec<Line>, StoreError> {
        let mut lines = sqlx::query_as::<_, Line>(
            "SELECT id, starts_at, ends_at, paused, wr_enabled, wr_admit_per_second,
                    wr_max_active, wr_pass_ttl_seconds, wr_queue_order, wr_prequeue_opens_at,
                    wr_pow_bits, wr_checkout_url
               FROM deals
              WHERE wr_enabled AND (ends_at IS NULL OR ends_at > now())
              ORDER BY id LIMIT $1",
        )
        .bind(LINES_MAX)
        .fetch_all(&self.pool)
        .await?;
        let passes = self.active_passes(&lines).await;
        let asked: Vec<(String, String)> = passes
            .iter()
            .map(|(deal, _, user)| (deal.clone(), user.clone()))
            .collect();
        let ids: Vec<String> = lines.iter().map(|l| l.id.clone()).collect();
        let stock = inventory::available_and_holders(&self.pool, &ids, &asked).await?;
        for line in &mut lines {
            line.available = stock.get(&line.id).map_or(0, |(available, _)| *available);
        }
        self.forget_used_passes(&passes, &stock).await;
        Ok(lines)
    }

    /// Every line's outstanding passes, as (deal, ticket, user).
    async fn active_passes(&self, lines: &[Line]) -> Vec<(String, String, String)> {
        let mut passes = Vec::new();
        for line in lines {
            let max = u32::try_from(line.terms.max_active).unwrap_or(1).max(1);
            match self.room.active_passes(&line.id, max).await {
                Ok(active) => passes.extend(
                    active
                        .into_iter()
                        .map(|(ticket, user)| (line.id.clone(), ticket, user)),
                ),
                Err(error) => tracing::debug!(%error, deal = line.id, "passes not read"),
            }
        }
        passes
    }

    async fn forget_used_passes(
        &self,
        passes: &[(String, String, String)],
        stock: &HashMap<String, (i64, Vec<String>)>,
    ) {
        let mut used: HashMap<&str, Vec<&str>> = HashMap::new();
        for (deal, ticket, user) in passes {
            let ordered = stock
                .get(deal)
                .is_some_and(|(_, holders)| holders.contains(user));
            if ordered {
                used.entry(deal.as_str()).or_default().push(ticket.as_str());
            }
        }
        for (deal, tickets) in used {
            match self.room.forget_passes(deal, &tickets).await {
                Ok(0) => {}
                Ok(freed) => tracing::info!(deal, freed, "freed the slots of passes already used"),
                Err(error) => tracing::debug!(%error, deal, "used passes not freed"),
            }
        }
    }
}
