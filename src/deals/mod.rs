//! The deal catalogue: what is on sale, at what price, when, and with which limits.
//!
//! Deals are read on every order, so each instance keeps them in a small cache with a short
//! TTL; the sale window checked here is re-checked by PostgreSQL's clock when an order is
//! written, so a stale cache can delay a decision but never let a wrong one through.

mod cache;
pub mod changes;
pub mod page_template;
mod settings;
mod waiting_room;

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};

pub use cache::DealCache;
pub use settings::DealSettings;
pub use waiting_room::{
    ADMIT_PER_SECOND_MAX, Activation, AdmissionMode, AdmissionTerms, Invitation, Priority,
    WaitingRoomTerms,
};

use crate::domain::{CaptureMethod, DealId, LatePaymentPolicy};
use crate::store::StoreError;
use sqlx::Row;
use sqlx::postgres::PgRow;

use crate::store::rows;

/// A deal as stored. Prices are in minor units (cents) of `currency`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deal {
    pub id: String,
    pub name: String,
    pub stock_total: i64,
    pub bucket_count: i32,
    pub unit_price_minor: i64,
    pub currency: String,
    pub per_user_limit: i32,
    pub reservation_ttl_seconds: i32,
    pub starts_at: Option<DateTime<Utc>>,
    pub ends_at: Option<DateTime<Utc>>,
    /// The operators' kill switch: a paused deal takes no new orders (answered
    /// `sale-not-open`), whatever its window says.
    pub paused: bool,
    /// What happens to money that arrives late.
    pub late_payment_policy: LatePaymentPolicy,
    /// Charge at once, or authorise and capture when confirmed.
    pub capture_method: CaptureMethod,
    /// The queue buyers pass through before ordering, when enabled.
    pub waiting_room: WaitingRoomTerms,
}

impl<'r> sqlx::FromRow<'r, PgRow> for Deal {
    fn from_row(row: &'r PgRow) -> Result<Self, sqlx::Error> {
        Ok(Self {
            id: row.try_get("id")?,
            name: row.try_get("name")?,
            stock_total: row.try_get("stock_total")?,
            bucket_count: row.try_get("bucket_count")?,
            unit_price_minor: row.try_get("unit_price_minor")?,
            currency: row.try_get("currency")?,
            per_user_limit: row.try_get("per_user_limit")?,
            reservation_ttl_seconds: row.try_get("reservation_ttl_seconds")?,
            starts_at: row.try_get("starts_at")?,
            ends_at: row.try_get("ends_at")?,
            paused: row.try_get("paused")?,
            late_payment_policy: rows::parsed(row, "late_payment_policy")?,
            capture_method: rows::parsed(row, "capture_method")?,
            waiting_room: WaitingRoomTerms::from_row(row)?,
        })
    }
}

/// Where a deal stands in time, judged by the given clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    Upcoming,
    Open,
    Ended,
}

impl Deal {
    pub fn window(&self, now: DateTime<Utc>) -> Window {
        match (self.starts_at, self.ends_at) {
            (Some(starts), _) if now < starts => Window::Upcoming,
            (_, Some(ends)) if now >= ends => Window::Ended,
            _ => Window::Open,
        }
    }

    /// The state a buyer is shown: the window first, then the sold-out mirror.
    pub fn public_state(&self, now: DateTime<Utc>, sold_out: bool) -> &'static str {
        match self.window(now) {
            Window::Upcoming => "upcoming",
            Window::Ended => "ended",
            Window::Open if sold_out => "sold_out",
            Window::Open => "open",
        }
    }
}

/// What an administrator asks for; validated by `NewDeal::validate` before any SQL runs.
#[derive(Debug, Clone)]
pub struct NewDeal {
    pub id: DealId,
    pub name: String,
    pub stock: i64,
    pub buckets: i32,
    pub unit_price_minor: i64,
    pub currency: String,
    pub per_user_limit: i32,
    pub reservation_ttl_seconds: i32,
    pub starts_at: Option<DateTime<Utc>>,
    pub ends_at: Option<DateTime<Utc>>,
    pub payment_terms: PaymentTerms,
    pub waiting_room: WaitingRoomTerms,
}

/// How a deal takes money.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PaymentTerms {
    /// What money arriving after the reservation expired does.
    pub late_payment_policy: LatePaymentPolicy,
    /// Charge at once, or authorise and capture once the order is confirmed (a late
    /// authorisation is voided instead of refunded).
    pub capture_method: CaptureMethod,
}

/// Bounds on what a deal may be created with.
pub const BUCKETS_MAX: i32 = 1024;
pub const STOCK_MAX: i64 = 1_000_000_000;
pub const UNIT_PRICE_MINOR_MAX: i64 = 1_000_000_000_000;
pub const TTL_SECONDS_MAX: i32 = 86_400;
pub const NAME_BYTES_MAX: usize = 200;

#[derive(Debug, thiserror::Error)]
pub enum DealError {
    /// A field out of its bounds.
    #[error("{0}")]
    Invalid(String),
    /// Each field valid on its own, but a rule between fields broken (an end before its
    /// start): answered 422 by the API.
    #[error("{0}")]
    Inconsistent(String),
    #[error("deal {0} already exists")]
    AlreadyExists(String),
    #[error("deal not found")]
    NotFound,
    /// The deal exists but has no waiting room, so it has no line to set an outflow for.
    #[error("deal {0} has no waiting room")]
    NoWaitingRoom(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl NewDeal {
    /// The rules between fields first, then each field's bounds; the message names the
    /// offending fields. The one place a new deal is checked, for the API and the CLI.
    pub fn validate(&self) -> Result<(), DealError> {
        self.check_across_fields()
            .map_err(DealError::Inconsistent)?;
        let invalid = |m: &str| Err(DealError::Invalid(m.to_owned()));
        if self.name.trim().is_empty()
            || self.name.len() > NAME_BYTES_MAX
            || self.name.chars().any(char::is_control)
        {
            return invalid("name must be 1-200 bytes without control characters");
        }
        if !(0..=STOCK_MAX).contains(&self.stock) {
            return invalid("stock must be 0-1000000000");
        }
        if !(1..=BUCKETS_MAX).contains(&self.buckets) {
            return invalid("buckets must be 1-1024");
        }
        if !(0..=UNIT_PRICE_MINOR_MAX).contains(&self.unit_price_minor) {
            return invalid("unit_price_minor must be 0-1000000000000");
        }
        if self.currency.len() != 3 || !self.currency.bytes().all(|b| b.is_ascii_uppercase()) {
            return invalid("currency must be an ISO 4217 code such as EUR");
        }
        if self.per_user_limit < 1 {
            return invalid("per_user_limit must be at least 1");
        }
        if !(1..=TTL_SECONDS_MAX).contains(&self.reservation_ttl_seconds) {
            return invalid("reservation_ttl_seconds must be 1-86400");
        }
        self.waiting_room.validate().map_err(DealError::Invalid)?;
        Ok(())
    }

    /// The rules between fields, each field being valid on its own.
    fn check_across_fields(&self) -> Result<(), String> {
        if let (Some(starts), Some(ends)) = (self.starts_at, self.ends_at)
            && starts >= ends
        {
            return Err("starts_at must be before ends_at".into());
        }
        self.waiting_room.check_across_fields(self.starts_at)
    }

    /// Units per bucket: as even as possible, the remainder on the lowest buckets.
    pub fn bucket_split(&self) -> Vec<i64> {
        split_evenly(self.stock, self.buckets)
    }
}

pub use crate::inventory::split_evenly;

const SELECT_DEAL: &str = "SELECT id, name, stock_total, bucket_count, unit_price_minor, currency,
        per_user_limit, reservation_ttl_seconds, starts_at, ends_at, paused,
        late_payment_policy, capture_method, wr_enabled, wr_admit_per_second, wr_max_active,
        wr_pass_ttl_seconds, wr_queue_order, wr_prequeue_opens_at, wr_pow_bits, wr_checkout_url, wr_admission_mode, wr_min_per_second,
        wr_max_per_second, wr_target_p99_ms, wr_activation, wr_invitation, wr_priority,
        wr_page_template
    FROM deals WHERE id = $1";

pub async fn load(pool: &PgPool, id: &str) -> Result<Option<Deal>, StoreError> {
    Ok(sqlx::query_as::<_, Deal>(SELECT_DEAL)
        .bind(id)
        .fetch_optional(pool)
        .await?)
}

/// Up to `limit` deal ids, for the cache's catalogue.
pub async fn all_ids(pool: &PgPool, limit: usize) -> Result<Vec<String>, StoreError> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    Ok(sqlx::query_scalar("SELECT id FROM deals LIMIT $1")
        .bind(limit)
        .fetch_all(pool)
        .await?)
}

/// Creates the deal and its bucket rows in one transaction, and announces it to every
/// instance (their catalogues of deal ids learn it at once).
pub async fn create(pool: &PgPool, new: &NewDeal) -> Result<Deal, DealError> {
    new.validate()?;
    let mut tx = pool.begin().await.map_err(StoreError::from)?;
    let inserted = sqlx::query(
        "INSERT INTO deals (id, name, stock_total, bucket_count, unit_price_minor, currency,
             per_user_limit, reservation_ttl_seconds, starts_at, ends_at,
             late_payment_policy, capture_method, wr_enabled, wr_admit_per_second,
             wr_max_active, wr_pass_ttl_seconds, wr_queue_order, wr_prequeue_opens_at,
             wr_pow_bits, wr_checkout_url, wr_admission_mode, wr_min_per_second,
             wr_max_per_second, wr_target_p99_ms, wr_activation, wr_invitation, wr_priority,
             wr_page_template)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14,
                 $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27, $28)
         ON CONFLICT (id) DO NOTHING",
    )
    .bind(new.id.as_str())
    .bind(&new.name)
    .bind(new.stock)
    .bind(new.buckets)
    .bind(new.unit_price_minor)
    .bind(&new.currency)
    .bind(new.per_user_limit)
    .bind(new.reservation_ttl_seconds)
    .bind(new.starts_at)
    .bind(new.ends_at)
    .bind(new.payment_terms.late_payment_policy.as_str())
    .bind(new.payment_terms.capture_method.as_str())
    .bind(new.waiting_room.enabled)
    .bind(new.waiting_room.admit_per_second)
    .bind(new.waiting_room.max_active)
    .bind(new.waiting_room.pass_ttl_seconds)
    .bind(&new.waiting_room.queue_order)
    .bind(new.waiting_room.prequeue_opens_at)
    .bind(new.waiting_room.pow_bits)
    .bind(&new.waiting_room.checkout_url)
    .bind(new.waiting_room.admission.mode.as_str())
    .bind(new.waiting_room.admission.min_per_second)
    .bind(new.waiting_room.admission.max_per_second)
    .bind(new.waiting_room.admission.target_p99_ms)
    .bind(new.waiting_room.activation.as_str())
    .bind(new.waiting_room.invitation.as_ref().map(sqlx::types::Json))
    .bind(new.waiting_room.priority.as_ref().map(sqlx::types::Json))
    .bind(&new.waiting_room.page_template)
    .execute(&mut *tx)
    .await
    .map_err(StoreError::from)?;
    if inserted.rows_affected() == 0 {
        return Err(DealError::AlreadyExists(new.id.to_string()));
    }
    crate::inventory::create_buckets(&mut tx, new.id.as_str(), &new.bucket_split()).await?;
    let deal = sqlx::query_as::<_, Deal>(SELECT_DEAL)
        .bind(new.id.as_str())
        .fetch_one(&mut *tx)
        .await
        .map_err(StoreError::from)?;
    changes::announce(&mut tx, new.id.as_str()).await?;
    tx.commit().await.map_err(StoreError::from)?;
    Ok(deal)
}

/// Sets the deal's `paused` flag and announces the change, in the caller's transaction;
/// false when there is no such deal.
pub async fn set_paused(
    tx: &mut PgConnection,
    deal_id: &str,
    paused: bool,
) -> Result<bool, StoreError> {
    let updated = sqlx::query("UPDATE deals SET paused = $2 WHERE id = $1")
        .bind(deal_id)
        .bind(paused)
        .execute(&mut *tx)
        .await?;
    if updated.rows_affected() == 0 {
        return Ok(false);
    }
    changes::announce(tx, deal_id).await?;
    Ok(true)
}

/// Hands the deal's outflow to the operator at `admit_per_second` (`fixed`) or back to
/// the controller (`adaptive`), and announces the change; `None` when there is no such
/// deal with a waiting room.
pub async fn set_admission(
    pool: &PgPool,
    deal_id: &str,
    mode: AdmissionMode,
    admit_per_second: Option<i32>,
) -> Result<Option<Deal>, DealError> {
    if let Some(rate) = admit_per_second
        && !(1..=ADMIT_PER_SECOND_MAX).contains(&rate)
    {
        return Err(DealError::Invalid(
            "waiting_room.admit_per_second must be 1-100000".into(),
        ));
    }
    let mut tx = pool.begin().await.map_err(StoreError::from)?;
    let updated = sqlx::query(
        "UPDATE deals SET wr_admission_mode = $2,
                wr_admit_per_second = COALESCE($3, wr_admit_per_second)
          WHERE id = $1 AND wr_enabled",
    )
    .bind(deal_id)
    .bind(mode.as_str())
    .bind(admit_per_second)
    .execute(&mut *tx)
    .await
    .map_err(StoreError::from)?;
    if updated.rows_affected() == 0 {
        let exists: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM deals WHERE id = $1)")
            .bind(deal_id)
            .fetch_one(&mut *tx)
            .await
            .map_err(StoreError::from)?;
        return match exists {
            true => Err(DealError::NoWaitingRoom(deal_id.to_owned())),
            false => Ok(None),
        };
    }
    changes::announce(&mut tx, deal_id).await?;
    let deal = sqlx::query_as::<_, Deal>(SELECT_DEAL)
        .bind(deal_id)
        .fetch_one(&mut *tx)
        .await
        .map_err(StoreError::from)?;
    tx.commit().await.map_err(StoreError::from)?;
    Ok(Some(deal))
}

/// Records the deal's new bucket count and announces it, in the transaction that moved
/// the units.
pub async fn set_bucket_count(
    tx: &mut PgConnection,
    deal_id: &str,
    buckets: i32,
) -> Result<(), StoreError> {
    sqlx::query("UPDATE deals SET bucket_count = $2 WHERE id = $1")
        .bind(deal_id)
        .bind(buckets)
        .execute(&mut *tx)
        .await?;
    changes::announce(tx, deal_id).await
}

/// Adds `delta` units to the deal's stock total, in the transaction that changed its
/// buckets.
pub async fn add_stock_total(
    tx: &mut PgConnection,
    deal_id: &str,
    delta: i64,
) -> Result<(), StoreError> {
    sqlx::query("UPDATE deals SET stock_total = stock_total + $2 WHERE id = $1")
        .bind(deal_id)
        .bind(delta)
        .execute(tx)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_keeps_every_unit() {
        for (units, buckets) in [(0, 1), (100, 8), (7, 3), (3, 8), (1_000_000, 1024)] {
            let split = split_evenly(units, buckets);
            assert_eq!(split.len(), buckets as usize);
            assert_eq!(split.iter().sum::<i64>(), units);
            let (min, max) = (split.iter().min().unwrap(), split.iter().max().unwrap());
            assert!(max - min <= 1);
        }
    }
}
