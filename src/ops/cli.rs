//! `flashgate deals …` and `flashgate check`: operator commands that talk to PostgreSQL
//! (and Redis, for the sold-out flag and the waiting-room lines) directly, so they work with no gateway running and
//! act on every instance at once. Output is JSON, one document per command.

use chrono::{DateTime, Utc};
use clap::Subcommand;
use serde::Serialize;
use sqlx::PgPool;

use super::{audit, pause, rebalance};
use crate::config::{Settings, millis};
use crate::deals::{self, Deal, NewDeal};
use crate::domain::DealId;
use crate::inventory;
use crate::redis_link::RedisHandle;
use crate::store::Pools;
use crate::waiting_room::WaitingRoom;

#[derive(Debug, Subcommand)]
pub enum DealsCommand {
    /// List every deal with its live stock.
    List,
    /// Show one deal's live stock, bucket by bucket.
    Show { id: String },
    /// Create a deal and its buckets.
    Create {
        #[arg(long)]
        id: String,
        #[arg(long)]
        name: String,
        #[arg(long)]
        stock: i64,
        #[arg(long, default_value_t = 8)]
        buckets: i32,
        #[arg(long)]
        unit_price_minor: i64,
        #[arg(long, default_value = "EUR")]
        currency: String,
        #[arg(long, default_value_t = 1)]
        per_user_limit: i32,
        #[arg(long, default_value_t = 300)]
        reservation_ttl_seconds: i32,
        /// RFC 3339, e.g. 2026-12-01T09:00:00Z; open at once when left out.
        #[arg(long)]
        starts_at: Option<DateTime<Utc>>,
        #[arg(long)]
        ends_at: Option<DateTime<Utc>>,
    },
    /// Add (positive) or remove (negative) available units.
    Stock {
        id: String,
        #[arg(long, allow_hyphen_values = true)]
        delta: i64,
    },
    /// Stop taking orders for the deal on every instance (answered `sale-not-open`).
    Pause { id: String },
    /// Take orders again after a pause.
    Resume { id: String },
    /// Spread the available units over a new number of buckets.
    Rebalance {
        id: String,
        #[arg(long)]
        buckets: i32,
    },
    /// Drain the deal's waiting room: close the line for good, tell everyone still waiting
    /// (their tickets read `expired`) and hand out no more passes. Needs Redis.
    DrainQueue { id: String },
}

fn admin_pool(settings: &Settings) -> Result<PgPool, String> {
    Pools::new(&settings.database)
        .map(|pools| pools.admin)
        .map_err(|e| e.to_string())
}

fn print(value: &impl Serialize) -> Result<(), String> {
    let text = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
    println!("{text}");
    Ok(())
}

/// Runs one `flashgate deals …` command.
pub async fn deals(settings: &Settings, command: DealsCommand) -> Result<(), String> {
    let pool = admin_pool(settings)?;
    let outcome = run_deals(settings, &pool, command).await;
    pool.close().await;
    outcome
}

fn connect_redis(settings: &Settings) -> RedisHandle {
    RedisHandle::new(
        &settings.redis.url,
        &settings.redis.key_prefix,
        millis(settings.redis.command_timeout_ms),
    )
}

/// `flashgate deals drain-queue <id>`: through the waiting room's own scripts, so every
/// instance serving the line sees it closed at once.
async fn drain_queue(settings: &Settings, pool: &PgPool, id: &str) -> Result<(), String> {
    let deal = deals::load(pool, id)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("deal {id} not found"))?;
    if !deal.waiting_room.enabled {
        return Err(format!("deal {id} has no waiting room"));
    }
    let redis = connect_redis(settings);
    redis.connect().await;
    let room = WaitingRoom::new(&settings.waiting_room, redis);
    let drained = room.drain(&deal.id).await.map_err(|e| e.to_string())?;
    print(&serde_json::json!({
        "deal_id": deal.id,
        "closed": true,
        "tickets_expired": drained.tickets_expired,
        "passes_active": drained.passes_active,
    }))
}

async fn run_deals(
    settings: &Settings,
    pool: &PgPool,
    command: DealsCommand,
) -> Result<(), String> {
    match command {
        DealsCommand::List => print(&list(pool).await.map_err(|e| e.to_string())?),
        DealsCommand::Show { id } => show(pool, &id).await,
        DealsCommand::Create {
            id,
            name,
            stock,
            buckets,
            unit_price_minor,
            currency,
            per_user_limit,
            reservation_ttl_seconds,
            starts_at,
            ends_at,
        } => {
            let new = NewDeal {
                id: DealId::parse(&id).map_err(|e| e.to_string())?,
                name,
                stock,
                buckets,
                unit_price_minor,
                currency: currency.to_ascii_uppercase(),
                per_user_limit,
                reservation_ttl_seconds,
                starts_at,
                ends_at,
                payment_terms: Default::default(),
                waiting_room: Default::default(),
            };
            let deal = deals::create(pool, &new).await.map_err(|e| e.to_string())?;
            print(&deal_json(&deal))
        }
        DealsCommand::Stock { id, delta } => {
            inventory::adjust(pool, &id, delta)
                .await
                .map_err(|e| e.to_string())?;
            show(pool, &id).await
        }
        DealsCommand::Pause { id } => set_paused(pool, &id, true).await,
        DealsCommand::Resume { id } => set_paused(pool, &id, false).await,
        DealsCommand::DrainQueue { id } => drain_queue(settings, pool, &id).await,
        DealsCommand::Rebalance { id, buckets } => {
            let done = rebalance::rebalance(pool, &id, buckets)
                .await
                .map_err(|e| e.to_string())?;
            print(&serde_json::json!({
                "deal_id": done.deal_id,
                "buckets_before": done.buckets_before,
                "buckets_after": done.buckets_after,
                "units_moved": done.units_moved,
            }))
        }
    }
}

async fn set_paused(pool: &PgPool, id: &str, paused: bool) -> Result<(), String> {
    let deal = pause::set_paused(pool, id, paused)
        .await
        .map_err(|e| e.to_string())?;
    print(&deal_json(&deal))
}

async fn show(pool: &PgPool, id: &str) -> Result<(), String> {
    let snapshot = inventory::snapshot(pool, id)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("deal {id} not found"))?;
    print(&serde_json::json!({
        "deal_id": id,
        "stock_total": snapshot.stock_total,
        "available": snapshot.available,
        "reserved": snapshot.reserved,
        "sold": snapshot.sold,
        "buckets": snapshot.buckets.iter()
            .map(|(bucket, available)| serde_json::json!({"bucket": bucket, "available": available}))
            .collect::<Vec<_>>(),
        "invariant_holds": snapshot.invariant_holds,
    }))
}

/// A deal as the CLI prints it.
#[derive(Debug, Serialize, sqlx::FromRow)]
pub struct DealSummary {
    pub id: String,
    pub name: String,
    pub paused: bool,
    pub buckets: i32,
    pub stock_total: i64,
    pub available: i64,
    pub reserved: i64,
    pub sold: i64,
    pub starts_at: Option<DateTime<Utc>>,
    pub ends_at: Option<DateTime<Utc>>,
}

fn deal_json(deal: &Deal) -> serde_json::Value {
    serde_json::json!({
        "id": deal.id,
        "name": deal.name,
        "paused": deal.paused,
        "buckets": deal.bucket_count,
        "stock_total": deal.stock_total,
        "starts_at": deal.starts_at,
        "ends_at": deal.ends_at,
    })
}

/// Every deal with its live stock, newest first.
pub async fn list(pool: &PgPool) -> Result<Vec<DealSummary>, sqlx::Error> {
    let mut deals: Vec<DealSummary> = sqlx::query_as(
        "SELECT d.id, d.name, d.paused, d.bucket_count AS buckets, d.stock_total,
                0::bigint AS available, 0::bigint AS reserved, 0::bigint AS sold,
                d.starts_at, d.ends_at
           FROM deals d ORDER BY d.created_at DESC, d.id",
    )
    .fetch_all(pool)
    .await?;
    let ids: Vec<String> = deals.iter().map(|deal| deal.id.clone()).collect();
    let totals = inventory::totals(pool, &ids)
        .await
        .map_err(|error| match error {
            crate::store::StoreError::Retryable(e) | crate::store::StoreError::Unexpected(e) => e,
            crate::store::StoreError::PoolExhausted => sqlx::Error::PoolTimedOut,
        })?;
    for deal in &mut deals {
        let stock = totals.get(&deal.id).copied().unwrap_or_default();
        (deal.available, deal.reserved, deal.sold) = (stock.available, stock.reserved, stock.sold);
    }
    Ok(deals)
}

/// `flashgate check`: prints the audit report; an error when any invariant is broken.
pub async fn check(settings: &Settings) -> Result<(), String> {
    let pool = admin_pool(settings)?;
    let redis = connect_redis(settings);
    redis.connect().await;
    let report = audit::run(&pool, Some(&redis), audit::Options::from_settings(settings)).await;
    pool.close().await;
    let report = report.map_err(|e| e.to_string())?;
    print(&report)?;
    if report.holds() {
        Ok(())
    } else {
        Err(format!(
            "{} invariant violation(s) found",
            report.findings.len()
        ))
    }
}
