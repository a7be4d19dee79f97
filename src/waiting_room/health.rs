//! What the admitted buyers meet, measured on every instance and shared through Redis.
//!
//! Each instance times the orders placed with a pass (`Recorder::begin`), counts those
//! refused 503 and notes the payment provider's breaker; every `health_report_ms` it writes
//! one short-lived report per deal to the line's `health` hash (one field per instance,
//! stamped with Redis's clock). The instance holding the advancer lease reads the fresh
//! reports of a line with its last published outflow (`read`) and hands them to the
//! controller. An order still unanswered counts at its age, so a back end that stops
//! answering shows up as slow rather than silent.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::controller::Health;
use super::{QueueError, WaitingRoom, line_key};
use crate::clock::monotonic;
use crate::shutdown::Every;

/// ARGV: instance, p99 ms, orders timed, orders refused 503, breaker open (0/1), ttl ms,
/// orders answered, the window's length in ms, orders under way, the wait they face in ms.
/// One field per instance:
/// `redis ms,p99 ms,orders,refused,breaker,answered,window ms,under way,queued ms`.
pub(super) const REPORT: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], ARGV[1],
  table.concat({now, ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[7], ARGV[8], ARGV[9], ARGV[10]}, ','))
redis.call('PEXPIRE', KEYS[1], ARGV[6])
return now
"#;

/// KEYS: the line's `meta`, its `health`. ARGV: stale ms. Drops the stale reports and returns
/// {Redis ms, last published outflow ('' before any), fresh reports...}.
pub(super) const READ: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {tostring(now), redis.call('HGET', KEYS[1], 'outflow') or ''}
local all = redis.call('HGETALL', KEYS[2])
for i = 1, #all, 2 do
  local at = tonumber(string.match(all[i + 1], '^(%d+),'))
  if at and now - at <= tonumber(ARGV[1]) then
    table.insert(out, all[i + 1])
  else
    redis.call('HDEL', KEYS[2], all[i])
  end
end
return out
"#;

/// What one instance saw of one deal between two reports.
#[derive(Default)]
struct Slice {
    latencies_ms: Vec<f64>,
    /// Orders answered (every one, past `SLICE_LATENCIES_MAX` too): the back end's throughput.
    answered: u64,
    refused: u64,
    /// How long the slice lasted; 0 for the first one (no rate can be told from it).
    span_ms: u64,
}

impl Slice {
    fn is_busy(&self) -> bool {
        !self.latencies_ms.is_empty() || self.refused > 0 || self.answered > 0
    }
}

/// What one instance saw of one deal over its report window: the slice being filled and the
/// last slices reported, newest last. A report goes out every `health_report_ms` and covers
/// the last `health_window_ms`, so a queue building shows within one report interval, while
/// the throughput is still counted over a window long enough to hold a few answers.
#[derive(Default)]
struct Window {
    current: Slice,
    reported: VecDeque<Slice>,
    /// Orders under way, by the id `begin` gave them.
    in_flight: HashMap<u64, UnderWay>,
    /// Orders answered on this instance since the window was made: how many were answered
    /// while an order under way waited.
    answered_total: u64,
    /// Whether the last report of this window told of any order. A busy report stays fresh
    /// in Redis for `health_stale_ms`, so a window going quiet is reported once more, empty:
    /// otherwise its last burst of answers would count again at every reading until then.
    reported_busy: bool,
}

/// An order being timed.
struct UnderWay {
    started: Instant,
    /// `Window::answered_total` when it was sent.
    answered_before: u64,
}

impl Window {
    fn is_busy(&self) -> bool {
        !self.in_flight.is_empty()
            || self.current.is_busy()
            || self.reported.iter().any(Slice::is_busy)
    }

    /// Closes the slice being filled after `span_ms` and keeps the newest slices that fit in
    /// `window_ms` (at least the one just closed).
    fn close(&mut self, span_ms: u64, window_ms: u64) {
        let closed = Slice {
            span_ms,
            ..std::mem::take(&mut self.current)
        };
        // The first slice has no known length: it goes once the next one is closed.
        self.reported.retain(|slice| slice.span_ms > 0);
        self.reported.push_back(closed);
        let mut covered_ms = 0;
        let keep = self
            .reported
            .iter()
            .rev()
            .take_while(|slice| {
                covered_ms += slice.span_ms;
                covered_ms <= window_ms
            })
            .count()
            .max(1);
        let stale = self.reported.len() - keep;
        self.reported.drain(..stale);
    }
}

/// This instance's measurements, per deal; cheap to share.
#[derive(Default)]
pub struct Recorder {
    windows: Mutex<HashMap<String, Window>>,
    /// When the reports were last taken: the windows' start.
    taken_at: Mutex<Option<Instant>>,
    next_id: std::sync::atomic::AtomicU64,
    breaker_open: std::sync::atomic::AtomicBool,
}

/// How a timed order ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// Answered (placed, refused for a rule, sold out): its latency counts.
    Answered,
    /// Refused 503 for want of capacity (pool exhausted, database unavailable).
    Overloaded,
}

/// One order being timed; dropped unfinished (the buyer went away), it is forgotten.
pub struct Timing {
    recorder: Arc<Recorder>,
    deal: String,
    id: u64,
    started: Instant,
}

impl Timing {
    pub fn finish(self, served: Served) {
        let elapsed_ms = monotonic()
            .saturating_duration_since(self.started)
            .as_secs_f64()
            * 1000.0;
        self.recorder.with(&self.deal, |window| match served {
            Served::Answered => {
                window.current.answered += 1;
                window.answered_total += 1;
                if window.current.latencies_ms.len() < SLICE_LATENCIES_MAX {
                    window.current.latencies_ms.push(elapsed_ms);
                }
            }
            Served::Overloaded => window.current.refused += 1,
        });
    }
}

impl Drop for Timing {
    fn drop(&mut self) {
        self.recorder.with(&self.deal, |window| {
            window.in_flight.remove(&self.id);
        });
    }
}

/// Most latencies kept per deal between two reports; past it the slice keeps the first ones,
/// enough for a p99. A window holds at most `HEALTH_WINDOW_REPORTS_MAX` slices.
const SLICE_LATENCIES_MAX: usize = 10_000;

impl Recorder {
    /// Starts timing an order of `deal` placed with a pass.
    pub fn begin(self: &Arc<Self>, deal: &str) -> Timing {
        self.begin_at(deal, monotonic())
    }

    /// Times an order of `deal` placed with a pass, from when it `started`.
    pub fn begin_at(self: &Arc<Self>, deal: &str, started: Instant) -> Timing {
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.with(deal, |window| {
            let answered_before = window.answered_total;
            window.in_flight.insert(
                id,
                UnderWay {
                    started,
                    answered_before,
                },
            );
        });
        Timing {
            recorder: self.clone(),
            deal: deal.to_owned(),
            id,
            started,
        }
    }

    /// The payment provider's breaker as this instance last saw it.
    pub fn set_breaker_open(&self, open: bool) {
        self.breaker_open
            .store(open, std::sync::atomic::Ordering::Relaxed);
    }

    /// Applies `change` to `deal`'s window; the deal's name is copied only when its window
    /// is new, not on every order.
    fn with(&self, deal: &str, change: impl FnOnce(&mut Window)) {
        let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        match windows.get_mut(deal) {
            Some(window) => change(window),
            None => change(windows.entry(deal.to_owned()).or_default()),
        }
    }

    /// Each deal's report over the last `window_ms`; a deal with nothing under way and
    /// nothing seen is reported once, empty, then dropped.
    fn take(&self, window_ms: u64) -> Vec<Taken> {
        let now = monotonic();
        let since = self
            .taken_at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .replace(now);
        let span_ms = since.map_or(0, |at| {
            u64::try_from(now.saturating_duration_since(at).as_millis()).unwrap_or(u64::MAX)
        });
        let gathered: Vec<(Taken, Vec<f64>)> = {
            let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
            for window in windows.values_mut() {
                window.close(span_ms, window_ms);
            }
            windows.retain(|_, w| w.reported_busy || w.is_busy());
            windows
                .iter_mut()
                .map(|(deal, window)| {
                    window.reported_busy = window.is_busy();
                    taken(deal, window, now)
                })
                .collect()
        };
        // The orders being timed wait on the lock: the percentiles are sorted after it.
        gathered
            .into_iter()
            .map(|(taken, mut samples)| Taken {
                p99_ms: p99(&mut samples),
                ..taken
            })
            .collect()
    }
}

/// The report of `deal`'s window at `now` and the latencies its p99 is to be taken from: its
/// slices merged, the orders under way at their age.
fn taken(deal: &str, window: &Window, now: Instant) -> (Taken, Vec<f64>) {
    let slices = &window.reported;
    let mut samples: Vec<f64> = slices
        .iter()
        .flat_map(|slice| slice.latencies_ms.iter().copied())
        .collect();
    samples.extend(
        window
            .in_flight
            .values()
            .map(|order| now.saturating_duration_since(order.started).as_secs_f64() * 1000.0),
    );
    let taken = Taken {
        deal: deal.to_owned(),
        p99_ms: 0.0,
        orders: samples.len() as u64,
        refused: slices.iter().map(|slice| slice.refused).sum(),
        answered: slices.iter().map(|slice| slice.answered).sum(),
        window_ms: slices.iter().map(|slice| slice.span_ms).sum(),
        under_way: window.in_flight.len() as u64,
        queued_ms: queued_ms(window, now),
    };
    (taken, samples)
}

/// The wait the orders under way on this instance face, by Little's law over the oldest
/// one's life: their count over the rate the instance answered orders since it was sent
/// (its own answer counted as if now, so the rate is never zero); 0 with none under way.
/// Each instance drains its own queue: at a slowdown's onset the orders pile up unanswered
/// here before a report window's throughput can fall, and the instance holding most of them
/// shows its queue in full rather than averaged with the others.
fn queued_ms(window: &Window, now: Instant) -> f64 {
    let Some(oldest) = window.in_flight.values().min_by_key(|order| order.started) else {
        return 0.0;
    };
    let waited_ms = now.saturating_duration_since(oldest.started).as_secs_f64() * 1000.0;
    let answered = window.answered_total.saturating_sub(oldest.answered_before);
    window.in_flight.len() as f64 * waited_ms / (answered + 1) as f64
}

/// One deal's window on this instance, as reported.
#[derive(Debug, PartialEq)]
struct Taken {
    deal: String,
    p99_ms: f64,
    /// Orders timed: answered, and those still under way at their age.
    orders: u64,
    refused: u64,
    answered: u64,
    /// How long the window covered; 0 for the first one (no rate can be told from it).
    window_ms: u64,
    /// Orders still under way when the window was taken.
    under_way: u64,
    /// The wait they face (`queued_ms`).
    queued_ms: f64,
}

/// The 99th percentile (nearest rank) of `samples`; 0 without any.
fn p99(samples: &mut [f64]) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    samples.sort_by(f64::total_cmp);
    let rank = (samples.len() as f64 * 0.99).ceil() as usize;
    samples[rank.clamp(1, samples.len()) - 1]
}

/// Reports this instance's health every `health_report_ms` until `shutdown`.
pub async fn run(room: WaitingRoom, shutdown: CancellationToken) {
    let interval = Duration::from_millis(room.settings.health_report_ms);
    let mut every = Every::new(interval, shutdown);
    while every.tick().await {
        report(&room).await;
    }
}

/// Writes one report per deal this instance saw orders of; a failure is left for the next.
pub async fn report(room: &WaitingRoom) {
    let breaker = room
        .health
        .breaker_open
        .load(std::sync::atomic::Ordering::Relaxed);
    let ttl = (room.settings.health_stale_ms * 2).to_string();
    for taken in room.health.take(room.settings.health_window_ms) {
        let key = [line_key(&room.redis, &taken.deal, "health")];
        let args = [
            room.instance.clone(),
            format!("{:.1}", taken.p99_ms),
            taken.orders.to_string(),
            taken.refused.to_string(),
            u8::from(breaker).to_string(),
            ttl.clone(),
            taken.answered.to_string(),
            taken.window_ms.to_string(),
            taken.under_way.to_string(),
            format!("{:.1}", taken.queued_ms),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let written: Result<i64, _> = room
            .eval_keys(&room.scripts.health_report, &key, &args)
            .await;
        if let Err(error) = written {
            tracing::debug!(%error, deal = taken.deal, "health not reported");
        }
    }
}

/// A line's fresh health and last published outflow, as the lease holder reads them.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    pub now_ms: i64,
    pub outflow: Option<f64>,
    pub health: Health,
}

/// Reads the line's reports: the worst p99, the 503s and breakers summed over instances.
pub async fn read(room: &WaitingRoom, deal: &str) -> Result<Reading, QueueError> {
    let keys = [
        line_key(&room.redis, deal, "meta"),
        line_key(&room.redis, deal, "health"),
    ];
    let stale = room.settings.health_stale_ms.to_string();
    let reply: Vec<String> = room
        .eval_keys(&room.scripts.health_read, &keys, &[&stale])
        .await?;
    parse_reading(&reply).ok_or_else(|| QueueError::Unexpected(format!("health {reply:?}")))
}

/// Orders answered a second over a report's window, and the window (seconds); `None` for a
/// window of no length.
fn rate(answered: &str, window_ms: &str) -> Option<(f64, f64)> {
    let answered: f64 = answered.parse().ok()?;
    let window_ms: f64 = window_ms.parse().ok()?;
    (window_ms > 0.0).then(|| (answered * 1000.0 / window_ms, window_ms / 1000.0))
}

fn parse_reading(reply: &[String]) -> Option<Reading> {
    let [now, outflow, reports @ ..] = reply else {
        return None;
    };
    let mut health = Health::default();
    for report in reports {
        let fields: Vec<&str> = report.split(',').collect();
        // Instances of earlier versions report no queue (eight fields) or no throughput
        // either (five).
        let (p99_ms, orders, refused, breaker, served, under_way, queued_ms) = match fields[..] {
            [
                _,
                p99_ms,
                orders,
                refused,
                breaker,
                answered,
                window_ms,
                under_way,
                ref queued @ ..,
            ] if queued.len() <= 1 => (
                p99_ms,
                orders,
                refused,
                breaker,
                rate(answered, window_ms),
                under_way.parse::<u64>().ok(),
                queued.first().and_then(|ms| ms.parse::<f64>().ok()),
            ),
            [_, p99_ms, orders, refused, breaker] => {
                (p99_ms, orders, refused, breaker, None, None, None)
            }
            _ => continue,
        };
        if let Some(queued_ms) = queued_ms.filter(|ms| *ms > 0.0) {
            let worst = health.queued_seconds.unwrap_or(0.0).max(queued_ms / 1000.0);
            health.queued_seconds = Some(worst);
        }
        if let Some((served, window_seconds)) = served {
            health.served_per_second = Some(health.served_per_second.unwrap_or(0.0) + served);
            let longest = health.window_seconds.unwrap_or(0.0).max(window_seconds);
            health.window_seconds = Some(longest);
        }
        if let Some(under_way) = under_way {
            health.under_way = Some(health.under_way.unwrap_or(0) + under_way);
        }
        let orders: u64 = orders.parse().unwrap_or(0);
        if let Ok(p99_ms) = p99_ms.parse::<f64>()
            && orders > 0
        {
            let worst = health.p99_seconds.unwrap_or(0.0).max(p99_ms / 1000.0);
            health.p99_seconds = Some(worst);
        }
        health.overloaded += refused.parse::<u64>().unwrap_or(0);
        health.breaker_open |= breaker == "1";
    }
    Some(Reading {
        now_ms: now.parse().ok()?,
        outflow: outflow.parse().ok(),
        health,
    })
}

#[cfg(test)]
mod tests;
