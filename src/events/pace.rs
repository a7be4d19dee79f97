//! How fast the feed grows, and whether deliveries give way to the sale that makes it grow.
//!
//! A hot sale writes thousands of events a second. Delivering them meanwhile costs the sale
//! more than their CPU: on a 2-core machine a receiver taking every event at once cost a
//! 100,000-unit sale 15 to 20 % of its purchases a second, even with the deliveries at the
//! lowest CPU priority, because a purchase's chain of wake-ups (client, gateway,
//! PostgreSQL) waits behind theirs. So while the sequencer positions more than
//! `events.yield_above_per_second` events a second, an endpoint holds an event back until it
//! is `events.yield_max_ms` old: a sale shorter than that delivers its events right after
//! it ends, and a longer one delivers them that far behind, at the rate they come.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use crate::clock::Clock;

/// The window the feed's rate is counted over.
const WINDOW: Duration = Duration::from_secs(1);

/// The feed's growth, as counted by the sequencer and read by the endpoints.
#[derive(Debug, Default)]
pub struct Pace {
    window: Mutex<Window>,
}

#[derive(Debug, Default)]
struct Window {
    /// When the current window began; `None` before the first round.
    started: Option<Instant>,
    positioned: u64,
    /// The last full window's rate, and when it ended.
    per_second: f64,
    measured_at: Option<Instant>,
}

impl Pace {
    /// Counts `positioned` events given a feed position at `now`.
    pub fn record(&self, positioned: usize, now: Instant) {
        let mut window = self.window.lock().unwrap_or_else(|e| e.into_inner());
        let started = *window.started.get_or_insert(now);
        window.positioned = window
            .positioned
            .saturating_add(u64::try_from(positioned).unwrap_or(u64::MAX));
        let elapsed = now.saturating_duration_since(started);
        if elapsed >= WINDOW {
            window.per_second = window.positioned as f64 / elapsed.as_secs_f64();
            window.measured_at = Some(now);
            window.started = Some(now);
            window.positioned = 0;
        }
    }

    /// Events positioned a second: the last full window's rate, or more when the window
    /// under way has already counted more. A window under way counts over at least a whole
    /// window, so it weighs in as soon as it holds more, and goes on counting past its end
    /// until a round closes it: a round straddling the end of a sale's first window does not
    /// make the feed look calm. 0 when the sequencer went quiet (no window ended in the last
    /// two, and the one under way counted nothing).
    pub fn per_second(&self, now: Instant) -> f64 {
        let window = self.window.lock().unwrap_or_else(|e| e.into_inner());
        let last = match window.measured_at {
            Some(at) if now.saturating_duration_since(at) <= 2 * WINDOW => window.per_second,
            _ => 0.0,
        };
        let under_way = window.started.map_or(0.0, |at| {
            let counted_over = now.saturating_duration_since(at).max(WINDOW);
            window.positioned as f64 / counted_over.as_secs_f64()
        });
        last.max(under_way)
    }
}

/// When to give way: above which rate, and how far behind the feed at most.
#[derive(Clone, Copy, Debug)]
pub struct Yield {
    pub above_per_second: u64,
    pub max: Duration,
}

/// How long to hold back an endpoint whose oldest undelivered event committed at
/// `oldest`: `None` to deliver now. While holding, it looks again at least every `recheck`.
pub fn hold(
    pace: &Pace,
    rule: Yield,
    clock: &Clock,
    oldest: DateTime<Utc>,
    recheck: Duration,
) -> Option<Duration> {
    let per_second = pace.per_second(clock.instant());
    if rule.above_per_second == 0 || per_second <= rule.above_per_second as f64 {
        return None;
    }
    let age = (clock.now() - oldest).to_std().unwrap_or(Duration::ZERO);
    let left = rule.max.checked_sub(age).filter(|left| !left.is_zero())?;
    Some(left.min(recheck))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    const RECHECK: Duration = Duration::from_millis(250);

    fn rule() -> Yield {
        Yield {
            above_per_second: 1_000,
            max: Duration::from_secs(30),
        }
    }

    #[test]
    fn the_rate_is_counted_over_whole_windows_and_forgotten_when_the_sequencer_goes_quiet() {
        let pace = Pace::default();
        let start = ManualClock::starting_now().clock().instant();
        for tenth in 0..10 {
            pace.record(500, start + Duration::from_millis(100 * tenth));
        }
        assert_eq!(
            pace.per_second(start + Duration::from_millis(900)),
            5_000.0,
            "a window under way counts as soon as it holds more"
        );
        pace.record(500, start + WINDOW);
        assert_eq!(pace.per_second(start + WINDOW), 5_500.0);
        assert_eq!(pace.per_second(start + 3 * WINDOW), 5_500.0);
        assert_eq!(
            pace.per_second(start + 3 * WINDOW + Duration::from_millis(1)),
            0.0
        );
    }

    #[test]
    fn a_round_straddling_the_end_of_a_sales_first_window_keeps_the_feed_hot() {
        let pace = Pace::default();
        let start = ManualClock::starting_now().clock().instant();
        pace.record(0, start);
        pace.record(0, start + WINDOW);
        pace.record(20, start + WINDOW + Duration::from_millis(900));
        let straddling = start + 2 * WINDOW + Duration::from_millis(50);
        assert!(
            pace.per_second(straddling) > 19.0,
            "the window under way counts until a round closes it, not 0 because the last closed one was calm"
        );
        pace.record(0, straddling);
        assert!(pace.per_second(straddling) > 19.0);
    }

    #[test]
    fn a_rate_between_whole_numbers_is_above_the_lower_one() {
        let pace = Pace::default();
        let start = ManualClock::starting_now().clock().instant();
        pace.record(0, start);
        pace.record(3, start + 2 * WINDOW);
        assert_eq!(pace.per_second(start + 2 * WINDOW), 1.5);
    }

    /// A manual clock and a pace that counted `per_second` over the window just ended.
    fn measured(per_second: usize) -> (ManualClock, Pace) {
        let manual = ManualClock::starting_now();
        let pace = Pace::default();
        pace.record(0, manual.clock().instant());
        manual.advance(WINDOW);
        pace.record(per_second, manual.clock().instant());
        (manual, pace)
    }

    #[test]
    fn a_hot_feed_holds_young_events_until_they_are_old_enough() {
        let (manual, pace) = measured(5_000);
        let clock = manual.clock();
        let young = clock.now();
        assert_eq!(hold(&pace, rule(), &clock, young, RECHECK), Some(RECHECK));
        let nearly = clock.now() - chrono::Duration::milliseconds(29_900);
        assert_eq!(
            hold(&pace, rule(), &clock, nearly, RECHECK),
            Some(Duration::from_millis(100))
        );
        let old = clock.now() - chrono::Duration::seconds(30);
        assert_eq!(hold(&pace, rule(), &clock, old, RECHECK), None);
    }

    #[test]
    fn a_calm_feed_or_a_rule_of_zero_holds_nothing() {
        let (manual, calm) = measured(900);
        let clock = manual.clock();
        assert_eq!(hold(&calm, rule(), &clock, clock.now(), RECHECK), None);
        let (manual, hot) = measured(9_000);
        let clock = manual.clock();
        let off = Yield {
            above_per_second: 0,
            ..rule()
        };
        assert_eq!(hold(&hot, off, &clock, clock.now(), RECHECK), None);
        assert!(hold(&hot, rule(), &clock, clock.now(), RECHECK).is_some());
    }
}
