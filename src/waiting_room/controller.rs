//! The adaptive outflow: a pure decision, `decide(state, health, clock) → outflow + reason`.
//!
//! It holds the admitted buyers' order p99 in a band under the target instead of probing
//! past it. Three zones of the p99 (the worst instance's; an unanswered order counts at its
//! age, and the orders under way over the orders answered a second, the wait they face,
//! count too, so a queue building shows at once):
//! - **over the target** (or 503s, or the provider's breaker open): a cut as deep as the
//!   overshoot (a p99 four times the target keeps at most a quarter: orders admitted past
//!   capacity queue, and a shallow cut leaves the queue growing), then a cool-down, so the
//!   next decision sees the lower rate's health rather than the backlog the higher one left.
//!   The rate that was cut from, scaled by target / p99, is remembered as the back end's
//!   *ceiling*;
//! - **between the hold line** (`hold_share` of the target) **and the target**: the back end
//!   is at its capacity; the outflow is held at most at what the back end keeps up with
//!   (no higher, so not into the target), which becomes the ceiling if none is known or
//!   raises it;
//! - **under the hold line**: the outflow climbs; from 80% of a remembered ceiling on only
//!   by `probe_share` of the ceiling a second, since that is where the back end gave out
//!   last, and at the full pace elsewhere. Once the back end keeps up with 125% of the
//!   ceiling, it has recovered: the ceiling is forgotten.
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
        }
    }
}

/// Share of a remembered ceiling from which a healthy climb slows to the probing pace.
const PROBE_FROM: f64 = 0.8;
/// A back end keeping up with this share of a remembered ceiling has recovered: the
/// ceiling is forgotten and the climb goes at its full pace again.
const PROBE_TO: f64 = 1.25;

/// The queue a p99 shows is drained within this (s).
const DRAIN_SECONDS: f64 = 1.0;
/// How long the orders-per-admission estimate takes to follow a change (s).
const LEARN_SECONDS: f64 = 2.0;
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
    let health = &Health {
        p99_seconds: looked_ahead(health),
        ..*health
    };
    let hold_line = bounds.target_p99_seconds * bounds.hold_share;
    let calm = health.p99_seconds.is_none_or(|p99| p99 <= hold_line);
    let learnt = Control {
        decided_at_ms: now_ms,
        orders_per_admission: learn(
            &state,
            health,
            calm && trouble(health, bounds).is_none(),
            elapsed_s,
        ),
        ..state
    };
    let (next, reason) = zone(learnt, health, bounds, elapsed_s, now_ms);
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
    bounds: &Bounds,
    elapsed_s: f64,
    now_ms: i64,
) -> (Control, Reason) {
    let cooling = state
        .cut_at_ms
        .is_some_and(|at| now_ms - at < bounds.cut_cooldown_ms);
    let capacity = capacity(&state, health);
    let level = capacity.map(|capacity| draining(capacity, health, 0.0));
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
        let (outflow, ceiling) = match (signal, level, capacity) {
            (Reason::P99, Some(level), Some(capacity)) => {
                (state.outflow.min(level), Some(capacity))
            }
            (Reason::P99, _, _) => (
                proportional,
                Some(state.outflow * served_share(health, bounds)),
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
    // The back end has recovered once it keeps up with clearly more than the ceiling (or,
    // without a throughput to tell, once the outflow is well past it unharmed).
    let recovered = |c: f64| match capacity {
        Some(capacity) => capacity >= PROBE_TO * c,
        None => state.outflow >= PROBE_TO * c,
    };
    let (climb, ceiling) = match state.ceiling {
        Some(c) if recovered(c) => (pace, None),
        Some(c) if state.outflow >= PROBE_FROM * c => (pace.min(c * bounds.probe_share), Some(c)),
        other => (pace, other),
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
/// order is old enough to move the p99.
fn looked_ahead(health: &Health) -> Option<f64> {
    let queued = match (health.under_way, health.served_per_second) {
        (Some(under_way), Some(served)) if served > 0.0 => Some(under_way as f64 / served),
        _ => None,
    };
    match (health.p99_seconds, queued) {
        (Some(p99), Some(queued)) => Some(p99.max(queued)),
        (p99, queued) => p99.or(queued),
    }
}

/// The orders-per-admission estimate, moved towards what this window shows while the back
/// end keeps up (then the orders follow the admissions; under a queue they do not).
fn learn(state: &Control, health: &Health, calm: bool, elapsed_s: f64) -> Option<f64> {
    let seen = health
        .served_per_second
        .filter(|served| calm && *served > 0.0 && state.outflow > 0.0)
        .map(|served| {
            (served / state.outflow).clamp(ORDERS_PER_ADMISSION.0, ORDERS_PER_ADMISSION.1)
        });
    match (state.orders_per_admission, seen) {
        (None, seen) => seen,
        (Some(known), Some(seen)) => {
            let weight = (elapsed_s / LEARN_SECONDS).min(1.0);
            Some(known + (seen - known) * weight)
        }
        (known, None) => known,
    }
}

/// The admissions a second that keep up with `capacity` and drain, within
/// `DRAIN_SECONDS`, the queue the wait shows above `beyond` (the oldest order waited the
/// p99: about that many seconds of the capacity stand in line).
fn draining(capacity: f64, health: &Health, beyond: f64) -> f64 {
    let queued = (health.p99_seconds.unwrap_or(0.0) - beyond).max(0.0);
    capacity * (1.0 - queued / DRAIN_SECONDS).max(0.0)
}

/// The admissions a second the back end keeps up with: the orders it answers a second
/// (all it can while a queue stands) over the orders each admission brings.
fn capacity(state: &Control, health: &Health) -> Option<f64> {
    let served = health
        .served_per_second
        .filter(|s| s.is_finite() && *s > 0.0)?;
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
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn bounds() -> Bounds {
        Bounds {
            min_per_second: 10.0,
            max_per_second: 200.0,
            target_p99_seconds: 0.5,
            cut_keep: 0.5,
            climb_share_per_second: 0.15,
            cut_cooldown_ms: 1000,
            hold_share: 0.4,
            probe_share: 0.1,
        }
    }

    fn healthy() -> Health {
        Health {
            p99_seconds: Some(0.1),
            ..Health::default()
        }
    }

    fn slow() -> Health {
        Health {
            p99_seconds: Some(0.9),
            ..Health::default()
        }
    }

    #[test]
    fn a_slow_p99_cuts_by_the_factor_and_names_the_signal() {
        let b = bounds();
        let state = Control::resume(Some(200.0), &b, 0);
        let (after, reason) = decide(state, Some(&slow()), &b, 100);
        assert_eq!(reason, Reason::P99);
        assert_eq!(after.outflow, 100.0);
        assert_eq!(after.cut_at_ms, Some(100));
    }

    #[test]
    fn a_p99_far_past_the_target_cuts_in_proportion() {
        let b = bounds();
        let state = Control::resume(Some(200.0), &b, 0);
        let far = Health {
            p99_seconds: Some(4.0),
            ..Health::default()
        };
        let (after, reason) = decide(state, Some(&far), &b, 100);
        assert_eq!(reason, Reason::P99);
        assert_eq!(after.outflow, 25.0);
        let (floor, _) = decide(
            state,
            Some(&Health {
                p99_seconds: Some(100.0),
                ..far
            }),
            &b,
            100,
        );
        assert_eq!(floor.outflow, b.min_per_second);
    }

    #[test]
    fn each_signal_cuts_and_the_breaker_is_named_first() {
        let b = bounds();
        let state = Control::resume(Some(100.0), &b, 0);
        let overloaded = Health {
            overloaded: 3,
            ..healthy()
        };
        let breaker = Health {
            breaker_open: true,
            ..slow()
        };
        assert_eq!(
            decide(state, Some(&overloaded), &b, 10).1,
            Reason::Overloaded
        );
        assert_eq!(decide(state, Some(&breaker), &b, 10).1, Reason::BreakerOpen);
        assert_eq!(decide(state, Some(&breaker), &b, 10).0.outflow, 50.0);
    }

    #[test]
    fn no_second_cut_within_the_cooldown_and_no_climb_either() {
        let b = bounds();
        let (cut, _) = decide(Control::resume(Some(200.0), &b, 0), Some(&slow()), &b, 0);
        let (held, reason) = decide(cut, Some(&slow()), &b, 500);
        assert_eq!((held.outflow, reason), (100.0, Reason::Cooling));
        let (held, reason) = decide(held, Some(&healthy()), &b, 900);
        assert_eq!((held.outflow, reason), (100.0, Reason::Cooling));
        let (again, reason) = decide(held, Some(&slow()), &b, 1000);
        assert_eq!((again.outflow, reason), (50.0, Reason::P99));
    }

    #[test]
    fn health_climbs_by_the_share_per_second_up_to_the_maximum() {
        let b = bounds();
        let state = Control::resume(Some(10.0), &b, 0);
        let (after, reason) = decide(state, Some(&healthy()), &b, 1000);
        assert_eq!(reason, Reason::Healthy);
        assert!((after.outflow - (10.0 + 190.0 * 0.15)).abs() < 1e-9);
        let (top, _) = decide(after, Some(&healthy()), &b, 100_000);
        assert_eq!(top.outflow, 200.0);
    }

    #[test]
    fn no_order_in_the_window_is_healthy() {
        let b = bounds();
        let quiet = Health::default();
        let (after, reason) = decide(Control::resume(None, &b, 0), Some(&quiet), &b, 1000);
        assert_eq!(reason, Reason::Healthy);
        assert!(after.outflow > b.min_per_second);
    }

    #[test]
    fn without_health_the_floor() {
        let b = bounds();
        let (after, reason) = decide(Control::resume(Some(150.0), &b, 0), None, &b, 10);
        assert_eq!((after.outflow, reason), (10.0, Reason::NoHealth));
    }

    #[test]
    fn a_takeover_resumes_from_the_published_outflow_within_bounds() {
        let b = bounds();
        assert_eq!(Control::resume(Some(73.0), &b, 0).outflow, 73.0);
        assert_eq!(Control::resume(None, &b, 0).outflow, 10.0);
        assert_eq!(Control::resume(Some(1e9), &b, 0).outflow, 200.0);
        assert_eq!(Control::resume(Some(f64::NAN), &b, 0).outflow, 10.0);
    }

    #[test]
    fn from_the_floor_back_within_a_fifth_of_the_maximum_in_ten_seconds() {
        let b = bounds();
        let mut state = Control::resume(None, &b, 0);
        for step in 1..=100 {
            state = decide(state, Some(&healthy()), &b, step * 100).0;
        }
        assert!(state.outflow >= 0.8 * b.max_per_second, "{state:?}");
    }

    #[test]
    fn near_the_target_the_outflow_holds_and_the_rate_is_remembered_as_the_ceiling() {
        let b = bounds();
        let near = Health {
            p99_seconds: Some(0.4),
            ..Health::default()
        };
        let (after, reason) = decide(Control::resume(Some(100.0), &b, 0), Some(&near), &b, 1000);
        assert_eq!(reason, Reason::NearTarget);
        assert_eq!(after.outflow, 100.0);
        assert_eq!(after.ceiling, Some(100.0));
    }

    #[test]
    fn the_climb_slows_near_the_ceiling_until_the_back_end_keeps_up_with_more() {
        let b = bounds();
        let pace = 190.0 * 0.15;
        let at = |outflow: f64| Control {
            outflow,
            cut_at_ms: None,
            decided_at_ms: 0,
            ceiling: Some(100.0),
            orders_per_admission: Some(1.0),
        };
        let serving = |served: f64| Health {
            served_per_second: Some(served),
            ..healthy()
        };
        let climb =
            |outflow: f64, served: f64| decide(at(outflow), Some(&serving(served)), &b, 1000).0;
        assert!((climb(50.0, 50.0).outflow - (50.0 + pace)).abs() < 1e-9);
        assert!((climb(90.0, 90.0).outflow - (90.0 + 10.0)).abs() < 1e-9);
        let above = climb(140.0, 110.0);
        assert!((above.outflow - 150.0).abs() < 1e-9, "{above:?}");
        assert_eq!(above.ceiling, Some(100.0), "not yet kept up with 125");
        let recovered = climb(140.0, 130.0);
        assert!((recovered.outflow - (140.0 + pace)).abs() < 1e-9);
        assert_eq!(recovered.ceiling, None);
    }

    /// A back end serving `capacity` orders a second, slowed for a span: what the admitted
    /// buyers' orders meet, step by step (50 ms, as the advancer moves), with the orders of
    /// a rate arriving `LAG_MS` after it admitted them (a buyer polls, then orders).
    struct Sale {
        queue: f64,
        arrivals: std::collections::VecDeque<f64>,
        /// Orders answered in the report window under way, and the last window's rate.
        answered: f64,
        served: Option<f64>,
    }

    const STEP_MS: i64 = 50;
    const LAG_MS: i64 = 300;
    const REPORT_MS: i64 = 250;
    const SERVICE_S: f64 = 0.02;

    impl Sale {
        fn new() -> Self {
            let lag = (LAG_MS / STEP_MS) as usize;
            Self {
                queue: 0.0,
                arrivals: std::iter::repeat_n(0.0, lag).collect(),
                answered: 0.0,
                served: None,
            }
        }

        /// One step at `outflow` against `capacity` at `now`: the health the instances
        /// report (the p99 is the oldest order waiting: the queue ahead of it served at
        /// the capacity; the throughput is the last report window's).
        fn step(&mut self, outflow: f64, capacity: f64, now: i64) -> Health {
            let dt = STEP_MS as f64 / 1000.0;
            self.arrivals.push_back(outflow * dt);
            let arrived = self.arrivals.pop_front().unwrap_or(0.0);
            let answered = (self.queue + arrived).min(capacity * dt);
            self.queue = self.queue + arrived - answered;
            self.answered += answered;
            if now % REPORT_MS == 0 {
                self.served = Some(self.answered * 1000.0 / REPORT_MS as f64);
                self.answered = 0.0;
            }
            Health {
                p99_seconds: Some(self.queue / capacity + SERVICE_S),
                served_per_second: self.served,
                under_way: Some(self.queue.round() as u64),
                ..Health::default()
            }
        }
    }

    /// Runs 10 s healthy at the maximum's capacity, 20 s at `slowed`, 15 s healthy again;
    /// the worst p99 from 5 s into the slowdown to its end, and how long after it the
    /// outflow was back within 20% of the maximum.
    fn slowdown(slowed: f64) -> (f64, Option<f64>) {
        let b = Bounds {
            min_per_second: 2.0,
            max_per_second: 60.0,
            target_p99_seconds: 0.3,
            ..bounds()
        };
        let (mut sale, mut state) = (Sale::new(), Control::resume(None, &b, 0));
        let (mut worst, mut back) = (0.0f64, None);
        for step in 0..(45_000 / STEP_MS) {
            let now = step * STEP_MS;
            let capacity = if (10_000..30_000).contains(&now) {
                slowed
            } else {
                80.0
            };
            let health = sale.step(state.outflow, capacity, now);
            let p99 = health.p99_seconds.unwrap_or(0.0);
            if (15_000..30_000).contains(&now) {
                worst = worst.max(p99);
            }
            if now >= 30_000 && back.is_none() && state.outflow >= 0.8 * b.max_per_second {
                back = Some((now - 30_000) as f64 / 1000.0);
            }
            state = decide(state, Some(&health), &b, now).0;
        }
        (worst, back)
    }

    #[test]
    fn a_slowdown_to_a_third_or_a_tenth_is_held_under_the_target_and_left_within_ten_seconds() {
        for slowed in [20.0, 6.0] {
            let (worst, back) = slowdown(slowed);
            assert!(
                worst < 0.3,
                "slowed to {slowed}/s: p99 {worst:.3} s after the first 5 s"
            );
            assert!(
                back.is_some_and(|s| s <= 10.0),
                "slowed to {slowed}/s: back within 20% of the maximum after {back:?} s"
            );
        }
    }

    #[test]
    fn orders_piling_up_count_before_the_oldest_is_old() {
        let b = bounds();
        let piling = Health {
            p99_seconds: Some(0.1),
            served_per_second: Some(10.0),
            under_way: Some(30),
            ..Health::default()
        };
        assert_eq!(
            looked_ahead(&piling),
            Some(3.0),
            "30 under way at 10 a second"
        );
        let state = Control {
            orders_per_admission: Some(1.0),
            ..Control::resume(Some(100.0), &b, 0)
        };
        let (after, reason) = decide(state, Some(&piling), &b, 100);
        assert_eq!(reason, Reason::P99);
        assert_eq!(
            after.outflow, b.min_per_second,
            "a 3 s queue drains at the floor"
        );
        assert_eq!(after.ceiling, Some(10.0));
    }

    fn any_health() -> impl Strategy<Value = Option<Health>> {
        let health = (
            proptest::option::of(0.0f64..5.0),
            0u64..3,
            proptest::bool::ANY,
        )
            .prop_map(|(p99_seconds, overloaded, breaker_open)| Health {
                p99_seconds,
                overloaded,
                breaker_open,
                served_per_second: None,
                under_way: None,
            });
        proptest::option::weighted(0.9, health)
    }

    proptest! {
        #[test]
        fn the_outflow_stays_in_bounds_and_moves_the_right_way(
            start in proptest::option::of(-100.0f64..1000.0),
            steps in proptest::collection::vec((any_health(), 0i64..3000), 1..60),
        ) {
            let b = bounds();
            let mut now = 0;
            let mut state = Control::resume(start, &b, now);
            for (health, gap) in steps {
                now += gap;
                let (next, reason) = decide(state, health.as_ref(), &b, now);
                prop_assert!(next.outflow >= b.min_per_second && next.outflow <= b.max_per_second);
                match health {
                    None => prop_assert_eq!(next.outflow, b.min_per_second),
                    Some(h) if trouble(&h, &b).is_some() => {
                        prop_assert!(next.outflow <= state.outflow);
                        prop_assert!(reason.is_cut() || reason == Reason::Cooling);
                    }
                    Some(h) if h.p99_seconds.is_some_and(|p| p > b.target_p99_seconds * b.hold_share) => {
                        prop_assert!(next.outflow <= state.outflow);
                    }
                    Some(_) => prop_assert!(next.outflow >= state.outflow),
                }
                if reason.is_cut() {
                    let keep = cut_keep(&health.unwrap_or_default(), &b, reason);
                    prop_assert!(keep <= b.cut_keep && keep > 0.0);
                    let expected = (state.outflow * keep).max(b.min_per_second);
                    prop_assert!((next.outflow - expected).abs() < 1e-9);
                    prop_assert!(state.cut_at_ms.is_none_or(|at| now - at >= b.cut_cooldown_ms));
                }
                state = next;
            }
        }
    }
}
