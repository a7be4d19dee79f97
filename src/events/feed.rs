//! The feed: positioned events read in position order, as the pull API and the deliveries
//! see them, and the retention that deletes old ones.

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

use super::EventError;
use crate::store::StoreError;
use sqlx::Row;
use sqlx::postgres::PgRow;

/// One event of the feed.
#[derive(Debug, Clone)]
pub struct Event {
    pub id: i64,
    pub position: i64,
    pub kind: String,
    pub order_id: Option<Uuid>,
    pub deal_id: String,
    pub sequence: i32,
    pub status: Option<String>,
    pub user_id: Option<String>,
    pub quantity: Option<i32>,
    pub amount_minor: Option<i64>,
    pub currency: Option<String>,
    pub paused: Option<bool>,
    pub available: Option<i64>,
    pub occurred_at: DateTime<Utc>,
}

impl<'r> sqlx::FromRow<'r, PgRow> for Event {
    fn from_row(row: &'r PgRow) -> Result<Self, sqlx::Error> {
        Ok(Self {
            id: row.try_get("id")?,
            position: row.try_get("position")?,
            kind: row.try_get("type")?,
            order_id: row.try_get("order_id")?,
            deal_id: row.try_get("deal_id")?,
            sequence: row.try_get("sequence")?,
            status: row.try_get("status")?,
            user_id: row.try_get("user_id")?,
            quantity: row.try_get("quantity")?,
            amount_minor: row.try_get("amount_minor")?,
            currency: row.try_get("currency")?,
            paused: row.try_get("paused")?,
            available: row.try_get("available")?,
            occurred_at: row.try_get("occurred_at")?,
        })
    }
}

impl Event {
    /// The stable id: the same in the feed and in every delivery's `webhook-id`.
    pub fn public_id(&self) -> String {
        format!("evt_{}", self.id)
    }

    /// What per-object order is kept for: the order, or the deal for a deal event.
    pub fn object(&self) -> String {
        match self.order_id {
            Some(order) => order.to_string(),
            None => format!("deal:{}", self.deal_id),
        }
    }

    /// `data`: the object's id, its sequence and its state after the change.
    pub fn data(&self) -> Value {
        match self.order_id {
            Some(order) => json!({
                "order_id": order,
                "sequence": self.sequence,
                "status": self.status,
                "deal_id": self.deal_id,
                "user_id": self.user_id,
                "quantity": self.quantity,
                "amount_minor": self.amount_minor,
                "currency": self.currency,
            }),
            None => json!({
                "deal_id": self.deal_id,
                "sequence": self.sequence,
                "paused": self.paused,
                "available": self.available,
                "sold_out": self.available == Some(0),
            }),
        }
    }

    /// The time in RFC 3339, UTC.
    pub fn timestamp(&self) -> String {
        self.occurred_at
            .to_rfc3339_opts(SecondsFormat::Micros, true)
    }

    /// A delivery's body.
    pub fn body(&self) -> Value {
        json!({"type": self.kind, "timestamp": self.timestamp(), "data": self.data()})
    }

    /// The pull API's entry: the body with the id.
    pub fn entry(&self) -> Value {
        json!({"id": self.public_id(), "type": self.kind, "timestamp": self.timestamp(),
               "data": self.data()})
    }
}

const COLUMNS: &str = "e.id, p.position, e.type, e.order_id, e.deal_id, e.sequence, e.status,
                       e.user_id, e.quantity, e.amount_minor, e.currency, e.paused,
                       e.available, e.occurred_at";

/// The position a cursor stands for: a `next` from an earlier page, or an event's id (to
/// go on after the last event seen, once a page ended with `next` null). Anything else, or a
/// position never given, or an id not kept, is an unknown cursor.
pub async fn resolve_cursor(pool: &PgPool, cursor: &str) -> Result<i64, EventError> {
    let unknown = || EventError::Invalid(format!("unknown cursor {cursor:?}"));
    if let Some(id) = cursor.strip_prefix("evt_") {
        let id = id.parse::<i64>().map_err(|_| unknown())?;
        let position: Option<i64> =
            sqlx::query_scalar("SELECT position FROM event_positions WHERE event_id = $1")
                .bind(id)
                .fetch_optional(pool)
                .await
                .map_err(StoreError::from)?;
        return position.ok_or_else(unknown);
    }
    let position = cursor
        .parse::<i64>()
        .ok()
        .filter(|p| *p >= 0)
        .ok_or_else(unknown)?;
    if position > last_position(pool).await? {
        return Err(unknown());
    }
    Ok(position)
}

/// The highest position given so far (0 before the first).
pub async fn last_position(pool: &PgPool) -> Result<i64, StoreError> {
    Ok(
        sqlx::query_scalar("SELECT coalesce(max(position), 0) FROM event_positions")
            .fetch_one(pool)
            .await?,
    )
}

/// Up to `limit` events after `after`, of the given types (`None`: all), in position order.
pub async fn after(
    pool: &PgPool,
    after: i64,
    limit: i64,
    types: Option<&[String]>,
) -> Result<Vec<Event>, StoreError> {
    let sql = format!(
        "SELECT {COLUMNS} FROM event_positions p JOIN events e ON e.id = p.event_id
          WHERE p.position > $1 AND ($3::text[] IS NULL OR e.type = ANY($3))
          ORDER BY p.position LIMIT $2"
    );
    Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(after)
        .bind(limit)
        .bind(types)
        .fetch_all(pool)
        .await?)
}

/// Deletes positioned events older than `hours`, keeping each order's and deal's newest
/// event so that its sequence carries on, and their positions. Returns how many went.
pub async fn expire(pool: &PgPool, hours: u64, batch: i64) -> Result<u64, StoreError> {
    let mut tx = pool.begin().await?;
    // Each candidate's newer event is one index lookup, never a scan of the events kept.
    sqlx::raw_sql(
        "SET LOCAL enable_seqscan = off; SET LOCAL enable_hashjoin = off;
         SET LOCAL enable_mergejoin = off; SET LOCAL jit = off",
    )
    .execute(&mut *tx)
    .await?;
    let gone: Vec<i64> = sqlx::query_scalar(
        "DELETE FROM events WHERE id IN (
             SELECT e.id FROM events e
              WHERE e.occurred_at < now() - make_interval(hours => $1)
                AND (e.xact IS NULL OR pg_visible_in_snapshot(
                         e.xact, (SELECT s.done FROM event_sequencer s)))
                AND CASE WHEN e.order_id IS NULL
                    THEN EXISTS (SELECT 1 FROM events n
                                  WHERE n.order_id IS NULL AND n.deal_id = e.deal_id
                                    AND n.sequence > e.sequence)
                    ELSE EXISTS (SELECT 1 FROM events n
                                  WHERE n.order_id = e.order_id AND n.sequence > e.sequence)
                    END
              LIMIT $2)
         RETURNING id",
    )
    .bind(i32::try_from(hours).unwrap_or(i32::MAX))
    .bind(batch)
    .fetch_all(&mut *tx)
    .await?;
    let (Some(low), Some(high)) = (gone.iter().min(), gone.iter().max()) else {
        return Ok(0);
    };
    // The range lets the block summaries on `event_id` find the rows.
    sqlx::query(
        "DELETE FROM event_positions
          WHERE event_id >= $1 AND event_id <= $2 AND event_id = ANY($3)",
    )
    .bind(low)
    .bind(high)
    .bind(&gone)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(gone.len() as u64)
}

/// Age in seconds of the oldest event kept, by id (0 when there is none).
pub async fn oldest_seconds(pool: &PgPool) -> Result<f64, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT coalesce((SELECT extract(epoch FROM now() - occurred_at)::float8
                            FROM events ORDER BY id LIMIT 1), 0)",
    )
    .fetch_one(pool)
    .await?)
}
