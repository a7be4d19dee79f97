//! The operator log: every change an operator makes, with who made it, so a deal created
//! or paused in the middle of a sale can be traced to a person. The only writer of
//! `operator_log`; a handler or command records a change with one call to [`record`].
//!
//! Who is named by the credential that made the change: a provider token's user claim,
//! `admin-token` for the static bootstrap token, `cli:<login>` for the command line.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use sqlx::Row;
use sqlx::postgres::PgRow;

/// Most entries one page of the log holds, whatever `limit` asks.
pub const PAGE_ENTRIES_MAX: i64 = 1000;

/// Entries a page holds when `limit` is not given.
pub const PAGE_ENTRIES_DEFAULT: i64 = 100;

/// Who made an admin change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Operator(String);

impl Operator {
    /// The static admin token (`auth.admin_token`), which names no one.
    pub fn admin_token() -> Self {
        Self("admin-token".into())
    }

    /// A provider token's user.
    pub fn named(user: &str) -> Self {
        Self(user.to_owned())
    }

    /// Whoever runs the command line, by their login.
    pub fn command_line() -> Self {
        let login = std::env::var("USER")
            .or_else(|_| std::env::var("LOGNAME"))
            .unwrap_or_else(|_| "unknown".into());
        Self(format!("cli:{login}"))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// What was changed: `deal.created`, `deal.stock_adjusted`, … and the deal, order or
/// endpoint it was done to.
pub struct Change<'a> {
    pub action: &'static str,
    pub target: &'a str,
    pub detail: serde_json::Value,
}

/// Records a change. A change already made is not undone when its record cannot be
/// written: the failure is logged with the whole entry, so it is not lost either.
pub async fn record(pool: &PgPool, who: &Operator, change: Change<'_>) {
    let written = insert(pool, who, &change).await;
    if let Err(error) = written {
        tracing::error!(
            %error,
            who = who.as_str(),
            action = change.action,
            target = change.target,
            detail = %change.detail,
            "an operator change could not be written to the operator log"
        );
    }
}

/// The entry's row, committed before the change's answer goes out (in its own transaction,
/// so that behind a transaction pooler it is not left waiting for the connection's return).
async fn insert(pool: &PgPool, who: &Operator, change: &Change<'_>) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query("INSERT INTO operator_log (who, action, target, detail) VALUES ($1, $2, $3, $4)")
        .bind(who.as_str())
        .bind(change.action)
        .bind(change.target)
        .bind(&change.detail)
        .execute(&mut *tx)
        .await?;
    tx.commit().await
}

/// One entry of the log.
#[derive(Debug, Serialize)]
pub struct Entry {
    #[serde(skip)]
    pub id: i64,
    pub at: DateTime<Utc>,
    pub who: String,
    pub action: String,
    pub target: String,
    pub detail: serde_json::Value,
}

impl<'r> sqlx::FromRow<'r, PgRow> for Entry {
    fn from_row(row: &'r PgRow) -> Result<Self, sqlx::Error> {
        Ok(Self {
            id: row.try_get("id")?,
            at: row.try_get("at")?,
            who: row.try_get("who")?,
            action: row.try_get("action")?,
            target: row.try_get("target")?,
            detail: row.try_get("detail")?,
        })
    }
}

/// A page of the log, oldest first, and the cursor to read on from (the last entry's, or
/// `after` itself when the page is empty, so a follower can poll with it).
#[derive(Debug, Serialize)]
pub struct Page {
    pub entries: Vec<Entry>,
    pub next: String,
}

/// A cursor given back by [`Page::next`]; malformed ones are refused by the caller.
pub fn parse_cursor(raw: &str) -> Option<i64> {
    raw.parse().ok().filter(|id: &i64| *id >= 0)
}

/// The entries after `after` (0: from the start), at most `limit` (capped).
pub async fn page(pool: &PgPool, after: i64, limit: i64) -> Result<Page, sqlx::Error> {
    let entries: Vec<Entry> = sqlx::query_as(
        "SELECT id, at, who, action, target, detail FROM operator_log
         WHERE id > $1 ORDER BY id LIMIT $2",
    )
    .bind(after)
    .bind(limit.clamp(1, PAGE_ENTRIES_MAX))
    .fetch_all(pool)
    .await?;
    let next = entries.last().map_or(after, |entry| entry.id).to_string();
    Ok(Page { entries, next })
}
