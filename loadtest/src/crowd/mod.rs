//! The crowd rehearsal: a line of many thousands waiting behind the edge, against a real
//! gateway, to show that the origin's load follows the front of the line, not the crowd.
//!
//! Every ticket is real: `tickets` users join one line through the gateway (no proof of
//! work: the rehearsal's deal asks none). Waiting clients are timers, not sockets: far from
//! the front a client only reads the public line state, so the crowd's public polls are
//! modelled (their count is reported) and sampled with real requests through the edge at
//! up to `edge_rate_max` per second, which is what the edge's hit ratio is measured on; each
//! client's check-in comes at its own timer's next tick once the line is within the
//! check-in window of its signed position, and from then on it polls its ticket through the
//! edge at the pace the gateway asks, collects its pass and orders with it. A share of the
//! crowd abandons (never checks in), and a share ignores the window (`impatient`): it polls
//! its ticket from the moment it joined, at the interval each answer gives, showing its
//! position token. Over a measurement window after the line opens it reports origin
//! requests per second (public and personal, from the gateway's own counters), Redis
//! commands per second (`INFO commandstats`) and Redis CPU (`INFO cpu`), the ticket polls
//! answered from memory and as check-ins, the edge's hit ratio, and then checks fairness
//! from Redis and the stock from PostgreSQL (`fairness`).

mod fairness;
mod impatient;
mod join;
mod order;
mod probes;
mod timers;

use std::time::Duration;

use serde_json::{Value, json};

use crate::loopback::ensure_loopback;
use crate::operator::Operator;

/// What to rehearse.
#[derive(Debug, Clone, clap::Args)]
pub struct CrowdConfig {
    /// The edge (nginx with config/nginx/edge.conf) in front of the gateway; loopback only.
    #[arg(long, default_value = "http://127.0.0.1:8090")]
    pub edge_url: String,
    /// The gateway itself, which the tickets are taken from (setting the line up is not
    /// what is measured); loopback only.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub origin_url: String,
    #[command(flatten)]
    pub operator: Operator,
    /// The gateway's Redis (a private one: its command counts are the measurement).
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    pub redis_url: String,
    /// The gateway's `redis.key_prefix`.
    #[arg(long, default_value = "")]
    pub redis_key_prefix: String,
    /// The gateway's PostgreSQL, to check the orders against the stock.
    #[arg(long)]
    pub database_url: Option<String>,
    /// Tickets in the line.
    #[arg(long, default_value_t = 10_000)]
    pub tickets: usize,
    #[arg(long, default_value_t = 100)]
    pub admit_per_second: i32,
    #[arg(long, default_value_t = 200)]
    pub max_active: i32,
    /// Units on sale.
    #[arg(long, default_value_t = 3000)]
    pub stock: i64,
    /// `fifo` or `random`.
    #[arg(long, default_value = "fifo")]
    pub queue_order: String,
    /// Share of the crowd that never checks in (it closed the page).
    #[arg(long, default_value_t = 0.05)]
    pub abandon_fraction: f64,
    /// Share of the crowd (in %, of those who do not abandon) that ignores the check-in
    /// window: it polls its own ticket from the moment it joins, at the interval each
    /// answer gives, showing its position token, and never reads the public line state.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub ignore_window_percent: u32,
    /// How often each waiting client reads the public line state.
    #[arg(long, default_value_t = 5.0)]
    pub public_poll_seconds: f64,
    /// Most real public requests per second sent through the edge for the crowd.
    #[arg(long, default_value_t = 3000)]
    pub edge_rate_max: u32,
    /// Joins in flight at once while the line fills.
    #[arg(long, default_value_t = 256)]
    pub join_concurrency: usize,
    /// Ticket polls and orders in flight at once.
    #[arg(long, default_value_t = 512)]
    pub poll_concurrency: usize,
    /// The line opens this long after the deal is created, at the earliest. A random-order
    /// line must have every ticket taken by then (its shuffle comes at the opening); a fifo
    /// line is paused until every ticket is taken and `--grace-seconds` more have passed.
    #[arg(long, default_value_t = 30)]
    pub open_after_seconds: u64,
    /// The gateway's `waiting_room.abandon_after_seconds`: a fifo line opens no sooner than
    /// this after its last ticket was taken, so a ticket that never checks in is skipped.
    #[arg(long, default_value_t = 10)]
    pub grace_seconds: u64,
    /// From the opening, how long before measuring (the first passes go out).
    #[arg(long, default_value_t = 5)]
    pub warmup_seconds: u64,
    /// The measurement window.
    #[arg(long, default_value_t = 30)]
    pub measure_seconds: u64,
}

/// Runs the rehearsal and returns its report (`ok` says whether every check held).
pub async fn run(config: &CrowdConfig) -> Result<Value, String> {
    for url in [
        &config.edge_url,
        &config.origin_url,
        &config.operator.ops_url,
    ] {
        ensure_loopback(url)?;
    }
    if !matches!(config.queue_order.as_str(), "fifo" | "random") {
        return Err("--queue-order is fifo or random".into());
    }
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(config.join_concurrency.max(config.poll_concurrency))
        .pool_idle_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(20))
        .build()
        .map_err(|e| e.to_string())?;
    let deal_id = format!("crowd-{}", uuid::Uuid::now_v7().simple());
    let random = config.queue_order == "random";
    let mut opens_at = create_deal(&http, config, &deal_id).await?;
    if !random {
        admin(&http, config, &deal_id, "pause").await?;
    }
    let base = format!("{}/v1/deals/{deal_id}", config.edge_url);
    let impatient = impatient::Impatient::start(http.clone(), base, config.poll_concurrency);
    let joined = join::join_all(&http, config, &deal_id, &impatient.arrivals).await?;
    let join_seconds = joined.elapsed.as_secs_f64();
    let now = std::time::Instant::now();
    if random && now >= opens_at {
        return Err(format!(
            "taking {} tickets took {join_seconds:.0} s, past the opening: raise --open-after-seconds",
            config.tickets
        ));
    }
    if !random {
        // A fifo line is held paused until every ticket is taken and the last one is older
        // than the abandon grace, so a ticket that never checks in is skipped at its turn.
        opens_at = opens_at.max(now + Duration::from_secs(config.grace_seconds + 1));
    }
    let run = timers::Crowd::new(
        http.clone(),
        config.clone(),
        deal_id.clone(),
        joined.clients,
        impatient.counts.clone(),
    );
    let resume =
        (!random).then(|| resume_at(http.clone(), config.clone(), deal_id.clone(), opens_at));
    let measured = run.run(opens_at).await;
    let counts = impatient.counts.clone();
    impatient.stop().await;
    let measured = measured?;
    if let Some(resume) = resume {
        resume.await.map_err(|e| e.to_string())??;
    }
    let checked = fairness::check(config, &deal_id, &measured).await?;
    let ok = checked["ok"] == json!(true) && measured.max_active_seen <= config.max_active as u64;
    Ok(json!({
        "deal_id": deal_id,
        "tickets": config.tickets,
        "queue_order": config.queue_order,
        "admit_per_second": config.admit_per_second,
        "max_active": config.max_active,
        "stock": config.stock,
        "abandon_fraction": config.abandon_fraction,
        "public_poll_seconds": config.public_poll_seconds,
        "ignore_window_percent": config.ignore_window_percent,
        "impatient": counts.report(),
        "join_seconds": join_seconds,
        "joins_per_second": config.tickets as f64 / join_seconds.max(1e-9),
        "measured": measured.report(),
        "fairness": checked,
        "ok": ok,
    }))
}

/// `POST /admin/deals/{id}/{action}` (`pause`, `resume`).
async fn admin(
    http: &reqwest::Client,
    config: &CrowdConfig,
    deal_id: &str,
    action: &str,
) -> Result<(), String> {
    let response = config
        .operator
        .post(http, &format!("/admin/deals/{deal_id}/{action}"))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    match response.status().is_success() {
        true => Ok(()),
        false => Err(format!("{action} answered {}", response.status())),
    }
}

/// Resumes the paused line at `at`, while the crowd already waits in it.
fn resume_at(
    http: reqwest::Client,
    config: CrowdConfig,
    deal_id: String,
    at: std::time::Instant,
) -> tokio::task::JoinHandle<Result<(), String>> {
    tokio::spawn(async move {
        tokio::time::sleep_until(at.into()).await;
        admin(&http, &config, &deal_id, "resume").await
    })
}

/// Creates the deal with its line, opening `open_after_seconds` from now; returns when.
async fn create_deal(
    http: &reqwest::Client,
    config: &CrowdConfig,
    deal_id: &str,
) -> Result<std::time::Instant, String> {
    let open_in = Duration::from_secs(config.open_after_seconds);
    let starts_at = chrono_like_now_plus(open_in);
    let body = json!({
        "id": deal_id, "name": "crowd rehearsal", "stock": config.stock, "buckets": 32,
        "unit_price_minor": 1000, "currency": "EUR", "per_user_limit": 1,
        "reservation_ttl_seconds": 600, "starts_at": starts_at,
        "waiting_room": {
            "enabled": true, "admit_per_second": config.admit_per_second,
            "max_active": config.max_active, "pass_ttl_seconds": fairness::PASS_TTL_MS / 1000,
            "queue_order": config.queue_order, "prequeue_opens_at": chrono_like_now_plus(Duration::ZERO),
            "pow_bits": 0,
        },
    });
    config.operator.create_deal(http, &body).await?;
    Ok(std::time::Instant::now() + open_in)
}

/// RFC 3339 time `after` from now, whole seconds rounded up.
fn chrono_like_now_plus(after: Duration) -> String {
    let at = chrono::Utc::now() + after + Duration::from_secs(1);
    at.format("%Y-%m-%dT%H:%M:%SZ").to_string()
}
