//! The payment-provider simulator (the `flashgate-psp-sim` crate), started in the test's
//! process on a runtime of its own, and a gateway wired to it with payments enabled. The
//! gateway speaks to it only over HTTP, as to any provider, and does not link it: only the
//! tests do.
//!
//! The simulator starts first on port 0 (`psp_sim::bind` tells its address), the gateway
//! is built with `payments.base_url` pointing at it, and only then is the simulator told
//! where to send webhooks (`POST /control/webhook_url`), so neither side needs a port
//! picked in advance.

use std::time::Duration;

use flashgate::config::Settings;
use serde_json::{Value, json};
use sqlx::postgres::PgPool;
use tokio_util::sync::{CancellationToken, DropGuard};
use uuid::Uuid;

use super::{TestApp, spawn_app_with, wait_until};
use sqlx::Row;
use sqlx::postgres::PgRow;

/// At least 32 bytes and not the development defaults, as `serve` requires.
pub const SIM_API_KEY: &str = "test-psp-api-key-0123456789abcdef";
pub const SIM_WEBHOOK_SECRET: &str = "test-psp-webhook-secret-0123456789abcdef";

/// Long enough for a payment to travel checkout → webhook → database.
pub const SETTLE: Duration = Duration::from_secs(10);

/// A running simulator, stopped when dropped.
pub struct Sim {
    _stop: DropGuard,
    pub client: SimClient,
}

impl std::ops::Deref for Sim {
    type Target = SimClient;
    fn deref(&self) -> &SimClient {
        &self.client
    }
}

/// Requests to a simulator; cheap to clone into tasks.
#[derive(Clone)]
pub struct SimClient {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    pub http: reqwest::Client,
}

impl Sim {
    pub async fn start() -> Sim {
        Self::start_with(None, reqwest::Client::builder()).await
    }

    /// Starts the simulator serving HTTPS with `certs`; the test's own client trusts their
    /// authority.
    pub async fn start_tls(certs: &TestCerts) -> Sim {
        let authority = reqwest::Certificate::from_pem(certs.ca_pem.as_bytes()).expect("CA");
        Self::start_with(
            Some(certs),
            reqwest::Client::builder().tls_certs_only([authority]),
        )
        .await
    }

    async fn start_with(tls: Option<&TestCerts>, http: reqwest::ClientBuilder) -> Sim {
        let config = psp_sim::SimConfig {
            listen: "127.0.0.1:0".parse().expect("a socket address"),
            webhook_url: None,
            webhook_secret: SIM_WEBHOOK_SECRET.to_owned(),
            api_key: SIM_API_KEY.to_owned(),
            tls_cert: tls.map(|certs| certs.cert_path().into()),
            tls_key: tls.map(|certs| certs.key_path().into()),
        };
        let stop = CancellationToken::new();
        let base = serve_on_own_runtime(config, stop.clone()).await;
        let http = http
            .no_proxy()
            .timeout(Duration::from_secs(30))
            .build()
            .expect("build HTTP client");
        Sim {
            _stop: stop.drop_guard(),
            client: SimClient { base, http },
        }
    }
}

/// Runs the simulator on a runtime and threads of its own, as its own process would, so a
/// test that keeps the gateway's threads busy does not slow the provider's answers down.
/// Answers its base URL once it listens; it serves until `stop` is cancelled.
async fn serve_on_own_runtime(config: psp_sim::SimConfig, stop: CancellationToken) -> String {
    let (bound_tx, bound_rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Runtime::new().expect("the simulator's runtime");
        runtime.block_on(async move {
            match psp_sim::bind(config, stop.clone()).await {
                Ok(bound) => {
                    let _ = bound_tx.send(Ok(bound.base_url().to_owned()));
                    bound.serve(stop).await;
                }
                Err(error) => {
                    let _ = bound_tx.send(Err(error));
                }
            }
        });
    });
    bound_rx
        .await
        .expect("the simulator's thread answers")
        .expect("start the payment simulator")
}

impl SimClient {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn answer(request: reqwest::RequestBuilder) -> (u16, Value) {
        let response = request.send().await.expect("the simulator answers");
        let status = response.status().as_u16();
        let text = response.text().await.expect("body");
        let json = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, json)
    }

    /// POSTs to a checkout or control path (the API key is sent too, harmlessly).
    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let request = self.http.post(self.url(path)).bearer_auth(SIM_API_KEY);
        Self::answer(request.json(&body)).await
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        Self::answer(self.http.get(self.url(path)).bearer_auth(SIM_API_KEY)).await
    }

    pub async fn set_webhook_url(&self, url: &str) {
        let (status, body) = self
            .post("/control/webhook_url", json!({ "url": url }))
            .await;
        assert_eq!(status, 200, "set webhook url: {body}");
    }

    pub async fn faults(&self, faults: Value) {
        let (status, body) = self.post("/control/faults", faults).await;
        assert_eq!(status, 200, "set faults: {body}");
    }

    pub async fn reset_faults(&self) {
        let request = self.http.delete(self.url("/control/faults"));
        let (status, body) = Self::answer(request).await;
        assert_eq!(status, 200, "reset faults: {body}");
    }

    pub async fn flush_webhooks(&self) {
        let (status, body) = self.post("/control/webhooks/flush", json!({})).await;
        assert_eq!(status, 200, "flush: {body}");
    }

    /// The payer presses Pay on the hosted checkout page.
    pub async fn pay(&self, intent_id: &str) -> (u16, Value) {
        self.post(&format!("/checkout/{intent_id}/pay"), json!({}))
            .await
    }

    pub async fn decline(&self, intent_id: &str) -> (u16, Value) {
        self.post(&format!("/checkout/{intent_id}/decline"), json!({}))
            .await
    }

    /// "The payment went through after all", from whatever state the intent is in.
    pub async fn force_succeed(&self, intent_id: &str) -> Value {
        let (status, body) = self
            .post(
                &format!("/control/payment_intents/{intent_id}/succeed"),
                json!({}),
            )
            .await;
        assert_eq!(status, 200, "force succeed {intent_id}: {body}");
        body
    }

    pub async fn intent(&self, intent_id: &str) -> Value {
        let (status, body) = self.get(&format!("/v1/payment_intents/{intent_id}")).await;
        assert_eq!(status, 200, "get intent {intent_id}: {body}");
        body
    }

    /// Every payment intent the simulator knows.
    pub async fn intents(&self) -> Vec<Value> {
        let (status, body) = self.get("/control/payment_intents").await;
        assert_eq!(status, 200, "list intents: {body}");
        body["data"].as_array().cloned().unwrap_or_default()
    }

    pub async fn refunds_of(&self, intent_id: &str) -> Vec<Value> {
        let (status, body) = self
            .get(&format!("/v1/payment_intents/{intent_id}/refunds"))
            .await;
        assert_eq!(status, 200, "refunds of {intent_id}: {body}");
        body["data"].as_array().cloned().unwrap_or_default()
    }

    /// Every event the simulator published, with its delivery record.
    pub async fn events(&self) -> Vec<Value> {
        let (status, body) = self.get("/control/events").await;
        assert_eq!(status, 200, "events: {body}");
        body["data"].as_array().cloned().unwrap_or_default()
    }

    /// `(attempts, answered 2xx)` of the `payment_intent.succeeded` webhook of `intent`.
    pub async fn succeeded_deliveries(&self, intent_id: &str) -> (u64, u64) {
        let events = self.events().await;
        let record = events.iter().find(|record| {
            record["event"]["type"] == "payment_intent.succeeded"
                && record["event"]["data"]["object"]["id"] == intent_id
        });
        record.map_or((0, 0), |r| {
            let count = |field: &str| r[field].as_u64().unwrap_or_default();
            (count("deliveries"), count("successful_deliveries"))
        })
    }
}

/// A certificate authority and a server certificate it signed for `localhost` and
/// 127.0.0.1, made for one test and written to a directory removed on drop.
pub struct TestCerts {
    dir: std::path::PathBuf,
    cert_path: String,
    key_path: String,
    pub ca_path: String,
    pub ca_pem: String,
}

impl TestCerts {
    pub fn generate() -> TestCerts {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "flashgate test authority");
        let ca = ca_params.self_signed(&ca_key).expect("self-sign the CA");
        let issuer = Issuer::new(ca_params, ca_key);
        let key = KeyPair::generate().expect("server key");
        let names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
        let cert = CertificateParams::new(names)
            .expect("server params")
            .signed_by(&key, &issuer)
            .expect("sign the server certificate");
        let dir = std::env::temp_dir().join(format!("flashgate-tls-{}", Uuid::now_v7()));
        std::fs::create_dir_all(&dir).expect("certificate directory");
        let write = |name: &str, pem: &str| {
            let path = dir.join(name);
            std::fs::write(&path, pem).expect("write a PEM file");
            path.to_str().expect("UTF-8 temp path").to_owned()
        };
        TestCerts {
            cert_path: write("server.pem", &cert.pem()),
            key_path: write("server.key", &key.serialize_pem()),
            ca_path: write("ca.pem", &ca.pem()),
            ca_pem: ca.pem(),
            dir,
        }
    }

    pub fn cert_path(&self) -> &str {
        &self.cert_path
    }

    pub fn key_path(&self) -> &str {
        &self.key_path
    }
}

impl Drop for TestCerts {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A gateway with payments at a simulator of its own.
pub struct PayApp {
    pub app: TestApp,
    pub sim: Sim,
}

impl std::ops::Deref for PayApp {
    type Target = TestApp;
    fn deref(&self) -> &TestApp {
        &self.app
    }
}

/// Payment settings for tests: fast workers, the simulator's key and secret.
pub fn payment_settings(s: &mut Settings, sim_base: &str) {
    s.payments.enabled = true;
    s.payments.base_url = sim_base.to_owned();
    s.payments.api_key = SIM_API_KEY.to_owned();
    s.payments.webhook_secret = SIM_WEBHOOK_SECRET.to_owned();
    s.payments.outbox_interval_ms = 50;
    s.payments.reconcile_interval_ms = 500;
    s.payments.reconcile_after_seconds = 1;
    s.payments.retry_backoff_ms = 50;
}

pub async fn spawn_pay_app() -> PayApp {
    spawn_pay_app_with(|_| {}).await
}

/// Starts a simulator, then a gateway using it (`configure` runs after the payment
/// settings), then points the simulator's webhooks at the gateway.
pub async fn spawn_pay_app_with(configure: impl FnOnce(&mut Settings)) -> PayApp {
    spawn_pay_app_at(Sim::start().await, configure).await
}

/// Like [`spawn_pay_app_with`], against a simulator already started (over TLS, say).
pub async fn spawn_pay_app_at(sim: Sim, configure: impl FnOnce(&mut Settings)) -> PayApp {
    let base = sim.base.clone();
    let app = spawn_app_with(move |s| {
        payment_settings(s, &base);
        configure(s);
    })
    .await;
    sim.set_webhook_url(&format!("http://{}/v1/webhooks/sim", app.addr))
        .await;
    PayApp { app, sim }
}

impl PayApp {
    pub async fn cleanup(self) {
        let PayApp { app, sim } = self;
        app.cleanup().await;
        drop(sim);
    }

    /// Polls `GET /v1/orders/{id}` until its status is one of `wanted`; panics with the last
    /// answer after `timeout`.
    pub async fn wait_for_order(
        &self,
        token: &str,
        order_id: &str,
        wanted: &[&str],
        timeout: Duration,
    ) -> Value {
        let what = format!("order {order_id} to reach {wanted:?}");
        wait_until(&what, timeout, || async {
            let body = self.get_order(token, order_id).await.expect(200);
            let status = body["status"].as_str().unwrap_or_default();
            if wanted.contains(&status) {
                Ok(body)
            } else {
                Err(body)
            }
        })
        .await
    }

    /// Polls the database until `check` holds; panics with `what` after `timeout`.
    pub async fn wait_db<F, Fut>(&self, what: &str, timeout: Duration, mut check: F)
    where
        F: FnMut(PgPool) -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        wait_until(what, timeout, || check(self.db.clone())).await
    }

    /// The value of one labelled series of a counter in `/metrics` (0 when absent).
    pub async fn counter(&self, name: &str, label: &str) -> f64 {
        let text = self.metrics().await;
        metric_value(&text, name, label)
    }
}

/// Reads `name{...label...} value` from a Prometheus exposition; 0 when absent.
pub fn metric_value(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter(|line| {
            line.starts_with(&format!("{name}{{")) && line.contains(label)
                || *line == name
                || line.starts_with(&format!("{name} "))
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The simulator's payment intent id of an order (or attempt) answer: the last segment of
/// `payment.checkout_url` (or of `checkout_url`).
pub fn intent_id(answer: &Value) -> String {
    let url = answer["payment"]["checkout_url"]
        .as_str()
        .or_else(|| answer["checkout_url"].as_str())
        .unwrap_or_else(|| panic!("no checkout_url in {answer}"));
    url.rsplit('/')
        .next()
        .expect("a checkout URL has a last segment")
        .to_owned()
}

/// One `payment_attempts` row, as the tests look at it.
#[derive(Debug, Clone)]
pub struct AttemptRow {
    pub id: Uuid,
    pub order_id: Uuid,
    pub provider_payment_id: Option<String>,
    pub status: String,
    pub accepted: bool,
}

impl<'r> sqlx::FromRow<'r, PgRow> for AttemptRow {
    fn from_row(row: &'r PgRow) -> Result<Self, sqlx::Error> {
        Ok(Self {
            id: row.try_get("id")?,
            order_id: row.try_get("order_id")?,
            provider_payment_id: row.try_get("provider_payment_id")?,
            status: row.try_get("status")?,
            accepted: row.try_get("accepted")?,
        })
    }
}

pub async fn attempts_of(db: &PgPool, order_id: &str) -> Vec<AttemptRow> {
    let order_id: Uuid = order_id.parse().expect("order id is a UUID");
    sqlx::query_as(
        "SELECT id, order_id, provider_payment_id, status, accepted FROM payment_attempts
          WHERE order_id = $1 ORDER BY created_at, id",
    )
    .bind(order_id)
    .fetch_all(db)
    .await
    .expect("read payment_attempts")
}

pub async fn all_attempts(db: &PgPool) -> Vec<AttemptRow> {
    sqlx::query_as(
        "SELECT id, order_id, provider_payment_id, status, accepted FROM payment_attempts
          ORDER BY created_at, id",
    )
    .fetch_all(db)
    .await
    .expect("read payment_attempts")
}

/// One `refunds` row.
#[derive(Debug, Clone)]
pub struct RefundRow {
    pub attempt_id: Uuid,
    pub order_id: Uuid,
    pub amount_minor: i64,
    pub reason: String,
    pub status: String,
    pub provider_refund_id: Option<String>,
}

impl<'r> sqlx::FromRow<'r, PgRow> for RefundRow {
    fn from_row(row: &'r PgRow) -> Result<Self, sqlx::Error> {
        Ok(Self {
            attempt_id: row.try_get("attempt_id")?,
            order_id: row.try_get("order_id")?,
            amount_minor: row.try_get("amount_minor")?,
            reason: row.try_get("reason")?,
            status: row.try_get("status")?,
            provider_refund_id: row.try_get("provider_refund_id")?,
        })
    }
}

pub async fn refunds(db: &PgPool) -> Vec<RefundRow> {
    sqlx::query_as(
        "SELECT attempt_id, order_id, amount_minor, reason, status, provider_refund_id
           FROM refunds ORDER BY created_at, id",
    )
    .fetch_all(db)
    .await
    .expect("read refunds")
}

/// `(event_id, event_type, outcome)` of every consumed provider event.
pub async fn payment_events(db: &PgPool) -> Vec<(String, String, String)> {
    sqlx::query_as(
        "SELECT event_id, event_type, outcome FROM payment_events ORDER BY received_at, event_id",
    )
    .fetch_all(db)
    .await
    .expect("read payment_events")
}

/// Everything a refused webhook must leave as it was.
#[derive(Debug, PartialEq)]
pub struct PaymentSnapshot {
    orders: Vec<(Uuid, String)>,
    attempts: Vec<(Uuid, String, bool)>,
    events: i64,
    refunds: i64,
    outbox: i64,
    buckets: Vec<super::BucketRow>,
}

pub async fn payment_snapshot(db: &PgPool, deal: &str) -> PaymentSnapshot {
    let count = |sql: &'static str| async move {
        sqlx::query_scalar::<_, i64>(sql)
            .fetch_one(db)
            .await
            .expect("count rows")
    };
    PaymentSnapshot {
        orders: sqlx::query_as("SELECT id, status FROM orders ORDER BY id")
            .fetch_all(db)
            .await
            .expect("read orders"),
        attempts: sqlx::query_as("SELECT id, status, accepted FROM payment_attempts ORDER BY id")
            .fetch_all(db)
            .await
            .expect("read attempts"),
        events: count("SELECT count(*) FROM payment_events").await,
        refunds: count("SELECT count(*) FROM refunds").await,
        outbox: count("SELECT count(*) FROM outbox").await,
        buckets: super::buckets(db, deal).await,
    }
}

/// `(available, reserved, sold)` summed over a deal's buckets.
pub async fn stock(db: &PgPool, deal: &str) -> (i64, i64, i64) {
    let rows = super::buckets(db, deal).await;
    rows.iter().fold((0, 0, 0), |(a, r, s), b| {
        (a + b.available, r + b.reserved, s + b.sold)
    })
}
