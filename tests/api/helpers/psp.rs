//! The payment-provider simulator (`flashgate psp-sim`) as a child process, and a gateway
//! wired to it with payments enabled.
//!
//! The simulator starts first on port 0 (its address is the first stdout line), the gateway
//! is built with `payments.base_url` pointing at it, and only then is the simulator told
//! where to send webhooks (`POST /control/webhook_url`), so neither side needs a port
//! picked in advance.

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use flashgate::config::Settings;
use serde_json::{Value, json};
use sqlx::postgres::PgPool;
use uuid::Uuid;

use super::{POLL_INTERVAL, TestApp, spawn_app_with, test_log};

/// At least 32 bytes and not the development defaults, as `serve` requires.
pub const SIM_API_KEY: &str = "test-psp-api-key-0123456789abcdef";
pub const SIM_WEBHOOK_SECRET: &str = "test-psp-webhook-secret-0123456789abcdef";

/// Long enough for a payment to travel checkout → webhook → database.
pub const SETTLE: Duration = Duration::from_secs(10);

/// A running simulator, killed when dropped.
pub struct Sim {
    child: Child,
    /// Kept open so the simulator can keep writing to stdout.
    _stdout: BufReader<ChildStdout>,
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

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Sim {
    pub async fn start() -> Sim {
        let mut command = Command::new(env!("CARGO_BIN_EXE_flashgate"));
        command
            .args([
                "psp-sim",
                "--listen",
                "127.0.0.1:0",
                "--api-key",
                SIM_API_KEY,
            ])
            .args(["--webhook-secret", SIM_WEBHOOK_SECRET])
            .env_remove("FLASHGATE_PSP_WEBHOOK_URL")
            .env_remove("FLASHGATE_PSP_API_KEY")
            .env_remove("FLASHGATE_PSP_WEBHOOK_SECRET")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(if test_log() {
                Stdio::inherit()
            } else {
                Stdio::null()
            });
        let mut child = command.spawn().expect("spawn flashgate psp-sim");
        let stdout = child.stdout.take().expect("piped stdout");
        let (line, stdout) = tokio::task::spawn_blocking(move || {
            let mut stdout = BufReader::new(stdout);
            let mut line = String::new();
            stdout.read_line(&mut line).map(|_| (line, stdout))
        })
        .await
        .expect("join")
        .expect("read the simulator's first stdout line");
        let base = line
            .trim()
            .strip_prefix("psp-sim listening on ")
            .unwrap_or_else(|| panic!("unexpected first line from psp-sim: {line:?}"))
            .to_owned();
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(30))
            .build()
            .expect("build HTTP client");
        Sim {
            child,
            _stdout: stdout,
            client: SimClient { base, http },
        }
    }
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
    let sim = Sim::start().await;
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
        let deadline = Instant::now() + timeout;
        loop {
            let body = self.get_order(token, order_id).await.expect(200);
            let status = body["status"].as_str().unwrap_or_default();
            if wanted.contains(&status) {
                return body;
            }
            assert!(
                Instant::now() < deadline,
                "order {order_id} never reached {wanted:?} within {timeout:?}; last: {body}"
            );
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// Polls the database until `check` holds; panics with `what` after `timeout`.
    pub async fn wait_db<F, Fut>(&self, what: &str, timeout: Duration, mut check: F)
    where
        F: FnMut(PgPool) -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let deadline = Instant::now() + timeout;
        while !check(self.db.clone()).await {
            assert!(
                Instant::now() < deadline,
                "{what}: not reached within {timeout:?}"
            );
            tokio::time::sleep(POLL_INTERVAL).await;
        }
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
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct AttemptRow {
    pub id: Uuid,
    pub order_id: Uuid,
    pub provider_payment_id: Option<String>,
    pub status: String,
    pub accepted: bool,
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
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct RefundRow {
    pub attempt_id: Uuid,
    pub order_id: Uuid,
    pub amount_minor: i64,
    pub reason: String,
    pub status: String,
    pub provider_refund_id: Option<String>,
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
