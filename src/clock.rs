//! The application's one clock, carried in its state: every rule that depends on the time
//! (a sale's window, a pass's or a challenge's expiry, a cache's age, a breaker's cool-down,
//! a limit's slice) asks it instead of reading the system's clock, so that a test can run the
//! gateway on a clock it moves itself instead of sleeping to see an expiry.
//!
//! Two readings: [`Clock::now`], the wall time that is compared with stored timestamps, and
//! [`Clock::instant`], monotonic time for durations within this process. A [`ManualClock`]
//! moves both together, and only when told. Expiry that the database decides (a
//! reservation's, an unpaid order's) stays on the database's clock.
//!
//! [`Clock::sleep`] waits on the clock, for a rule's wait (a retry's back-off): on the
//! system's clock it is tokio's sleep, on a manual one it ends when the clock is moved past
//! it, so a test moves a minute of back-off without waiting a minute.
//!
//! [`monotonic`] is the process's monotonic time for what only measures or paces (a
//! request's latency, a log line's rate limit): it follows tokio's clock, so a test on a
//! paused runtime sees it move with `tokio::time::advance`. This module is the only place
//! that reads a clock directly (a test keeps it so).

use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use tokio::sync::Notify;

/// The time rules are decided on: the system's, or a manual one in tests. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Clock {
    /// `None` is the system's clock.
    manual: Option<Arc<Manual>>,
}

impl Clock {
    /// The system's clock (wall time from the OS, monotonic time from tokio's clock).
    pub fn system() -> Self {
        Self { manual: None }
    }

    /// Wall time now.
    pub fn now(&self) -> DateTime<Utc> {
        match &self.manual {
            None => Utc::now(),
            Some(manual) => manual.now(),
        }
    }

    /// Monotonic time now, for durations and deadlines within this process.
    pub fn instant(&self) -> Instant {
        match &self.manual {
            None => monotonic(),
            Some(manual) => manual.instant(),
        }
    }

    /// Waits until `duration` has passed on this clock: tokio's sleep on the system's clock,
    /// and on a manual one until it has been moved that far.
    pub async fn sleep(&self, duration: Duration) {
        let Some(manual) = &self.manual else {
            return tokio::time::sleep(duration).await;
        };
        let deadline = manual.instant() + duration;
        loop {
            let mut moved = pin!(manual.moved.notified());
            moved.as_mut().enable();
            if manual.instant() >= deadline {
                return;
            }
            moved.await;
        }
    }

    /// True on a manual clock: code that also asks another clock (Redis's, say) uses this
    /// one's time there too, so that both move together.
    pub fn is_manual(&self) -> bool {
        self.manual.is_some()
    }
}

/// The process's monotonic time, for measuring and pacing only (never for a rule that a
/// test must be able to move: that asks [`Clock::instant`]).
pub fn monotonic() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// Monotonic time passed since `earlier` (a reading of [`monotonic`]), for measuring.
pub fn elapsed_since(earlier: Instant) -> Duration {
    monotonic().saturating_duration_since(earlier)
}

/// A clock that moves only when told: what tests run the gateway on where the case is about
/// time. Clones share the time.
#[derive(Clone, Debug)]
pub struct ManualClock(Arc<Manual>);

#[derive(Debug)]
struct Manual {
    wall_start: DateTime<Utc>,
    /// Microseconds the wall time is past `wall_start` (negative when set back).
    wall_us: AtomicI64,
    instant_start: Instant,
    /// Microseconds the monotonic time has moved; never goes back.
    instant_us: AtomicU64,
    /// Wakes the sleepers on this clock whenever it is moved.
    moved: Notify,
}

impl ManualClock {
    /// A clock standing at `wall` until it is moved.
    pub fn starting_at(wall: DateTime<Utc>) -> Self {
        Self(Arc::new(Manual {
            wall_start: wall,
            wall_us: AtomicI64::new(0),
            instant_start: monotonic(),
            instant_us: AtomicU64::new(0),
            moved: Notify::new(),
        }))
    }

    /// A clock standing at the system's time now until it is moved.
    pub fn starting_now() -> Self {
        Self::starting_at(Utc::now())
    }

    /// The clock to give the application.
    pub fn clock(&self) -> Clock {
        Clock {
            manual: Some(Arc::clone(&self.0)),
        }
    }

    /// Moves wall and monotonic time forward by `by`.
    pub fn advance(&self, by: Duration) {
        let us = i64::try_from(by.as_micros()).unwrap_or(i64::MAX);
        self.0.wall_us.fetch_add(us, Ordering::Relaxed);
        self.0
            .instant_us
            .fetch_add(us.unsigned_abs(), Ordering::Relaxed);
        self.0.moved.notify_waiters();
    }

    /// Sets the wall time to `at`; monotonic time moves forward by as much when that is
    /// later, and stays when it is earlier (as a system's clock set back by NTP).
    pub fn set(&self, at: DateTime<Utc>) {
        let us = (at - self.0.wall_start)
            .num_microseconds()
            .unwrap_or(i64::MAX);
        let before = self.0.wall_us.swap(us, Ordering::Relaxed);
        let forward = us.saturating_sub(before).max(0).unsigned_abs();
        self.0.instant_us.fetch_add(forward, Ordering::Relaxed);
        self.0.moved.notify_waiters();
    }

    pub fn now(&self) -> DateTime<Utc> {
        self.0.now()
    }
}

impl Manual {
    fn now(&self) -> DateTime<Utc> {
        self.wall_start + chrono::Duration::microseconds(self.wall_us.load(Ordering::Relaxed))
    }

    fn instant(&self) -> Instant {
        self.instant_start + Duration::from_micros(self.instant_us.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_told_and_its_clones_follow() {
        let start = DateTime::parse_from_rfc3339("2026-12-06T10:00:00Z")
            .unwrap()
            .to_utc();
        let manual = ManualClock::starting_at(start);
        let clock = manual.clock();
        let (wall, instant) = (clock.now(), clock.instant());
        assert_eq!(wall, start);
        assert_eq!(clock.clone().instant(), instant);

        manual.advance(Duration::from_millis(1_500));
        assert_eq!(clock.now(), start + chrono::Duration::milliseconds(1_500));
        assert_eq!(clock.instant() - instant, Duration::from_millis(1_500));
        assert!(clock.is_manual() && !Clock::system().is_manual());
    }

    #[test]
    fn setting_a_manual_clock_back_moves_wall_time_only() {
        let manual = ManualClock::starting_now();
        let (wall, instant) = (manual.now(), manual.clock().instant());
        manual.set(wall + chrono::Duration::seconds(60));
        assert_eq!(manual.clock().instant() - instant, Duration::from_secs(60));

        manual.set(wall - chrono::Duration::seconds(5));
        assert_eq!(manual.now(), wall - chrono::Duration::seconds(5));
        assert_eq!(manual.clock().instant() - instant, Duration::from_secs(60));
    }

    #[tokio::test]
    async fn a_sleep_on_a_manual_clock_ends_when_the_clock_is_moved_past_it() {
        let manual = ManualClock::starting_now();
        let clock = manual.clock();
        let mut sleeping = pin!(clock.sleep(Duration::from_secs(60)));
        let short = Duration::from_millis(20);
        assert!(
            tokio::time::timeout(short, sleeping.as_mut())
                .await
                .is_err()
        );
        manual.advance(Duration::from_secs(59));
        assert!(
            tokio::time::timeout(short, sleeping.as_mut())
                .await
                .is_err()
        );
        manual.advance(Duration::from_secs(1));
        tokio::time::timeout(Duration::from_secs(10), sleeping)
            .await
            .expect("the sleep ends once the clock passed it");
    }

    #[tokio::test(start_paused = true)]
    async fn system_monotonic_time_follows_tokio_s_paused_clock() {
        let before = Clock::system().instant();
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(monotonic() - before, Duration::from_secs(3));
    }
}
