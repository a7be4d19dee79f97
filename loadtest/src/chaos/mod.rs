//! `flashgate-loadtest chaos`: a whole sale with payments across three gateway processes,
//! under a fault schedule derived from a seed, checked against the ledger at the end.
//!
//! Everything runs on loopback in processes of its own: a private PostgreSQL cluster, a
//! private Redis, the payment simulator and three `flashgate serve`. Buyers order, retry
//! with the same key, pay or abandon, while one fault at a time hits a process (see
//! [`schedule`]). Then every fault is healed, the gateways settle, and the verdict compares
//! the database and the provider with what clients were told, and the events a receiver
//! subscribed before the sale got with the database's changes ([`events`]). A failing run
//! prints its seed and schedule: the same seed replays the same faults.

mod clients;
mod cluster;
pub mod events;
mod ledger;
pub mod schedule;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use cluster::{ADMIN_TOKEN, Gateway, Postgres, PspSim, Redis, Wiring};
use schedule::{Fault, Step};

/// Gateways in every run.
const GATEWAYS: usize = 3;
/// How often a webhook storm moves delivery to the next gateway.
const WEBHOOK_SWITCH: Duration = Duration::from_millis(150);
/// How long the gateways get, once healed, to expire, refund and reconcile: a loaded
/// machine has been seen to need about a minute for a backlog of webhooks the provider
/// gave up on. A run that settles sooner goes on at once.
const SETTLE_MAX: Duration = Duration::from_secs(90);

/// What to run.
#[derive(Debug, Clone, clap::Args)]
pub struct ChaosConfig {
    /// Seed of the fault schedule and of the buyers' choices.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Length of the sale; faults fall in its first three quarters.
    #[arg(long, default_value_t = 60)]
    pub duration_seconds: u64,
    /// Concurrent buyers.
    #[arg(long, default_value_t = 24)]
    pub buyers: usize,
    /// Units on sale.
    #[arg(long, default_value_t = 600)]
    pub stock: i64,
    /// Seconds an unpaid order holds its units: short, so abandoned orders expire during
    /// the sale and its faults (the provider's checkout session still lasts its minimum).
    #[arg(long, default_value_t = 10)]
    pub reservation_ttl_seconds: i64,
    /// The `flashgate` binary; defaults to the one next to this program.
    #[arg(long)]
    pub flashgate: Option<PathBuf>,
    /// The payment simulator's binary (`flashgate-psp-sim`); defaults to the one next to
    /// this program.
    #[arg(long)]
    pub psp_sim: Option<PathBuf>,
}

/// The programs a run starts.
struct Binaries {
    flashgate: PathBuf,
    psp_sim: PathBuf,
}

/// Runs one seeded sale; the report says `"ok": true` when no violation was found.
pub async fn run(config: &ChaosConfig) -> Result<Value, String> {
    let binaries = Binaries {
        flashgate: binary(config.flashgate.as_ref(), "flashgate", "--flashgate")?,
        psp_sim: binary(config.psp_sim.as_ref(), "flashgate-psp-sim", "--psp-sim")?,
    };
    let duration = Duration::from_secs(config.duration_seconds);
    let steps = schedule::schedule(config.seed, duration, GATEWAYS);
    let dir = std::env::temp_dir().join(format!("flashgate-chaos-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let outcome = sale(config, &binaries, &steps, &dir).await;
    let _ = std::fs::remove_dir_all(&dir);
    let shown: Vec<String> = steps.iter().map(ToString::to_string).collect();
    let mut report =
        outcome.map_err(|error| format!("{error}\nschedule:\n  {}", shown.join("\n  ")))?;
    report["seed"] = json!(config.seed);
    report["schedule"] = json!(shown);
    Ok(report)
}

/// `given`, or the program `name` next to this one (`flag` names the option to pass).
fn binary(given: Option<&PathBuf>, name: &str, flag: &str) -> Result<PathBuf, String> {
    if let Some(path) = given {
        return Ok(path.clone());
    }
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let dir = me.parent().ok_or("no directory for this program")?;
    let candidates = [dir.join(name), dir.join("..").join(name)];
    candidates
        .into_iter()
        .find(|path| path.is_file())
        .ok_or_else(|| format!("no {name} binary next to {}; pass {flag}", me.display()))
}

/// The processes of a run; all killed when dropped.
struct Cluster {
    postgres: Postgres,
    redis: Redis,
    sim: PspSim,
    wiring: Wiring,
    gateways: Vec<Gateway>,
    http: reqwest::Client,
}

async fn sale(
    config: &ChaosConfig,
    binaries: &Binaries,
    steps: &[Step],
    dir: &std::path::Path,
) -> Result<Value, String> {
    let mut cluster = Cluster::start(binaries, dir).await?;
    let receiver = events::Receiver::start().await?;
    receiver
        .subscribe(&cluster.http, &cluster.gateways[0].ops(), ADMIN_TOKEN)
        .await?;
    let deal = cluster.create_deal(config).await?;
    let targets = clients::Targets {
        gateways: cluster.gateways.iter().map(Gateway::base).collect(),
        psp_base: cluster.sim.base.clone(),
        deal: deal.clone(),
    };
    let opened = Instant::now();
    let until = opened + Duration::from_secs(config.duration_seconds);
    let buyers = tokio::spawn(clients::run(targets, config.buyers, config.seed, until));
    let mut applied = 0;
    for step in steps {
        tokio::time::sleep_until((opened + step.at).into()).await;
        cluster.apply(step).await?;
        applied += 1;
    }
    let journal = buyers.await.map_err(|e| e.to_string())?;
    cluster.heal().await?;
    let db = sqlx::PgPool::connect(&cluster.wiring.database_url)
        .await
        .map_err(|e| e.to_string())?;
    cluster.settle(&db, &deal).await;
    let intents = cluster.intents().await?;
    // The buyers are done: the journal is taken out rather than checked under the lock.
    let journal = std::mem::take(&mut *journal.lock().unwrap_or_else(|e| e.into_inner()));
    let (mut violations, figures) = ledger::check(&db, &journal, &intents, &deal).await?;
    let (event_violations, event_figures) = events::check(&db, &receiver).await;
    violations.extend(event_violations);
    violations.extend(ledger::audit(
        &binaries.flashgate,
        &cluster.wiring.database_url,
        &cluster.redis.url(),
    ));
    let mut clean_exits = 0;
    for gateway in &mut cluster.gateways {
        if let Some(process) = gateway.process.as_mut()
            && process.terminate(Duration::from_secs(10)).await
        {
            clean_exits += 1;
        }
    }
    if clean_exits != GATEWAYS {
        violations.push(format!(
            "{} gateways did not exit 0 on SIGTERM",
            GATEWAYS - clean_exits
        ));
    }
    db.close().await;
    Ok(json!({
        "ok": violations.is_empty(),
        "faults_applied": applied,
        "violations": violations,
        "figures": figures,
        "events": event_figures,
    }))
}

impl Cluster {
    async fn start(binaries: &Binaries, dir: &std::path::Path) -> Result<Self, String> {
        let postgres = Postgres::start(dir).await?;
        let redis = Redis::start().await?;
        let sim = PspSim::start(&binaries.psp_sim).await?;
        let wiring = Wiring {
            flashgate: binaries.flashgate.clone(),
            logs: dir.to_owned(),
            database_url: postgres.url(),
            redis_url: redis.url(),
            psp_base: sim.base.clone(),
        };
        let mut gateways = Vec::new();
        for _ in 0..GATEWAYS {
            let mut gateway = Gateway {
                port: cluster::free_port()?,
                ops_port: cluster::free_port()?,
                process: None,
            };
            wiring.start(&mut gateway).await?;
            gateways.push(gateway);
        }
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| e.to_string())?;
        let cluster = Self {
            postgres,
            redis,
            sim,
            wiring,
            gateways,
            http,
        };
        cluster.webhooks_to(0).await?;
        Ok(cluster)
    }

    async fn create_deal(&self, config: &ChaosConfig) -> Result<String, String> {
        let deal = format!("chaos-{}", config.seed);
        let body = json!({
            "id": deal, "name": "Chaos sale", "stock": config.stock, "buckets": 4,
            "unit_price_minor": 1500, "currency": "EUR", "per_user_limit": 2,
            "reservation_ttl_seconds": config.reservation_ttl_seconds,
        });
        let url = format!("{}/admin/deals", self.gateways[0].ops());
        let response = self
            .http
            .post(url)
            .bearer_auth(ADMIN_TOKEN)
            .json(&body)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        if response.status() != 201 {
            let text = response.text().await.unwrap_or_default();
            return Err(format!("creating the deal: {text}"));
        }
        Ok(deal)
    }

    async fn sim_post(&self, path: &str, body: Value) -> Result<(), String> {
        let url = format!("{}{path}", self.sim.base);
        let response = self.http.post(url).json(&body).send().await;
        match response {
            Ok(r) if r.status().is_success() => Ok(()),
            Ok(r) => Err(format!("psp-sim {path}: {}", r.status())),
            Err(e) => Err(format!("psp-sim {path}: {e}")),
        }
    }

    async fn webhooks_to(&self, gateway: usize) -> Result<(), String> {
        let url = format!("{}/v1/webhooks/sim", self.gateways[gateway].base());
        self.sim_post("/control/webhook_url", json!({ "url": url }))
            .await
    }

    /// Points webhooks at each gateway in turn, starting with `first`, for `lasts`: copies
    /// of one event land on different gateways, in any order.
    async fn spread_webhooks(&self, first: usize, lasts: Duration) -> Result<(), String> {
        let until = Instant::now() + lasts;
        let mut gateway = first;
        while Instant::now() < until {
            self.webhooks_to(gateway).await?;
            gateway = (gateway + 1) % GATEWAYS;
            tokio::time::sleep(WEBHOOK_SWITCH).await;
        }
        Ok(())
    }

    async fn reset_provider(&self) -> Result<(), String> {
        let url = format!("{}/control/faults", self.sim.base);
        self.http
            .delete(url)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        self.sim_post("/control/webhooks/flush", json!({})).await
    }

    /// Applies one fault, waits its length, and heals it.
    async fn apply(&mut self, step: &Step) -> Result<(), String> {
        eprintln!("chaos: {step}");
        let pause = || tokio::time::sleep(step.lasts);
        match step.fault {
            Fault::KillGateway { gateway } => {
                if let Some(process) = self.gateways[gateway].process.as_mut() {
                    process.kill();
                }
                pause().await;
                self.wiring.start(&mut self.gateways[gateway]).await?;
            }
            Fault::RollingRestart => {
                for gateway in &mut self.gateways {
                    if let Some(process) = gateway.process.as_mut() {
                        process.terminate(Duration::from_secs(10)).await;
                    }
                    self.wiring.start(gateway).await?;
                }
            }
            Fault::RestartPostgres => {
                self.postgres.down(true)?;
                pause().await;
                self.postgres.up()?;
            }
            Fault::KillRedis => {
                self.redis.process.kill();
                pause().await;
                self.redis.restart().await?;
            }
            Fault::FreezeRedis => {
                let pid = self.redis.process.pid().unwrap_or_default();
                cluster::signal(pid, "STOP");
                pause().await;
                cluster::signal(pid, "CONT");
            }
            Fault::EmptyRedis => {
                let port = self.redis.port.to_string();
                let _ = std::process::Command::new("redis-cli")
                    .args(["-p", &port, "FLUSHALL"])
                    .output();
            }
            Fault::ProviderLatency => {
                self.sim_post("/control/faults", json!({ "api_delay_ms": 1500 }))
                    .await?;
                pause().await;
                self.reset_provider().await?;
            }
            Fault::ProviderOutage { after_effect } => {
                let faults =
                    json!({ "api_fail_status": 503, "api_fail_after_effect": after_effect });
                self.sim_post("/control/faults", faults).await?;
                pause().await;
                self.reset_provider().await?;
            }
            Fault::WebhookStorm { gateway } => {
                let faults = json!({ "webhook_duplicates": 2, "webhook_reorder": true });
                self.sim_post("/control/faults", faults).await?;
                self.spread_webhooks(gateway, step.lasts).await?;
                self.reset_provider().await?;
            }
        }
        Ok(())
    }

    /// Every process up, no provider fault left.
    async fn heal(&mut self) -> Result<(), String> {
        for gateway in &mut self.gateways {
            if gateway.process.is_none() {
                self.wiring.start(gateway).await?;
            }
        }
        self.reset_provider().await
    }

    /// Waits until nothing is left to expire, refund or confirm (bounded): every payment
    /// the provider took has reached its order, through a webhook or the reconciler.
    async fn settle(&self, db: &sqlx::PgPool, deal: &str) {
        let deadline = Instant::now() + SETTLE_MAX;
        while Instant::now() < deadline {
            let _ = self.sim_post("/control/webhooks/flush", json!({})).await;
            let busy: Result<(i64,), _> = sqlx::query_as(
                "SELECT count(*) FROM orders WHERE deal_id = $1
                    AND (status = 'REFUND_PENDING'
                         OR (status = 'PENDING_PAYMENT' AND expires_at < now()))",
            )
            .bind(deal)
            .fetch_one(db)
            .await;
            let unconfirmed = match self.intents().await {
                Ok(intents) => ledger::unconfirmed_payments(db, deal, &intents)
                    .await
                    .unwrap_or(1),
                Err(_) => 1,
            };
            if matches!(busy, Ok((0,))) && unconfirmed == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    async fn intents(&self) -> Result<Vec<Value>, String> {
        let url = format!("{}/control/payment_intents", self.sim.base);
        let body: Value = self
            .http
            .get(url)
            .send()
            .await
            .map_err(|e| e.to_string())?
            .json()
            .await
            .map_err(|e| e.to_string())?;
        Ok(body["data"].as_array().cloned().unwrap_or_default())
    }
}
