//! Per-instance cache of deal settings, so most requests never ask PostgreSQL about the deal.
//!
//! Next to the deals themselves it keeps the catalogue: the set of every deal id, read in
//! one query. An id missing from a fresh catalogue is answered "no such deal" from memory,
//! so a scanner sending thousands of made-up ids costs one PostgreSQL transaction per
//! `deals.cache_ttl_ms`, not one per id. A deal created anywhere is announced to every
//! instance (see `deals::changes`), which adds its id at once; the TTL bounds the staleness
//! when an announcement is lost.
//!
//! When a cached deal goes stale, one request re-reads it and the others are answered from
//! the stale copy meanwhile, so a crowd polling one deal costs one query per
//! `deals.cache_ttl_ms` rather than one per request in flight at that moment (on a gateway
//! short of CPU that burst would hold the pool long enough to turn orders away as overloaded).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use sqlx::PgPool;

use super::Deal;
use crate::clock::Clock;
use crate::store::StoreError;

struct Entry {
    /// `None` caches "no such deal" for ids the catalogue could not rule out.
    deal: Option<Arc<Deal>>,
    loaded_at: Instant,
    /// Set while one request re-reads this stale entry; the others use it meanwhile.
    refreshing: Arc<AtomicBool>,
}

/// Claims the re-read of a stale entry; released when dropped, also when the request
/// re-reading it is cancelled, so the next request takes over.
struct Refresh(Arc<AtomicBool>);

impl Refresh {
    /// The claim, unless another request holds it.
    fn claim(flag: &Arc<AtomicBool>) -> Option<Self> {
        let claimed = flag
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        claimed.then(|| Self(flag.clone()))
    }
}

impl Drop for Refresh {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// Every deal id, as read at `loaded_at` plus those announced since; `ids` is `None` when
/// there were more than `ids_max` (each unknown id is then looked up on its own).
struct Catalogue {
    ids: Option<HashSet<Box<str>>>,
    loaded_at: Instant,
}

pub struct DealCache {
    entries: DashMap<Box<str>, Entry>,
    /// `None` until loaded and after `clear`.
    catalogue: RwLock<Option<Catalogue>>,
    /// One catalogue query at a time; the others wait for its answer.
    catalogue_load: tokio::sync::Mutex<()>,
    ttl: Duration,
    entries_max: usize,
    ids_max: usize,
    /// What a copy's age is measured on.
    clock: Clock,
}

/// What the catalogue says about an id.
enum Known {
    Yes,
    No,
    /// The catalogue is too large to keep: ask PostgreSQL.
    Unlisted,
    /// The catalogue is missing or stale: reload it first.
    Stale,
}

impl DealCache {
    pub fn new(ttl: Duration, entries_max: usize, ids_max: usize, clock: Clock) -> Self {
        assert!(entries_max > 0 && ids_max > 0);
        Self {
            entries: DashMap::new(),
            catalogue: RwLock::new(None),
            catalogue_load: tokio::sync::Mutex::new(()),
            ttl,
            entries_max,
            ids_max,
            clock,
        }
    }

    /// How long ago `at` was.
    fn age(&self, at: Instant) -> Duration {
        self.clock.instant().saturating_duration_since(at)
    }

    /// The deal, from memory when fresh, else from `pool`. A stale deal is re-read by one
    /// request at a time; meanwhile the others get the stale copy, for at most one more
    /// `ttl` (past that, a slow or failing PostgreSQL is every request's answer again, as
    /// for a deal never read).
    pub async fn get(&self, pool: &PgPool, id: &str) -> Result<Option<Arc<Deal>>, StoreError> {
        let refresh = match self.entries.get(id) {
            Some(entry) if self.age(entry.loaded_at) < self.ttl => return Ok(entry.deal.clone()),
            Some(entry) => match Refresh::claim(&entry.refreshing) {
                None if self.age(entry.loaded_at) < 2 * self.ttl => {
                    return Ok(entry.deal.clone());
                }
                claim => claim,
            },
            None => None,
        };
        let known = match self.known(id) {
            Known::Stale => {
                self.reload_catalogue(pool).await?;
                self.known(id)
            }
            known => known,
        };
        if matches!(known, Known::No) {
            return Ok(None);
        }
        let deal = super::load(pool, id).await?.map(Arc::new);
        self.put(id, deal.clone());
        drop(refresh);
        Ok(deal)
    }

    fn known(&self, id: &str) -> Known {
        let catalogue = self.catalogue.read().unwrap_or_else(|e| e.into_inner());
        match catalogue.as_ref() {
            Some(c) if self.age(c.loaded_at) < self.ttl => match &c.ids {
                Some(ids) if ids.contains(id) => Known::Yes,
                Some(_) => Known::No,
                None => Known::Unlisted,
            },
            _ => Known::Stale,
        }
    }

    /// Reads every deal id, unless another request just did.
    async fn reload_catalogue(&self, pool: &PgPool) -> Result<(), StoreError> {
        let _one_at_a_time = self.catalogue_load.lock().await;
        if !matches!(self.known(""), Known::Stale) {
            return Ok(());
        }
        let ids = super::all_ids(pool, self.ids_max + 1).await?;
        let ids = (ids.len() <= self.ids_max)
            .then(|| ids.into_iter().map(String::into_boxed_str).collect());
        if ids.is_none() {
            tracing::warn!(
                ids_max = self.ids_max,
                "more deals than deals.catalogue_ids_max; unknown ids are looked up one by one"
            );
        }
        *self.catalogue.write().unwrap_or_else(|e| e.into_inner()) = Some(Catalogue {
            ids,
            loaded_at: self.clock.instant(),
        });
        Ok(())
    }

    /// Forgets `id`, so the next request re-reads it (another instance or the CLI changed
    /// or created it).
    pub fn evict(&self, id: &str) {
        self.entries.remove(id);
        self.add_known(id);
    }

    /// Forgets every deal; used when change notifications may have been missed.
    pub fn clear(&self) {
        self.entries.clear();
        *self.catalogue.write().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Records a deal this instance just wrote.
    pub fn put(&self, id: &str, deal: Option<Arc<Deal>>) {
        if deal.is_some() {
            self.add_known(id);
        }
        if self.entries.len() >= self.entries_max {
            self.entries.clear();
        }
        self.entries.insert(
            id.into(),
            Entry {
                deal,
                loaded_at: self.clock.instant(),
                refreshing: Arc::default(),
            },
        );
    }

    fn add_known(&self, id: &str) {
        let mut catalogue = self.catalogue.write().unwrap_or_else(|e| e.into_inner());
        let Some(c) = catalogue.as_mut() else {
            return;
        };
        if let Some(ids) = c.ids.as_mut()
            && !ids.contains(id)
        {
            if ids.len() >= self.ids_max {
                c.ids = None;
            } else {
                ids.insert(id.into());
            }
        }
    }
}
