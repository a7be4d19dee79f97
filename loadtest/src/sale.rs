//! A bounded flash sale against a running gateway.
//!
//! It creates a deal, lets `users` virtual users each try `attempts` purchases, retries
//! 429 and 503 answers as a real client would, and records latency per outcome in HDR
//! histograms and per second in a timeline. Arrivals are either closed loop (`concurrency`
//! workers) or open loop (`rate` new purchases per second whatever the server does, with
//! latency measured from the scheduled start, so slow answers cannot hide queueing). The
//! verdict checks the inventory and, with a database URL, the orders themselves: no
//! oversell, the invariant holds, and every acknowledged order exists.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use hyper::header::HeaderValue;
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use crate::line::wait_for_pass;
use crate::loopback::ensure_loopback;
use crate::order_client::OrderClient;
use crate::timeline::Slot;

pub use crate::summary::summary;
use crate::verdict::{DbCheck, check_database, verdict};

pub use crate::sale_config::SaleConfig;

/// Latency histograms keyed by outcome (HTTP status or "error").
type Outcomes = BTreeMap<String, Histogram<u64>>;

struct Recorder {
    outcomes: Outcomes,
    per_second: Vec<Histogram<u64>>,
    created_per_second: Vec<u64>,
    order_ids: Vec<String>,
    /// Units on sale: every order is for one unit, so the sale sold out when this many
    /// orders were created.
    stock: i64,
    /// When the order that took the last unit was answered, measured from the start.
    sold_out_at: Option<Duration>,
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

impl Recorder {
    /// How many answers of each outcome were recorded so far.
    fn counts(&self) -> Vec<(String, u64)> {
        self.outcomes
            .iter()
            .map(|(outcome, h)| (outcome.clone(), Histogram::len(h)))
            .collect()
    }

    fn new(stock: i64) -> Self {
        Self {
            outcomes: Outcomes::new(),
            per_second: Vec::new(),
            created_per_second: Vec::new(),
            order_ids: Vec::new(),
            stock,
            sold_out_at: None,
        }
    }

    fn record(&mut self, second: usize, outcome: &str, micros: u64, order_id: Option<String>) {
        let micros = micros.max(1);
        self.outcomes
            .entry(outcome.to_owned())
            .or_insert_with(histogram)
            .saturating_record(micros);
        while self.per_second.len() <= second {
            self.per_second.push(histogram());
            self.created_per_second.push(0);
        }
        self.per_second[second].saturating_record(micros);
        if let Some(id) = order_id {
            self.created_per_second[second] += 1;
            self.order_ids.push(id);
        }
    }

    /// Notes the answer time of a created order that took the last unit.
    fn note_sold_out(&mut self, answered_after: Duration) {
        if self.sold_out_at.is_none()
            && i64::try_from(self.order_ids.len()).is_ok_and(|n| n >= self.stock)
        {
            self.sold_out_at = Some(answered_after);
        }
    }
}

/// Runs the sale and returns the report (its `verdict.ok` says whether it passed).
pub async fn run(config: &SaleConfig) -> Result<Value, String> {
    for base_url in config.base_urls() {
        ensure_loopback(base_url)?;
    }
    ensure_loopback(&config.operator.ops_url)?;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(config.concurrency)
        // Dropped before the gateway's header read timeout closes them, so no request is
        // sent on a connection the server is closing.
        .pool_idle_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| e.to_string())?;
    let deal_id = format!("lt-{}", uuid::Uuid::now_v7().simple());
    let subscribed = if config.events_receiver {
        let database_url = config.database_url.as_deref();
        Some(crate::sale_events::subscribe(&client, &config.operator, database_url).await?)
    } else {
        None
    };
    create_deal(&client, config, &deal_id).await?;
    let recorder = Arc::new(Mutex::new(Recorder::new(config.stock)));
    // Every token is minted before the clock starts, so signing costs the run nothing.
    let tokens: Arc<Vec<String>> = Arc::new(config.operator.tokens("lt-user-", config.users)?);
    let bearers: Arc<Vec<HeaderValue>> = Arc::new(
        tokens
            .iter()
            .map(|token| OrderClient::bearer(token))
            .collect::<Result<_, _>>()?,
    );
    let orders = config
        .base_urls()
        .map(|base_url| OrderClient::new(base_url, &deal_id).map(Arc::new))
        .collect::<Result<Vec<_>, _>>()?;
    let cpu_before = process_cpu_seconds();
    let started = Instant::now();
    let stock_samples = Arc::new(Mutex::new(Vec::<(Duration, i64)>::new()));
    let sampler = tokio::spawn(sample_stock(
        client.clone(),
        config.clone(),
        deal_id.clone(),
        started,
        stock_samples.clone(),
    ));
    let counted = recorder.clone();
    let progress = crate::progress::Progress::start(
        started,
        config.stock,
        move || counted.lock().map(|r| r.counts()).unwrap_or_default(),
        stock_samples.clone(),
    );
    let users = Users { tokens, bearers };
    let paid = drive(
        &client,
        &orders,
        config,
        &deal_id,
        &users,
        started,
        recorder.clone(),
    )
    .await;
    sampler.abort();
    let elapsed = started.elapsed();
    progress.finish().await;
    let cpu_used = process_cpu_seconds()
        .zip(cpu_before)
        .map(|(after, before)| after - before);
    let inventory = get_inventory(&client, config, &deal_id).await?;
    let recorder = Arc::try_unwrap(recorder)
        .map_err(|_| "workers still running")?
        .into_inner()
        .map_err(|_| "poisoned")?;
    let db = match &config.database_url {
        Some(url) => Some(check_database(url, &deal_id, &recorder.order_ids).await?),
        None => None,
    };
    let samples = stock_samples.lock().map(|s| s.clone()).unwrap_or_default();
    let timeline = timeline(&recorder, &samples);
    let sold_out_after = sold_out_after(&recorder, &samples);
    let mut report = report(
        config,
        &deal_id,
        elapsed,
        &recorder.outcomes,
        &timeline,
        &inventory,
        db.as_ref(),
    );
    report["sold_out_after_seconds"] = json!(sold_out_after);
    report["stock_samples"] = samples
        .iter()
        .map(|(at, units)| json!([at.as_secs_f64(), units]))
        .collect();
    report["paid_at_checkout"] = json!(paid);
    report["load_generator_cpu_seconds"] = json!(cpu_used);
    if let Some(subscribed) = subscribed {
        let (operator, orders) = (&config.operator, &recorder.order_ids);
        subscribed
            .report(&client, operator, &deal_id, orders, &mut report)
            .await;
    }
    Ok(report)
}

/// CPU time (user + system) this process used so far, from `/proc/self/stat` (Linux; the
/// kernel counts in ticks of 1/100 s for user space).
fn process_cpu_seconds() -> Option<f64> {
    const TICKS_PER_SECOND: f64 = 100.0;
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces) start at the state, field 3.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let user: f64 = fields.get(11)?.parse().ok()?;
    let system: f64 = fields.get(12)?.parse().ok()?;
    Some((user + system) / TICKS_PER_SECOND)
}

fn deal_body(config: &SaleConfig, deal_id: &str) -> Value {
    let mut body = json!({
        "id": deal_id, "name": "load test", "stock": config.stock, "buckets": config.buckets,
        "unit_price_minor": 1000, "currency": "EUR", "per_user_limit": config.per_user_limit,
        "reservation_ttl_seconds": 600,
    });
    if config.queue_admit_per_second > 0 {
        body["waiting_room"] = json!({
            "enabled": true, "admit_per_second": config.queue_admit_per_second,
            "max_active": config.queue_max_active, "pass_ttl_seconds": 120, "queue_order": "fifo",
        });
    }
    body
}

async fn create_deal(
    client: &reqwest::Client,
    config: &SaleConfig,
    deal_id: &str,
) -> Result<(), String> {
    config
        .operator
        .create_deal(client, &deal_body(config, deal_id))
        .await
}

/// Runs every purchase, closed or open loop, until done or out of time.
/// Returns how many orders were paid at the provider's checkout.
/// Every user's token, and the same as an `Authorization` value, both made before the run.
struct Users {
    tokens: Arc<Vec<String>>,
    bearers: Arc<Vec<HeaderValue>>,
}

async fn drive(
    client: &reqwest::Client,
    orders: &[Arc<OrderClient>],
    config: &SaleConfig,
    deal_id: &str,
    users: &Users,
    started: Instant,
    recorder: Arc<Mutex<Recorder>>,
) -> u64 {
    let deadline = started + Duration::from_secs(config.duration_max_seconds);
    let total = config.users * config.attempts;
    let permits = Arc::new(Semaphore::new(config.concurrency.max(1)));
    let queue_url: Option<Arc<String>> = (config.queue_admit_per_second > 0).then(|| {
        Arc::new(format!(
            "{}/v1/deals/{deal_id}/queue",
            config.first_base_url()
        ))
    });
    let paid = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for job in 0..total {
        let scheduled = if config.rate > 0 {
            let at = started + Duration::from_secs_f64(job as f64 / f64::from(config.rate));
            tokio::time::sleep_until(at.into()).await;
            at
        } else {
            Instant::now()
        };
        let Ok(permit) = permits.clone().acquire_owned().await else {
            break;
        };
        if Instant::now() >= deadline {
            break;
        }
        let (user, attempt) = (job % config.users, job / config.users);
        let key = format!("{deal_id}-{user}-{attempt}");
        let (client, orders, tokens, bearers, recorder, retries) = (
            client.clone(),
            orders[(user + attempt) % orders.len()].clone(),
            users.tokens.clone(),
            users.bearers.clone(),
            recorder.clone(),
            config.retries_max,
        );
        let (paid, pay_fraction) = (paid.clone(), config.pay_fraction);
        let scheduled = if config.rate > 0 {
            scheduled
        } else {
            Instant::now()
        };
        let queue_url = queue_url.clone();
        tasks.spawn(async move {
            let pass = match queue_url.as_deref() {
                Some(queue_url) => match wait_for_pass(&client, queue_url, &tokens[user], deadline)
                    .await
                {
                    Ok(pass) => Some(pass),
                    Err(outcome) => {
                        let second = usize::try_from(scheduled.duration_since(started).as_secs())
                            .unwrap_or(usize::MAX);
                        if let Ok(mut recorder) = recorder.lock() {
                            recorder.record(second, &outcome, 1, None);
                        }
                        drop(permit);
                        return;
                    }
                },
                None => None,
            };
            // Behind a waiting room the order's latency starts when the pass is in hand.
            let scheduled = if pass.is_some() {
                Instant::now()
            } else {
                scheduled
            };
            let (outcome, created) =
                buy(&orders, &bearers[user], &key, retries, pass.as_deref()).await;
            if let Some(checkout_url) = created.as_ref().and_then(|c| c.checkout_url.as_deref())
                && pays(pay_fraction)
                && pay(&client, checkout_url).await
            {
                paid.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            let order_id = created.map(|c| c.order_id);
            let micros = u64::try_from(scheduled.elapsed().as_micros()).unwrap_or(u64::MAX);
            let second =
                usize::try_from(scheduled.duration_since(started).as_secs()).unwrap_or(usize::MAX);
            let answered_after = started.elapsed();
            if let Ok(mut recorder) = recorder.lock() {
                recorder.record(second, &outcome, micros, order_id);
                recorder.note_sold_out(answered_after);
            }
            drop(permit);
        });
    }
    while tasks.join_next().await.is_some() {}
    paid.load(std::sync::atomic::Ordering::Relaxed)
}

/// Whether this buyer pays: true with probability `fraction`, from a uniform draw in
/// [0, 1) of the thread's cryptographically seeded generator.
fn pays(fraction: f64) -> bool {
    pays_by(&mut rand::rng(), fraction)
}

/// `pays` with the generator given, so a test can seed it.
fn pays_by(rng: &mut impl rand::RngExt, fraction: f64) -> bool {
    rng.random::<f64>() < fraction
}

/// What a 201 told the buyer.
struct Created {
    order_id: String,
    checkout_url: Option<String>,
}

/// Pays at the provider's hosted checkout, as the payer's browser would; only on loopback.
async fn pay(client: &reqwest::Client, checkout_url: &str) -> bool {
    if ensure_loopback(checkout_url).is_err() {
        return false;
    }
    let paid = client.post(format!("{checkout_url}/pay")).send().await;
    paid.is_ok_and(|response| response.status().is_success())
}

/// One purchase with its retries: the outcome and, for a 201, the order.
async fn buy(
    orders: &OrderClient,
    bearer: &HeaderValue,
    key: &str,
    retries_max: u32,
    pass: Option<&str>,
) -> (String, Option<Created>) {
    let mut retries = 0;
    loop {
        let Ok(answer) = orders.order(bearer, key, pass).await else {
            return ("error".into(), None);
        };
        if matches!(answer.status, 429 | 503) && retries < retries_max {
            retries += 1;
            tokio::time::sleep(Duration::from_millis(20 * u64::from(retries))).await;
            continue;
        }
        let created = answer.body.and_then(|body| {
            let body: Value = serde_json::from_slice(&body).unwrap_or_default();
            body["order_id"].as_str().map(|id| Created {
                order_id: id.to_owned(),
                checkout_url: body["payment"]["checkout_url"].as_str().map(str::to_owned),
            })
        });
        return (answer.status.to_string(), created);
    }
}

async fn sample_stock(
    client: reqwest::Client,
    config: SaleConfig,
    deal_id: String,
    started: Instant,
    samples: Arc<Mutex<Vec<(Duration, i64)>>>,
) {
    // With the database at hand, the 32 bucket rows are read directly: the inventory
    // endpoint also checks every reservation line against its order, whose cost grows with
    // the sale and would be billed to the purchases being measured.
    let pool = match &config.database_url {
        Some(url) => sqlx::PgPool::connect(url).await.ok(),
        None => None,
    };
    loop {
        let available = match &pool {
            Some(pool) => sqlx::query_scalar::<_, i64>(
                "SELECT COALESCE(sum(available), 0)::bigint FROM inventory_buckets
                  WHERE deal_id = $1",
            )
            .bind(&deal_id)
            .fetch_one(pool)
            .await
            .ok(),
            None => get_inventory(&client, &config, &deal_id)
                .await
                .ok()
                .and_then(|inventory| inventory["available"].as_i64()),
        };
        if let Some(available) = available
            && let Ok(mut samples) = samples.lock()
        {
            samples.push((started.elapsed(), available));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn get_inventory(
    client: &reqwest::Client,
    config: &SaleConfig,
    deal_id: &str,
) -> Result<Value, String> {
    client
        .get(format!(
            "{}/admin/deals/{deal_id}/inventory",
            config.operator.ops_url
        ))
        .bearer_auth(&config.operator.admin_token)
        .send()
        .await
        .map_err(|e| e.to_string())?
        .json()
        .await
        .map_err(|e| e.to_string())
}

/// Seconds from the start to the answer that took the last unit, to the millisecond; or,
/// when units came back (so the count of orders does not tell), to the first stock sample
/// that read none left. `None` when the sale did not sell out.
fn sold_out_after(recorder: &Recorder, samples: &[(Duration, i64)]) -> Option<f64> {
    let sampled = samples
        .iter()
        .find(|(_, available)| *available == 0)
        .map(|(at, _)| *at);
    recorder
        .sold_out_at
        .or(sampled)
        .map(|at| (at.as_secs_f64() * 1000.0).round() / 1000.0)
}

fn timeline(recorder: &Recorder, samples: &[(Duration, i64)]) -> Vec<Slot> {
    let mut last_available = -1;
    recorder
        .per_second
        .iter()
        .enumerate()
        .map(|(second, h)| {
            let in_second = |at: &Duration| at.as_secs() as usize == second;
            if let Some((_, available)) = samples.iter().rev().find(|(at, _)| in_second(at)) {
                last_available = *available;
            }
            Slot {
                responses: h.len(),
                created: recorder.created_per_second[second],
                p50_us: h.value_at_quantile(0.5),
                p99_us: h.value_at_quantile(0.99),
                available: last_available,
            }
        })
        .collect()
}

fn report(
    config: &SaleConfig,
    deal_id: &str,
    elapsed: Duration,
    outcomes: &Outcomes,
    timeline: &[Slot],
    inventory: &Value,
    db: Option<&DbCheck>,
) -> Value {
    let requests: u64 = outcomes.values().map(Histogram::len).sum();
    let created = outcomes.get("201").map_or(0, Histogram::len);
    let per_user_limit = i64::from(config.per_user_limit);
    let (ok, reasons) = verdict(config.stock, per_user_limit, created, inventory, db);
    let latency: BTreeMap<&String, Value> = outcomes
        .iter()
        .map(|(outcome, h)| {
            let q = |p: f64| h.value_at_quantile(p);
            (outcome, json!({"count": h.len(), "p50_us": q(0.5), "p90_us": q(0.9), "p99_us": q(0.99), "max_us": h.max()}))
        })
        .collect();
    json!({
        "deal_id": deal_id,
        "stock": config.stock, "buckets": config.buckets, "users": config.users,
        "attempts_per_user": config.attempts, "concurrency": config.concurrency, "rate": config.rate,
        "elapsed_seconds": elapsed.as_secs_f64(),
        "requests": requests,
        "requests_per_second": requests as f64 / elapsed.as_secs_f64().max(1e-9),
        "latency_by_outcome": latency,
        "timeline": timeline.iter().map(|s| json!({"responses": s.responses, "created": s.created, "p50_us": s.p50_us, "p99_us": s.p99_us, "available": s.available})).collect::<Vec<_>>(),
        "inventory": inventory,
        "database": db.map(|d| json!({"holding_orders": d.holding_orders, "holding_units": d.holding_units, "acknowledged": d.acknowledged, "acknowledged_found": d.acknowledged_found, "buyers_holding": d.buyers_holding, "most_units_of_one_buyer": d.most_units_of_one_buyer})),
        "verdict": {"ok": ok, "created": created, "reasons": reasons},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pay_fraction_is_the_share_that_pays() {
        use rand::SeedableRng;
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for fraction in [0.0, 0.1, 0.3, 0.5, 0.74, 0.8, 1.0] {
            let paid = (0..10_000).filter(|_| pays_by(&mut rng, fraction)).count();
            let share = paid as f64 / 10_000.0;
            assert!(
                (share - fraction).abs() <= 0.02,
                "--pay-fraction {fraction} paid {share}"
            );
        }
    }

    #[test]
    fn the_sell_out_time_is_kept_below_a_second() {
        let mut recorder = Recorder::new(2);
        for (at, id) in [(120, "a"), (412, "b")] {
            recorder.record(0, "201", 1, Some(id.to_owned()));
            recorder.note_sold_out(Duration::from_millis(at));
        }
        assert_eq!(sold_out_after(&recorder, &[]), Some(0.412));
        let unsold = Recorder::new(5);
        let sampled = [(Duration::from_millis(700), 0)];
        assert_eq!(sold_out_after(&unsold, &sampled), Some(0.7));
        assert_eq!(sold_out_after(&unsold, &[]), None);
    }
}
