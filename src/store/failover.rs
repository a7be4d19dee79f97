//! A PostgreSQL failover is logged as a warning with a count, not as an error per request.
//!
//! While a primary is replaced, writes meet a server that turned read-only (`25006`), one
//! shutting down (`57P0x`) or a dropped connection. Those requests are answered 503 with
//! `Retry-After` and retried by their clients: the failures are expected and handled. The
//! first one is logged at once; the following ones are counted and reported at most every
//! `database.failover_log_interval_ms`, with how many failed since the previous line.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The interval of the process's one failover log, in milliseconds.
static INTERVAL_MS: AtomicU64 = AtomicU64::new(10_000);
static TALLY: Mutex<Tally> = Mutex::new(Tally {
    warned_at: None,
    unlogged: 0,
});

/// Sets `database.failover_log_interval_ms` (process-wide, as the log is).
pub fn set_log_interval(interval: Duration) {
    let ms = u64::try_from(interval.as_millis()).unwrap_or(u64::MAX);
    INTERVAL_MS.store(ms, Ordering::Relaxed);
}

/// SQLSTATEs of a primary being replaced: read-only transaction, admin or crash shutdown,
/// starting up; and every connection exception (class 08).
pub fn is_failover(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_) => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            matches!(code.as_ref(), "25006" | "57P01" | "57P02" | "57P03") || code.starts_with("08")
        }),
        _ => false,
    }
}

/// Counts one failure of `what` and logs the count when a line is due.
pub fn record(what: &'static str, error: &sqlx::Error) {
    let interval = Duration::from_millis(INTERVAL_MS.load(Ordering::Relaxed));
    let due = TALLY
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .record(crate::clock::monotonic(), interval);
    if let Some(failed) = due {
        tracing::warn!(
            %error, failed, what,
            "PostgreSQL refuses writes or is unreachable (failover?); answering 503 with Retry-After"
        );
    }
}

/// Failures counted since the last line, and when that line was written.
struct Tally {
    warned_at: Option<Instant>,
    unlogged: u64,
}

impl Tally {
    /// Counts a failure at `now`; the number to log when a line is due.
    fn record(&mut self, now: Instant, interval: Duration) -> Option<u64> {
        self.unlogged += 1;
        let due = self
            .warned_at
            .is_none_or(|at| now.saturating_duration_since(at) >= interval);
        if !due {
            return None;
        }
        self.warned_at = Some(now);
        Some(std::mem::take(&mut self.unlogged))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_at_first_then_a_count_per_interval() {
        let mut tally = Tally {
            warned_at: None,
            unlogged: 0,
        };
        let start = crate::clock::monotonic();
        let interval = Duration::from_secs(10);
        let at = |ms: u64| start + Duration::from_millis(ms);
        assert_eq!(tally.record(at(0), interval), Some(1));
        for ms in 1..=25 {
            assert_eq!(tally.record(at(ms * 100), interval), None);
        }
        assert_eq!(tally.record(at(10_000), interval), Some(26));
        assert_eq!(tally.record(at(10_001), interval), None);
    }

    #[test]
    fn read_only_and_shutdown_are_failover_and_a_constraint_is_not() {
        let io = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(is_failover(&io));
        assert!(!is_failover(&sqlx::Error::RowNotFound));
        assert!(!is_failover(&sqlx::Error::Protocol("bad".into())));
    }
}
