//! The `payment_attempts` table: one row per try at taking money for an order.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

pub use crate::domain::AttemptStatus;
use crate::domain::{CaptureMethod, OrderStatus};
use crate::orders::settlement;
use crate::store::{StoreError, Writes};
use sqlx::Row;
use sqlx::postgres::PgRow;

use crate::store::rows;

/// An attempt as stored.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub id: Uuid,
    pub order_id: Uuid,
    pub provider: String,
    pub provider_payment_id: Option<String>,
    pub status: AttemptStatus,
    pub amount_minor: i64,
    pub currency: String,
    pub capture_method: CaptureMethod,
    pub checkout_url: Option<String>,
    pub provider_expires_at: Option<DateTime<Utc>>,
    pub accepted: bool,
    pub checks: i32,
    pub created_at: DateTime<Utc>,
    /// A create call may have reached the provider without our learning the payment id.
    pub create_uncertain: bool,
}

impl<'r> sqlx::FromRow<'r, PgRow> for Attempt {
    fn from_row(row: &'r PgRow) -> Result<Self, sqlx::Error> {
        Ok(Self {
            id: row.try_get("id")?,
            order_id: row.try_get("order_id")?,
            provider: row.try_get("provider")?,
            provider_payment_id: row.try_get("provider_payment_id")?,
            status: rows::parsed(row, "status")?,
            amount_minor: row.try_get("amount_minor")?,
            currency: row.try_get("currency")?,
            capture_method: rows::parsed(row, "capture_method")?,
            checkout_url: row.try_get("checkout_url")?,
            provider_expires_at: row.try_get("provider_expires_at")?,
            accepted: row.try_get("accepted")?,
            checks: row.try_get("checks")?,
            created_at: row.try_get("created_at")?,
            create_uncertain: row.try_get("create_uncertain")?,
        })
    }
}

const COLUMNS: &str = "id, order_id, provider, provider_payment_id, status, amount_minor, currency,
    capture_method, checkout_url, provider_expires_at, accepted, checks, created_at, create_uncertain";

/// Opens the first payment attempt of every order placed, inside the order batch's own
/// transaction (the SQL function `payments_open_initial_attempts`); the provider itself is
/// called only after the commit.
pub struct InitialAttempt {
    provider: String,
}

impl InitialAttempt {
    pub fn hook(provider: &str) -> std::sync::Arc<dyn crate::orders::PlacementHook> {
        std::sync::Arc::new(Self {
            provider: provider.to_owned(),
        })
    }
}

impl crate::orders::PlacementHook for InitialAttempt {
    fn sql_function(&self) -> &'static str {
        "payments_open_initial_attempts"
    }

    fn argument(&self) -> &str {
        &self.provider
    }
}

/// What asking for another attempt under a client's key came to.
#[derive(Debug)]
pub enum Keyed {
    /// A new attempt, not yet opened at the provider.
    Created(Attempt),
    /// The key was used before: that attempt, and whether it may still be opened at the
    /// provider (the order is pending and its reservation has not expired).
    Replayed(Attempt, bool),
    /// The order no longer waits for payment.
    NotPending,
    /// The order's `expires_at` has passed (database clock).
    Expired,
    /// The order already has `attempts_max` attempts.
    Exhausted,
}

/// Starts another attempt for a pending order under the client's key, in a short
/// transaction that locks the order, so that the cap on attempts and the expiry are checked
/// against what is committed. A key used before returns that attempt, whatever the order's
/// state now.
pub async fn insert_keyed(
    pool: &PgPool,
    order_id: Uuid,
    provider: &str,
    key: &str,
    attempts_max: u32,
) -> Result<Keyed, StoreError> {
    let mut tx = pool.begin().await?;
    let gate: Option<(String, bool, i64)> = sqlx::query_as(
        "SELECT o.status, o.expires_at > now(),
                (SELECT count(*) FROM payment_attempts a WHERE a.order_id = o.id)
           FROM orders o WHERE o.id = $1 FOR NO KEY UPDATE OF o",
    )
    .bind(order_id)
    .fetch_optional(&mut *tx)
    .await?;
    let Some((status, open, count)) = gate else {
        return Ok(Keyed::NotPending);
    };
    let sql = format!(
        "SELECT {COLUMNS} FROM payment_attempts WHERE order_id = $1 AND idempotency_key = $2"
    );
    let existing = sqlx::query_as::<_, Attempt>(sqlx::AssertSqlSafe(sql))
        .bind(order_id)
        .bind(key)
        .fetch_optional(&mut *tx)
        .await?;
    let verdict = match existing {
        Some(attempt) => Keyed::Replayed(attempt, status == "PENDING_PAYMENT" && open),
        None if status != "PENDING_PAYMENT" => Keyed::NotPending,
        None if !open => Keyed::Expired,
        None if count >= i64::from(attempts_max) => Keyed::Exhausted,
        None => Keyed::Created(insert_next(&mut tx, order_id, provider, key).await?),
    };
    tx.commit().await?;
    Ok(verdict)
}

async fn insert_next(
    tx: &mut PgConnection,
    order_id: Uuid,
    provider: &str,
    key: &str,
) -> Result<Attempt, StoreError> {
    let sql = format!(
        "INSERT INTO payment_attempts (id, order_id, provider, status, amount_minor, currency, capture_method, idempotency_key)
         SELECT $1, o.id, $3, 'PENDING', o.amount_minor, o.currency, o.capture_method, $4
           FROM orders o
          WHERE o.id = $2
         RETURNING {COLUMNS}"
    );
    Ok(sqlx::query_as::<_, Attempt>(sqlx::AssertSqlSafe(sql))
        .bind(Uuid::now_v7())
        .bind(order_id)
        .bind(provider)
        .bind(key)
        .fetch_one(tx)
        .await?)
}

/// The attempt created with the order.
pub async fn initial(pool: &PgPool, order_id: Uuid) -> Result<Option<Attempt>, StoreError> {
    let sql = format!(
        "SELECT {COLUMNS} FROM payment_attempts WHERE order_id = $1 AND idempotency_key IS NULL"
    );
    Ok(sqlx::query_as::<_, Attempt>(sqlx::AssertSqlSafe(sql))
        .bind(order_id)
        .fetch_optional(pool)
        .await?)
}

/// The newest attempt of an order, for showing its payment.
pub async fn latest(pool: &PgPool, order_id: Uuid) -> Result<Option<Attempt>, StoreError> {
    let sql = format!(
        "SELECT {COLUMNS} FROM payment_attempts WHERE order_id = $1 ORDER BY created_at DESC, id DESC LIMIT 1"
    );
    Ok(sqlx::query_as::<_, Attempt>(sqlx::AssertSqlSafe(sql))
        .bind(order_id)
        .fetch_optional(pool)
        .await?)
}

/// Records what the provider answered to the create call, and lets the reservation follow
/// the provider's session when that ends first. Returns the order's expiry.
pub async fn record_created(
    pool: &PgPool,
    attempt_id: Uuid,
    order_id: Uuid,
    provider_payment_id: &str,
    checkout_url: Option<&str>,
    provider_expires_at: Option<DateTime<Utc>>,
) -> Result<Option<DateTime<Utc>>, StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query(
        "UPDATE payment_attempts
            SET provider_payment_id = COALESCE(provider_payment_id, $2), checkout_url = $3,
                provider_expires_at = $4, updated_at = now()
          WHERE id = $1",
    )
    .bind(attempt_id)
    .bind(provider_payment_id)
    .bind(checkout_url)
    .bind(provider_expires_at)
    .execute(&mut *tx)
    .await?;
    let expires_at = settlement::follow_session(&mut tx, order_id, provider_expires_at).await?;
    tx.commit().await?;
    Ok(expires_at)
}

/// Locks the attempt a provider payment belongs to: by provider payment id, or (before the
/// create answer was recorded) by the reference we sent, adopting the payment id.
pub async fn lock_for_payment(
    tx: &mut PgConnection,
    provider: &str,
    provider_payment_id: &str,
    reference: Option<Uuid>,
) -> Result<Option<Attempt>, StoreError> {
    let sql = format!(
        "SELECT {COLUMNS} FROM payment_attempts WHERE provider = $1 AND provider_payment_id = $2 FOR UPDATE"
    );
    let found = sqlx::query_as::<_, Attempt>(sqlx::AssertSqlSafe(sql))
        .bind(provider)
        .bind(provider_payment_id)
        .fetch_optional(&mut *tx)
        .await?;
    if found.is_some() {
        return Ok(found);
    }
    let Some(reference) = reference else {
        return Ok(None);
    };
    let sql = format!(
        "UPDATE payment_attempts SET provider_payment_id = $3, updated_at = now()
          WHERE id = $1 AND provider = $2 AND provider_payment_id IS NULL
         RETURNING {COLUMNS}"
    );
    let adopted = sqlx::query_as::<_, Attempt>(sqlx::AssertSqlSafe(sql))
        .bind(reference)
        .bind(provider)
        .bind(provider_payment_id)
        .fetch_optional(&mut *tx)
        .await?;
    if adopted.is_some() {
        return Ok(adopted);
    }
    // Another report of the same payment adopted it first: read it as it is now.
    let sql = format!(
        "SELECT {COLUMNS} FROM payment_attempts WHERE provider = $1 AND provider_payment_id = $2 FOR UPDATE"
    );
    Ok(sqlx::query_as::<_, Attempt>(sqlx::AssertSqlSafe(sql))
        .bind(provider)
        .bind(provider_payment_id)
        .fetch_optional(&mut *tx)
        .await?)
}

/// Moves an attempt to `to`, guarded by its current status; false if it had moved already.
pub async fn transition(
    tx: &mut PgConnection,
    attempt_id: Uuid,
    from: AttemptStatus,
    to: AttemptStatus,
) -> Result<bool, StoreError> {
    let updated = sqlx::query(
        "UPDATE payment_attempts SET status = $3, updated_at = now() WHERE id = $1 AND status = $2",
    )
    .bind(attempt_id)
    .bind(from.as_str())
    .bind(to.as_str())
    .execute(tx)
    .await?;
    Ok(updated.rows_affected() == 1)
}

/// Asks again later about a payment the provider still has in progress.
pub async fn postpone(
    pool: &PgPool,
    writes: Writes,
    attempt_id: Uuid,
    backoff_max_seconds: u32,
) -> Result<(), StoreError> {
    let mut conn = writes.acquire(pool).await?;
    sqlx::query(
        "UPDATE payment_attempts
            SET checks = checks + 1,
                next_check_at = now() + make_interval(secs => LEAST($2, power(2, LEAST(checks, 16)))::float8)
          WHERE id = $1",
    )
    .bind(attempt_id)
    .bind(f64::from(backoff_max_seconds))
    .execute(&mut *conn)
    .await?;
    conn.commit().await
}

/// Where a queued capture stands once its order has been re-checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaptureClaim {
    /// The order still waits for this money (and its hold has not ended): capture.
    Claimed,
    /// The order was cancelled, expired or paid otherwise, or its hold ended: void instead.
    OrderGone,
    /// The attempt has already been settled: nothing to do.
    Settled,
}

/// Re-checks the order of a queued capture and, when it still waits for this payment,
/// marks the capture as in flight (committed before the provider is called, so a void of
/// the same payment waits for it and no lock is held across the call).
pub async fn claim_capture(
    pool: &PgPool,
    writes: Writes,
    attempt_id: Uuid,
    grace_seconds: u32,
) -> Result<CaptureClaim, StoreError> {
    let mut conn = writes.acquire(pool).await?;
    let row: Option<(String, bool)> = sqlx::query_as(
        "WITH claim AS (
             UPDATE payment_attempts a SET capture_claimed_at = now(), updated_at = now()
               FROM orders o
              WHERE a.id = $1 AND o.id = a.order_id AND a.status = 'PENDING'
                AND o.status = $3
                AND o.expires_at > now() - make_interval(secs => $2)
             RETURNING a.id)
         SELECT a.status, EXISTS (SELECT 1 FROM claim)
           FROM payment_attempts a WHERE a.id = $1",
    )
    .bind(attempt_id)
    .bind(f64::from(grace_seconds))
    .bind(OrderStatus::PendingPayment.as_str())
    .fetch_optional(&mut *conn)
    .await?;
    conn.commit().await?;
    Ok(match row {
        Some((_, true)) => CaptureClaim::Claimed,
        Some((status, false)) if status == AttemptStatus::Pending.as_str() => {
            CaptureClaim::OrderGone
        }
        _ => CaptureClaim::Settled,
    })
}

/// The capture of this attempt will not happen (its order is gone): a void may proceed.
pub async fn drop_capture_claim(
    pool: &PgPool,
    writes: Writes,
    attempt_id: Uuid,
) -> Result<(), StoreError> {
    let mut conn = writes.acquire(pool).await?;
    sqlx::query("UPDATE payment_attempts SET capture_claimed_at = NULL WHERE id = $1")
        .bind(attempt_id)
        .execute(&mut *conn)
        .await?;
    conn.commit().await
}

/// Whether a capture of this pending attempt is in flight (a void must wait for it).
pub async fn capture_in_flight(pool: &PgPool, attempt_id: Uuid) -> Result<bool, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM payment_attempts
                         WHERE id = $1 AND status = 'PENDING' AND capture_claimed_at IS NOT NULL)",
    )
    .bind(attempt_id)
    .fetch_one(pool)
    .await?)
}

/// A create call for the attempt may have reached the provider.
pub async fn mark_create_uncertain(
    pool: &PgPool,
    writes: Writes,
    attempt_id: Uuid,
) -> Result<(), StoreError> {
    let mut conn = writes.acquire(pool).await?;
    sqlx::query("UPDATE payment_attempts SET create_uncertain = true WHERE id = $1")
        .bind(attempt_id)
        .execute(&mut *conn)
        .await?;
    conn.commit().await
}

/// Whether the order of `attempt` has another attempt still waiting for the payer.
pub async fn other_pending(tx: &mut PgConnection, attempt: &Attempt) -> Result<bool, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM payment_attempts WHERE order_id = $1 AND id <> $2 AND status = 'PENDING')",
    )
    .bind(attempt.order_id)
    .bind(attempt.id)
    .fetch_one(tx)
    .await?)
}

/// Marks the attempt as the one that paid its order (unique per order).
pub async fn accept(tx: &mut PgConnection, attempt_id: Uuid) -> Result<(), StoreError> {
    sqlx::query("UPDATE payment_attempts SET accepted = true WHERE id = $1")
        .bind(attempt_id)
        .execute(tx)
        .await?;
    Ok(())
}

/// The attempts of an order still open at the provider: id and provider payment id.
pub async fn open_at_provider(
    conn: &mut PgConnection,
    order_id: Uuid,
) -> Result<Vec<(Uuid, String)>, StoreError> {
    Ok(sqlx::query_as(
        "SELECT id, provider_payment_id FROM payment_attempts
          WHERE order_id = $1 AND status = 'PENDING' AND provider_payment_id IS NOT NULL",
    )
    .bind(order_id)
    .fetch_all(conn)
    .await?)
}

/// Closes an attempt no create call ever reached the provider with, as EXPIRED; `None`
/// when it is not such an attempt (any more).
pub async fn expire_never_created(
    tx: &mut PgConnection,
    attempt_id: Uuid,
) -> Result<Option<Attempt>, StoreError> {
    let sql = format!(
        "UPDATE payment_attempts SET status = 'EXPIRED', updated_at = now()
          WHERE id = $1 AND status = 'PENDING' AND provider_payment_id IS NULL
            AND NOT create_uncertain
         RETURNING {COLUMNS}"
    );
    Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(attempt_id)
        .fetch_optional(tx)
        .await?)
}
