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
//! up to `outflow × elapsed` tickets are taken from the front (the outflow is the deal's
//! `admit_per_second` or an adaptive line's decision, see `outflow`; a line that could
//! not admit starts with a full `burst_ms` budget), skipping abandoned ones, while
//! outstanding passes stay within `max_active` and the units that can still be bought:
//! passes outstanding plus passes that ordered since the stock snapshot never exceed
//! `stock_multiple ×` the snapshot's available units (see `scripts::ADVANCE`).
//!
//! Idle lines cost nothing: a line whose step found nobody waiting (all admitted, gone or
//! never there, whatever passes are still outstanding) is not stepped again until someone
//! joins it, and once every line is idle the advancer sleeps and gives the lease up
//! (`lease`), so what a gateway costs Redis while no line has anyone waiting does not grow
//! with the number of deals, lines or passes that exist.

mod gauges;
mod lease;
mod lines;
mod outflow;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use super::{QueueError, WaitingRoom, shuffle};
use crate::shutdown::Every;
use gauges::Gauges;
pub(super) use lease::wake;
use lines::Line;

/// Tickets moved per script while shuffling, so no single script runs long.
const SHUFFLE_CHUNK: u64 = 2000;

/// Outcome of one step of one line.
#[derive(Debug, Clone, Copy)]
struct Step {
    admitted: i64,
    skipped: i64,
    active: i64,
    waiting: i64,
    /// The line queues newcomers (always, unless a `when_busy` line is calm).
    line_active: bool,
}

impl Step {
    /// Nobody waits: nothing to do until someone joins. Passes still outstanding need no
    /// step: their slots matter only to someone waiting, and the step a join wakes frees
    /// the expired ones first. An active `when_busy` line is stepped until it turns calm.
    fn is_idle(&self, when_busy: bool) -> bool {
        self.waiting == 0 && !(when_busy && self.line_active)
    }
}

/// Whether the advancer keeps ticking or sleeps until a join wakes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pace {
    Awake,
    Asleep,
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
    /// Whether the last read of the lines succeeded: only then may the advancer sleep.
    read_ok: bool,
    /// Redis's clock just before the last snapshot was read (ms).
    snapshot_ms: i64,
    /// The lines version the last snapshot saw.
    version: i64,
    /// Lines with nothing to do, not stepped until woken.
    idle: HashSet<String>,
    gauges: Gauges,
    /// Each adaptive line's loop, resumed from the published outflow when this instance
    /// takes the lease.
    controls: HashMap<String, super::controller::Control>,
    /// The loops' clock.
    started: Instant,
}

/// Runs until `shutdown`, then gives the lease up so another instance takes over at once.
pub async fn run(room: WaitingRoom, pool: PgPool, shutdown: CancellationToken) {
    let interval = Duration::from_millis(room.settings.advance_interval_ms);
    let started = room.clock().instant();
    let mut advancer = Advancer {
        room,
        pool,
        token: hex::encode(rand::random::<[u8; 16]>()),
        epoch: String::new(),
        holding: false,
        lines: Vec::new(),
        read_at: None,
        read_ok: false,
        snapshot_ms: 0,
        version: -1,
        idle: HashSet::new(),
        gauges: Gauges::default(),
        controls: HashMap::new(),
        started,
    };
    let mut every = Every::new(interval, shutdown.clone());
    while every.tick().await {
        if advancer.tick().await == Pace::Asleep {
            advancer.fall_asleep();
            if !lease::doze(&advancer.room, &shutdown).await {
                break;
            }
            every.reset_immediately();
        }
    }
    if advancer.holding {
        lease::resign(&advancer.room, &advancer.token).await;
    }
    advancer.gauges.clear(|_| true);
}

impl Advancer {
    async fn tick(&mut self) -> Pace {
        let renewal = lease::renew(&self.room, &self.token).await;
        let renewal = renewal.unwrap_or_else(|_| lease::Renewal {
            version: self.version,
            ..lease::Renewal::default()
        });
        if renewal.asleep {
            return Pace::Asleep;
        }
        self.epoch = renewal.epoch.to_string();
        if renewal.held != self.holding {
            self.holding = renewal.held;
            tracing::info!(
                holding = self.holding,
                "waiting-room advancer lease changed"
            );
            // A new holder reads the lines afresh and steps each once, and resumes each
            // adaptive loop from the outflow last published.
            self.read_at = None;
            self.idle.clear();
            self.controls.clear();
        }
        if !self.holding {
            self.gauges.clear(|_| true);
            return Pace::Awake;
        }
        for deal in &renewal.woken {
            self.idle.remove(deal);
        }
        self.refresh_lines(&renewal).await;
        self.step_lines().await;
        let all_idle = self.lines.iter().all(|line| self.idle.contains(&line.id));
        if self.read_ok && all_idle && lease::sleep(&self.room, &self.token).await {
            return Pace::Asleep;
        }
        Pace::Awake
    }

    /// The lease is given up and nothing is left to show.
    fn fall_asleep(&mut self) {
        if self.holding {
            tracing::info!("waiting-room advancer asleep: no line has anything to do");
        }
        self.holding = false;
        self.read_at = None;
        self.idle.clear();
        self.controls.clear();
        self.gauges.clear(|_| true);
    }

    /// Re-reads the lines when a new one appeared or a line woke (a pause, a window or terms
    /// changed while it slept count from its first ticket on), when the holder changed or
    /// woke, and at least every `stock_refresh_ms`.
    async fn refresh_lines(&mut self, renewal: &lease::Renewal) {
        let refresh = Duration::from_millis(self.room.settings.stock_refresh_ms);
        let now = self.room.clock().instant();
        let due = self
            .read_at
            .is_none_or(|at| now.saturating_duration_since(at) >= refresh);
        if renewal.version == self.version && renewal.woken.is_empty() && !due {
            return;
        }
        match lines::read(&self.room, &self.pool, &self.idle).await {
            Ok(lines) => {
                self.gauges.keep_only(&lines);
                self.lines = lines;
                self.snapshot_ms = renewal.now_ms;
                self.version = renewal.version;
                self.read_ok = true;
            }
            Err(error) => {
                tracing::debug!(%error, "waiting-room lines not re-read");
                self.read_ok = false;
            }
        }
        self.read_at = Some(self.room.clock().instant());
    }

    /// Steps every line that is not idle; a line found idle is left alone from then on.
    async fn step_lines(&mut self) {
        let lines = std::mem::take(&mut self.lines);
        let busy: Vec<&Line> = lines
            .iter()
            .filter(|line| !self.idle.contains(&line.id))
            .collect();
        if !busy.is_empty() {
            let sold_out = self.sold_out().await;
            for line in busy {
                let line_sold_out = sold_out.contains(&line.id);
                let outflow = self.outflow(line).await;
                match self.advance(line, line_sold_out, outflow.per_second).await {
                    Ok(Some(step)) => {
                        self.count_admitted(line, step.admitted);
                        self.gauges.record(line, step, line_sold_out, &outflow);
                        if step.is_idle(line.terms.when_busy()) {
                            self.idle.insert(line.id.clone());
                        }
                    }
                    Ok(None) => break,
                    Err(error) => tracing::debug!(%error, deal = line.id, "line not advanced"),
                }
            }
        }
        self.lines = lines;
    }

    /// The deals flagged sold out in the shared set; empty when it cannot be read (the
    /// stock snapshot still stops admissions).
    async fn sold_out(&self) -> Vec<String> {
        let redis = &self.room.redis;
        let cmd = redis::cmd("SMEMBERS").arg(redis.sold_out_key()).clone();
        redis.run(&cmd).await.unwrap_or_default()
    }

    /// One step of one line; `None` when the lease turned out to be lost.
    async fn advance(
        &self,
        line: &Line,
        sold_out: bool,
        outflow: f64,
    ) -> Result<Option<Step>, QueueError> {
        let open = line.is_open(self.room.clock().now());
        let mut may_admit = open && !line.paused;
        if open && line.terms.is_random() && !self.shuffle(&line.id).await? {
            may_admit = false;
        }
        let s = &self.room.settings;
        let terms = &line.terms;
        let args = [
            self.epoch.clone(),
            u8::from(sold_out).to_string(),
            format!("{outflow:.3}"),
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
            u8::from(terms.when_busy()).to_string(),
            (s.when_busy_calm_seconds * 1000).to_string(),
            terms
                .priority
                .as_ref()
                .map_or(0, |p| p.share_percent)
                .to_string(),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let reply: Vec<i64> = self
            .room
            .eval(&self.room.scripts.advance, &line.id, &args)
            .await?;
        let [admitted, skipped, active, waiting, line_active, switched] =
            reply.get(..6).unwrap_or_default()[..]
        else {
            return Err(QueueError::Unexpected(format!("advance {reply:?}")));
        };
        if admitted < 0 {
            return Ok(None);
        }
        super::busy::record_switches(&line.id, switched);
        gauges::record_report(&line.id, reply.get(6..).unwrap_or_default());
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
            line_active: line_active == 1,
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
}
