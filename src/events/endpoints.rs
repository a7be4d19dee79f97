//! The endpoints table: where the shop wants events pushed, with its secret, its filter and
//! how far it has accepted. The only writer of `event_endpoints`.

use chrono::{DateTime, Utc};
use sqlx::{PgPool, Row};
use uuid::Uuid;

use super::{EventError, TYPES, signing};
use crate::store::StoreError;
use sqlx::postgres::PgRow;

/// An endpoint as the deliveries and the admin API see it.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub id: Uuid,
    pub url: String,
    /// `None`: every type.
    pub event_types: Option<Vec<String>>,
    pub enabled: bool,
    pub secret: Vec<u8>,
    pub previous_secret: Option<Vec<u8>>,
    pub previous_until: Option<DateTime<Utc>>,
    /// `active`, or `failing` once deliveries failed past the limit.
    pub state: String,
    /// The highest feed position the endpoint has accepted (or skipped by its filter).
    pub delivered_position: i64,
    pub failing_since: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
}

impl<'r> sqlx::FromRow<'r, PgRow> for Endpoint {
    fn from_row(row: &'r PgRow) -> Result<Self, sqlx::Error> {
        Ok(Self {
            id: row.try_get("id")?,
            url: row.try_get("url")?,
            event_types: row.try_get("event_types")?,
            enabled: row.try_get("enabled")?,
            secret: row.try_get("secret")?,
            previous_secret: row.try_get("previous_secret")?,
            previous_until: row.try_get("previous_until")?,
            state: row.try_get("state")?,
            delivered_position: row.try_get("delivered_position")?,
            failing_since: row.try_get("failing_since")?,
            last_error: row.try_get("last_error")?,
        })
    }
}

/// An endpoint with its backlog, for the admin view.
#[derive(Debug, Clone)]
pub struct EndpointView {
    pub endpoint: Endpoint,
    pub pending: i64,
    pub oldest_pending_seconds: f64,
}

/// What a create or an update sets; `None` leaves a field as it is.
#[derive(Debug, Default, Clone)]
pub struct Changes {
    pub url: Option<String>,
    pub event_types: Option<Option<Vec<String>>>,
    pub enabled: Option<bool>,
}

/// Pending events are counted up to this many, so the view and the gauges of an endpoint
/// with a huge backlog cost a bounded scan.
pub const PENDING_COUNTED_MAX: i64 = 100_000;

const COLUMNS: &str = "id, url, event_types, enabled, secret,
                       CASE WHEN previous_until > now() THEN previous_secret END
                           AS previous_secret, previous_until,
                       state, delivered_position, failing_since, last_error";

/// Checks a filter: known types, at least one.
pub fn check_types(types: &[String]) -> Result<(), EventError> {
    if types.is_empty() {
        return Err(EventError::Invalid("event_types must not be empty".into()));
    }
    match types.iter().find(|t| !TYPES.contains(&t.as_str())) {
        Some(unknown) => Err(EventError::Invalid(format!(
            "unknown event type {unknown:?}"
        ))),
        None => Ok(()),
    }
}

/// Saves a new endpoint with a fresh secret. A new endpoint starts at the feed's end: it
/// is sent what happens from now on (a replay sends the past).
pub async fn create(pool: &PgPool, url: &str, changes: &Changes) -> Result<Endpoint, EventError> {
    let mut tx = pool.begin().await.map_err(StoreError::from)?;
    let row = sqlx::query_as::<_, Endpoint>(sqlx::AssertSqlSafe(format!(
        "INSERT INTO event_endpoints (id, url, event_types, enabled, secret, delivered_position)
         VALUES ($1, $2, $3, $4, $5,
                 (SELECT coalesce(max(position), 0) FROM event_positions))
         RETURNING {COLUMNS}"
    )))
    .bind(Uuid::now_v7())
    .bind(url)
    .bind(changes.event_types.clone().flatten())
    .bind(changes.enabled.unwrap_or(true))
    .bind(signing::generate())
    .fetch_one(&mut *tx)
    .await
    .map_err(StoreError::from)?;
    tx.commit().await.map_err(StoreError::from)?;
    Ok(row)
}

/// Every endpoint, oldest first.
pub async fn list(pool: &PgPool) -> Result<Vec<Endpoint>, StoreError> {
    let sql = format!("SELECT {COLUMNS} FROM event_endpoints ORDER BY created_at, id");
    Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .fetch_all(pool)
        .await?)
}

/// One endpoint.
pub async fn get(pool: &PgPool, id: Uuid) -> Result<Endpoint, EventError> {
    let sql = format!("SELECT {COLUMNS} FROM event_endpoints WHERE id = $1");
    sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(id)
        .fetch_optional(pool)
        .await
        .map_err(StoreError::from)?
        .ok_or(EventError::NotFound)
}

/// The endpoint with its pending events and the age of the oldest.
pub async fn view(pool: &PgPool, endpoint: Endpoint) -> Result<EndpointView, StoreError> {
    let row = sqlx::query(
        "SELECT count(*) AS pending,
                coalesce(extract(epoch FROM now() - min(occurred_at)), 0)::float8 AS oldest
           FROM (SELECT e.occurred_at FROM event_positions p JOIN events e ON e.id = p.event_id
                  WHERE p.position > $1 AND ($2::text[] IS NULL OR e.type = ANY($2))
                  ORDER BY p.position LIMIT $3) pending",
    )
    .bind(endpoint.delivered_position)
    .bind(&endpoint.event_types)
    .bind(PENDING_COUNTED_MAX)
    .fetch_one(pool)
    .await?;
    Ok(EndpointView {
        pending: row.get("pending"),
        oldest_pending_seconds: row.get("oldest"),
        endpoint,
    })
}

/// Applies `changes`; an endpoint enabled again after failing starts retrying.
pub async fn update(pool: &PgPool, id: Uuid, changes: &Changes) -> Result<Endpoint, EventError> {
    let sql = format!(
        "UPDATE event_endpoints
            SET url = coalesce($2, url),
                event_types = CASE WHEN $3 THEN $4 ELSE event_types END,
                enabled = coalesce($5, enabled),
                state = CASE WHEN $5 THEN 'active' ELSE state END,
                failing_since = CASE WHEN $5 THEN NULL ELSE failing_since END,
                updated_at = now()
          WHERE id = $1
        RETURNING {COLUMNS}"
    );
    let mut tx = pool.begin().await.map_err(StoreError::from)?;
    let row: Option<Endpoint> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(id)
        .bind(&changes.url)
        .bind(changes.event_types.is_some())
        .bind(changes.event_types.clone().flatten())
        .bind(changes.enabled)
        .fetch_optional(&mut *tx)
        .await
        .map_err(StoreError::from)?;
    tx.commit().await.map_err(StoreError::from)?;
    row.ok_or(EventError::NotFound)
}

/// Removes an endpoint; its events stay in the feed.
pub async fn delete(pool: &PgPool, id: Uuid) -> Result<(), EventError> {
    let mut tx = pool.begin().await.map_err(StoreError::from)?;
    let deleted = sqlx::query("DELETE FROM event_endpoints WHERE id = $1")
        .bind(id)
        .execute(&mut *tx)
        .await
        .map_err(StoreError::from)?;
    tx.commit().await.map_err(StoreError::from)?;
    match deleted.rows_affected() {
        0 => Err(EventError::NotFound),
        _ => Ok(()),
    }
}

/// A new secret; the current one keeps signing for `overlap_seconds`.
pub async fn rotate(pool: &PgPool, id: Uuid, overlap_seconds: u64) -> Result<Vec<u8>, EventError> {
    let secret = signing::generate();
    let mut tx = pool.begin().await.map_err(StoreError::from)?;
    let updated = sqlx::query(
        "UPDATE event_endpoints
            SET previous_secret = secret, secret = $2,
                previous_until = now() + make_interval(secs => $3), updated_at = now()
          WHERE id = $1",
    )
    .bind(id)
    .bind(&secret)
    .bind(overlap_seconds as f64)
    .execute(&mut *tx)
    .await
    .map_err(StoreError::from)?;
    tx.commit().await.map_err(StoreError::from)?;
    match updated.rows_affected() {
        0 => Err(EventError::NotFound),
        _ => Ok(secret),
    }
}

/// Sends again everything after `after` (a feed position), and takes a failing endpoint
/// back into the deliveries.
pub async fn replay(pool: &PgPool, id: Uuid, after: i64) -> Result<Endpoint, EventError> {
    let sql = format!(
        "UPDATE event_endpoints
            SET delivered_position = $2, state = 'active', failing_since = NULL,
                updated_at = now()
          WHERE id = $1
        RETURNING {COLUMNS}"
    );
    let mut tx = pool.begin().await.map_err(StoreError::from)?;
    let row: Option<Endpoint> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(id)
        .bind(after)
        .fetch_optional(&mut *tx)
        .await
        .map_err(StoreError::from)?;
    tx.commit().await.map_err(StoreError::from)?;
    row.ok_or(EventError::NotFound)
}

/// Records accepted deliveries: the endpoint has everything up to `to`. Only moves forward
/// from `from`, so a replay set meanwhile is not undone.
pub async fn advance(pool: &PgPool, id: Uuid, from: i64, to: i64) -> Result<bool, StoreError> {
    let mut tx = pool.begin().await?;
    let moved = sqlx::query(
        "UPDATE event_endpoints
            SET delivered_position = $3, failing_since = NULL, last_error = NULL
          WHERE id = $1 AND delivered_position = $2",
    )
    .bind(id)
    .bind(from)
    .bind(to)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(moved.rows_affected() == 1)
}

/// Records a failed attempt at `now` (the application's clock); past
/// `failing_after_seconds` of failures the endpoint is marked failing. Returns the
/// endpoint's state afterwards.
pub async fn record_failure(
    pool: &PgPool,
    id: Uuid,
    error: &str,
    failing_after_seconds: u64,
    now: DateTime<Utc>,
) -> Result<String, StoreError> {
    let mut tx = pool.begin().await?;
    let state: Option<String> = sqlx::query_scalar(
        "UPDATE event_endpoints
            SET failing_since = coalesce(failing_since, $4), last_error = $2,
                state = CASE WHEN coalesce(failing_since, $4)
                                  <= $4 - make_interval(secs => $3)
                             THEN 'failing' ELSE state END
          WHERE id = $1
        RETURNING state",
    )
    .bind(id)
    .bind(error)
    .bind(failing_after_seconds as f64)
    .bind(now)
    .fetch_optional(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(state.unwrap_or_else(|| "deleted".to_owned()))
}
