//! flashgate-loadtest: a flash sale against a running gateway, on loopback only.
//!
//! It creates a deal, lets `users` virtual users each try `attempts` purchases through a
//! fixed number of concurrent workers (closed loop), retries 429 and 503 answers as a real
//! client would, and records latency per outcome in HDR histograms. Afterwards it reads
//! the inventory back and fails unless every unit is accounted for and nothing oversold.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use hdrhistogram::Histogram;
use serde_json::{Value, json};
use tokio::sync::Mutex;

#[derive(Parser, Clone)]
#[command(about = "Run a bounded flash sale against a flashgate on loopback")]
struct Args {
    /// Gateway base URL; must be a loopback address.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    base_url: String,
    #[arg(
        long,
        env = "FLASHGATE_ADMIN_TOKEN",
        default_value = "flashgate-dev-admin-token"
    )]
    admin_token: String,
    #[arg(
        long,
        env = "FLASHGATE_JWT_SECRET",
        default_value = "flashgate-dev-secret-change-me"
    )]
    jwt_secret: String,
    /// Units on sale.
    #[arg(long, default_value_t = 1000)]
    stock: i64,
    #[arg(long, default_value_t = 32)]
    buckets: i32,
    #[arg(long, default_value_t = 4000)]
    users: usize,
    /// Purchase attempts per user, each with its own idempotency key.
    #[arg(long, default_value_t = 1)]
    attempts: usize,
    #[arg(long, default_value_t = 1)]
    per_user_limit: i32,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Hard stop, whatever is left.
    #[arg(long, default_value_t = 60)]
    duration_max_seconds: u64,
    /// Retries of one attempt after 429 or 503.
    #[arg(long, default_value_t = 5)]
    retries_max: u32,
    /// Where to write the JSON result.
    #[arg(long)]
    out: Option<std::path::PathBuf>,
}

/// Latency histograms keyed by outcome (HTTP status or "error").
type Outcomes = BTreeMap<String, Histogram<u64>>;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    ensure_loopback(&args.base_url)?;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency)
        .timeout(Duration::from_secs(10))
        .build()?;
    let deal_id = format!("lt-{}", uuid::Uuid::now_v7().simple());
    create_deal(&client, &args, &deal_id).await?;
    let started = Instant::now();
    let outcomes = run_sale(&client, &args, &deal_id).await;
    let elapsed = started.elapsed();
    let inventory = get_inventory(&client, &args, &deal_id).await?;
    let report = report(&args, &deal_id, elapsed, &outcomes, &inventory);
    println!("{}", summary(&report));
    if let Some(path) = &args.out {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)?;
    }
    if report["verdict"]["ok"] != json!(true) {
        return Err("inventory check failed".into());
    }
    Ok(())
}

fn ensure_loopback(base_url: &str) -> Result<(), String> {
    let url = reqwest::Url::parse(base_url).map_err(|e| e.to_string())?;
    let host = url.host_str().unwrap_or_default().trim_matches(['[', ']']);
    let loopback = host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
    if loopback {
        Ok(())
    } else {
        Err(format!("{base_url} is not a loopback address"))
    }
}

async fn create_deal(client: &reqwest::Client, args: &Args, deal_id: &str) -> Result<(), String> {
    let response = client
        .post(format!("{}/admin/deals", args.base_url))
        .bearer_auth(&args.admin_token)
        .json(&json!({
            "id": deal_id, "name": "load test", "stock": args.stock, "buckets": args.buckets,
            "unit_price_minor": 1000, "currency": "EUR", "per_user_limit": args.per_user_limit,
            "reservation_ttl_seconds": 600,
        }))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if response.status() != reqwest::StatusCode::CREATED {
        return Err(format!("creating the deal answered {}", response.status()));
    }
    Ok(())
}

async fn run_sale(client: &reqwest::Client, args: &Args, deal_id: &str) -> Outcomes {
    let tokens: Arc<Vec<String>> = Arc::new(
        (0..args.users)
            .map(|u| flashgate::auth::mint_token(&args.jwt_secret, &format!("lt-user-{u}"), 3600))
            .collect(),
    );
    let next = Arc::new(AtomicUsize::new(0));
    let outcomes = Arc::new(Mutex::new(Outcomes::new()));
    let deadline = Instant::now() + Duration::from_secs(args.duration_max_seconds);
    let total = args.users * args.attempts;
    let workers: Vec<_> = (0..args.concurrency)
        .map(|_| {
            let (client, args, tokens, next, outcomes) = (
                client.clone(),
                args.clone(),
                tokens.clone(),
                next.clone(),
                outcomes.clone(),
            );
            let url = format!("{}/v1/deals/{deal_id}/orders", args.base_url);
            let deal_id = deal_id.to_owned();
            tokio::spawn(async move {
                let mut local = Outcomes::new();
                loop {
                    let job = next.fetch_add(1, Ordering::Relaxed);
                    if job >= total || Instant::now() >= deadline {
                        break;
                    }
                    let (user, attempt) = (job % args.users, job / args.users);
                    let key = format!("{deal_id}-{user}-{attempt}");
                    let (outcome, micros) =
                        buy(&client, &url, &tokens[user], &key, args.retries_max).await;
                    record(&mut local, outcome, micros);
                }
                let mut shared = outcomes.lock().await;
                for (outcome, histogram) in local {
                    shared
                        .entry(outcome)
                        .or_insert_with(new_histogram)
                        .add(histogram)
                        .ok();
                }
            })
        })
        .collect();
    for worker in workers {
        let _ = worker.await;
    }
    Arc::try_unwrap(outcomes)
        .map(Mutex::into_inner)
        .unwrap_or_default()
}

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

fn record(outcomes: &mut Outcomes, outcome: String, micros: u64) {
    let histogram = outcomes.entry(outcome).or_insert_with(new_histogram);
    histogram.saturating_record(micros.max(1));
}

/// One purchase attempt with its retries; latency is measured per HTTP exchange.
async fn buy(
    client: &reqwest::Client,
    url: &str,
    token: &str,
    key: &str,
    retries_max: u32,
) -> (String, u64) {
    let mut retries = 0;
    loop {
        let sent = Instant::now();
        let response = client
            .post(url)
            .bearer_auth(token)
            .header("Idempotency-Key", key)
            .body(r#"{"quantity":1}"#)
            .send()
            .await;
        let micros = u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX);
        let status = match response {
            Ok(response) => response.status().as_u16(),
            Err(_) => return ("error".into(), micros),
        };
        if matches!(status, 429 | 503) && retries < retries_max {
            retries += 1;
            tokio::time::sleep(Duration::from_millis(20 * u64::from(retries))).await;
            continue;
        }
        return (status.to_string(), micros);
    }
}

async fn get_inventory(
    client: &reqwest::Client,
    args: &Args,
    deal_id: &str,
) -> Result<Value, String> {
    client
        .get(format!("{}/admin/deals/{deal_id}/inventory", args.base_url))
        .bearer_auth(&args.admin_token)
        .send()
        .await
        .map_err(|e| e.to_string())?
        .json()
        .await
        .map_err(|e| e.to_string())
}

fn report(
    args: &Args,
    deal_id: &str,
    elapsed: Duration,
    outcomes: &Outcomes,
    inventory: &Value,
) -> Value {
    let count = |status: &str| outcomes.get(status).map_or(0, Histogram::len);
    let requests: u64 = outcomes.values().map(Histogram::len).sum();
    let created = count("201");
    let held =
        inventory["reserved"].as_i64().unwrap_or(-1) + inventory["sold"].as_i64().unwrap_or(-1);
    let ok = inventory["invariant_holds"] == json!(true)
        && i64::try_from(created).is_ok_and(|c| c == held)
        && held <= args.stock;
    let latency: BTreeMap<&String, Value> = outcomes
        .iter()
        .map(|(outcome, h)| {
            let q = |p: f64| h.value_at_quantile(p);
            (outcome, json!({"count": h.len(), "p50_us": q(0.5), "p90_us": q(0.9), "p99_us": q(0.99), "max_us": h.max()}))
        })
        .collect();
    json!({
        "deal_id": deal_id,
        "stock": args.stock, "buckets": args.buckets, "users": args.users,
        "attempts_per_user": args.attempts, "concurrency": args.concurrency,
        "elapsed_seconds": elapsed.as_secs_f64(),
        "requests": requests,
        "requests_per_second": requests as f64 / elapsed.as_secs_f64().max(1e-9),
        "latency_by_outcome": latency,
        "inventory": inventory,
        "verdict": {"ok": ok, "created": created, "units_held": held},
    })
}

fn summary(report: &Value) -> String {
    let mut lines = vec![format!(
        "{} requests in {:.2} s = {:.0} req/s (stock {}, {} buckets, {} users, concurrency {})",
        report["requests"],
        report["elapsed_seconds"].as_f64().unwrap_or(0.0),
        report["requests_per_second"].as_f64().unwrap_or(0.0),
        report["stock"],
        report["buckets"],
        report["users"],
        report["concurrency"],
    )];
    if let Some(outcomes) = report["latency_by_outcome"].as_object() {
        for (outcome, l) in outcomes {
            lines.push(format!(
                "  {outcome:>5}: {:>7} responses, p50 {} us, p90 {} us, p99 {} us, max {} us",
                l["count"], l["p50_us"], l["p90_us"], l["p99_us"], l["max_us"]
            ));
        }
    }
    lines.push(format!("inventory: {}", report["inventory"]));
    lines.push(format!("verdict: {}", report["verdict"]));
    lines.join("\n")
}
