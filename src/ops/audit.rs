//! The invariant audit: what must always hold between deals, buckets, orders and their
//! reservations (lines and the buckets kept in order rows), checked from one consistent
//! snapshot.
//!
//! Any finding means a bug (or a hand edit), never load: the order path keeps every one of
//! these in the same transaction that changes the rows. `flashgate check` exits non-zero
//! on a finding, `GET /admin/audit` returns the findings, and every gateway runs the audit
//! every `ops.audit_interval_ms` and exports `flashgate_invariant_violations{check}`.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use serde::Serialize;
use sqlx::{PgConnection, PgPool};
use tokio_util::sync::CancellationToken;

use super::OpsSettings;
use crate::redis_link::RedisHandle;
use crate::store::StoreError;
use crate::telemetry;

/// Order statuses whose units are held (reserved or sold) and counted against the user.
pub const HOLDING_STATUSES: [&str; 2] = ["PENDING_PAYMENT", "PAID"];

/// The checks, each exported as one `check` label value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Check {
    /// `stock_total = Σ(available + reserved + sold)` over the deal's buckets.
    StockTotal,
    /// No bucket holds a negative number of units.
    NegativeBucket,
    /// Each bucket's `reserved` equals what its pending orders hold there (`held_units`).
    ReservedLines,
    /// Each bucket's `sold` equals what its paid orders hold there (`held_units`).
    SoldLines,
    /// What every holding order holds (lines and its row's bucket) covers its quantity
    /// exactly, in its own deal.
    OrderLines,
    /// Each user's counted units equal the units of their holding orders.
    UserUnits,
    /// No order in a state it cannot reach (expired before its expiry, changed before it
    /// was created).
    OrderState,
    /// No deal flagged sold out in Redis while PostgreSQL still has units on sale.
    SoldOutFlag,
    /// Every payment attempt belongs to an order that exists. No foreign key enforces it
    /// (checking one cost every purchase a row lock); the statements creating attempts do.
    AttemptOrder,
}

impl Check {
    pub const ALL: [Check; 9] = [
        Check::StockTotal,
        Check::NegativeBucket,
        Check::ReservedLines,
        Check::SoldLines,
        Check::OrderLines,
        Check::UserUnits,
        Check::OrderState,
        Check::SoldOutFlag,
        Check::AttemptOrder,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Check::StockTotal => "stock_total",
            Check::NegativeBucket => "negative_bucket",
            Check::ReservedLines => "reserved_lines",
            Check::SoldLines => "sold_lines",
            Check::OrderLines => "order_lines",
            Check::UserUnits => "user_units",
            Check::OrderState => "order_state",
            Check::SoldOutFlag => "sold_out_flag",
            Check::AttemptOrder => "attempt_order",
        }
    }
}

/// One broken invariant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub check: Check,
    pub deal_id: String,
    pub detail: String,
}

/// What one audit found.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub deals_checked: i64,
    /// Whether the Redis sold-out set could be read and compared.
    pub sold_out_flag_checked: bool,
    /// Pending orders more than `overdue_after` past their expiry: the sweeper is behind.
    /// Not an invariant (the sweeper will catch up), but worth an alert.
    pub overdue_reservations: i64,
    pub findings: Vec<Finding>,
}

impl Report {
    pub fn holds(&self) -> bool {
        self.findings.is_empty()
    }

    /// Findings per check, every check present (0 when it passed).
    pub fn counts(&self) -> BTreeMap<Check, usize> {
        let mut counts: BTreeMap<Check, usize> = Check::ALL.iter().map(|c| (*c, 0)).collect();
        for finding in &self.findings {
            *counts.entry(finding.check).or_default() += 1;
        }
        counts
    }
}

/// How the audit runs.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// A pending order this long past `expires_at` counts as overdue.
    pub overdue_after: Duration,
    /// How long a sold-out flag PostgreSQL contradicts may live before it is a finding:
    /// every instance drops such flags on its next refresh, so a younger one is normal.
    pub flag_grace: Duration,
}

impl Options {
    /// The options the CLI, the admin API and the periodic task share; `flag_refresh` is
    /// how often every instance refreshes its sold-out flags (`soldout.refresh_interval_ms`).
    pub fn from_settings(settings: &OpsSettings, flag_refresh: Duration) -> Self {
        Self {
            overdue_after: Duration::from_secs(settings.overdue_after_seconds),
            flag_grace: flag_refresh * 4,
        }
    }
}

/// Runs every check. PostgreSQL checks read one REPEATABLE READ snapshot; the sold-out flag
/// is compared when `redis` is given and answers.
pub async fn run(
    pool: &PgPool,
    redis: Option<&RedisHandle>,
    options: Options,
) -> Result<Report, StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .execute(&mut *tx)
        .await?;
    let deals_checked: i64 = sqlx::query_scalar("SELECT count(*) FROM deals")
        .fetch_one(&mut *tx)
        .await?;
    let mut findings = Vec::new();
    for (check, sql) in SQL_CHECKS {
        findings.extend(sql_check(&mut tx, check, sql).await?);
    }
    let overdue_reservations = overdue(&mut tx, options.overdue_after).await?;
    tx.commit().await?;
    let sold_out_flag_checked = match redis {
        Some(redis) => match stale_flags(pool, redis, options.flag_grace).await? {
            Some(stale) => {
                findings.extend(stale);
                true
            }
            None => false,
        },
        None => false,
    };
    Ok(Report {
        deals_checked,
        sold_out_flag_checked,
        overdue_reservations,
        findings,
    })
}

/// Each query returns `(deal_id, detail)` rows, one per violation.
const SQL_CHECKS: [(Check, &str); 8] = [
    (
        Check::StockTotal,
        "SELECT d.id, format('stock_total %s, buckets hold %s', d.stock_total,
                            coalesce(sum(b.available + b.reserved + b.sold), 0))
           FROM deals d LEFT JOIN inventory_buckets b ON b.deal_id = d.id
          GROUP BY d.id, d.stock_total
         HAVING d.stock_total <> coalesce(sum(b.available + b.reserved + b.sold), 0)",
    ),
    (
        Check::NegativeBucket,
        "SELECT deal_id, format('bucket %s: available %s, reserved %s, sold %s',
                                bucket, available, reserved, sold)
           FROM inventory_buckets WHERE available < 0 OR reserved < 0 OR sold < 0",
    ),
    (
        Check::ReservedLines,
        "WITH l AS (SELECT l.deal_id, l.bucket, sum(l.quantity)::bigint AS q
                      FROM held_units l JOIN orders o ON o.id = l.order_id
                     WHERE o.status = 'PENDING_PAYMENT'
                     GROUP BY l.deal_id, l.bucket)
         SELECT b.deal_id, format('bucket %s: reserved %s, pending lines %s',
                                  b.bucket, b.reserved, coalesce(l.q, 0))
           FROM inventory_buckets b LEFT JOIN l ON l.deal_id = b.deal_id AND l.bucket = b.bucket
          WHERE b.reserved <> coalesce(l.q, 0)",
    ),
    (
        Check::SoldLines,
        "WITH l AS (SELECT l.deal_id, l.bucket, sum(l.quantity)::bigint AS q
                      FROM held_units l JOIN orders o ON o.id = l.order_id
                     WHERE o.status = 'PAID'
                     GROUP BY l.deal_id, l.bucket)
         SELECT b.deal_id, format('bucket %s: sold %s, paid lines %s',
                                  b.bucket, b.sold, coalesce(l.q, 0))
           FROM inventory_buckets b LEFT JOIN l ON l.deal_id = b.deal_id AND l.bucket = b.bucket
          WHERE b.sold <> coalesce(l.q, 0)",
    ),
    (
        Check::OrderLines,
        "SELECT o.deal_id, format('order %s (%s): quantity %s, lines %s, lines in other deals %s',
                                  o.id, o.status, o.quantity, coalesce(sum(l.quantity), 0),
                                  count(*) FILTER (WHERE l.deal_id <> o.deal_id))
           FROM orders o LEFT JOIN held_units l ON l.order_id = o.id
          WHERE o.status IN ('PENDING_PAYMENT', 'PAID')
          GROUP BY o.id
         HAVING coalesce(sum(l.quantity), 0) <> o.quantity
             OR count(*) FILTER (WHERE l.deal_id <> o.deal_id) > 0",
    ),
    (
        Check::UserUnits,
        "WITH held AS (SELECT deal_id, user_id, sum(quantity)::bigint AS units FROM orders
                        WHERE status IN ('PENDING_PAYMENT', 'PAID') GROUP BY deal_id, user_id),
              counted AS (SELECT deal_id, user_id, units::bigint AS units FROM user_deal_units)
         SELECT coalesce(h.deal_id, c.deal_id),
                format('user %s: holding orders %s units, counter %s',
                       coalesce(h.user_id, c.user_id), coalesce(h.units, 0), coalesce(c.units, 0))
           FROM held h FULL JOIN counted c ON c.deal_id = h.deal_id AND c.user_id = h.user_id
          WHERE coalesce(h.units, 0) <> coalesce(c.units, 0)",
    ),
    (
        Check::OrderState,
        "SELECT deal_id, format('order %s (%s): expires_at %s, created_at %s, updated_at %s',
                                id, status, expires_at, created_at, updated_at)
           FROM orders
          WHERE updated_at < created_at
             OR expires_at <= created_at
             OR (status = 'EXPIRED' AND updated_at < expires_at)",
    ),
    (
        Check::AttemptOrder,
        "SELECT ''::text, format('payment attempt %s (%s): its order %s does not exist',
                                a.id, a.status, a.order_id)
           FROM payment_attempts a
          WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.id = a.order_id)",
    ),
];

async fn sql_check(
    tx: &mut PgConnection,
    check: Check,
    sql: &'static str,
) -> Result<Vec<Finding>, StoreError> {
    let rows: Vec<(String, String)> = sqlx::query_as(sql).fetch_all(&mut *tx).await?;
    Ok(rows
        .into_iter()
        .map(|(deal_id, detail)| Finding {
            check,
            deal_id,
            detail,
        })
        .collect())
}

async fn overdue(tx: &mut PgConnection, overdue_after: Duration) -> Result<i64, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM orders
          WHERE status = 'PENDING_PAYMENT'
            AND expires_at < now() - make_interval(secs => $1)",
    )
    .bind(overdue_after.as_secs_f64())
    .fetch_one(tx)
    .await?)
}

/// Flags in the Redis sold-out set that PostgreSQL contradicts (units on sale in an open,
/// known deal) and still does after `grace`. `None` when Redis does not answer.
async fn stale_flags(
    pool: &PgPool,
    redis: &RedisHandle,
    grace: Duration,
) -> Result<Option<Vec<Finding>>, StoreError> {
    let Some(first) = contradicted(pool, redis).await? else {
        return Ok(None);
    };
    if first.is_empty() {
        return Ok(Some(Vec::new()));
    }
    tokio::time::sleep(grace).await;
    let Some(second) = contradicted(pool, redis).await? else {
        return Ok(None);
    };
    Ok(Some(
        first
            .into_iter()
            .filter(|(deal, _)| second.contains_key(deal))
            .map(|(deal_id, available)| Finding {
                check: Check::SoldOutFlag,
                detail: format!("flagged sold out while {available} units are available"),
                deal_id,
            })
            .collect(),
    ))
}

/// Flagged deals with units available, and how many.
async fn contradicted(
    pool: &PgPool,
    redis: &RedisHandle,
) -> Result<Option<BTreeMap<String, i64>>, StoreError> {
    let smembers = redis::cmd("SMEMBERS").arg(redis.sold_out_key()).clone();
    let Ok(flagged) = redis.run::<Vec<String>>(&smembers).await else {
        return Ok(None);
    };
    let flagged: Vec<String> = flagged
        .into_iter()
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT d.id, sum(b.available)::bigint FROM deals d
           JOIN inventory_buckets b ON b.deal_id = d.id
          WHERE d.id = ANY($1) AND (d.ends_at IS NULL OR d.ends_at > now())
          GROUP BY d.id HAVING sum(b.available) > 0",
    )
    .bind(&flagged)
    .fetch_all(pool)
    .await?;
    Ok(Some(rows.into_iter().collect()))
}

/// Publishes a report as gauges: one `flashgate_invariant_violations` series per check.
pub fn record(report: &Report) {
    for (check, count) in report.counts() {
        metrics::gauge!(telemetry::INVARIANT_VIOLATIONS, "check" => check.as_str())
            .set(count as f64);
    }
    metrics::gauge!(telemetry::OVERDUE_RESERVATIONS).set(report.overdue_reservations as f64);
}

/// Audits every `interval` until `shutdown`, starting at once. Each run is its own task so
/// that a panic is reported and the next run still happens.
pub async fn keep_auditing(
    pool: PgPool,
    redis: RedisHandle,
    options: Options,
    interval: Duration,
    shutdown: CancellationToken,
) {
    loop {
        let (pool, redis) = (pool.clone(), redis.clone());
        let outcome = tokio::spawn(async move { run(&pool, Some(&redis), options).await }).await;
        let label = match outcome {
            Ok(Ok(report)) => {
                record(&report);
                for finding in &report.findings {
                    tracing::error!(
                        check = finding.check.as_str(),
                        deal_id = %finding.deal_id,
                        detail = %finding.detail,
                        "invariant violated"
                    );
                }
                "ok"
            }
            Ok(Err(error)) => {
                tracing::warn!(%error, "invariant audit failed");
                "error"
            }
            Err(panic) => {
                tracing::error!(%panic, "invariant audit panicked");
                "panic"
            }
        };
        metrics::counter!(telemetry::AUDIT_RUNS, "outcome" => label).increment(1);
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
    }
}
