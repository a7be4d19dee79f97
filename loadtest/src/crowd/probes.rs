//! What the rehearsal reads from the gateway and its Redis: request counters, the passes
//! outstanding, and Redis's own command counts.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The gateway's answered requests, by kind, from `flashgate_http_requests_total`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counts {
    pub public: u64,
    pub personal: u64,
    pub orders: u64,
    pub orders_created: u64,
}

impl Counts {
    pub fn since(&self, before: &Counts) -> Counts {
        Counts {
            public: self.public - before.public,
            personal: self.personal - before.personal,
            orders: self.orders - before.orders,
            orders_created: self.orders_created - before.orders_created,
        }
    }
}

async fn scrape(http: &reqwest::Client, ops_url: &str) -> Result<String, String> {
    let response = http
        .get(format!("{ops_url}/metrics"))
        .send()
        .await
        .map_err(|e| format!("metrics: {e}"))?;
    response.text().await.map_err(|e| format!("metrics: {e}"))
}

/// The value of each sample line of `metric` whose labels contain every one of `labels`.
fn samples<'a>(
    text: &'a str,
    metric: &'a str,
    labels: &'a [&'a str],
) -> impl Iterator<Item = f64> + 'a {
    text.lines()
        .filter(move |line| line.starts_with(metric) && labels.iter().all(|l| line.contains(l)))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
}

pub async fn origin_counts(http: &reqwest::Client, ops_url: &str) -> Result<Counts, String> {
    let text = scrape(http, ops_url).await?;
    let sum = |labels: &[&str]| {
        samples(&text, "flashgate_http_requests_total{", labels).sum::<f64>() as u64
    };
    Ok(Counts {
        public: sum(&["route=\"/v1/deals/{id}/queue\""]),
        personal: sum(&["route=\"/v1/deals/{id}/queue/{ticket}\""]),
        orders: sum(&["route=\"/v1/deals/{id}/orders\""]),
        orders_created: sum(&["route=\"/v1/deals/{id}/orders\"", "status=\"201\""]),
    })
}

/// The most passes outstanding the advancer reported for the deal, read every 200 ms
/// until `stop`.
pub async fn watch_passes_active(
    http: reqwest::Client,
    ops_url: String,
    deal_id: String,
    stop: Stop,
) -> u64 {
    let label = format!("deal=\"{deal_id}\"");
    let mut max = 0u64;
    while !stop.is_stopped() {
        if let Ok(text) = scrape(&http, &ops_url).await {
            let labels = [label.as_str()];
            let active = samples(&text, "flashgate_waiting_room_passes_active{", &labels);
            max = active.fold(max, |m, v| m.max(v as u64));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    max
}

/// Redis's command counts: every command, those run inside scripts included
/// (`INFO commandstats`), and the commands clients sent (`total_commands_processed`); and
/// the CPU its server process used (`INFO cpu`: `used_cpu_sys` + `used_cpu_user`).
#[derive(Debug, Clone, Default)]
pub struct RedisCounts {
    pub by_command: HashMap<String, u64>,
    pub client_commands: u64,
    pub cpu_seconds: f64,
}

impl RedisCounts {
    /// Calls since `before`, in total and by command (most first).
    pub fn calls_since(&self, before: &RedisCounts) -> (u64, Vec<(String, u64)>) {
        let mut by: Vec<(String, u64)> = self
            .by_command
            .iter()
            .map(|(c, n)| {
                (
                    c.clone(),
                    n - before.by_command.get(c).copied().unwrap_or(0),
                )
            })
            .filter(|(_, n)| *n > 0)
            .collect();
        by.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
        (by.iter().map(|(_, n)| n).sum(), by)
    }
}

pub async fn redis_counts(redis_url: &str) -> Result<RedisCounts, String> {
    let client = redis::Client::open(redis_url).map_err(|e| e.to_string())?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    let general: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    let cpu: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    Ok(RedisCounts {
        by_command: parse_commandstats(&stats),
        client_commands: field(&general, "total_commands_processed:").unwrap_or(0.0) as u64,
        cpu_seconds: field(&cpu, "used_cpu_sys:").unwrap_or(0.0)
            + field(&cpu, "used_cpu_user:").unwrap_or(0.0),
    })
}

/// The number after `name` (with its colon) on a line of an `INFO` section.
fn field(info: &str, name: &str) -> Option<f64> {
    info.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|n| n.trim().parse().ok())
}

/// `cmdstat_get:calls=12,usec=…` lines as command → calls.
fn parse_commandstats(text: &str) -> HashMap<String, u64> {
    text.lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest.split(',').find_map(|kv| kv.strip_prefix("calls="))?;
            Some((name.to_owned(), calls.parse().ok()?))
        })
        .collect()
}

/// A stop flag shared by the crowd's background tasks.
#[derive(Clone, Default)]
pub struct Stop(Arc<AtomicBool>);

impl Stop {
    pub fn stop(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    pub fn is_stopped(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_prometheus_samples_and_commandstats() {
        let text = "flashgate_http_requests_total{route=\"/v1/deals/{id}/queue\",status=\"200\"} 7\n\
                    flashgate_http_requests_total{route=\"/v1/deals/{id}/queue/{ticket}\",status=\"200\"} 3\n";
        let public: f64 = samples(
            text,
            "flashgate_http_requests_total{",
            &["route=\"/v1/deals/{id}/queue\""],
        )
        .sum();
        assert_eq!(public, 7.0);
        let stats = parse_commandstats(
            "# Commandstats\r\ncmdstat_evalsha:calls=5,usec=9\r\ncmdstat_hget:calls=40,usec=1\r\n",
        );
        assert_eq!(stats.get("evalsha"), Some(&5));
        assert_eq!(stats.get("hget"), Some(&40));
        let cpu = "# CPU\r\nused_cpu_sys:1.250000\r\nused_cpu_user:2.500000\r\nused_cpu_sys_children:9.0\r\n";
        assert_eq!(field(cpu, "used_cpu_sys:"), Some(1.25));
        assert_eq!(field(cpu, "used_cpu_user:"), Some(2.5));
    }
}
