//! The verdict: the whole ledger against what clients were told, once every fault is
//! healed and the gateways have settled.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};
use sqlx::PgPool;

use super::clients::{Journal, Outcome};

/// Every violation found, in words; empty when the run is clean.
pub async fn check(
    db: &PgPool,
    journal: &Journal,
    intents: &[Value],
    deal: &str,
) -> Result<(Vec<String>, Value), String> {
    let mut violations = Vec::new();
    let orders: Vec<(String, String, String, String, i32)> = sqlx::query_as(
        "SELECT id::text, user_id, idempotency_key, status, quantity FROM orders
          WHERE deal_id = $1",
    )
    .bind(deal)
    .fetch_all(db)
    .await
    .map_err(|e| e.to_string())?;
    let by_key: HashMap<(String, String), (String, String)> = orders
        .iter()
        .map(|(id, user, key, status, _)| {
            ((user.clone(), key.clone()), (id.clone(), status.clone()))
        })
        .collect();
    let mut acknowledged = 0;
    for ((user, key), outcome) in &journal.purchases {
        let stored = by_key.get(&(user.clone(), key.clone()));
        match (outcome, stored) {
            (Outcome::Acknowledged(id), Some((stored_id, _))) if id == stored_id => {
                acknowledged += 1;
            }
            (Outcome::Acknowledged(id), stored) => violations.push(format!(
                "acknowledged order {id} of {user}/{key} is stored as {stored:?}"
            )),
            (Outcome::Refused(status, seen), Some((id, _))) => violations.push(format!(
                "{user}/{key} was refused {status} ({seen}) but order {id} exists"
            )),
            _ => {}
        }
    }
    for (user, key) in by_key.keys() {
        if !journal.purchases.contains_key(&(user.clone(), key.clone())) {
            violations.push(format!("order for {user}/{key} that no client asked for"));
        }
    }
    let refunding = orders.iter().filter(|o| o.3 == "REFUND_PENDING").count();
    if refunding > 0 {
        violations.push(format!("{refunding} refunds still pending after settling"));
    }
    let stock = stock_violations(db, deal).await?;
    violations.extend(stock.0);
    violations.extend(payment_violations(&orders, intents));
    let mut statuses = std::collections::BTreeMap::new();
    for (_, _, _, status, _) in &orders {
        *statuses.entry(status.as_str()).or_insert(0) += 1;
    }
    let figures = json!({
        "orders_stored": orders.len(),
        "statuses": statuses,
        "acknowledged": acknowledged,
        "purchases": journal.purchases.len(),
        "requests": journal.requests,
        "retries": journal.retries,
        "paid_at_checkout": journal.paid_intents.len(),
        "provider_succeeded": intents.iter().filter(|i| i["status"] == "succeeded").count(),
        "units": stock.1,
    });
    Ok((violations, figures))
}

/// No oversell, `stock_total = available + reserved + sold`, and nothing left reserved by
/// an order that has expired.
async fn stock_violations(db: &PgPool, deal: &str) -> Result<(Vec<String>, Value), String> {
    // One statement, so buckets and orders are read from one snapshot: the gateways may
    // still be expiring orders while the ledger looks, and two reads would see an order's
    // release in one table and not yet in the other.
    let (total, available, reserved, sold, held, overdue): (i64, i64, i64, i64, i64, i64) =
        sqlx::query_as(
            "SELECT d.stock_total::bigint, b.available, b.reserved, b.sold, o.held, o.overdue
               FROM deals d,
                    LATERAL (SELECT sum(available)::bigint AS available,
                                    sum(reserved)::bigint AS reserved,
                                    sum(sold)::bigint AS sold
                               FROM inventory_buckets WHERE deal_id = d.id) b,
                    LATERAL (SELECT coalesce(sum(quantity) FILTER
                                        (WHERE status IN ('PENDING_PAYMENT', 'PAID')), 0)::bigint AS held,
                                    count(*) FILTER (WHERE status = 'PENDING_PAYMENT'
                                        AND expires_at < now() - interval '5 seconds') AS overdue
                               FROM orders WHERE deal_id = d.id) o
              WHERE d.id = $1",
        )
        .bind(deal)
        .fetch_one(db)
        .await
        .map_err(|e| e.to_string())?;
    let mut violations = Vec::new();
    if total != available + reserved + sold {
        violations.push(format!(
            "stock_total {total} != available {available} + reserved {reserved} + sold {sold}"
        ));
    }
    if held > total || reserved + sold != held {
        violations.push(format!(
            "orders hold {held} units, buckets say reserved {reserved} + sold {sold} of {total}"
        ));
    }
    if overdue > 0 {
        violations.push(format!("{overdue} expired orders still hold their units"));
    }
    let figures =
        json!({"total": total, "available": available, "reserved": reserved, "sold": sold});
    Ok((violations, figures))
}

/// How many payments the provider took have not reached their order yet.
pub async fn unconfirmed_payments(
    db: &PgPool,
    deal: &str,
    intents: &[Value],
) -> Result<usize, String> {
    let orders: Vec<(String, String, String, String, i32)> = sqlx::query_as(
        "SELECT id::text, user_id, idempotency_key, status, quantity FROM orders
          WHERE deal_id = $1",
    )
    .bind(deal)
    .fetch_all(db)
    .await
    .map_err(|e| e.to_string())?;
    Ok(payment_violations(&orders, intents).len())
}

/// Every payment the provider took ends PAID, or refunded (or on its way to it).
fn payment_violations(
    orders: &[(String, String, String, String, i32)],
    intents: &[Value],
) -> Vec<String> {
    let status: HashMap<&str, &str> = orders
        .iter()
        .map(|(id, _, _, status, _)| (id.as_str(), status.as_str()))
        .collect();
    let mut violations = Vec::new();
    for intent in intents.iter().filter(|i| i["status"] == "succeeded") {
        let order = intent["metadata"]["order_id"].as_str().unwrap_or_default();
        let refunded = intent["amount_refunded_minor"] == intent["amount_minor"];
        match status.get(order) {
            Some(&("PAID" | "REFUND_PENDING")) => {}
            Some(&"REFUNDED") if refunded => {}
            other => violations.push(format!(
                "provider took payment {} for order {order}, which is {other:?} (refunded: {refunded})",
                intent["id"]
            )),
        }
    }
    violations
}

/// `flashgate check`: the product's own audit of every invariant.
pub fn audit(flashgate: &Path, database_url: &str, redis_url: &str) -> Option<String> {
    let output = Command::new(flashgate)
        .arg("check")
        .env("DATABASE_URL", database_url)
        .env("REDIS_URL", redis_url)
        .env("FLASHGATE_JWT_SECRET", super::cluster::JWT_SECRET)
        .env("FLASHGATE_ADMIN_TOKEN", super::cluster::ADMIN_TOKEN)
        .env("RUST_LOG", "error")
        .output();
    match output {
        Ok(output) if output.status.success() => None,
        Ok(output) => Some(format!(
            "flashgate check failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )),
        Err(error) => Some(format!("flashgate check did not run: {error}")),
    }
}
