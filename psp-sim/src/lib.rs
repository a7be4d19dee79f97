//! A payment-provider simulator, run as its own process (`flashgate-psp-sim`) or started by
//! the gateway's tests through [`bind`]. It is a test tool: the gateway does not link it and
//! speaks to it only over HTTP, as to any provider.
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
//! - [`tls`]: serving over TLS with a certificate from PEM files, as real providers do.
//!
//! Everything lives in memory and is gone when the process stops.

pub mod checkout;
pub mod faults;
pub mod handlers;
pub mod ledger;
pub mod model;
pub mod route;
pub mod server;
pub mod tls;
pub mod webhooks;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use faults::Faults;
use ledger::Ledger;
use model::SimError;
use webhooks::Outbox;

/// How often the background ticker expires unpaid intents past `expires_at`.
const EXPIRY_TICK_MS: u64 = 1_000;

/// What the simulator needs to run: its command-line arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct SimConfig {
    /// Address to listen on; port 0 picks a free one (printed on the first stdout line).
    #[arg(long, default_value = "127.0.0.1:8090")]
    pub listen: SocketAddr,
    /// Where webhooks are POSTed (`http://` only); without it events are only recorded
    /// until a test sets one with `POST /control/webhook_url`.
    #[arg(long, env = "FLASHGATE_PSP_WEBHOOK_URL")]
    pub webhook_url: Option<String>,
    /// Shared secret for the `Flashgate-Signature` webhook header.
    #[arg(
        long,
        env = "FLASHGATE_PSP_WEBHOOK_SECRET",
        default_value = "psp-dev-webhook-secret",
        hide_env_values = true
    )]
    pub webhook_secret: String,
    /// Bearer token the simulator's API requires.
    #[arg(
        long,
        env = "FLASHGATE_PSP_API_KEY",
        default_value = "psp-dev-api-key",
        hide_env_values = true
    )]
    pub api_key: String,
    /// PEM certificate chain to serve HTTPS with (needs `--tls-key`); plain HTTP without.
    #[arg(long, requires = "tls_key", value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `--tls-cert`.
    #[arg(long, requires = "tls_cert", value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
}

/// The running simulator, shared by every connection.
pub struct Sim {
    ledger: Ledger,
    outbox: Arc<Outbox>,
    faults: Arc<Mutex<Faults>>,
    api_key: String,
}

/// Binds, prints `psp-sim listening on http(s)://ADDR` as the first stdout line, and serves
/// until `shutdown` is cancelled.
pub async fn run(config: SimConfig, shutdown: CancellationToken) -> Result<(), String> {
    let bound = bind(config, shutdown.clone()).await?;
    println!("psp-sim listening on {}", bound.base_url());
    bound.serve(shutdown).await;
    Ok(())
}

/// A simulator listening on its address but not yet serving, so whoever started it learns
/// the address first: the command prints it, a test in the same process reads it.
pub struct Bound {
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    sim: Arc<Sim>,
    base_url: String,
}

/// Binds `config.listen` and starts the background work (webhook delivery, expiry), which
/// stops when `shutdown` is cancelled.
pub async fn bind(config: SimConfig, shutdown: CancellationToken) -> Result<Bound, String> {
    let webhook_url = config
        .webhook_url
        .as_deref()
        .map(parse_webhook_url)
        .transpose()
        .map_err(|e| format!("webhook url: {}", e.body()["error"]["message"]))?;
    let tls = match (&config.tls_cert, &config.tls_key) {
        (Some(cert), Some(key)) => Some(tls::acceptor(cert, key)?),
        _ => None,
    };
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("cannot read the bound address: {e}"))?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    let base_url = format!("{scheme}://{addr}");
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
    tokio::spawn(expire_in_background(sim.clone(), shutdown));
    tracing::info!(%addr, "psp-sim listening");
    Ok(Bound {
        listener,
        tls,
        sim,
        base_url,
    })
}

impl Bound {
    /// `http://ADDR` or `https://ADDR`: where the simulator answers.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// Serves until `shutdown` is cancelled.
    pub async fn serve(self, shutdown: CancellationToken) {
        server::serve(self.listener, self.tls, self.sim, shutdown).await;
    }
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

/// Cancels `token` on the first SIGTERM or SIGINT.
pub async fn cancel_on_signal(token: CancellationToken) {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut stream) => {
                stream.recv().await;
            }
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
    token.cancel();
}

/// Locks a mutex, carrying on after a panic elsewhere: every critical section leaves the
/// data consistent before anything that could panic.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
