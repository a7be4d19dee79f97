//! Slices of a deal's shared budget held by this instance, on the application's clock.
//!
//! Taking a fixed slice per Redis call wastes the budget on sparse traffic: an instance that
//! sees one request per `slice_ttl_ms` would take a whole slice for it and drop the rest. So
//! a slice grows with local demand: it starts at one request, doubles (up to `deal_slice`)
//! each time the previous one was spent before it lapsed, and halves when one lapses with
//! requests left. The requests left go back to the shared budget, with the next call for the
//! deal or, at the latest, with [`Slices::lapsed`] run every `slice_ttl_ms`. Sparse traffic
//! then costs one request of budget per request and a flood takes whole slices, and either
//! way the deal's budget is spent on requests, not dropped.

use std::time::{Duration, Instant};

use dashmap::DashMap;

use crate::clock::Clock;

/// The shared budget's time: `None` is Redis's clock (`TIME`), so that instances with
/// skewed clocks agree; on a manual clock the budget runs on that clock's time too, so that
/// a test moves both together.
pub fn shared_now_us(clock: &Clock) -> Option<u64> {
    clock
        .is_manual()
        .then(|| u64::try_from(clock.now().timestamp_micros()).unwrap_or(0))
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
    clock: Clock,
    by_deal: DashMap<String, Slice>,
}

impl Slices {
    pub fn new(max: u32, ttl: Duration, clock: Clock) -> Self {
        Self {
            max: max.max(1),
            ttl,
            clock,
            by_deal: DashMap::new(),
        }
    }

    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Spends one request of `deal`'s live slice, or says what to ask Redis for.
    pub fn take(&self, deal: &str) -> Need {
        let now = self.clock.instant();
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
        let expires = self.clock.instant() + self.ttl;
        if let Some(mut slice) = self.by_deal.get_mut(deal) {
            slice.left += left;
            slice.expires = expires;
        }
    }

    /// Takes the requests left in lapsed slices, to return them: `(deal, requests)`.
    pub fn lapsed(&self) -> Vec<(String, u32)> {
        let now = self.clock.instant();
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
        let now = self.clock.instant();
        self.by_deal.retain(|_, s| s.left > 0 || s.expires > now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn slices(max: u32) -> (Slices, ManualClock) {
        let clock = ManualClock::starting_now();
        let slices = Slices::new(max, Duration::from_millis(50), clock.clock());
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
