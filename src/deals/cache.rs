//! Per-instance cache of deal settings, so most requests never ask PostgreSQL about the deal.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dashmap::DashMap;
use sqlx::PgPool;

use super::Deal;
use crate::store::StoreError;

struct Entry {
    /// `None` caches "no such deal", so probing unknown ids cannot hammer PostgreSQL.
    deal: Option<Arc<Deal>>,
    loaded_at: Instant,
}

pub struct DealCache {
    entries: DashMap<Box<str>, Entry>,
    ttl: Duration,
    entries_max: usize,
}

impl DealCache {
    pub fn new(ttl: Duration, entries_max: usize) -> Self {
        assert!(entries_max > 0);
        Self {
            entries: DashMap::new(),
            ttl,
            entries_max,
        }
    }

    /// The deal, from memory when fresh, else from `pool`.
    pub async fn get(&self, pool: &PgPool, id: &str) -> Result<Option<Arc<Deal>>, StoreError> {
        if let Some(entry) = self.entries.get(id)
            && entry.loaded_at.elapsed() < self.ttl
        {
            return Ok(entry.deal.clone());
        }
        let deal = super::load(pool, id).await?.map(Arc::new);
        self.put(id, deal.clone());
        Ok(deal)
    }

    /// Forgets `id`, so the next request re-reads it (another instance or the CLI changed it).
    pub fn evict(&self, id: &str) {
        self.entries.remove(id);
    }

    /// Forgets every deal; used when change notifications may have been missed.
    pub fn clear(&self) {
        self.entries.clear();
    }

    /// Records a deal this instance just wrote.
    pub fn put(&self, id: &str, deal: Option<Arc<Deal>>) {
        if self.entries.len() >= self.entries_max {
            self.entries.clear();
        }
        self.entries.insert(
            id.into(),
            Entry {
                deal,
                loaded_at: Instant::now(),
            },
        );
    }
}
