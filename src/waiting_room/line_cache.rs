//! The public state of each line as this instance last read it from Redis.
//!
//! Everyone waiting reads the same public state, so an instance reads it from Redis at most
//! once per `line_state_refresh_ms` per line and answers every public poll in between from
//! memory. Concurrent polls of a stale line wait for the one read under way rather than
//! each sending their own, so the Redis work of public polls does not grow with the crowd.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dashmap::DashMap;
use tokio::sync::Mutex;

use super::{LineStatus, QueueError};
use crate::clock::Clock;
use crate::telemetry;

/// One line's last read, and when it was taken.
type Slot = Arc<Mutex<Option<(Instant, LineStatus)>>>;

/// The lines' public states by deal id; cheap to clone.
#[derive(Clone)]
pub(super) struct LineCache {
    refresh: Duration,
    slots: Arc<DashMap<String, Slot>>,
    /// What a read's age is measured on.
    clock: Clock,
}

impl LineCache {
    pub fn new(refresh: Duration, clock: Clock) -> Self {
        Self {
            refresh,
            slots: Arc::default(),
            clock,
        }
    }

    /// The line's state from memory while younger than the refresh interval, else from
    /// `read` (a failed read is not kept: the next poll tries again).
    pub async fn get_or_refresh<F>(
        &self,
        deal_id: &str,
        read: impl FnOnce() -> F,
    ) -> Result<LineStatus, QueueError>
    where
        F: Future<Output = Result<LineStatus, QueueError>>,
    {
        let known = self.slots.get(deal_id).map(|slot| slot.clone());
        let slot =
            known.unwrap_or_else(|| self.slots.entry(deal_id.to_owned()).or_default().clone());
        let mut held = slot.lock().await;
        if let Some((at, line)) = held.as_ref()
            && self.clock.instant().saturating_duration_since(*at) < self.refresh
        {
            count("memory");
            return Ok(line.clone());
        }
        let line = read().await?;
        count("redis");
        *held = Some((self.clock.instant(), line.clone()));
        Ok(line)
    }
}

fn count(source: &'static str) {
    metrics::counter!(telemetry::WAITING_ROOM_LINE_READS, "source" => source).increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    fn line(through: u64) -> LineStatus {
        LineStatus {
            admitted_through: through,
            ..LineStatus::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn reads_redis_once_per_interval_however_many_poll() {
        let cache = LineCache::new(Duration::from_millis(1000), Clock::system());
        let reads = Arc::new(AtomicU64::new(0));
        let read = |reads: Arc<AtomicU64>| async move {
            let n = reads.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(5)).await;
            Ok(line(n))
        };
        let polls = (0..200).map(|_| cache.get_or_refresh("d", || read(reads.clone())));
        let seen = futures_util::future::join_all(polls).await;
        assert!(
            seen.iter()
                .all(|l| l.as_ref().is_ok_and(|l| l.admitted_through == 0))
        );
        assert_eq!(reads.load(Ordering::SeqCst), 1);

        tokio::time::advance(Duration::from_millis(900)).await;
        let again = cache.get_or_refresh("d", || read(reads.clone())).await;
        assert_eq!(again.map(|l| l.admitted_through).ok(), Some(0));
        assert_eq!(reads.load(Ordering::SeqCst), 1);

        tokio::time::advance(Duration::from_millis(200)).await;
        let fresh = cache.get_or_refresh("d", || read(reads.clone())).await;
        assert_eq!(fresh.map(|l| l.admitted_through).ok(), Some(1));
        assert_eq!(reads.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_read_is_not_kept() {
        let cache = LineCache::new(Duration::from_millis(1000), Clock::system());
        let failed = cache
            .get_or_refresh("d", || async { Err(QueueError::Unexpected("down".into())) })
            .await;
        assert!(failed.is_err());
        let read = cache.get_or_refresh("d", || async { Ok(line(7)) }).await;
        assert_eq!(read.map(|l| l.admitted_through).ok(), Some(7));
    }
}
