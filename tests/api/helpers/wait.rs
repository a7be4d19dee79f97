//! Waiting for an outcome: poll it against a deadline instead of sleeping a fixed time.
//!
//! A fixed sleep is too short on a busy runner and time thrown away on an idle one; a poll
//! returns as soon as the outcome holds and, when it never does, fails naming what it
//! awaited and what it saw last. The tests' waits go through here, so there is one poll
//! interval and one failure message to read; a fixed sleep is left only where elapsed time
//! is itself the input or the measurement.

use std::fmt::Display;
use std::future::Future;
use std::time::{Duration, Instant};

/// How often a condition is re-checked while waiting for it.
pub const POLL_INTERVAL: Duration = Duration::from_millis(25);

/// What one look at an awaited outcome found: reached (with a value for the caller), or not
/// yet (with what was seen instead, for the failure message).
pub trait Outcome {
    type Value;
    fn reached(self) -> Result<Self::Value, String>;
}

impl Outcome for bool {
    type Value = ();
    fn reached(self) -> Result<(), String> {
        if self { Ok(()) } else { Err(String::new()) }
    }
}

impl<T> Outcome for Option<T> {
    type Value = T;
    fn reached(self) -> Result<T, String> {
        self.ok_or_else(String::new)
    }
}

/// `Err` carries what was seen instead; the last one goes into the failure message.
impl<T, E: Display> Outcome for Result<T, E> {
    type Value = T;
    fn reached(self) -> Result<T, String> {
        self.map_err(|seen| seen.to_string())
    }
}

/// Looks at `condition` until it holds and returns its value; panics naming `what` (and the
/// last thing seen) once `limit` has passed without it.
pub async fn wait_until<O, F>(what: &str, limit: Duration, condition: impl FnMut() -> F) -> O::Value
where
    O: Outcome,
    F: Future<Output = O>,
{
    match poll(limit, condition).await {
        Ok(value) => value,
        Err(seen) if seen.is_empty() => panic!("waited {limit:?} for {what} in vain"),
        Err(seen) => panic!("waited {limit:?} for {what} in vain; last seen: {seen}"),
    }
}

/// Looks at `condition` until it holds; `Err` with the last thing seen once `limit` has
/// passed, for a caller whose failure is an outcome of its own.
pub async fn poll<O, F>(limit: Duration, condition: impl FnMut() -> F) -> Result<O::Value, String>
where
    O: Outcome,
    F: Future<Output = O>,
{
    poll_every(POLL_INTERVAL, limit, condition).await
}

/// `poll`, looking again only every `every`: for a look that costs the server work it asked
/// to be spared (a retry after 503 overloaded).
pub async fn poll_every<O, F>(
    every: Duration,
    limit: Duration,
    mut condition: impl FnMut() -> F,
) -> Result<O::Value, String>
where
    O: Outcome,
    F: Future<Output = O>,
{
    let deadline = Instant::now() + limit;
    loop {
        let seen = match condition().await.reached() {
            Ok(value) => return Ok(value),
            Err(seen) => seen,
        };
        if Instant::now() >= deadline {
            return Err(seen);
        }
        pace(every).await;
    }
}

/// Checks that `condition` holds at every look (eight or more, spread) through `span`: for
/// an outcome that is "nothing changes" (a drained line admits nobody, a settled order stays
/// put), which no event marks. It fails at the first look that finds otherwise, naming
/// `what`.
pub async fn holds_for<F>(what: &str, span: Duration, mut condition: impl FnMut() -> F)
where
    F: Future<Output = bool>,
{
    let until = Instant::now() + span;
    let every = (span / 8).max(POLL_INTERVAL);
    loop {
        assert!(condition().await, "{what}: no longer holds");
        if Instant::now() >= until {
            return;
        }
        pace(every).await;
    }
}

/// A span of real time over which a test counts what happened (Redis commands sent, polls
/// answered): its length is the measurement's denominator, not a wait for an outcome, so it
/// cannot be shortened by polling.
pub async fn measure_for(span: Duration) {
    tokio::time::sleep(span).await;
}

/// The pause between two steps of a loop whose rhythm is the input, never a wait for an
/// outcome (that is [`wait_until`]): a poll's interval, a client's pace between requests (a
/// buyer polling, a shopper retrying, a slow client trickling its bytes: the load is part of
/// the case), a sampler's between samples taken over a span.
pub async fn pace(between: Duration) {
    // The tests' one pacing sleep: the rhythm of a loop, the subject of no assertion.
    tokio::time::sleep(between).await;
}
