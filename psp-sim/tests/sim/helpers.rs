//! The simulator process, a webhook receiver, and small request helpers.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hmac::{Hmac, KeyInit, Mac};
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use sha2::Sha256;
use tokio::sync::Notify;

use crate::wait::poll;

pub const API_KEY: &str = "test-api-key";
pub const SECRET: &str = "test-webhook-secret";

/// A running `flashgate-psp-sim`, killed when dropped.
pub struct Sim {
    child: Child,
    /// Kept open: the simulator must be able to write to stdout.
    _stdout: BufReader<ChildStdout>,
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
    /// Starts the simulator on a free port, sending webhooks to `webhook_url` if given.
    pub async fn start(webhook_url: Option<&str>) -> Sim {
        let mut command = Command::new(env!("CARGO_BIN_EXE_flashgate-psp-sim"));
        command
            .args(["--listen", "127.0.0.1:0", "--api-key", API_KEY])
            .args(["--webhook-secret", SECRET])
            .env_remove("FLASHGATE_PSP_WEBHOOK_URL")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(if std::env::var_os("TEST_LOG").is_some() {
                Stdio::inherit()
            } else {
                Stdio::null()
            });
        if let Some(url) = webhook_url {
            command.args(["--webhook-url", url]);
        }
        let mut child = command.spawn().expect("spawn flashgate-psp-sim");
        let stdout = child.stdout.take().expect("piped stdout");
        let (line, stdout) = tokio::task::spawn_blocking(move || {
            let mut stdout = BufReader::new(stdout);
            let mut line = String::new();
            stdout.read_line(&mut line).map(|_| (line, stdout))
        })
        .await
        .expect("join")
        .expect("read the first stdout line");
        let base = line
            .trim()
            .strip_prefix("psp-sim listening on ")
            .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
            .to_owned();
        Sim {
            child,
            _stdout: stdout,
            base,
            http: reqwest::Client::new(),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// An authorised API request.
    pub fn api(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.http
            .request(method, self.url(path))
            .bearer_auth(API_KEY)
    }

    pub async fn create(&self, key: &str, body: Value) -> reqwest::Response {
        self.api(reqwest::Method::POST, "/v1/payment_intents")
            .header("Idempotency-Key", key)
            .json(&body)
            .send()
            .await
            .expect("create request")
    }

    /// Creates an intent for 49.99 EUR and returns it.
    pub async fn create_ok(&self, key: &str, extra: Value) -> Value {
        let mut body = json!({"amount_minor": 4999, "currency": "EUR", "reference": key});
        if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
            body.extend(extra.clone());
        }
        let response = self.create(key, body).await;
        assert_eq!(response.status(), 200);
        response.json().await.expect("intent JSON")
    }

    /// POSTs to a path (checkout, control or API) and returns status and JSON.
    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let response = self
            .api(reqwest::Method::POST, path)
            .json(&body)
            .send()
            .await
            .expect("POST");
        status_json(response).await
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        let response = self
            .api(reqwest::Method::GET, path)
            .send()
            .await
            .expect("GET");
        status_json(response).await
    }

    pub async fn faults(&self, faults: Value) {
        let (status, body) = self.post("/control/faults", faults).await;
        assert_eq!(status, 200, "{body}");
    }

    /// The `/control/events` records of one event type once `settled` holds for them (the
    /// simulator records an attempt's outcome only after the receiver has answered).
    pub async fn events_when(&self, kind: &str, settled: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let looked = poll(ARRIVAL, || async {
            let records = self.events_of(kind).await;
            settled(&records).then_some(records)
        })
        .await;
        match looked {
            Ok(records) => records,
            Err(_) => self.events_of(kind).await,
        }
    }

    /// The `/control/events` records of one event type.
    pub async fn events_of(&self, kind: &str) -> Vec<Value> {
        let (_, events) = self.get("/control/events").await;
        events["data"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|record| record["event"]["type"] == kind)
            .cloned()
            .collect()
    }
}

pub async fn status_json(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    let text = response.text().await.expect("body");
    let json = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, json)
}

/// One webhook request as received.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub signature: String,
    pub content_type: String,
    pub body: Bytes,
    pub event: Value,
    pub at: Instant,
}

/// A webhook endpoint on a free port that records every request and answers with the
/// scripted statuses first, then 200.
pub struct Receiver {
    pub url: String,
    deliveries: Arc<Mutex<Vec<Delivery>>>,
    arrived: Arc<Notify>,
    statuses: Arc<Mutex<VecDeque<u16>>>,
}

impl Receiver {
    pub async fn start() -> Receiver {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind receiver");
        let url = format!("http://{}/webhooks/psp", listener.local_addr().unwrap());
        let receiver = Receiver {
            url,
            deliveries: Arc::default(),
            arrived: Arc::default(),
            statuses: Arc::default(),
        };
        let (deliveries, arrived, statuses) = (
            receiver.deliveries.clone(),
            receiver.arrived.clone(),
            receiver.statuses.clone(),
        );
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (deliveries, arrived, statuses) =
                    (deliveries.clone(), arrived.clone(), statuses.clone());
                let service = service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                    let (deliveries, arrived, statuses) =
                        (deliveries.clone(), arrived.clone(), statuses.clone());
                    async move {
                        let header = |name: &str| {
                            request
                                .headers()
                                .get(name)
                                .and_then(|v| v.to_str().ok())
                                .unwrap_or_default()
                                .to_owned()
                        };
                        let (signature, content_type) =
                            (header("flashgate-signature"), header("content-type"));
                        let body = request.into_body().collect().await?.to_bytes();
                        let event = serde_json::from_slice(&body).unwrap_or(Value::Null);
                        let status = statuses.lock().unwrap().pop_front().unwrap_or(200);
                        deliveries.lock().unwrap().push(Delivery {
                            signature,
                            content_type,
                            body,
                            event,
                            at: Instant::now(),
                        });
                        arrived.notify_waiters();
                        let mut response = hyper::Response::new(Full::new(Bytes::new()));
                        *response.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
                        Ok::<_, hyper::Error>(response)
                    }
                });
                tokio::spawn(http1::Builder::new().serve_connection(TokioIo::new(stream), service));
            }
        });
        receiver
    }

    /// The next requests are answered with these statuses.
    pub fn answer_next(&self, statuses: &[u16]) {
        self.statuses.lock().unwrap().extend(statuses);
    }

    pub fn deliveries(&self) -> Vec<Delivery> {
        self.deliveries.lock().unwrap().clone()
    }

    /// Waits until at least `n` requests arrived; panics after `timeout`.
    pub async fn wait_for(&self, n: usize, timeout: Duration) -> Vec<Delivery> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.arrived.notified();
            let deliveries = self.deliveries();
            if deliveries.len() >= n {
                return deliveries;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                panic!("expected {n} webhooks, got {}", self.deliveries().len());
            }
        }
    }

    /// Asserts that no more than `n` requests arrived in total, and that none more arrives
    /// within `quiet`: fails as soon as one does.
    pub async fn assert_total(&self, n: usize, quiet: Duration) {
        let deadline = tokio::time::Instant::now() + quiet;
        loop {
            let notified = self.arrived.notified();
            assert!(self.deliveries().len() <= n, "{:#?}", self.deliveries());
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                break;
            }
        }
        assert_eq!(self.deliveries().len(), n, "{:#?}", self.deliveries());
    }
}

/// Checks `t=<t>,v1=<hex>` against HMAC-SHA256(secret, "<t>.<body>") and a 300 s window.
pub fn signature_valid(secret: &str, header: &str, body: &[u8]) -> bool {
    let mut t = None;
    let mut v1 = None;
    for part in header.split(',') {
        match part.split_once('=') {
            Some(("t", value)) => t = value.parse::<i64>().ok(),
            Some(("v1", value)) => v1 = hex::decode(value).ok(),
            _ => {}
        }
    }
    let (Some(t), Some(v1)) = (t, v1) else {
        return false;
    };
    if (chrono::Utc::now().timestamp() - t).abs() > 300 {
        return false;
    }
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(format!("{t}.").as_bytes());
    mac.update(body);
    mac.verify_slice(&v1).is_ok()
}

/// Asserts a delivery is a correctly signed JSON event of `kind` about `object_id`.
pub fn assert_event(delivery: &Delivery, kind: &str, object_id: &str) {
    assert!(
        signature_valid(SECRET, &delivery.signature, &delivery.body),
        "bad signature {:?}",
        delivery.signature
    );
    assert_eq!(delivery.content_type, "application/json");
    let event = &delivery.event;
    assert_eq!(event["object"], "event");
    assert!(
        event["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("evt_"))
    );
    assert!(event["created"].is_i64());
    assert_eq!(event["type"], kind, "{event}");
    assert_eq!(event["data"]["object"]["id"], object_id, "{event}");
}

/// Long enough for any single webhook in these tests to arrive.
pub const ARRIVAL: Duration = Duration::from_secs(5);
/// How long to watch for webhooks that must not come.
pub const QUIET: Duration = Duration::from_millis(400);
