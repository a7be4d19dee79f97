//! A payment-provider simulator, run as its own process with `flashgate psp-sim`.
//!
//! It behaves like a hosted-checkout provider, so the gateway's payment code can be tested
//! over real HTTP exactly as it would talk to a real one:
//!
//! ```text
//! gateway ──/v1 (bearer key, Idempotency-Key)──► ledger ──events──► outbox ──signed POST──► webhook URL
//! browser ──/checkout/{id} Pay | Decline──────────┘                    ▲ drop, duplicate,
//! tests ────/control: faults, clock, force success, flush, events ─────┘ delay, reorder
//! ```
//!
//! - [`model`]: the objects, the payment-intent state machine, the error type. No IO.
//! - [`ledger`]: intents, refunds and idempotency keys behind one lock; the clock.
//! - [`webhooks`]: records every event and delivers it signed, with retries and faults.
//! - [`faults`]: what `/control/faults` can switch on.
//! - [`server`] and [`handlers`]: routing and the three route groups; [`checkout`]: HTML.
//!
//! Everything lives in memory and is gone when the process stops.

pub mod checkout;
pub mod faults;
pub mod handlers;
pub mod ledger;
pub mod model;
pub mod server;
pub mod webhooks;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use faults::Faults;
use ledger::Ledger;
use model::SimError;
use webhooks::Outbox;

/// How often the background ticker expires unpaid intents past `expires_at`.
const EXPIRY_TICK_MS: u64 = 1_000;

/// What `flashgate psp-sim` needs to run.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Address to listen on; port 0 picks a free port.
    pub listen: SocketAddr,
    /// Where events are POSTed (`http://` only); none means they are only recorded until
    /// a test sets one with `POST /control/webhook_url`.
    pub webhook_url: Option<String>,
    /// Shared secret for the `Flashgate-Signature` header.
    pub webhook_secret: String,
    /// The bearer token every `/v1` call must present.
    pub api_key: String,
}

/// The running simulator, shared by every connection.
pub struct Sim {
    ledger: Ledger,
    outbox: Arc<Outbox>,
    faults: Arc<Mutex<Faults>>,
    api_key: String,
}

/// Binds, prints `psp-sim listening on http://ADDR` as the first stdout line, and serves
/// until `shutdown` is cancelled.
pub async fn run(config: SimConfig, shutdown: CancellationToken) -> Result<(), String> {
    let webhook_url = config
        .webhook_url
        .as_deref()
        .map(parse_webhook_url)
        .transpose()
        .map_err(|e| format!("webhook url: {}", e.body()["error"]["message"]))?;
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("cannot read the bound address: {e}"))?;
    let base_url = format!("http://{addr}");
    let faults = Arc::new(Mutex::new(Faults::default()));
    let outbox = Outbox::start(
        webhook_url,
        config.webhook_secret,
        faults.clone(),
        shutdown.clone(),
    )?;
    let sim = Arc::new(Sim {
        ledger: Ledger::new(outbox.clone(), base_url.clone()),
        outbox,
        faults,
        api_key: config.api_key,
    });
    tokio::spawn(expire_in_background(sim.clone(), shutdown.clone()));
    println!("psp-sim listening on {base_url}");
    tracing::info!(%addr, "psp-sim listening");
    server::serve(listener, sim, shutdown).await;
    Ok(())
}

/// Accepts only `http://` URLs: the simulator sends webhooks without TLS.
pub fn parse_webhook_url(raw: &str) -> Result<String, SimError> {
    let url = reqwest::Url::parse(raw)
        .map_err(|e| SimError::invalid(format!("not a URL: {raw}: {e}")))?;
    if url.scheme() != "http" || url.host().is_none() {
        return Err(SimError::invalid(format!(
            "webhook URL must be http://host[:port]/path, got {raw}"
        )));
    }
    Ok(url.to_string())
}

async fn expire_in_background(sim: Arc<Sim>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_millis(EXPIRY_TICK_MS));
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {
                sim.ledger.expire_due();
            }
        }
    }
}

/// Locks a mutex, carrying on after a panic elsewhere: every critical section leaves the
/// data consistent before anything that could panic.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
