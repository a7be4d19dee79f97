//! A flood of distinct users: every user has a token of its own (its own `sub`) and sends
//! one order, optionally from an address of its own, so that every per-user and per-address
//! structure of the gateway meets a new key per request. While it runs and after it ends,
//! the gateway's resident memory is read from `/proc/<pid>/status` (`VmRSS`, `VmHWM`), to
//! show whether the gateway forgets its flood once its limiters' idle keys are swept.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::loopback::ensure_loopback;
use crate::operator::Operator;
use crate::order_client::OrderClient;

/// What to run.
#[derive(Debug, Clone, clap::Args)]
pub struct FloodConfig {
    /// Gateway base URL; must be a loopback address.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub base_url: String,
    #[command(flatten)]
    pub operator: Operator,
    /// Distinct users, each sending one order with a token of its own.
    #[arg(long, default_value_t = 1_000_000)]
    pub users: usize,
    /// Units of the flooded deal: 0 floods a sold-out deal, `--users` or more lets every
    /// user buy its one unit.
    #[arg(long, default_value_t = 0)]
    pub stock: i64,
    #[arg(long, default_value_t = 32)]
    pub buckets: i32,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 128)]
    pub concurrency: usize,
    /// Hard stop of the flood, whatever is left.
    #[arg(long, default_value_t = 300)]
    pub duration_max_seconds: u64,
    /// After the last user, start again from the first until `--duration-max-seconds`:
    /// a refusal rate taken over a set time, not over however long the users last.
    #[arg(long)]
    pub repeat: bool,
    /// Each user sends `X-Forwarded-For` with an address of its own (the gateway must
    /// trust loopback as a proxy), so the per-address limiter meets a new key each time.
    #[arg(long)]
    pub distinct_addresses: bool,
    /// The gateway's process id, whose resident memory is sampled.
    #[arg(long)]
    pub gateway_pid: Option<u32>,
    /// After the flood, how long memory is watched (longer than the limiters' retain
    /// interval and every cache's time to live).
    #[arg(long, default_value_t = 30)]
    pub settle_seconds: u64,
}

/// Up to this many users, every token is minted before the flood starts, so signing
/// (a few hundred microseconds per RS256 token) is not measured.
const PREMINT_MAX: usize = 200_000;

/// How often resident memory is sampled.
const SAMPLE_EVERY: Duration = Duration::from_millis(500);

/// Runs the flood and returns the report.
pub async fn run(config: &FloodConfig) -> Result<Value, String> {
    ensure_loopback(&config.base_url)?;
    ensure_loopback(&config.operator.ops_url)?;
    let deal_id = format!("flood-{}", uuid::Uuid::now_v7().simple());
    create_deal(config, &deal_id).await?;
    let orders = Arc::new(OrderClient::new(&config.base_url, &deal_id)?);
    let premint = if config.users <= PREMINT_MAX {
        Some(Arc::new(
            config.operator.tokens("flood-user-", config.users)?,
        ))
    } else {
        None
    };
    let before = config.gateway_pid.and_then(memory_of);
    let started = Instant::now();
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let watch = config
        .gateway_pid
        .map(|pid| tokio::spawn(watch(pid, started, stopped)));
    let statuses = flood(config, &orders, premint, &deal_id, started).await;
    let elapsed = started.elapsed();
    let at_end = config.gateway_pid.and_then(memory_of);
    drop(orders);
    tokio::time::sleep(Duration::from_secs(config.settle_seconds)).await;
    let _ = stop.send(());
    let samples = match watch {
        Some(watch) => watch.await.unwrap_or_default(),
        None => Vec::new(),
    };
    let after = config.gateway_pid.and_then(memory_of);
    let sent: u64 = statuses.values().sum();
    Ok(json!({
        "deal": deal_id,
        "users": config.users,
        "stock": config.stock,
        "sent": sent,
        "elapsed_seconds": elapsed.as_secs_f64(),
        "requests_per_second": sent as f64 / elapsed.as_secs_f64().max(f64::EPSILON),
        "statuses": statuses,
        "memory_before": before.map(Memory::json),
        "memory_at_end": at_end.map(Memory::json),
        "memory_after_settle": after.map(Memory::json),
        "settle_seconds": config.settle_seconds,
        "rss_peak_sampled_kib": samples.iter().map(|(_, m)| m.rss_kib).max(),
        "rss_samples": samples.iter().map(|(at, m)| json!([at, m.rss_kib])).collect::<Vec<_>>(),
    }))
}

/// Sends every user's order, `concurrency` at a time, until all are sent (with `repeat`,
/// round after round) or time is up.
/// Returns how many answers of each status came back ("error" for none).
async fn flood(
    config: &FloodConfig,
    orders: &Arc<OrderClient>,
    premint: Option<Arc<Vec<String>>>,
    deal_id: &str,
    started: Instant,
) -> BTreeMap<String, u64> {
    let deadline = started + Duration::from_secs(config.duration_max_seconds);
    let next = Arc::new(AtomicUsize::new(0));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..config.concurrency.max(1) {
        let (orders, premint, next, config, deal_id) = (
            orders.clone(),
            premint.clone(),
            next.clone(),
            config.clone(),
            deal_id.to_owned(),
        );
        workers.spawn(async move {
            let mut statuses = BTreeMap::<String, u64>::new();
            loop {
                let sent = next.fetch_add(1, Ordering::Relaxed);
                if (sent >= config.users && !config.repeat) || Instant::now() >= deadline {
                    return statuses;
                }
                let user = sent % config.users.max(1);
                let outcome = one_user(
                    &orders,
                    premint.as_deref().map(Vec::as_slice),
                    &config,
                    &deal_id,
                    user,
                )
                .await;
                *statuses.entry(outcome).or_default() += 1;
            }
        });
    }
    let mut all = BTreeMap::new();
    while let Some(done) = workers.join_next().await {
        for (status, count) in done.unwrap_or_default() {
            *all.entry(status).or_default() += count;
        }
    }
    all
}

/// One user's order, with its token minted before the flood when up to `PREMINT_MAX`
/// users flood, else minted now: a million tokens minted ahead would hold them all in the
/// load generator's memory.
async fn one_user(
    orders: &OrderClient,
    premint: Option<&[String]>,
    config: &FloodConfig,
    deal_id: &str,
    user: usize,
) -> String {
    let token = match premint {
        Some(tokens) => tokens.get(user).cloned(),
        None => config
            .operator
            .user_token(&format!("flood-user-{user}"), 3600)
            .ok(),
    };
    let Some(Ok(bearer)) = token.as_deref().map(OrderClient::bearer) else {
        return "error".to_owned();
    };
    let address = config.distinct_addresses.then(|| address_of(user));
    let key = format!("{deal_id}-{user}");
    match orders
        .order_from(&bearer, &key, None, address.as_deref())
        .await
    {
        Ok(answer) => answer.status.to_string(),
        Err(_) => "error".to_owned(),
    }
}

/// A distinct address per user in 10.0.0.0/8 (as a proxy would report it: only text in a
/// header, no traffic goes there).
fn address_of(user: usize) -> String {
    let host = u32::try_from(user % (1 << 24)).unwrap_or(0);
    Ipv4Addr::from(0x0a00_0000 | host).to_string()
}

async fn create_deal(config: &FloodConfig, deal_id: &str) -> Result<(), String> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| e.to_string())?;
    let body = json!({
        "id": deal_id, "name": "flood", "stock": config.stock, "buckets": config.buckets,
        "unit_price_minor": 1000, "currency": "EUR", "per_user_limit": 1,
        "reservation_ttl_seconds": 600,
    });
    config.operator.create_deal(&client, &body).await
}

/// Samples the gateway's memory every `SAMPLE_EVERY` until `stop` is sent (or dropped),
/// printing each sample as it comes; returns them with their time since `started`.
async fn watch(
    pid: u32,
    started: Instant,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) -> Vec<(f64, Memory)> {
    let mut samples = Vec::new();
    loop {
        if let Some(memory) = memory_of(pid) {
            let at = started.elapsed().as_secs_f64();
            eprintln!(
                "flood: {at:>6.1} s  VmRSS {} KiB  VmHWM {} KiB",
                memory.rss_kib, memory.hwm_kib
            );
            samples.push((at, memory));
        }
        tokio::select! {
            _ = &mut stop => return samples,
            () = tokio::time::sleep(SAMPLE_EVERY) => {}
        }
    }
}

/// Resident memory of a process, now and at its peak.
#[derive(Debug, Clone, Copy)]
pub struct Memory {
    pub rss_kib: u64,
    pub hwm_kib: u64,
}

impl Memory {
    fn json(self) -> Value {
        json!({"rss_kib": self.rss_kib, "hwm_kib": self.hwm_kib})
    }
}

/// `VmRSS` and `VmHWM` of `pid` from `/proc/<pid>/status` (Linux).
pub fn memory_of(pid: u32) -> Option<Memory> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_status(&status)
}

fn parse_status(status: &str) -> Option<Memory> {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
    };
    Some(Memory {
        rss_kib: field("VmRSS:")?,
        hwm_kib: field("VmHWM:")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_is_read_from_the_status_fields() {
        let status = "Name:\tflashgate\nVmHWM:\t  204800 kB\nVmRSS:\t   51200 kB\n";
        let memory = parse_status(status).expect("both fields");
        assert_eq!((memory.rss_kib, memory.hwm_kib), (51200, 204800));
        assert!(parse_status("Name:\tx\n").is_none());
    }

    #[test]
    fn every_user_below_two_to_the_24_has_its_own_address() {
        assert_eq!(address_of(0), "10.0.0.0");
        assert_eq!(address_of(1_000_000), "10.15.66.64");
        assert_ne!(address_of(255), address_of(256));
    }
}
