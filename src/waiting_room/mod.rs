//! The waiting room: a fair line in front of a deal, admitting buyers at a controlled rate.
//!
//! A buyer takes a ticket (one per user per deal) and polls it; an advancer moves the line
//! at the deal's `admit_per_second` (or, for an adaptive line, at the outflow `controller`
//! decides from the health the instances report through Redis, `health`), never letting
//! more than `max_active` passes (or a multiple of the stock left) be outstanding, and a buyer at the front gets a signed pass
//! to order with. All state lives in Redis under `redis.key_prefix`, each change one Lua
//! script (`scripts`), so every instance serves one shared line; polls never touch
//! PostgreSQL. Passes are checked in memory (`pass`). One instance at a time advances the
//! lines, holding a Redis lease (`advancer`); random-order lines are shuffled verifiably
//! when the sale opens (`shuffle`).
//!
//! A ticket carries its position signed (`position`), so its holder follows the line on the
//! public state, which each instance reads from Redis at most once per
//! `line_state_refresh_ms` (`line_cache`) and a CDN caches; the holder polls personally
//! only to check in once `admitted_through` is within `checkin_window_seconds` of outflow of
//! its position, and to collect the pass. A ticket not checked in when its turn comes is
//! skipped as abandoned.
//!
//! Without Redis, tickets cannot be taken or polled (503) and the line stands still; orders
//! on deals with a waiting room still need a valid pass, so nobody skips the line.
//!
//! A join is checked in memory first (`join`): a proof of work for a new place, or the
//! signed position a returning buyer shows instead, so a refused join costs Redis nothing.
//! A poll from far outside the check-in window is answered from the signed position and
//! the line state in memory (`follow`), which also says how often a client far back reads.
//!
//! A `when_busy` deal's line is in force only while arrivals go past its outflow; while it
//! is calm, a join is admitted at once (`busy`).
//!
//! An invitation-only line (`invitation`) lets in buyers whose token claim or access code
//! (`access_codes`, the one PostgreSQL table of the module) says so.
//!
//! An operator can drain a line (`flashgate deals drain-queue`, `WaitingRoom::drain`): it
//! closes for good, every waiting ticket reads `expired`, and no pass is handed out again.

pub mod access_codes;
pub mod advancer;
pub mod busy;
pub mod challenge;
pub mod controller;
pub mod follow;
pub mod health;
pub mod invitation;
mod join;
mod line_cache;
pub mod pass;
pub mod position;
pub mod priority;
pub mod report;
pub mod revocation;
mod scripts;
mod settings;
pub mod shuffle;

use std::sync::Arc;

use redis::Value;

use crate::clock::Clock;
use crate::redis_link::{RedisError, RedisHandle, Script};
use crate::telemetry;

pub use challenge::{Challenge, ChallengeError, Challenges};
pub use follow::Far;
pub use join::Proof;
use line_cache::LineCache;
pub use pass::{PassError, Passes, VerifiedPass};
pub use position::{Position, PositionError, Positions};
use revocation::Revoked;
use scripts::Scripts;
pub use settings::WaitingRoomSettings;

/// Where a ticket stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TicketState {
    /// In line.
    Waiting,
    /// At the front: the poll answer carries a pass.
    Admitted,
    /// The deal sold out while the ticket waited; it keeps its place in case stock returns.
    SoldOut,
    /// The pass ran out unused, the ticket was skipped after its holder stopped polling, or
    /// the line was drained.
    Expired,
}

impl TicketState {
    pub fn as_str(self) -> &'static str {
        match self {
            TicketState::Waiting => "waiting",
            TicketState::Admitted => "admitted",
            TicketState::SoldOut => "sold_out",
            TicketState::Expired => "expired",
        }
    }

    fn parse(text: &str) -> Self {
        match text {
            "admitted" => TicketState::Admitted,
            "sold_out" => TicketState::SoldOut,
            "expired" => TicketState::Expired,
            _ => TicketState::Waiting,
        }
    }
}

/// One ticket as a poll sees it.
#[derive(Debug, Clone)]
pub struct TicketStatus {
    pub ticket: String,
    /// 1-based place in the line; dense across instances.
    pub position: u64,
    /// False for a random-order line's pre-queue ticket before the shuffle moved it.
    pub position_final: bool,
    /// The highest position the advancer has passed (admitted or skipped).
    pub admitted_through: u64,
    /// Tickets still waiting in front of this one.
    pub ahead: u64,
    pub state: TicketState,
    /// When the pass expires (unix milliseconds); 0 unless admitted.
    pub pass_expires_ms: i64,
    /// Redis's clock when the status was read (unix milliseconds).
    pub now_ms: i64,
    /// Units of the last stock snapshot not yet promised to an outstanding pass; `None`
    /// until the advancer has read the deal's stock.
    pub units_left: Option<u64>,
    /// The rate the advancer last admitted at (tickets per second); `None` before its first
    /// step.
    pub outflow_per_second: Option<f64>,
    /// The ticket is the priority group's (its place and `ahead` count in that group's line).
    pub priority: bool,
    /// Tickets waiting in the other group's line (with no priority group: none).
    pub other_waiting: u64,
}

/// A line as the public sees it.
#[derive(Debug, Clone, Default)]
pub struct LineStatus {
    pub admitted_through: u64,
    pub waiting: u64,
    pub sold_out: bool,
    pub seed_sha256: Option<String>,
    /// Published once the pre-queue was shuffled.
    pub seed: Option<String>,
    pub prequeue_size: Option<u64>,
    pub passes_active: u64,
    pub admitted_total: u64,
    /// The rate the advancer last admitted at; `None` before its first step.
    pub outflow_per_second: Option<f64>,
    /// Units of the last stock snapshot not yet promised to an outstanding pass; `None`
    /// until the advancer has read the deal's stock.
    pub units_left: Option<u64>,
    /// An operator drained the line: it takes no tickets and admits nobody any more.
    pub closed: bool,
    /// A `when_busy` line is active: newcomers queue rather than being admitted at once.
    pub busy: bool,
    /// The priority group's `admitted_through`, in its own places.
    pub priority_through: u64,
    /// Tickets of the priority group among `waiting`.
    pub priority_waiting: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("the waiting room is unavailable: {0}")]
    Unavailable(#[from] RedisError),
    #[error("unexpected answer from redis: {0}")]
    Unexpected(String),
    /// The line was drained: it takes no new tickets.
    #[error("the waiting room is closed")]
    Closed,
    /// The deal asks for a proof of work and this one does not do.
    #[error(transparent)]
    Challenge(#[from] ChallengeError),
}

/// What draining a line did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Drained {
    /// Waiting tickets that now read `expired`.
    pub tickets_expired: u64,
    /// Passes handed out before the drain and not yet used or expired; they stay valid
    /// until their expiry (pause the deal to refuse their orders too).
    pub passes_active: u64,
}

/// Waiting tickets expired per script while draining, so no single script runs long.
const DRAIN_CHUNK: u64 = 1000;

/// The Redis key of a line's `name`: the deal id is its hash tag, so on a Redis Cluster all
/// of one line's keys are in one slot, and lines spread over the cluster.
fn line_key(redis: &RedisHandle, deal_id: &str, name: &str) -> String {
    redis.key(&format!("wr:{{{deal_id}}}:{name}"))
}

/// The Redis keys of one deal's line, in the order the scripts expect.
struct Keys([String; 14]);

impl Keys {
    fn of(redis: &RedisHandle, deal_id: &str) -> Self {
        let deal = |name: &str| line_key(redis, deal_id, name);
        Keys([
            deal("meta"),
            deal("users"),
            deal("t_user"),
            deal("t_pos"),
            deal("t_issue"),
            deal("t_seen"),
            deal("t_adm"),
            deal("t_skip"),
            deal("line"),
            deal("active"),
            deal("issued"),
            deal("used"),
            deal("t_join"),
            deal("t_grp"),
        ])
    }
}

/// Queue operations shared by every handler of one instance; cheap to clone.
#[derive(Clone)]
pub struct WaitingRoom {
    redis: RedisHandle,
    passes: Passes,
    positions: Positions,
    scripts: Arc<Scripts>,
    line_cache: LineCache,
    settings: Arc<WaitingRoomSettings>,
    revoked: Revoked,
    challenges: Challenges,
    /// Wakes this instance's sleeping advancer when a join here puts someone in a line.
    woken: Arc<tokio::sync::Notify>,
    /// This instance's measurements of pass holders' orders, reported for adaptive lines.
    health: Arc<health::Recorder>,
    /// Names this instance's health reports.
    instance: String,
    /// What passes, challenges, revocations and the line's opening are timed on.
    clock: Clock,
}

impl WaitingRoom {
    pub fn new(settings: &WaitingRoomSettings, redis: RedisHandle, clock: Clock) -> Self {
        Self {
            redis,
            passes: Passes::from_settings(settings),
            positions: Positions::new(&settings.pass_secret),
            scripts: Arc::new(Scripts::new()),
            line_cache: LineCache::new(
                std::time::Duration::from_millis(settings.line_state_refresh_ms),
                clock.clone(),
            ),
            settings: Arc::new(settings.clone()),
            revoked: Revoked::default(),
            challenges: Challenges::new(&settings.pass_secret, settings.pow_challenge_ttl_seconds),
            woken: Arc::default(),
            health: Arc::default(),
            instance: hex::encode(rand::random::<[u8; 8]>()),
            clock,
        }
    }

    /// The application's clock.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Where the sale times the orders placed with a pass.
    pub fn health(&self) -> &Arc<health::Recorder> {
        &self.health
    }

    pub fn passes(&self) -> &Passes {
        &self.passes
    }

    pub fn positions(&self) -> &Positions {
        &self.positions
    }

    pub fn settings(&self) -> &WaitingRoomSettings {
        &self.settings
    }

    /// Runs `script` on the deal's keys with `args`.
    async fn eval<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        deal_id: &str,
        args: &[&str],
    ) -> Result<T, RedisError> {
        self.eval_keys(script, &Keys::of(&self.redis, deal_id).0, args)
            .await
    }

    /// Runs `script` on `keys` (of one Redis Cluster slot) with `args`.
    async fn eval_keys<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        keys: &[String],
        args: &[&str],
    ) -> Result<T, RedisError> {
        self.redis.eval(script, keys, &args).await
    }

    /// Closes the deal's line for good: no new tickets, no more passes, and every ticket
    /// still waiting reads `expired` at its next poll. Ticket holders keep their (expired)
    /// ticket; the keys leave Redis after `keys_ttl_seconds` like any finished line. Safe
    /// to run again, and while instances serve the line: each step is one script.
    pub async fn drain(&self, deal_id: &str) -> Result<Drained, QueueError> {
        let chunk = DRAIN_CHUNK.to_string();
        let keys_ttl = (self.settings.keys_ttl_seconds * 1000).to_string();
        let mut drained = Drained::default();
        loop {
            let reply: Vec<u64> = self
                .eval(&self.scripts.drain, deal_id, &[&chunk, &keys_ttl])
                .await?;
            let [expired, waiting, active] = reply[..] else {
                return Err(QueueError::Unexpected(format!("drain {reply:?}")));
            };
            drained.tickets_expired += expired;
            drained.passes_active = active;
            if waiting == 0 {
                return Ok(drained);
            }
        }
    }

    /// The ticket's status if it is `user`'s; records the poll so the ticket is not abandoned.
    pub async fn poll(
        &self,
        deal_id: &str,
        user: &str,
        ticket: &str,
    ) -> Result<Option<TicketStatus>, QueueError> {
        let reply: Value = self
            .eval(&self.scripts.poll, deal_id, &[ticket, user])
            .await?;
        parse_status(reply)
    }

    /// The public view of the line, read from Redis at most once per
    /// `line_state_refresh_ms` by this instance; the reads in between are answered from
    /// memory.
    pub async fn line(&self, deal_id: &str) -> Result<LineStatus, QueueError> {
        self.line_cache
            .get_or_refresh(deal_id, || self.read_line(deal_id))
            .await
    }

    /// The public view of the line, from Redis.
    async fn read_line(&self, deal_id: &str) -> Result<LineStatus, QueueError> {
        let m: Vec<String> = self.eval(&self.scripts.public, deal_id, &[]).await?;
        let [
            through,
            waiting,
            state,
            hash,
            seed,
            size,
            active,
            total,
            outflow,
            left,
            closed,
            busy,
            priority_through,
            priority_waiting,
        ] = m.as_slice()
        else {
            return Err(QueueError::Unexpected(format!("line status {m:?}")));
        };
        let some = |s: &String| (!s.is_empty()).then(|| s.clone());
        Ok(LineStatus {
            admitted_through: through.parse().unwrap_or(0),
            waiting: waiting.parse().unwrap_or(0),
            sold_out: state == "sold_out",
            seed_sha256: some(hash),
            seed: some(seed),
            prequeue_size: size.parse().ok(),
            passes_active: active.parse().unwrap_or(0),
            admitted_total: total.parse().unwrap_or(0),
            outflow_per_second: outflow.parse().ok().filter(|rate: &f64| *rate > 0.0),
            units_left: left.parse().ok(),
            closed: closed == "1",
            busy: busy == "1",
            priority_through: priority_through.parse().unwrap_or(0),
            priority_waiting: priority_waiting.parse().unwrap_or(0),
        })
    }

    /// A pass placed an order: free its slot now rather than at its expiry. Best effort.
    pub async fn release(&self, deal_id: &str, pass_id: &str) {
        let keys_ttl = (self.settings.keys_ttl_seconds * 1000).to_string();
        let freed = self
            .eval::<i64>(&self.scripts.release, deal_id, &[pass_id, &keys_ttl])
            .await;
        if let Err(error) = freed {
            tracing::debug!(%error, deal_id, "pass slot not freed; it frees at its expiry");
        }
    }

    /// The outstanding passes of `deal_id` as (ticket, user), at most `max` of them.
    pub(crate) async fn active_passes(
        &self,
        deal_id: &str,
        max: u32,
    ) -> Result<Vec<(String, String)>, QueueError> {
        let flat: Vec<String> = self
            .eval(&self.scripts.active, deal_id, &[&max.to_string()])
            .await?;
        Ok(flat
            .chunks_exact(2)
            .map(|pair| (pair[0].clone(), pair[1].clone()))
            .collect())
    }

    /// Frees the slots of passes whose orders a stock snapshot already counts; returns how
    /// many were still outstanding.
    pub(crate) async fn forget_passes(
        &self,
        deal_id: &str,
        tickets: &[&str],
    ) -> Result<i64, QueueError> {
        Ok(self.eval(&self.scripts.forget, deal_id, tickets).await?)
    }

    /// Ends `user`'s session on the deal's line (an operator's call, or the user's order was
    /// paid or cancelled): the pass stops working on every instance within
    /// `revocation_poll_ms`, here at once, and a waiting ticket leaves the line. Returns the
    /// revoked ticket, `None` when the user never queued. Ending a session again is harmless:
    /// it announces the pass's own expiry again, never an earlier one.
    pub async fn revoke(&self, deal_id: &str, user: &str) -> Result<Option<String>, QueueError> {
        let revoked: Option<(String, i64, i64)> =
            self.eval(&self.scripts.revoke, deal_id, &[user]).await?;
        let Some((ticket, until_ms, first)) = revoked else {
            return Ok(None);
        };
        self.revoked.insert(&ticket, until_ms);
        // Not in the script: the stream is shared by all lines, so on a Redis Cluster it
        // lives in another slot. A failure here is returned; revoking again announces the
        // same entry, so a retry completes what failed.
        revocation::announce(self, deal_id, &ticket, until_ms).await?;
        if first == 1 {
            metrics::counter!(telemetry::WAITING_ROOM_REVOKED).increment(1);
        }
        Ok(Some(ticket))
    }

    /// The hook for the order paths: a paid or cancelled order ends its buyer's session on
    /// the line. Best effort: without Redis the pass still runs out at its expiry, and the
    /// per-user limit still bounds what it can buy.
    pub async fn end_session(&self, deal_id: &str, user: &str) {
        if let Err(error) = self.revoke(deal_id, user).await {
            tracing::warn!(%error, deal_id, "pass not revoked; it runs out at its expiry");
        }
    }

    /// The passes revoked before their expiry that this instance knows of.
    pub fn revoked(&self) -> &Revoked {
        &self.revoked
    }

    /// Verifies a pass for an order, counting refusals by reason.
    pub fn check_pass(
        &self,
        pass: Option<&[u8]>,
        deal_id: &str,
        user: &str,
    ) -> Result<VerifiedPass, PassError> {
        let now = self.clock.now().timestamp();
        self.passes
            .verify(pass, deal_id, user, now)
            .and_then(|verified| match self.revoked.contains(&verified.pass_id) {
                true => Err(PassError::Revoked),
                false => Ok(verified),
            })
            .inspect_err(|error| {
                metrics::counter!(telemetry::WAITING_ROOM_PASS_REJECTIONS, "reason" => error.reason())
                    .increment(1);
            })
    }
}

/// Fields of the scripts' `status` tuple.
const STATUS_FIELDS: usize = 13;

/// Reads the `status` tuple of the scripts (nil: no such ticket).
fn parse_status(reply: Value) -> Result<Option<TicketStatus>, QueueError> {
    if matches!(reply, Value::Nil) {
        return Ok(None);
    }
    type Row = (
        String,
        u64,
        u64,
        u64,
        String,
        i64,
        i64,
        u64,
        i64,
        String,
        i64,
    );
    let unexpected = |e: redis::ParsingError| QueueError::Unexpected(e.to_string());
    let Value::Array(mut items) = reply else {
        return Err(QueueError::Unexpected(format!("status {reply:?}")));
    };
    if items.len() != STATUS_FIELDS {
        return Err(QueueError::Unexpected(format!("status {items:?}")));
    }
    let groups = items.split_off(STATUS_FIELDS - 2);
    let (priority, other_waiting): (i64, u64) =
        redis::FromRedisValue::from_redis_value(Value::Array(groups)).map_err(unexpected)?;
    let row: Row =
        redis::FromRedisValue::from_redis_value(Value::Array(items)).map_err(unexpected)?;
    let (
        ticket,
        position,
        admitted_through,
        ahead,
        state,
        pass_expires_ms,
        now_ms,
        _,
        left,
        outflow,
        fin,
    ) = row;
    Ok(Some(TicketStatus {
        ticket,
        position,
        position_final: fin == 1,
        admitted_through,
        ahead,
        state: TicketState::parse(&state),
        pass_expires_ms,
        now_ms,
        units_left: u64::try_from(left).ok(),
        outflow_per_second: outflow.parse().ok().filter(|rate: &f64| *rate > 0.0),
        priority: priority == 1,
        other_waiting,
    }))
}
