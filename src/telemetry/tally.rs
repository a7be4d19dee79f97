//! Per-thread tallies of the series every request records (requests by route and status,
//! their duration, admission rejections by reason), moved into the exporter before each
//! render.
//!
//! The exporter keeps each series in atomics that every core writes, several per event
//! (the value and the generation its idle timeout reads). Under a flood of refusals those
//! cache lines travel between the cores on every request, which cost more than deciding
//! the refusal. Each thread adds to a tally of its own instead, behind a lock only the
//! render ever contends for, and the render first moves every tally into the exporter: a
//! scrape still counts every request answered before it.
//!
//! Durations wait in their thread's tally until the next render, as they would otherwise
//! wait in the exporter's own buffer until it runs its upkeep at render time.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use metrics::{Counter, Histogram};

use super::{ADMISSION_REJECTIONS, HTTP_DURATION, HTTP_REQUESTS};

/// A series kept in a tally: a static label set, compared by its strings' addresses.
/// Two spellings of one label at different addresses make two entries whose handles share
/// one series in the exporter, so the address is only a fast key, never a wrong one.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Series {
    Request { route: usize, status: u16 },
    Rejection { reason: usize },
    Duration { route: usize },
}

/// The key of a `&'static str` label: where it lives.
fn address(label: &'static str) -> usize {
    label.as_ptr() as usize
}

/// Hashes a `Series` (a few machine words, distinct by construction) by folding them.
#[derive(Default)]
struct WordHasher(u64);

impl Hasher for WordHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(u64::from(byte));
        }
    }

    fn write_u64(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95);
    }

    fn write_usize(&mut self, word: usize) {
        self.write_u64(word as u64);
    }

    fn write_u16(&mut self, word: u16) {
        self.write_u64(u64::from(word));
    }
}

type Map<V> = HashMap<Series, V, BuildHasherDefault<WordHasher>>;

/// One thread's events not yet moved into the exporter, with the handles to move them to.
#[derive(Default)]
struct Pending {
    counts: Map<(Counter, u64)>,
    durations: Map<(Histogram, Vec<f64>)>,
}

impl Pending {
    fn count(&mut self, series: Series, register: impl FnOnce() -> Counter) {
        self.counts
            .entry(series)
            .or_insert_with(|| (register(), 0))
            .1 += 1;
    }

    fn duration(&mut self, series: Series, seconds: f64, register: impl FnOnce() -> Histogram) {
        let (histogram, samples) = self
            .durations
            .entry(series)
            .or_insert_with(|| (register(), Vec::new()));
        samples.push(seconds);
        // Nobody may scrape for hours: a full buffer goes to the exporter, whose own upkeep
        // folds it into the histogram, so memory stays bounded however long nobody renders.
        if samples.len() >= SAMPLES_MAX {
            hand_over(histogram, samples);
        }
    }

    /// Moves everything into the exporter; the handles stay for the next events.
    fn drain(&mut self) {
        for (counter, count) in self.counts.values_mut() {
            if *count > 0 {
                counter.increment(std::mem::take(count));
            }
        }
        for (histogram, samples) in self.durations.values_mut() {
            hand_over(histogram, samples);
            // Freed, not only cleared: a flood's buffer is not kept for the quiet after it.
            *samples = Vec::new();
        }
    }
}

/// Durations one thread keeps for one route before handing them to the exporter (8 bytes
/// each): large enough that the exporter's shared atomics are touched once per thousands of
/// requests, small enough to be nothing next to a connection's buffers.
const SAMPLES_MAX: usize = 4096;

/// Hands buffered samples to the exporter, leaving the buffer empty with its capacity.
fn hand_over(histogram: &Histogram, samples: &mut Vec<f64>) {
    for seconds in samples.drain(..) {
        histogram.record(seconds);
    }
}

/// A thread's tally, shared with the render that drains it.
#[derive(Default)]
struct Tally(Mutex<Pending>);

impl Tally {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        // A panic cannot leave `Pending` half-changed in a way that matters: counts only grow.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Every thread's tally, for the render. A thread that ended leaves its tally here until
/// a render has drained it.
static TALLIES: Mutex<Vec<Arc<Tally>>> = Mutex::new(Vec::new());

thread_local! {
    static MINE: Arc<Tally> = {
        let tally = Arc::new(Tally::default());
        TALLIES.lock().unwrap_or_else(PoisonError::into_inner).push(tally.clone());
        tally
    };
}

fn with_mine(record: impl FnOnce(&mut Pending)) {
    MINE.with(|tally| record(&mut tally.lock()));
}

/// One answered request: `flashgate_http_requests_total` and its duration.
pub fn request(route: &'static str, status: u16, seconds: f64) {
    with_mine(|pending| {
        let key = address(route);
        pending.count(
            Series::Request { route: key, status },
            || metrics::counter!(HTTP_REQUESTS, "route" => route, "status" => status.to_string()),
        );
        pending.duration(
            Series::Duration { route: key },
            seconds,
            || metrics::histogram!(HTTP_DURATION, "route" => route),
        );
    });
}

/// One request turned away by admission: `flashgate_admission_rejections_total`.
pub fn rejection(reason: &'static str) {
    with_mine(|pending| {
        pending.count(
            Series::Rejection {
                reason: address(reason),
            },
            || metrics::counter!(ADMISSION_REJECTIONS, "reason" => reason),
        );
    });
}

/// Moves every thread's tally into the exporter; the render calls it first.
pub(super) fn drain_all() {
    let mut tallies = TALLIES.lock().unwrap_or_else(PoisonError::into_inner);
    for tally in tallies.iter() {
        tally.lock().drain();
    }
    // Drained, and no thread holds it any more.
    tallies.retain(|tally| Arc::strong_count(tally) > 1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drain_moves_counts_once_and_keeps_the_handles() {
        let counter = Counter::noop();
        let mut pending = Pending::default();
        let series = Series::Rejection { reason: 1 };
        pending.count(series, || counter.clone());
        pending.count(series, || unreachable!("registered once"));
        pending.duration(Series::Duration { route: 1 }, 0.5, Histogram::noop);
        assert_eq!(pending.counts[&series].1, 2);
        pending.drain();
        assert_eq!(pending.counts[&series].1, 0);
        assert!(pending.durations.values().all(|(_, s)| s.is_empty()));
    }

    #[test]
    fn durations_never_wait_in_a_tally_beyond_its_limit() {
        let mut pending = Pending::default();
        let series = Series::Duration { route: 1 };
        for _ in 0..SAMPLES_MAX * 3 + 7 {
            pending.duration(series, 0.001, Histogram::noop);
        }
        assert!(pending.durations[&series].1.len() < SAMPLES_MAX);
    }
}
