//! The kill switch: pausing and resuming a deal.
//!
//! A paused deal answers every new order with `sale-not-open` on every instance: admission
//! reads the flag from the deal cache (dropped at once by the change announcement, re-read
//! within `deals.cache_ttl_ms` at the latest) and the order INSERT re-checks it in
//! PostgreSQL, which has the final word. Orders already placed keep their reservations; they
//! can still be cancelled, and unpaid ones expire as usual.

use sqlx::PgPool;

use crate::deals::{self, Deal, DealError};
use crate::store::StoreError;

/// Sets the deal's `paused` flag and announces the change; returns the deal as it reads
/// afterwards.
pub async fn set_paused(pool: &PgPool, deal_id: &str, paused: bool) -> Result<Deal, DealError> {
    let mut tx = pool.begin().await.map_err(StoreError::from)?;
    if !deals::set_paused(&mut tx, deal_id, paused).await? {
        return Err(DealError::NotFound);
    }
    tx.commit().await.map_err(StoreError::from)?;
    deals::load(pool, deal_id).await?.ok_or(DealError::NotFound)
}
