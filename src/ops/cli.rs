//! `flashgate deals …` and `flashgate check`: operator commands that talk to PostgreSQL
//! (and Redis, for the sold-out flag and the waiting-room lines) directly, so they work with no gateway running and
//! act on every instance at once. Output is JSON, one document per command.

use chrono::{DateTime, Utc};
use clap::builder::PossibleValue;
use clap::{Subcommand, ValueEnum};
use serde::Serialize;
use sqlx::PgPool;

use super::room_args::WaitingRoomArgs;
use super::{admission, audit, pause, rebalance};
use crate::clock::Clock;
use crate::deals::{self, AdmissionMode, Deal, NewDeal, PaymentTerms};
use crate::domain::{CaptureMethod, DealId, LatePaymentPolicy};
use crate::inventory;
use crate::operators::{self, Change, Operator};
use crate::redis_link::RedisHandle;
use crate::store::Pools;
use crate::waiting_room::WaitingRoom;
use sqlx::Row;
use sqlx::postgres::PgRow;

pub use super::cli_settings::CliSettings;

#[derive(Debug, Subcommand)]
pub enum DealsCommand {
    /// List every deal with its live stock.
    List,
    /// Show one deal's live stock, bucket by bucket.
    Show {
        /// The deal's id.
        id: String,
    },
    /// Create a deal and its buckets, with a waiting room and payment terms if asked.
    #[command(allow_negative_numbers = true)]
    Create(Box<CreateArgs>),
    /// Add (positive) or remove (negative) available units.
    #[command(allow_negative_numbers = true)]
    Stock {
        /// The deal's id.
        id: String,
        /// Units to add, or to remove when negative (e.g. `--delta -5`).
        #[arg(long, allow_hyphen_values = true)]
        delta: i64,
    },
    /// Stop taking orders for the deal on every instance (answered `sale-not-open`).
    Pause {
        /// The deal's id.
        id: String,
    },
    /// Take orders again after a pause.
    Resume {
        /// The deal's id.
        id: String,
    },
    /// Spread the available units over a new number of buckets.
    #[command(allow_negative_numbers = true)]
    Rebalance {
        /// The deal's id.
        id: String,
        /// The number of buckets after the move (1-1024).
        #[arg(long)]
        buckets: i32,
    },
    /// Drain the deal's waiting room: close the line for good, tell everyone still waiting
    /// (their tickets read `expired`) and hand out no more passes. Needs Redis.
    DrainQueue {
        /// The deal's id.
        id: String,
    },
    /// What the deal's waiting room did: joins, waits, abandons, passes expired unused, and
    /// how many admitted buyers ordered and paid. Needs Redis.
    Report {
        /// The deal's id.
        id: String,
        /// Print the JSON of `GET /admin/deals/{id}/report` instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Set who drives the deal's waiting-room outflow: `fixed` takes manual control at the
    /// line's current outflow (or `--admit-per-second`), `adaptive` hands it back to the
    /// loop. Needs Redis to read the current outflow.
    Admission {
        /// The deal's id.
        id: String,
        /// `fixed` or `adaptive`.
        #[arg(long, value_parser = ["fixed", "adaptive"])]
        mode: String,
        /// Fixed: the rate to admit at, instead of the current outflow.
        #[arg(long, value_name = "N")]
        admit_per_second: Option<i32>,
    },
    /// Issue access codes for an invitation-only line; printed this once (only their
    /// SHA-256 digests are kept), with the deal's codes issued and redeemed.
    AccessCodes {
        /// The deal's id.
        id: String,
        /// How many (at most `waiting_room.access_codes_per_request_max`).
        #[arg(long)]
        count: i64,
    },
}

/// `flashgate deals create`: what the admin API's create-deal body holds. Values are
/// checked by the same rules as the API's (negative numbers reach them and are refused
/// there, naming the field).
#[derive(Debug, clap::Args)]
pub struct CreateArgs {
    /// The deal's id: letters, digits, `-` and `_`.
    #[arg(long)]
    id: String,
    /// The name buyers see.
    #[arg(long)]
    name: String,
    /// Units on sale.
    #[arg(long)]
    stock: i64,
    /// Buckets the units are spread over; more buckets, fewer lock conflicts (1-1024).
    #[arg(long, default_value_t = 8)]
    buckets: i32,
    /// Price of one unit in minor units of the currency (cents).
    #[arg(long)]
    unit_price_minor: i64,
    /// ISO 4217 currency code.
    #[arg(long, default_value = "EUR")]
    currency: String,
    /// Most units one user may hold in orders of this deal.
    #[arg(long, default_value_t = 1)]
    per_user_limit: i32,
    /// Seconds an unpaid order holds its units.
    #[arg(long, default_value_t = 300)]
    reservation_ttl_seconds: i32,
    /// RFC 3339, e.g. 2026-12-01T09:00:00Z; open at once when left out.
    #[arg(long)]
    starts_at: Option<DateTime<Utc>>,
    /// RFC 3339; the sale never ends when left out.
    #[arg(long)]
    ends_at: Option<DateTime<Utc>>,
    /// What happens to money that arrives after its order gave its units back.
    #[arg(long, value_name = "POLICY", value_enum)]
    late_payment_policy: Option<LatePaymentPolicy>,
    /// When the money is taken: `automatic` (at once) or `manual` (captured on confirmation).
    #[arg(long, value_name = "METHOD", value_enum)]
    capture_method: Option<CaptureMethod>,
    #[command(flatten)]
    waiting_room: WaitingRoomArgs,
}

impl CreateArgs {
    fn into_new_deal(self) -> Result<NewDeal, String> {
        let defaults = PaymentTerms::default();
        Ok(NewDeal {
            id: DealId::parse(&self.id).map_err(|e| e.to_string())?,
            name: self.name,
            stock: self.stock,
            buckets: self.buckets,
            unit_price_minor: self.unit_price_minor,
            currency: self.currency.to_ascii_uppercase(),
            per_user_limit: self.per_user_limit,
            reservation_ttl_seconds: self.reservation_ttl_seconds,
            starts_at: self.starts_at,
            ends_at: self.ends_at,
            payment_terms: PaymentTerms {
                late_payment_policy: self
                    .late_payment_policy
                    .unwrap_or(defaults.late_payment_policy),
                capture_method: self.capture_method.unwrap_or(defaults.capture_method),
            },
            waiting_room: self.waiting_room.into_terms(),
        })
    }
}

/// The policies the domain knows, offered and listed in `--help` by the CLI.
impl ValueEnum for LatePaymentPolicy {
    fn value_variants<'a>() -> &'a [Self] {
        &Self::ALL
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(PossibleValue::new(self.as_str()))
    }
}

/// The capture methods the domain knows, offered and listed in `--help` by the CLI.
impl ValueEnum for CaptureMethod {
    fn value_variants<'a>() -> &'a [Self] {
        &Self::ALL
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(PossibleValue::new(self.as_str()))
    }
}

/// The admin pool, after one connection proved the database reachable: a CLI command
/// says at once why PostgreSQL is not there rather than after a pool timeout.
async fn admin_pool(settings: &CliSettings) -> Result<PgPool, String> {
    Pools::connect(&settings.database)
        .await
        .map(|pools| pools.admin)
        .map_err(|e| e.to_string())
}

fn print(value: &impl Serialize) -> Result<(), String> {
    super::output::json(value)
}

/// Runs one `flashgate deals …` command.
pub async fn deals(settings: &CliSettings, command: DealsCommand) -> Result<(), String> {
    let pool = admin_pool(settings).await?;
    let change = change_of(&command);
    let outcome = run_deals(settings, &pool, command).await;
    if let (Ok(()), Some((action, target, detail))) = (&outcome, change) {
        let change = Change {
            action,
            target: &target,
            detail,
        };
        operators::record(&pool, &Operator::command_line(), change).await;
    }
    pool.close().await;
    outcome
}

/// What a command changes, for the operator log: nothing for the readers.
fn change_of(command: &DealsCommand) -> Option<(&'static str, String, serde_json::Value)> {
    use serde_json::json;
    let (action, id, detail) = match command {
        DealsCommand::List | DealsCommand::Show { .. } | DealsCommand::Report { .. } => {
            return None;
        }
        DealsCommand::Create(args) => (
            "deal.created",
            &args.id,
            json!({"name": args.name, "stock": args.stock}),
        ),
        DealsCommand::Stock { id, delta } => ("deal.stock_adjusted", id, json!({"delta": delta})),
        DealsCommand::Pause { id } => ("deal.paused", id, json!({})),
        DealsCommand::Resume { id } => ("deal.resumed", id, json!({})),
        DealsCommand::DrainQueue { id } => ("queue.drained", id, json!({})),
        DealsCommand::AccessCodes { id, count } => {
            ("deal.access_codes_issued", id, json!({"count": count}))
        }
        DealsCommand::Admission {
            id,
            mode,
            admit_per_second,
        } => (
            "deal.admission_set",
            id,
            json!({"mode": mode, "admit_per_second": admit_per_second}),
        ),
        DealsCommand::Rebalance { id, buckets } => {
            ("deal.rebalanced", id, json!({"buckets_after": buckets}))
        }
    };
    Some((action, id.clone(), detail))
}

/// `flashgate operator-log`: a page of the operator log, as `GET /admin/operator-log`.
pub async fn operator_log(
    settings: &CliSettings,
    after: Option<String>,
    limit: i64,
) -> Result<(), String> {
    let after = match after.as_deref() {
        None => 0,
        Some(raw) => operators::parse_cursor(raw)
            .ok_or("--after must be a cursor printed as `next` by an earlier page")?,
    };
    if !(1..=operators::PAGE_ENTRIES_MAX).contains(&limit) {
        return Err(format!("--limit must be 1-{}", operators::PAGE_ENTRIES_MAX));
    }
    let pool = admin_pool(settings).await?;
    let page = operators::page(&pool, after, limit).await;
    pool.close().await;
    print(&page.map_err(|e| e.to_string())?)
}

fn connect_redis(settings: &CliSettings) -> RedisHandle {
    RedisHandle::from_settings(&settings.redis)
}

/// `flashgate deals drain-queue <id>`: through the waiting room's own scripts, so every
/// instance serving the line sees it closed at once.
async fn drain_queue(settings: &CliSettings, pool: &PgPool, id: &str) -> Result<(), String> {
    let deal = deals::load(pool, id)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("deal {id} not found"))?;
    if !deal.waiting_room.enabled {
        return Err(format!("deal {id} has no waiting room"));
    }
    let redis = connect_redis(settings);
    redis.connect().await;
    let room = WaitingRoom::new(&settings.waiting_room, redis, Clock::system());
    let drained = room.drain(&deal.id).await.map_err(|e| e.to_string())?;
    print(&serde_json::json!({
        "deal_id": deal.id,
        "closed": true,
        "tickets_expired": drained.tickets_expired,
        "passes_active": drained.passes_active,
    }))
}

async fn run_deals(
    settings: &CliSettings,
    pool: &PgPool,
    command: DealsCommand,
) -> Result<(), String> {
    match command {
        DealsCommand::List => print(&list(pool).await.map_err(|e| e.to_string())?),
        DealsCommand::Show { id } => show(settings, pool, &id).await,
        DealsCommand::Create(args) => {
            let new = (*args).into_new_deal()?;
            let deal = deals::create(pool, &new).await.map_err(|e| e.to_string())?;
            print(&deal_json(&deal))
        }
        DealsCommand::Stock { id, delta } => {
            super::stock::adjust(pool, &id, delta)
                .await
                .map_err(|e| e.to_string())?;
            show(settings, pool, &id).await
        }
        DealsCommand::Pause { id } => set_paused(pool, &id, true).await,
        DealsCommand::Resume { id } => set_paused(pool, &id, false).await,
        DealsCommand::DrainQueue { id } => drain_queue(settings, pool, &id).await,
        DealsCommand::AccessCodes { id, count } => {
            let max = settings.waiting_room.access_codes_per_request_max;
            let issued = crate::waiting_room::access_codes::issue_for(pool, &id, count, max)
                .await
                .map_err(|e| e.to_string())?;
            print(&issued)
        }
        DealsCommand::Report { id, json } => super::report::run(settings, pool, &id, json).await,
        DealsCommand::Admission {
            id,
            mode,
            admit_per_second,
        } => set_admission(settings, pool, &id, &mode, admit_per_second).await,
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

/// `flashgate deals admission`: the same call as `POST /admin/deals/{id}/admission`.
async fn set_admission(
    settings: &CliSettings,
    pool: &PgPool,
    id: &str,
    mode: &str,
    admit_per_second: Option<i32>,
) -> Result<(), String> {
    let mode = AdmissionMode::parse(mode).ok_or("--mode must be fixed or adaptive")?;
    let room = connected_room(settings).await;
    let deal = admission::set_mode(pool, &room, id, mode, admit_per_second)
        .await
        .map_err(|e| e.to_string())?;
    print(&deal_json(&deal))
}

async fn connected_room(settings: &CliSettings) -> WaitingRoom {
    let redis = connect_redis(settings);
    redis.connect().await;
    WaitingRoom::new(&settings.waiting_room, redis, Clock::system())
}

/// A deal's waiting room with who drives it and its outflow now (as published by the
/// advancer; before its first step, or without Redis, the rate the line starts at).
async fn waiting_room_json(settings: &CliSettings, deal: &Deal) -> serde_json::Value {
    let terms = &deal.waiting_room;
    let published = if terms.enabled {
        let room = connected_room(settings).await;
        room.line(&deal.id)
            .await
            .ok()
            .and_then(|l| l.outflow_per_second)
    } else {
        None
    };
    let start = if terms.admission.is_adaptive() {
        terms.admission.min_per_second
    } else {
        terms.admit_per_second
    };
    let outflow = published.unwrap_or(f64::from(start));
    let mut json = serde_json::to_value(terms).unwrap_or_default();
    if let Some(object) = json.as_object_mut() {
        object.insert("mode".into(), terms.admission.mode.as_str().into());
        object.insert(
            "outflow_per_second".into(),
            ((outflow * 100.0).round() / 100.0).into(),
        );
    }
    json
}

async fn show(settings: &CliSettings, pool: &PgPool, id: &str) -> Result<(), String> {
    let snapshot = inventory::snapshot(pool, id)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("deal {id} not found"))?;
    let deal = deals::load(pool, id)
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
        "waiting_room": waiting_room_json(settings, &deal).await,
    }))
}

/// A deal as the CLI prints it.
#[derive(Debug, Serialize)]
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

impl<'r> sqlx::FromRow<'r, PgRow> for DealSummary {
    fn from_row(row: &'r PgRow) -> Result<Self, sqlx::Error> {
        Ok(Self {
            id: row.try_get("id")?,
            name: row.try_get("name")?,
            paused: row.try_get("paused")?,
            buckets: row.try_get("buckets")?,
            stock_total: row.try_get("stock_total")?,
            available: row.try_get("available")?,
            reserved: row.try_get("reserved")?,
            sold: row.try_get("sold")?,
            starts_at: row.try_get("starts_at")?,
            ends_at: row.try_get("ends_at")?,
        })
    }
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
        "late_payment_policy": deal.late_payment_policy.as_str(),
        "capture_method": deal.capture_method.as_str(),
        "waiting_room": deal.waiting_room,
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
            crate::store::StoreError::PoolExhausted => sqlx::Error::PoolTimedOut,
            crate::store::StoreError::Retryable(e)
            | crate::store::StoreError::Unavailable(e)
            | crate::store::StoreError::Unstorable(e)
            | crate::store::StoreError::Unexpected(e) => {
                // Just made from one sqlx error, so not shared.
                std::sync::Arc::try_unwrap(e)
                    .unwrap_or_else(|e| sqlx::Error::Protocol(e.to_string()))
            }
        })?;
    for deal in &mut deals {
        let stock = totals.get(&deal.id).copied().unwrap_or_default();
        (deal.available, deal.reserved, deal.sold) = (stock.available, stock.reserved, stock.sold);
    }
    Ok(deals)
}

/// `flashgate check`: prints the audit report; an error when any invariant is broken.
pub async fn check(settings: &CliSettings) -> Result<(), String> {
    let pool = admin_pool(settings).await?;
    let redis = connect_redis(settings);
    redis.connect().await;
    let report = audit::run(&pool, Some(&redis), settings.audit).await;
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
