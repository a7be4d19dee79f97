//! After the crowd: was the line fair, and were the caps kept? Read from the line's own keys
//! in Redis and from the orders in PostgreSQL, not from what the clients were told.

use std::collections::{HashMap, HashSet};

use redis::AsyncCommands;
use serde_json::{Value, json};

use super::CrowdConfig;
use super::timers::Measured;

/// The pass lifetime the rehearsal's deal is created with, in ms.
pub(super) const PASS_TTL_MS: i64 = 60_000;

/// The Redis key of the deal's line field `name`, as the gateway names it.
fn key(config: &CrowdConfig, deal_id: &str, name: &str) -> String {
    format!("{}wr:{{{deal_id}}}:{name}", config.redis_key_prefix)
}

/// Checks, each a count that must be zero, and the figures behind them.
pub async fn check(
    config: &CrowdConfig,
    deal_id: &str,
    measured: &Measured,
) -> Result<Value, String> {
    let client = redis::Client::open(config.redis_url.as_str()).map_err(|e| e.to_string())?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    let k = |name: &str| key(config, deal_id, name);
    let admitted: HashMap<String, i64> =
        conn.hgetall(k("t_adm")).await.map_err(|e| e.to_string())?;
    let ended: HashMap<String, i64> = conn.hgetall(k("t_skip")).await.map_err(|e| e.to_string())?;
    let meta: HashMap<String, String> = conn.hgetall(k("meta")).await.map_err(|e| e.to_string())?;
    let through: u64 = meta
        .get("admitted_through")
        .and_then(|t| t.parse().ok())
        .unwrap_or(0);
    let left_behind: u64 = conn
        .zcount(k("line"), "-inf", through as f64)
        .await
        .map_err(|e| e.to_string())?;
    let by_ticket: HashMap<&str, usize> = measured
        .clients
        .iter()
        .enumerate()
        .map(|(i, c)| (c.ticket.as_str(), i))
        .collect();
    let mut tickets: Vec<&String> = admitted.keys().collect();
    tickets.sort();
    let positions = read_field(&mut conn, &k("t_pos"), &tickets).await?;
    let users = read_field(&mut conn, &k("t_user"), &tickets).await?;
    let issues = read_field(&mut conn, &k("t_issue"), &tickets).await?;
    let order = order_breaks(&tickets, &positions, &admitted);
    let lottery = lottery_breaks(&meta, &positions, &issues);
    let distinct_users = users.iter().flatten().collect::<HashSet<_>>().len();
    // A random line's pre-queue counts as present at the shuffle for one grace: an abandoned
    // ticket whose turn came within it is admitted, as the gateway documents.
    let shuffled_at: i64 = meta
        .get("shuffled_at")
        .and_then(|t| t.parse().ok())
        .unwrap_or(0);
    let excused = |t: &str| {
        let admitted_at = admitted.get(t).copied().unwrap_or(0) - PASS_TTL_MS;
        shuffled_at > 0 && admitted_at <= shuffled_at + config.grace_seconds as i64 * 1000
    };
    let abandoned: Vec<&&String> = tickets
        .iter()
        .filter(|t| {
            by_ticket
                .get(t.as_str())
                .is_some_and(|i| measured.clients[*i].abandoned)
        })
        .collect();
    let admitted_abandoned = abandoned.iter().filter(|t| !excused(t)).count();
    let admitted_in_shuffle_grace = abandoned.len() - admitted_abandoned;
    let (abandoned_passed, abandoned_skipped, present_skipped) =
        skips(measured, &ended, &admitted, through);
    let orders = orders_check(config, deal_id).await?;
    let checks = json!({
        "admission_order_breaks": order,
        "lottery_position_breaks": lottery,
        "admitted_twice": tickets.len() - distinct_users,
        "abandoned_admitted": admitted_abandoned,
        "abandoned_passed_not_skipped": abandoned_passed - abandoned_skipped - admitted_in_shuffle_grace as u64,
        "checked_in_but_skipped": present_skipped,
        "left_behind_before_admitted_through": left_behind,
        "orders_over_stock": orders["over_stock"],
        "users_with_two_orders": orders["users_with_two_orders"],
        "max_active_exceeded_by": measured.max_active_seen.saturating_sub(config.max_active as u64),
    });
    let ok = checks
        .as_object()
        .is_some_and(|c| c.values().all(|v| v == &json!(0)));
    Ok(json!({
        "ok": ok,
        "checks": checks,
        "admitted_through": through,
        "admitted": tickets.len(),
        "abandoned_skipped": abandoned_skipped,
        "abandoned_admitted_within_grace_of_the_shuffle": admitted_in_shuffle_grace,
        "orders": orders["orders"],
        "max_active_seen": measured.max_active_seen,
        "abandoned_total": meta.get("abandoned_total"),
    }))
}

async fn read_field(
    conn: &mut redis::aio::MultiplexedConnection,
    hash: &str,
    tickets: &[&String],
) -> Result<Vec<Option<String>>, String> {
    let mut out = Vec::with_capacity(tickets.len());
    for chunk in tickets.chunks(1000) {
        let values: Vec<Option<String>> = redis::cmd("HMGET")
            .arg(hash)
            .arg(chunk)
            .query_async(conn)
            .await
            .map_err(|e| e.to_string())?;
        out.extend(values);
    }
    Ok(out)
}

/// Admitted tickets in position order whose admission came before an earlier position's:
/// in a fair line the pass expiries (admission time + one ttl) never go down with position.
fn order_breaks(
    tickets: &[&String],
    positions: &[Option<String>],
    admitted: &HashMap<String, i64>,
) -> u64 {
    let mut by_position: Vec<(u64, i64)> = tickets
        .iter()
        .zip(positions)
        .filter_map(|(t, p)| Some((p.as_ref()?.parse().ok()?, *admitted.get(t.as_str())?)))
        .collect();
    by_position.sort_unstable();
    by_position.windows(2).filter(|w| w[1].1 < w[0].1).count() as u64
}

/// For a random line, admitted pre-queue tickets whose position is not the one the published
/// seed gives their issue number.
fn lottery_breaks(
    meta: &HashMap<String, String>,
    positions: &[Option<String>],
    issues: &[Option<String>],
) -> u64 {
    let (Some(seed), Some(size)) = (meta.get("seed"), meta.get("prequeue_size")) else {
        return 0;
    };
    let size: u64 = size.parse().unwrap_or(0);
    let lottery = flashgate::waiting_room::shuffle::positions(seed, size);
    positions
        .iter()
        .zip(issues)
        .filter_map(|(p, i)| {
            Some((
                p.as_ref()?.parse::<u64>().ok()?,
                i.as_ref()?.parse::<u64>().ok()?,
            ))
        })
        .filter(|(_, issue)| *issue >= 1 && *issue <= size)
        .filter(|(position, issue)| lottery[*issue as usize - 1] != *position)
        .count() as u64
}

/// Abandoned clients the line passed, those of them it skipped, and clients that checked
/// in but were skipped.
fn skips(
    measured: &Measured,
    ended: &HashMap<String, i64>,
    admitted: &HashMap<String, i64>,
    through: u64,
) -> (u64, u64, u64) {
    let (mut passed, mut skipped, mut present) = (0, 0, 0);
    for client in measured.clients.iter().filter(|c| c.position <= through) {
        let was_skipped = ended.get(&client.ticket).is_some_and(|at| *at > 0)
            && !admitted.contains_key(&client.ticket);
        if client.abandoned {
            passed += 1;
            skipped += u64::from(was_skipped);
        } else {
            present += u64::from(was_skipped);
        }
    }
    (passed, skipped, present)
}

async fn orders_check(config: &CrowdConfig, deal_id: &str) -> Result<Value, String> {
    let Some(url) = &config.database_url else {
        return Ok(json!({"orders": null, "over_stock": 0, "users_with_two_orders": 0}));
    };
    let pool = sqlx::PgPool::connect(url)
        .await
        .map_err(|e| e.to_string())?;
    let (orders, units): (i64, i64) = sqlx::query_as(
        "SELECT count(*), COALESCE(sum(quantity), 0)::bigint FROM orders WHERE deal_id = $1",
    )
    .bind(deal_id)
    .fetch_one(&pool)
    .await
    .map_err(|e| e.to_string())?;
    let doubles: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT user_id FROM orders WHERE deal_id = $1
           GROUP BY user_id HAVING count(*) > 1) d",
    )
    .bind(deal_id)
    .fetch_one(&pool)
    .await
    .map_err(|e| e.to_string())?;
    pool.close().await;
    Ok(json!({
        "orders": orders,
        "over_stock": (units - config.stock).max(0),
        "users_with_two_orders": doubles,
    }))
}
