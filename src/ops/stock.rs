//! Administrative stock changes: the buckets (through the same constraints as
//! reservations: only available units move, never reserved or sold ones) and the deal's
//! total, in one transaction.

use sqlx::PgPool;

use crate::deals;
use crate::inventory::{self, StockError};
use crate::store::StoreError;

/// Adds (`delta > 0`) or removes (`delta < 0`) available units of `deal_id`.
pub async fn adjust(pool: &PgPool, deal_id: &str, delta: i64) -> Result<(), StockError> {
    let mut tx = pool.begin().await.map_err(StoreError::from)?;
    inventory::adjust(&mut tx, deal_id, delta).await?;
    deals::add_stock_total(&mut tx, deal_id, delta).await?;
    tx.commit().await.map_err(StoreError::from)?;
    Ok(())
}
