//! The lines the advancer moves, read from PostgreSQL with their stock.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use crate::deals::WaitingRoomTerms;
use crate::inventory;
use crate::store::StoreError;
use crate::waiting_room::WaitingRoom;
use sqlx::Row;
use sqlx::postgres::PgRow;

/// Most deals with a waiting room advanced at once.
const LINES_MAX: i64 = 1000;

/// A deal with a waiting room, and its stock as last read.
#[derive(Debug, Clone)]
pub(super) struct Line {
    pub id: String,
    starts_at: Option<DateTime<Utc>>,
    ends_at: Option<DateTime<Utc>>,
    pub paused: bool,
    pub terms: WaitingRoomTerms,
    /// Units available in the last snapshot; -1 until read.
    pub available: i64,
}

impl<'r> sqlx::FromRow<'r, PgRow> for Line {
    fn from_row(row: &'r PgRow) -> Result<Self, sqlx::Error> {
        Ok(Self {
            id: row.try_get("id")?,
            starts_at: row.try_get("starts_at")?,
            ends_at: row.try_get("ends_at")?,
            paused: row.try_get("paused")?,
            terms: WaitingRoomTerms::from_row(row)?,
            available: -1,
        })
    }
}

impl Line {
    pub fn is_open(&self, now: DateTime<Utc>) -> bool {
        self.starts_at.is_none_or(|s| now >= s) && self.ends_at.is_none_or(|e| now < e)
    }
}

/// Deals with a waiting room still on sale, with their available units (read through
/// `inventory`, the owner of the stock). The same snapshot says which holders of outstanding
/// passes have already ordered: those slots are freed here, so a pass whose release was lost
/// (a Redis timeout after the order) cannot hold a unit back from the line until it
/// expires. Lines in `idle` have nobody waiting, so their slots matter to no one: not asked.
pub(super) async fn read(
    room: &WaitingRoom,
    pool: &PgPool,
    idle: &HashSet<String>,
) -> Result<Vec<Line>, StoreError> {
    let mut lines = sqlx::query_as::<_, Line>(
        "SELECT id, starts_at, ends_at, paused, wr_enabled, wr_admit_per_second,
                wr_max_active, wr_pass_ttl_seconds, wr_queue_order, wr_prequeue_opens_at,
                wr_pow_bits, wr_checkout_url, wr_admission_mode, wr_min_per_second,
                wr_max_per_second, wr_target_p99_ms, wr_activation, wr_invitation,
                wr_priority
           FROM deals
          WHERE wr_enabled AND (ends_at IS NULL OR ends_at > now())
          ORDER BY id LIMIT $1",
    )
    .bind(LINES_MAX)
    .fetch_all(pool)
    .await?;
    let busy: Vec<&Line> = lines.iter().filter(|l| !idle.contains(&l.id)).collect();
    let passes = active_passes(room, &busy).await;
    let asked: Vec<(String, String)> = passes
        .iter()
        .map(|(deal, _, user)| (deal.clone(), user.clone()))
        .collect();
    let ids: Vec<String> = lines.iter().map(|l| l.id.clone()).collect();
    let stock = inventory::available_and_holders(pool, &ids, &asked).await?;
    for line in &mut lines {
        line.available = stock.get(&line.id).map_or(0, |(available, _)| *available);
    }
    forget_used_passes(room, &passes, &stock).await;
    Ok(lines)
}

/// The outstanding passes of `lines`, as (deal, ticket, user).
async fn active_passes(room: &WaitingRoom, lines: &[&Line]) -> Vec<(String, String, String)> {
    let mut passes = Vec::new();
    for line in lines {
        let max = u32::try_from(line.terms.max_active).unwrap_or(1).max(1);
        match room.active_passes(&line.id, max).await {
            Ok(active) => passes.extend(
                active
                    .into_iter()
                    .map(|(ticket, user)| (line.id.clone(), ticket, user)),
            ),
            Err(error) => tracing::debug!(%error, deal = line.id, "passes not read"),
        }
    }
    passes
}

async fn forget_used_passes(
    room: &WaitingRoom,
    passes: &[(String, String, String)],
    stock: &HashMap<String, (i64, Vec<String>)>,
) {
    let mut used: HashMap<&str, Vec<&str>> = HashMap::new();
    for (deal, ticket, user) in passes {
        let ordered = stock
            .get(deal)
            .is_some_and(|(_, holders)| holders.contains(user));
        if ordered {
            used.entry(deal.as_str()).or_default().push(ticket.as_str());
        }
    }
    for (deal, tickets) in used {
        match room.forget_passes(deal, &tickets).await {
            Ok(0) => {}
            Ok(freed) => tracing::info!(deal, freed, "freed the slots of passes already used"),
            Err(error) => tracing::debug!(%error, deal, "used passes not freed"),
        }
    }
}
