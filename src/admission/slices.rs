//! Slices of a deal's shared budget held by this instance, and the clock they run on.
//!
//! Taking a fixed slice per Redis call wastes the budget on sparse traffic: an instance that
//! sees one request per `slice_ttl_ms` would take a whole slice for it and drop the rest. So
//! a slice grows with local demand: it starts at one request, doubles (up to `deal_slice`)
//! each time the previous one was spent before it lapsed, and halves when one lapses with
//! requests left. The requests left go back to the shared budget, with the next call for the
//! deal or, at the latest, with [`Slices::lapsed`] run every `slice_ttl_ms`. Sparse traffic
//! then costs one request of budget per request and a flood takes whole slices, and either
//! way the deal's budget is spent on requests, not dropped.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dashmap::DashMap;

/// Time for the shared limits. The budget in Redis runs on Redis's clock (`TIME`), so that
/// instances with skewed clocks agree; a test clock supplies its own time to both.
pub trait Clock: Send + Sync {
    fn now(&self) -> Instant;
    /// Microseconds for the budget in Redis; `None` for Redis's own clock.
    fn shared_now_us(&self) -> Option<u64>;
}

/// The real clock: this process's for slices, Redis's for the budget.
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn shared_now_us(&self) -> Option<u64> {
        None
    }
}

/// A clock that moves only when told, for tests and simulations of the limits.
pub struct ManualClock {
    start: Instant,
    elapsed_us: AtomicU64,
}

/// Where a manual clock's shared time starts, so that it is never zero.
const MANUAL_EPOCH_US: u64 = 1_000_000_000;

impl ManualClock {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            start: Instant::now(),
            elapsed_us: AtomicU64::new(0),
        })
    }

    pub fn advance(&self, by: Duration) {
        let us = u64::try_from(by.as_micros()).unwrap_or(u64::MAX);
        self.elapsed_us.fetch_add(us, Ordering::Relaxed);
    }

    fn elapsed(&self) -> Duration {
        Duration::from_micros(self.elapsed_us.load(Ordering::Relaxed))
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        self.start + self.elapsed()
    }

    fn shared_now_us(&self) -> Option<u64> {
        Some(MANUAL_EPOCH_US + self.elapsed_us.load(Ordering::Relaxed))
    }
}

/// What a check on this instance needs from the shared budget.
#[derive(Debug, PartialEq, Eq)]
pub enum Need {
    /// Spent from a live slice: nothing.
    Nothing,
    /// A call taking `want` requests (this check's one included) and returning `give_back`.
    Call { want: u32, give_back: u32 },
}

/// One deal's slice on this instance.
struct Slice {
    left: u32,
    expires: Instant,
    /// Requests the next call takes.
    size: u32,
}

/// The slices of every deal this instance saw lately.
pub struct Slices {
    max: u32,
    ttl: Duration,
    clock: Arc<dyn Clock>,
    by_deal: DashMap<String, Slice>,
}

impl Slices {
    pub fn new(max: u32, ttl: Duration, clock: Arc<dyn Clock>) -> Self {
        Self {
            max: max.max(1),
            ttl,
            clock,
            by_deal: DashMap::new(),
        }
    }

    pub fn clock(&self) -> &dyn Clock {
        self.clock.as_ref()
    }

    /// Spends one request of `deal`'s live slice, or says what to ask Redis for.
    pub fn take(&self, deal: &str) -> Need {
        let now = self.clock.now();
        let mut slice = self.by_deal.entry(deal.to_owned()).or_insert(Slice {
            left: 0,
            expires: now,
            size: 1,
        });
        let live = slice.expires > now;
        if live && slice.left > 0 {
            slice.left -= 1;
            return Need::Nothing;
        }
        let give_back = std::mem::take(&mut slice.left);
        // The new slice's lifetime starts with its call, whatever it is granted.
        slice.expires = now + self.ttl;
        slice.size = match (live, give_back) {
            // Spent before it lapsed: demand outpaces the slice.
            (true, _) => slice.size.saturating_mul(2).min(self.max),
            // Lapsed with requests left: more than local demand needs.
            (false, 1..) => (slice.size / 2).max(1),
            (false, 0) => slice.size,
        };
        Need::Call {
            want: slice.size,
            give_back,
        }
    }

    /// Keeps `left` requests granted beyond this check's one, for `slice_ttl_ms`.
    pub fn keep(&self, deal: &str, left: u32) {
        if left == 0 {
            return;
        }
        let expires = self.clock.now() + self.ttl;
        if let Some(mut slice) = self.by_deal.get_mut(deal) {
            slice.left += left;
            slice.expires = expires;
        }
    }

    /// Takes the requests left in lapsed slices, to return them: `(deal, requests)`.
    pub fn lapsed(&self) -> Vec<(String, u32)> {
        let now = self.clock.now();
        let mut lapsed = Vec::new();
        for mut slice in self.by_deal.iter_mut() {
            if slice.left > 0 && slice.expires <= now {
                lapsed.push((slice.key().clone(), std::mem::take(&mut slice.left)));
                slice.size = (slice.size / 2).max(1);
            }
        }
        lapsed
    }

    /// Drops lapsed and empty slices (their size starts over at one).
    pub fn forget_idle(&self) {
        let now = self.clock.now();
        self.by_deal.retain(|_, s| s.left > 0 || s.expires > now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slices(max: u32) -> (Slices, Arc<ManualClock>) {
        let clock = ManualClock::new();
        let slices = Slices::new(max, Duration::from_millis(50), clock.clone());
        (slices, clock)
    }

    fn call(want: u32, give_back: u32) -> Need {
        Need::Call { want, give_back }
    }

    #[test]
    fn a_slice_starts_at_one_and_doubles_while_spent_in_time() {
        let (slices, _clock) = slices(16);
        assert_eq!(slices.take("d"), call(1, 0));
        assert_eq!(slices.take("d"), call(2, 0), "spent at once: grows");
        slices.keep("d", 1);
        assert_eq!(slices.take("d"), Need::Nothing);
        assert_eq!(slices.take("d"), call(4, 0));
        slices.keep("d", 3);
        for _ in 0..3 {
            assert_eq!(slices.take("d"), Need::Nothing);
        }
        assert_eq!(slices.take("d"), call(8, 0));
        assert_eq!(slices.take("d"), call(16, 0));
        assert_eq!(slices.take("d"), call(16, 0), "never above deal_slice");
    }

    #[test]
    fn a_lapsed_slice_is_returned_and_shrinks() {
        let (slices, clock) = slices(16);
        assert_eq!(slices.take("d"), call(1, 0));
        assert_eq!(slices.take("d"), call(2, 0));
        slices.keep("d", 1);
        clock.advance(Duration::from_millis(50));
        assert_eq!(slices.take("d"), call(1, 1), "the unspent one goes back");
        assert_eq!(slices.take("d"), call(2, 0));
        slices.keep("d", 1);
        clock.advance(Duration::from_millis(60));
        assert_eq!(slices.lapsed(), vec![("d".to_owned(), 1)]);
        assert!(slices.lapsed().is_empty(), "returned once");
        assert_eq!(slices.take("d"), call(1, 0));
    }

    #[test]
    fn sparse_checks_take_one_request_each() {
        let (slices, clock) = slices(16);
        for _ in 0..10 {
            assert_eq!(slices.take("d"), call(1, 0));
            clock.advance(Duration::from_millis(100));
        }
    }
}
