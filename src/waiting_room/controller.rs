//! The adaptive outflow: a pure decision, `decide(state, health, clock) → outflow + reason`.
//!
//! It holds the admitted buyers' order p99 in a band under the target instead of probing
//! past it. Three zones of the p99 (the worst instance's; an unanswered order counts at its
//! age, and the wait the orders under way face, by their count over the rate they are
//! answered at on all the instances and on each, counts too, so a queue building shows at
//! once):
//! - **over the target** (or 503s, or the provider's breaker open): a cut as deep as the
//!   overshoot (a p99 four times the target keeps at most a quarter: orders admitted past
//!   capacity queue, and a shallow cut leaves the queue growing), then a cool-down, so the
//!   next decision sees the lower rate's health rather than the backlog the higher one left.
//!   What the back end kept up with when it was cut becomes the *ceiling*, or lowers the
//!   one remembered;
//! - **between the hold line** (`hold_share` of the target) **and the target**: the back end
//!   is at its capacity; the outflow is held at most at what the back end keeps up with
//!   (no higher, so not into the target), which becomes the ceiling if none is known or
//!   raises it;
//! - **under the hold line**: the outflow climbs; under a remembered ceiling only by
//!   `probe_share` of the ceiling a second, since that is where the back end gave out last,
//!   and at the full pace without one. Once the back end keeps up with 125% of the ceiling,
//!   or its orders wait next to nothing for a while, it has recovered: the ceiling is
//!   forgotten.
//!
//! What the back end keeps up with is read from its throughput sustained over a second and
//! the buyers the line admitted, not from one report window: at a few orders a second a
//! window holds none or a burst of them. The window still tells the wait (a queue must show
//! at once) and, at a slowdown's onset, the lower rate a cut goes by.
//!
//! The outflow never leaves the deal's `[min_per_second, max_per_second]`. The advancer
//! feeds it (`advancer`), the instances' reports come through Redis (`health`); nothing
//! here does IO, so every rule is tested on its own.

/// The deal's bounds and target, and the loop's tuning (`waiting_room.adaptive_*`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bounds {
    pub min_per_second: f64,
    pub max_per_second: f64,
    /// Admitted buyers' order p99 above which the outflow is cut (seconds).
    pub target_p99_seconds: f64,
    /// What a cut keeps of the outflow (0-1).
    pub cut_keep: f64,
    /// Added per second of health, as a share of `max - min`.
    pub climb_share_per_second: f64,
    /// After a cut, no other cut and no climb for this long (ms).
    pub cut_cooldown_ms: i64,
    /// The hold line, as a share of the target (0-1): above it the outflow eases down.
    pub hold_share: f64,
    /// The climb from near a remembered ceiling on, as a share of the ceiling per second
    /// (0-1): the same few seconds past it whatever its size.
    pub probe_share: f64,
}

/// What every instance measured over its last window, merged.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Health {
    /// The worst instance's order p99 for passes of this deal (seconds); `None` without
    /// any order in the window.
    pub p99_seconds: Option<f64>,
    /// Orders of pass holders answered 503 (pool exhausted, database unavailable).
    pub overloaded: u64,
    /// Whether any instance saw the payment provider's breaker open.
    pub breaker_open: bool,
    /// Orders of pass holders answered a second, summed over the instances; `None` when
    /// no report tells it.
    pub served_per_second: Option<f64>,
    /// Orders of pass holders under way, summed over the instances; `None` when no report
    /// tells it.
    pub under_way: Option<u64>,
    /// The longest report window the throughput was measured over (seconds); `None` when
    /// no report tells it.
    pub window_seconds: Option<f64>,
    /// The worst wait an instance's own orders under way face, by its count of them over
    /// the rate it answered since the oldest was sent (seconds); `None` when no instance has
    /// one under way or none tells it.
    pub queued_seconds: Option<f64>,
}

/// Why the outflow is what it is; logged on a cut, shown as a label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Healthy: the outflow climbs (or stays at the maximum).
    Healthy,
    /// Orders were slower than the target at p99.
    P99,
    /// Orders were refused 503 for want of database capacity.
    Overloaded,
    /// The payment provider's breaker is open.
    BreakerOpen,
    /// Unhealthy, but a cut was made within the cool-down: held.
    Cooling,
    /// The p99 between the hold line and the target: at capacity, held there.
    NearTarget,
    /// No health could be read (Redis unreachable): the floor, never more.
    NoHealth,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Healthy => "healthy",
            Reason::P99 => "p99_over_target",
            Reason::Overloaded => "overloaded",
            Reason::BreakerOpen => "breaker_open",
            Reason::Cooling => "cooling",
            Reason::NearTarget => "p99_near_target",
            Reason::NoHealth => "no_health",
        }
    }

    /// Whether this reason lowers the outflow.
    pub fn is_cut(self) -> bool {
        matches!(self, Reason::P99 | Reason::Overloaded | Reason::BreakerOpen)
    }
}

/// A line's loop between two steps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Control {
    pub outflow: f64,
    /// When the last cut was made (ms); `None` before any.
    pub cut_at_ms: Option<i64>,
    /// When the loop last decided (ms).
    pub decided_at_ms: i64,
    /// The rate the back end last gave out at (per second); `None` before any cut for
    /// slowness, or once a healthy climb left it well behind.
    pub ceiling: Option<f64>,
    /// Orders answered per buyer admitted, learnt while healthy; `None` before any.
    pub orders_per_admission: Option<f64>,
    /// Buyers the line admitted since the last decision (the advancer counts them): the
    /// outflow is only what the line may admit, and a line with few waiting admits less.
    pub admitted_since: f64,
    /// Buyers admitted a second, smoothed over `SUSTAINED_SECONDS` as the orders answered
    /// are, so their ratio holds while both fall after a cut; `None` before any count.
    pub admitted_per_second: Option<f64>,
    /// Orders answered a second, smoothed over `SUSTAINED_SECONDS`; `None` before any.
    pub served_per_second: Option<f64>,
    /// The p99 (looked ahead), smoothed over `SUSTAINED_SECONDS`; `None` before any.
    pub p99_seconds: Option<f64>,
}

impl Control {
    /// A loop taking over at `outflow` (the last one published, when there is one; the
    /// minimum otherwise): never from zero, never from the maximum by default.
    pub fn resume(published: Option<f64>, bounds: &Bounds, now_ms: i64) -> Self {
        let start = published
            .filter(|rate| rate.is_finite())
            .unwrap_or(bounds.min_per_second);
        Self {
            outflow: clamp(start, bounds),
            cut_at_ms: None,
            decided_at_ms: now_ms,
            ceiling: None,
            orders_per_admission: None,
            admitted_since: 0.0,
            admitted_per_second: None,
            served_per_second: None,
            p99_seconds: None,
        }
    }
}

/// A back end keeping up with this share of a remembered ceiling has recovered: the
/// ceiling is forgotten and the climb goes at its full pace again.
const PROBE_TO: f64 = 1.25;

/// The queue a p99 shows is drained within this (s).
const DRAIN_SECONDS: f64 = 1.0;
/// How long the orders-per-admission estimate takes to follow a change (s).
const LEARN_SECONDS: f64 = 2.0;
/// How long the throughput, the admissions and the p99 are smoothed over (s): a slowed back
/// end answers in bursts (a lock let go answers every order waiting on it), and one window's
/// burst is not a back end keeping up with more.
const SUSTAINED_SECONDS: f64 = 1.0;
/// A p99 sustained under this share of the hold line is a back end that has recovered.
const QUIET_SHARE: f64 = 0.25;
/// Bounds of the orders-per-admission estimate. Above one, a rate just lowered would read as
/// more orders per buyer (the orders of the higher rate still arriving) and the back end's
/// capacity as less than it is; a buyer ordering twice a pass is then under-counted, which
/// the p99's zones still bound.
const ORDERS_PER_ADMISSION: (f64, f64) = (0.05, 1.0);

/// The new state and why. `health` is `None` when it could not be read.
pub fn decide(
    state: Control,
    health: Option<&Health>,
    bounds: &Bounds,
    now_ms: i64,
) -> (Control, Reason) {
    let elapsed_s = (now_ms - state.decided_at_ms).max(0) as f64 / 1000.0;
    let Some(health) = health else {
        let floor = Control {
            decided_at_ms: now_ms,
            outflow: bounds.min_per_second,
            ..state
        };
        return (floor, Reason::NoHealth);
    };
    // A p99 over the target from a queue tells the rate the back end gives out at; one
    // from a lone slow order does not.
    let queue_stands = queued(health).is_some_and(|wait| wait > bounds.target_p99_seconds);
    let health = &Health {
        p99_seconds: looked_ahead(health),
        ..*health
    };
    let hold_line = bounds.target_p99_seconds * bounds.hold_share;
    let calm = health.p99_seconds.is_none_or(|p99| p99 <= hold_line);
    let counted = Control {
        served_per_second: smoothed(
            state.served_per_second,
            health.served_per_second,
            elapsed_s / SUSTAINED_SECONDS,
        ),
        p99_seconds: smoothed(
            state.p99_seconds,
            health.p99_seconds,
            elapsed_s / SUSTAINED_SECONDS,
        ),
        ..count_admissions(&state, elapsed_s)
    };
    let learnt = Control {
        decided_at_ms: now_ms,
        orders_per_admission: learn(
            &counted,
            calm && trouble(health, bounds).is_none(),
            elapsed_s,
        ),
        ..counted
    };
    let (next, reason) = zone(learnt, health, queue_stands, bounds, elapsed_s, now_ms);
    (
        Control {
            outflow: clamp(next.outflow, bounds),
            ..next
        },
        reason,
    )
}

/// The decision by the p99's zone (see the module's comment), before the bounds.
fn zone(
    state: Control,
    health: &Health,
    queue_stands: bool,
    bounds: &Bounds,
    elapsed_s: f64,
    now_ms: i64,
) -> (Control, Reason) {
    let cooling = state
        .cut_at_ms
        .is_some_and(|at| now_ms - at < bounds.cut_cooldown_ms);
    let capacity = capacity(&state);
    // A cut goes by the lower of the sustained rate and the window's: at a slowdown's onset
    // only the window shows the back end answering less.
    let now_capacity = health
        .served_per_second
        .and_then(|served| admissions_for(served, &state));
    let level = match (capacity, now_capacity) {
        (Some(sustained), Some(now)) => Some(sustained.min(now)),
        (sustained, now) => sustained.or(now),
    }
    .map(|capacity| draining(capacity, health, 0.0));
    if let Some(signal) = trouble(health, bounds) {
        // What the back end serves is measured now, unlike the p99's queue: a rate still
        // above it is lowered within the cool-down too.
        if cooling {
            let held = Control {
                outflow: level.map_or(state.outflow, |level| state.outflow.min(level)),
                ..state
            };
            return (held, Reason::Cooling);
        }
        let proportional = state.outflow * cut_keep(health, bounds, signal);
        let lowered = |estimate: f64| match state.ceiling {
            Some(c) if queue_stands => Some(c.min(estimate)),
            Some(c) => Some(c),
            None => Some(estimate),
        };
        let (outflow, ceiling) = match (signal, level, capacity) {
            (Reason::P99, Some(level), Some(capacity)) => {
                (state.outflow.min(level), lowered(capacity))
            }
            (Reason::P99, _, _) => (
                proportional,
                lowered(state.outflow * served_share(health, bounds)),
            ),
            _ => (proportional, state.ceiling),
        };
        let cut = Control {
            outflow,
            cut_at_ms: Some(now_ms),
            ceiling,
            ..state
        };
        return (cut, signal);
    }
    if cooling {
        return (state, Reason::Cooling);
    }
    let pace = (bounds.max_per_second - bounds.min_per_second) * bounds.climb_share_per_second;
    let hold_line = bounds.target_p99_seconds * bounds.hold_share;
    if health.p99_seconds.is_some_and(|p99| p99 > hold_line) {
        // At capacity: the outflow goes no higher than what the back end keeps up with, less
        // what drains the wait above the hold line (the wait under it may be the back end's
        // own pace, and draining it would feed on itself). Without a queue what it keeps
        // up with may be only what it is sent, so it raises a remembered ceiling but never
        // lowers one: only a cut, made under a queue, does.
        let (outflow, ceiling) = match capacity {
            Some(capacity) => (
                state.outflow.min(draining(capacity, health, hold_line)),
                state.ceiling.map_or(capacity, |c| c.max(capacity)),
            ),
            None => (state.outflow, state.ceiling.unwrap_or(state.outflow)),
        };
        let held = Control {
            outflow,
            ceiling: Some(ceiling),
            ..state
        };
        return (held, Reason::NearTarget);
    }
    // The back end has recovered once it keeps up with clearly more than the ceiling for a
    // while (or, without a throughput to tell, once the outflow is well past it unharmed),
    // or once its orders have waited next to nothing for a while: a back end that still
    // gives out makes the few orders it gets wait on what slows it.
    let quiet = state
        .p99_seconds
        .zip(health.p99_seconds)
        .is_some_and(|(sustained, now)| sustained.max(now) <= QUIET_SHARE * hold_line);
    let recovered = |c: f64| {
        quiet
            || match capacity {
                Some(capacity) => capacity >= PROBE_TO * c,
                None => state.outflow >= PROBE_TO * c,
            }
    };
    let (climb, ceiling) = match state.ceiling {
        Some(c) if recovered(c) => (pace, None),
        Some(c) => (pace.min(c * bounds.probe_share), Some(c)),
        None => (pace, None),
    };
    let climbed = Control {
        outflow: state.outflow + climb * elapsed_s,
        ceiling,
        ..state
    };
    (climbed, Reason::Healthy)
}

/// The worse of the p99 and the wait the orders under way face (by Little's law, their
/// count over the orders answered a second): a queue shows in the count before its oldest
/// order is old enough to move the p99. A window without an answer while the oldest order
/// waited through all of it served fewer than one order a window: each order under way
/// then stands at least a window's wait.
fn looked_ahead(health: &Health) -> Option<f64> {
    match (health.p99_seconds, queued(health)) {
        (Some(p99), Some(queued)) => Some(p99.max(queued)),
        (p99, queued) => p99.or(queued),
    }
}

/// The wait the orders under way face: the worse of their count over the orders all the
/// instances answered a second (see `looked_ahead`) and the worst instance's own queue
/// (`Health::queued_seconds`: each instance drains its own).
fn queued(health: &Health) -> Option<f64> {
    match (summed_queue(health), health.queued_seconds) {
        (Some(summed), Some(own)) => Some(summed.max(own)),
        (summed, own) => summed.or(own),
    }
}

/// The wait the orders under way face by their count over all the instances, once the
/// oldest of them has waited longer than the back end takes an order: at a few orders a
/// second, two orders just sent to a back end answering in milliseconds are not a queue.
fn summed_queue(health: &Health) -> Option<f64> {
    let waited = |seconds: f64| health.p99_seconds.is_some_and(|p99| p99 >= seconds);
    match (
        health.under_way,
        health.served_per_second,
        health.window_seconds,
    ) {
        (Some(under_way), Some(served), _) if served > 0.0 => {
            waited(1.0 / served).then(|| under_way as f64 / served)
        }
        (Some(under_way), Some(_), Some(window)) if under_way > 0 && waited(window) => {
            Some(under_way as f64 * window)
        }
        _ => None,
    }
}

/// The admissions counted since the last decision folded into the smoothed rate.
fn count_admissions(state: &Control, elapsed_s: f64) -> Control {
    if elapsed_s <= 0.0 {
        return *state;
    }
    Control {
        admitted_since: 0.0,
        admitted_per_second: smoothed(
            state.admitted_per_second,
            Some(state.admitted_since / elapsed_s),
            elapsed_s / SUSTAINED_SECONDS,
        ),
        ..*state
    }
}

/// `known` moved towards `seen` by `weight` (at most all the way); the first `seen` as it is.
fn smoothed(known: Option<f64>, seen: Option<f64>, weight: f64) -> Option<f64> {
    match (known, seen.filter(|s| s.is_finite())) {
        (Some(known), Some(seen)) => Some(known + (seen - known) * weight.min(1.0)),
        (known, seen) => seen.or(known),
    }
}

/// The orders-per-admission estimate, moved towards the sustained ratio of orders answered to
/// buyers admitted while the back end keeps up (then the orders follow the admissions; under
/// a queue they do not).
fn learn(state: &Control, calm: bool, elapsed_s: f64) -> Option<f64> {
    let admitted = state.admitted_per_second.unwrap_or(0.0);
    let seen = state
        .served_per_second
        .filter(|served| calm && *served > 0.0 && admitted > 0.0)
        .map(|served| (served / admitted).clamp(ORDERS_PER_ADMISSION.0, ORDERS_PER_ADMISSION.1));
    smoothed(state.orders_per_admission, seen, elapsed_s / LEARN_SECONDS)
}

/// The admissions a second that keep up with `capacity` and drain, within
/// `DRAIN_SECONDS`, the queue the wait shows above `beyond` (the oldest order waited the
/// p99: about that many seconds of the capacity stand in line).
fn draining(capacity: f64, health: &Health, beyond: f64) -> f64 {
    let queued = (health.p99_seconds.unwrap_or(0.0) - beyond).max(0.0);
    capacity * (1.0 - queued / DRAIN_SECONDS).max(0.0)
}

/// The admissions a second the back end keeps up with: the orders it answers a second
/// (all it can while a queue stands), sustained over `SUSTAINED_SECONDS`, over the orders
/// each admission brings. At a few orders a second one report window holds none or a
/// burst of them; the wait they face is read from the window (`looked_ahead`), the rate
/// they can go at is not.
fn capacity(state: &Control) -> Option<f64> {
    let served = state
        .served_per_second
        .filter(|s| s.is_finite() && *s > 0.0)?;
    admissions_for(served, state)
}

/// The admissions a second that bring `served` orders a second; `None` before the orders
/// per admission are learnt.
fn admissions_for(served: f64, state: &Control) -> Option<f64> {
    Some(served / state.orders_per_admission?)
}

/// The strongest bad signal in `health`, if any: a breaker first (payments fail whatever
/// the rate), then refusals, then slowness.
fn trouble(health: &Health, bounds: &Bounds) -> Option<Reason> {
    if health.breaker_open {
        return Some(Reason::BreakerOpen);
    }
    if health.overloaded > 0 {
        return Some(Reason::Overloaded);
    }
    health
        .p99_seconds
        .filter(|p99| *p99 > bounds.target_p99_seconds)
        .map(|_| Reason::P99)
}

/// What a cut for `signal` keeps of the outflow: `cut_keep`, or less for a p99 further past
/// the target than that, in proportion (the rate the back end served within the target).
fn cut_keep(health: &Health, bounds: &Bounds, signal: Reason) -> f64 {
    match (signal, health.p99_seconds) {
        (Reason::P99, Some(p99)) if p99 > 0.0 => {
            bounds.cut_keep.min(bounds.target_p99_seconds / p99)
        }
        _ => bounds.cut_keep,
    }
}

/// What share of its outflow the back end served within the target: target / p99 for a
/// p99 past it, all of it otherwise.
fn served_share(health: &Health, bounds: &Bounds) -> f64 {
    match health.p99_seconds {
        Some(p99) if p99 > bounds.target_p99_seconds => bounds.target_p99_seconds / p99,
        _ => 1.0,
    }
}

fn clamp(outflow: f64, bounds: &Bounds) -> f64 {
    if outflow.is_nan() {
        return bounds.min_per_second;
    }
    outflow.clamp(bounds.min_per_second, bounds.max_per_second)
}

#[cfg(test)]
mod tests;
