//! `flashgate deals report <id>`: the deal's report (`GET /admin/deals/{id}/report`) as a
//! table for a person reading it after a sale, or as the same JSON with `--json`.

use sqlx::PgPool;

use super::cli_settings::CliSettings;
use super::output;
use crate::clock::Clock;
use crate::deals;
use crate::redis_link::RedisHandle;
use crate::waiting_room::WaitingRoom;
use crate::waiting_room::report::Report;

/// `flashgate deals report <id>`: the same report as `GET /admin/deals/{id}/report`, read
/// from PostgreSQL and Redis directly (no gateway needed).
pub async fn run(
    settings: &CliSettings,
    pool: &PgPool,
    id: &str,
    json: bool,
) -> Result<(), String> {
    let deal = deals::load(pool, id)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("deal {id} not found"))?;
    if !deal.waiting_room.enabled {
        return Err(format!("deal {id} has no waiting room"));
    }
    let redis = RedisHandle::from_settings(&settings.redis);
    redis.connect().await;
    let room = WaitingRoom::new(&settings.waiting_room, redis, Clock::system());
    let report = room
        .report(pool, &deal.id)
        .await
        .map_err(|e| e.to_string())?;
    match json {
        true => output::json(&report),
        false => output::line(&table(&report)),
    }
}

/// The report as two aligned columns: the three questions a finished sale asks (how long
/// people waited, how many gave up, how many who got a turn bought) in that order.
pub fn table(report: &Report) -> String {
    let w = &report.wait_seconds;
    let mut rows: Vec<(&str, String)> = vec![
        ("deal", report.deal_id.clone()),
        ("joined", report.line.joined.to_string()),
        ("tickets issued", report.line.tickets_issued.to_string()),
        ("still waiting", report.line.waiting.to_string()),
        ("admitted", report.line.admitted.to_string()),
    ];
    if let Some(priority) = report.line.admitted_priority {
        rows.push((
            "admitted, priority group",
            share(priority, report.line.admitted),
        ));
    }
    rows.extend([
        ("wait p50", seconds(w.p50)),
        ("wait p90", seconds(w.p90)),
        ("wait p99", seconds(w.p99)),
        ("wait max", seconds(w.max)),
        ("abandoned", report.line.abandoned.to_string()),
        ("drained", report.line.drained.to_string()),
        ("sessions ended", report.line.sessions_ended.to_string()),
        ("passes active", report.line.passes_active.to_string()),
        (
            "passes expired unused",
            report.line.passes_expired_unused.to_string(),
        ),
        (
            "admitted who ordered",
            share(report.admitted_who_ordered, report.line.admitted),
        ),
        ("orders with a pass", report.orders_with_pass.to_string()),
        (
            "orders paid",
            share(report.orders_paid, report.orders_with_pass),
        ),
    ]);
    let width = rows.iter().map(|(name, _)| name.len()).max().unwrap_or(0);
    let lines: Vec<String> = rows
        .iter()
        .map(|(name, value)| format!("{name:<width$}  {value}"))
        .collect();
    lines.join("\n")
}

/// A wait in seconds with one decimal, `-` before anyone was admitted.
fn seconds(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |s| format!("{s:.1} s"))
}

/// `part` and its share of `whole` in percent, when `whole` is not 0.
fn share(part: u64, whole: u64) -> String {
    if whole == 0 {
        return part.to_string();
    }
    format!("{part} ({:.1}%)", part as f64 * 100.0 / whole as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::waiting_room::report::{LineCounts, OrderCounts};

    #[test]
    fn the_table_answers_the_three_questions() {
        let line = LineCounts {
            joined: 10,
            tickets_issued: 10,
            admitted: 8,
            abandoned: 2,
            ..LineCounts::default()
        };
        let orders = OrderCounts {
            buyers: 6,
            orders: 6,
            paid: 3,
        };
        let text = table(&Report::of("d1", line, orders));
        assert!(text.contains("abandoned              2"), "{text}");
        assert!(text.contains("admitted who ordered   6 (75.0%)"), "{text}");
        assert!(text.contains("orders paid            3 (50.0%)"), "{text}");
        assert!(text.contains("wait p50               -"), "{text}");
    }
}
