//! A circuit breaker on provider calls.
//!
//! When the provider is down, every order, check, capture and refund would otherwise wait
//! out its full timeout and retries, tying up tasks and hammering a provider that is trying
//! to recover. After `payments.breaker_failures_max` failed calls in a row the breaker opens:
//! calls are refused at once, before anything is sent, so callers treat them exactly like a
//! refused connection (nothing happened; ask again later) and never as a failed payment.
//! After `payments.breaker_open_ms` one probe is let through (half-open); its success
//! closes the breaker, its failure opens it again.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::telemetry;

/// Where the breaker stands; exported as `flashgate_provider_breaker_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    Closed,
    /// One probe call is allowed (or in flight); the rest are refused.
    HalfOpen,
    Open,
}

impl BreakerState {
    /// The gauge value: 0 closed, 1 half-open, 2 open.
    pub fn gauge(self) -> f64 {
        match self {
            Self::Closed => 0.0,
            Self::HalfOpen => 1.0,
            Self::Open => 2.0,
        }
    }
}

/// What a finished call tells the breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallOutcome {
    /// The provider answered (even with a refusal of the request): it is up.
    Answered,
    /// A timeout, a refused connection or a 5xx after every retry.
    Failed,
}

/// A call may go ahead; whether it is the half-open probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Permit {
    probe: bool,
}

#[derive(Debug)]
struct Inner {
    state: BreakerState,
    failures: u32,
    opened_at: Instant,
    probe_in_flight: bool,
}

pub struct Breaker {
    failures_max: u32,
    open_for: Duration,
    inner: Mutex<Inner>,
}

impl Breaker {
    pub fn new(failures_max: u32, open_for: Duration) -> Self {
        metrics::gauge!(telemetry::PROVIDER_BREAKER_STATE).set(BreakerState::Closed.gauge());
        Self {
            failures_max: failures_max.max(1),
            open_for,
            inner: Mutex::new(Inner {
                state: BreakerState::Closed,
                failures: 0,
                // Read only once opened, which sets it.
                opened_at: crate::clock::monotonic(),
                probe_in_flight: false,
            }),
        }
    }

    pub fn state(&self) -> BreakerState {
        self.lock().state
    }

    /// Whether a call may be sent now; `None` while open (or while the probe is out).
    pub fn admit(&self, now: Instant) -> Option<Permit> {
        let mut inner = self.lock();
        match inner.state {
            BreakerState::Closed => Some(Permit { probe: false }),
            BreakerState::Open if now.duration_since(inner.opened_at) >= self.open_for => {
                inner.state = BreakerState::HalfOpen;
                inner.probe_in_flight = true;
                publish(inner.state);
                Some(Permit { probe: true })
            }
            BreakerState::HalfOpen if !inner.probe_in_flight => {
                inner.probe_in_flight = true;
                Some(Permit { probe: true })
            }
            BreakerState::Open | BreakerState::HalfOpen => None,
        }
    }

    /// Records how an admitted call ended.
    pub fn record(&self, permit: Permit, outcome: CallOutcome, now: Instant) {
        let mut inner = self.lock();
        if permit.probe {
            inner.probe_in_flight = false;
        }
        match (outcome, inner.state) {
            (CallOutcome::Answered, _) => {
                inner.failures = 0;
                if inner.state == BreakerState::HalfOpen && permit.probe {
                    inner.state = BreakerState::Closed;
                    tracing::info!("provider answers again: circuit breaker closed");
                }
            }
            (CallOutcome::Failed, BreakerState::HalfOpen) if permit.probe => {
                Self::open(&mut inner, now);
            }
            (CallOutcome::Failed, BreakerState::Closed) => {
                inner.failures += 1;
                if inner.failures >= self.failures_max {
                    Self::open(&mut inner, now);
                }
            }
            // A call admitted before the breaker opened ended after it: already counted.
            (CallOutcome::Failed, _) => {}
        }
        publish(inner.state);
    }

    fn open(inner: &mut Inner, now: Instant) {
        if inner.state != BreakerState::Open {
            tracing::warn!(
                failures = inner.failures,
                "provider failing: circuit breaker open"
            );
            metrics::counter!(telemetry::PROVIDER_BREAKER_OPENED).increment(1);
        }
        inner.state = BreakerState::Open;
        inner.opened_at = now;
        inner.failures = 0;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn publish(state: BreakerState) {
    metrics::gauge!(telemetry::PROVIDER_BREAKER_STATE).set(state.gauge());
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPEN_FOR: Duration = Duration::from_secs(5);

    fn fail(breaker: &Breaker, now: Instant) {
        let permit = breaker.admit(now).expect("admitted");
        breaker.record(permit, CallOutcome::Failed, now);
    }

    #[test]
    fn opens_after_consecutive_failures_only() {
        let breaker = Breaker::new(3, OPEN_FOR);
        let now = crate::clock::monotonic();
        fail(&breaker, now);
        fail(&breaker, now);
        let permit = breaker.admit(now).unwrap();
        breaker.record(permit, CallOutcome::Answered, now);
        fail(&breaker, now);
        fail(&breaker, now);
        assert_eq!(
            breaker.state(),
            BreakerState::Closed,
            "the streak was broken"
        );
        fail(&breaker, now);
        assert_eq!(breaker.state(), BreakerState::Open);
        assert!(
            breaker.admit(now + OPEN_FOR / 2).is_none(),
            "refused while open"
        );
    }

    #[test]
    fn one_probe_after_the_open_time_and_its_outcome_decides() {
        let breaker = Breaker::new(1, OPEN_FOR);
        let start = crate::clock::monotonic();
        fail(&breaker, start);
        let later = start + OPEN_FOR;
        let probe = breaker.admit(later).expect("a probe");
        assert_eq!(breaker.state(), BreakerState::HalfOpen);
        assert!(breaker.admit(later).is_none(), "one probe at a time");
        breaker.record(probe, CallOutcome::Failed, later);
        assert_eq!(
            breaker.state(),
            BreakerState::Open,
            "a failed probe opens again"
        );
        assert!(breaker.admit(later + OPEN_FOR / 2).is_none());

        let again = later + OPEN_FOR;
        let probe = breaker.admit(again).expect("another probe");
        breaker.record(probe, CallOutcome::Answered, again);
        assert_eq!(breaker.state(), BreakerState::Closed);
        assert!(breaker.admit(again).is_some());
    }

    #[test]
    fn a_late_failure_from_before_the_opening_does_not_reopen_a_probe() {
        let breaker = Breaker::new(1, OPEN_FOR);
        let start = crate::clock::monotonic();
        let early = breaker.admit(start).unwrap();
        fail(&breaker, start);
        let probe = breaker.admit(start + OPEN_FOR).unwrap();
        breaker.record(early, CallOutcome::Failed, start + OPEN_FOR);
        assert_eq!(breaker.state(), BreakerState::HalfOpen);
        breaker.record(probe, CallOutcome::Answered, start + OPEN_FOR);
        assert_eq!(breaker.state(), BreakerState::Closed);
    }
}
