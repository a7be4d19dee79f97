//! The adaptive outflow: a pure decision, `decide(state, health, clock) → outflow + reason`.
//!
//! Additive increase while the admitted buyers are served well, multiplicative cut when
//! they are not (AIMD, as TCP finds a path's capacity): the back end's capacity is found
//! by probing it, not guessed before the sale. A cut is followed by a cool-down, so the
//! next decision sees the health of the lower rate rather than the queue the higher one
//! left behind. The outflow never leaves the deal's `[min_per_second, max_per_second]`.
//! The advancer feeds it (`advancer`), the instances' reports come through Redis
//! (`health`); nothing here does IO, so every rule is tested on its own.

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
        }
    }
}

/// The new state and why. `health` is `None` when it could not be read.
pub fn decide(
    state: Control,
    health: Option<&Health>,
    bounds: &Bounds,
    now_ms: i64,
) -> (Control, Reason) {
    let elapsed_ms = (now_ms - state.decided_at_ms).max(0);
    let next = |outflow: f64, cut_at_ms: Option<i64>| Control {
        outflow: clamp(outflow, bounds),
        cut_at_ms,
        decided_at_ms: now_ms,
    };
    let Some(health) = health else {
        return (
            next(bounds.min_per_second, state.cut_at_ms),
            Reason::NoHealth,
        );
    };
    let cooling = state
        .cut_at_ms
        .is_some_and(|at| now_ms - at < bounds.cut_cooldown_ms);
    if let Some(signal) = trouble(health, bounds) {
        if cooling {
            return (next(state.outflow, state.cut_at_ms), Reason::Cooling);
        }
        return (next(state.outflow * bounds.cut_keep, Some(now_ms)), signal);
    }
    if cooling {
        return (next(state.outflow, state.cut_at_ms), Reason::Cooling);
    }
    let span = bounds.max_per_second - bounds.min_per_second;
    let climb = span * bounds.climb_share_per_second * elapsed_ms as f64 / 1000.0;
    (
        next(state.outflow + climb, state.cut_at_ms),
        Reason::Healthy,
    )
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
                    Some(_) => prop_assert!(next.outflow >= state.outflow),
                }
                if reason.is_cut() {
                    let expected = (state.outflow * b.cut_keep).max(b.min_per_second);
                    prop_assert!((next.outflow - expected).abs() < 1e-9);
                    prop_assert!(state.cut_at_ms.is_none_or(|at| now - at >= b.cut_cooldown_ms));
                }
                state = next;
            }
        }
    }
}
