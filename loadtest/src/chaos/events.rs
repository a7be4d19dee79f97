//! The sale's events at a receiver: an in-process HTTP receiver subscribed to every event
//! before the sale, and the check, once the sale settled, that it got exactly the database's
//! events (after dedup by `webhook-id`), each signed with the endpoint's secret, and every
//! order's in sequence. (The signatures are verified by the Standard Webhooks reference
//! library in the gateway's own tests; here the HMAC is recomputed to catch a body or id
//! mixed up under faults.)

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use sqlx::PgPool;

/// How long the deliveries get to catch up once the sale settled.
const DRAIN_MAX: Duration = Duration::from_secs(60);
/// Comparisons of the database with the deliveries before a difference is reported.
const COMPARE_TRIES: u32 = 5;
/// Pause between two comparisons.
const COMPARE_AGAIN_AFTER: Duration = Duration::from_millis(500);

/// One delivery as it arrived.
struct Delivery {
    id: String,
    signed: bool,
    body: Value,
}

/// A running receiver; what arrived, in order. Dropping it stops its thread.
pub struct Receiver {
    pub addr: SocketAddr,
    key: Arc<Mutex<Vec<u8>>>,
    arrived: Arc<Mutex<Vec<Delivery>>>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Receiver {
    /// Listens on a loopback port; answers 204 to every delivery and records it. It runs on
    /// a thread and runtime of its own, as a shop's receiver runs apart from the buyers: on
    /// the load generator's one thread it would take the time of the buyers' requests.
    pub async fn start() -> Result<Self, String> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        listener.set_nonblocking(true).map_err(|e| e.to_string())?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let key = Arc::new(Mutex::new(Vec::new()));
        let arrived = Arc::new(Mutex::new(Vec::new()));
        let (k, a) = (key.clone(), arrived.clone());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("events-receiver".to_owned())
            .spawn(move || runtime.block_on(serve(listener, k, a, stopped)))
            .map_err(|e| e.to_string())?;
        Ok(Self {
            addr,
            key,
            arrived,
            _stop: stop,
        })
    }

    /// Subscribes the receiver to every event through the admin API at `ops`; the
    /// endpoint's id.
    pub async fn subscribe(
        &self,
        http: &reqwest::Client,
        ops: &str,
        token: &str,
    ) -> Result<String, String> {
        let url = format!("http://{}/hooks", self.addr);
        let answer = http
            .post(format!("{ops}/admin/event-endpoints"))
            .bearer_auth(token)
            .json(&json!({"url": url}))
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let created: Value = answer.json().await.map_err(|e| e.to_string())?;
        let secret = created["secret"]
            .as_str()
            .ok_or(format!("no endpoint: {created}"))?;
        let key = STANDARD
            .decode(secret.trim_start_matches("whsec_"))
            .map_err(|e| e.to_string())?;
        *self.key.lock().unwrap_or_else(|e| e.into_inner()) = key;
        let id = created["id"].as_str().unwrap_or_default();
        Ok(id.to_owned())
    }

    /// How many different events arrived.
    pub fn distinct(&self) -> usize {
        let arrived = self.arrived.lock().unwrap_or_else(|e| e.into_inner());
        arrived
            .iter()
            .map(|d| d.id.as_str())
            .collect::<BTreeSet<_>>()
            .len()
    }

    /// How many of `objects` (order ids) had at least one event arrive.
    pub fn objects_told(&self, objects: &HashSet<String>) -> usize {
        let arrived = self.arrived.lock().unwrap_or_else(|e| e.into_inner());
        arrived
            .iter()
            .map(|d| object(&d.body))
            .filter(|o| objects.contains(o))
            .collect::<HashSet<_>>()
            .len()
    }

    /// How many deliveries arrived, repeats counted.
    pub fn arrivals(&self) -> usize {
        self.arrived.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// What arrived wrongly signed, changed on a repeat or out of its object's sequence,
    /// among the events of `objects` (order ids, and `deal:<id>` for a deal) from the
    /// `from`th delivery on.
    pub fn violations(&self, objects: &HashSet<String>, from: usize) -> Vec<String> {
        let arrived = self.arrived.lock().unwrap_or_else(|e| e.into_inner());
        let since = arrived.get(from..).unwrap_or_default();
        let among = since.iter().filter(|d| objects.contains(&object(&d.body)));
        walk(among).violations
    }
}

/// Accepts deliveries until `stopped` (the receiver was dropped).
async fn serve(
    listener: std::net::TcpListener,
    key: Arc<Mutex<Vec<u8>>>,
    arrived: Arc<Mutex<Vec<Delivery>>>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
        return;
    };
    loop {
        let stream = tokio::select! {
            _ = &mut stopped => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => return,
            },
        };
        let (k, a) = (key.clone(), arrived.clone());
        tokio::spawn(async move {
            let service = service_fn(move |request| record(request, k.clone(), a.clone()));
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn record(
    request: Request<hyper::body::Incoming>,
    key: Arc<Mutex<Vec<u8>>>,
    arrived: Arc<Mutex<Vec<Delivery>>>,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let header = |name: &str| {
        request
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let (id, timestamp, signatures) = (
        header("webhook-id"),
        header("webhook-timestamp"),
        header("webhook-signature"),
    );
    let body = request.into_body().collect().await?.to_bytes();
    let key = key.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let expected = format!(
        "v1,{}",
        STANDARD.encode(hmac_sha256(
            &key,
            &[id.as_bytes(), b".", timestamp.as_bytes(), b".", &body]
        ))
    );
    let signed = signatures.split(' ').any(|s| s == expected);
    let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
    arrived
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(Delivery { id, signed, body });
    let mut answer = Response::new(Full::new(Bytes::new()));
    *answer.status_mut() = StatusCode::NO_CONTENT;
    Ok(answer)
}

/// HMAC-SHA256 (RFC 2104) over the concatenated `parts`.
fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut block = [0u8; 64];
    if key.len() > 64 {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(block.map(|b| b ^ 0x36));
    for part in parts {
        inner.update(part);
    }
    let mut outer = Sha256::new();
    outer.update(block.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

/// Waits for the deliveries to catch up with the database, then compares: violations and
/// figures. The sale is over but the sweeper still expires its last reservations, so a
/// comparison may read an order's new state a moment before its event is delivered: it is
/// taken again (up to `COMPARE_TRIES` times) after the deliveries catch up once more, and
/// only a difference that stays is a violation; a lost or invented event always stays.
pub async fn check(db: &PgPool, receiver: &Receiver) -> (Vec<String>, Value) {
    let started = Instant::now();
    let mut tries = 0;
    let (committed, violations) = loop {
        tries += 1;
        let committed = drained(db, receiver, started).await;
        let violations = compare(db, receiver).await.unwrap_or_else(|e| vec![e]);
        if violations.is_empty() || tries == COMPARE_TRIES || started.elapsed() > DRAIN_MAX {
            break (committed, violations);
        }
        tokio::time::sleep(COMPARE_AGAIN_AFTER).await;
    };
    let arrived = receiver
        .arrived
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .len();
    let figures = json!({"events": committed, "deliveries": arrived, "comparisons": tries,
                         "drained_in_seconds": started.elapsed().as_secs_f64()});
    (violations, figures)
}

/// Waits until every committed event is sequenced and delivered (or `DRAIN_MAX` since
/// `started`); the events committed.
async fn drained(db: &PgPool, receiver: &Receiver, started: Instant) -> i64 {
    loop {
        let counts: Result<(i64, i64), _> = sqlx::query_as(
            "SELECT count(*), count(*) FILTER (WHERE NOT EXISTS (
                            SELECT 1 FROM event_positions p WHERE p.event_id = e.id))
                   FROM events e",
        )
        .fetch_one(db)
        .await;
        let distinct = receiver.distinct();
        match counts {
            Ok((all, 0)) if all == distinct as i64 => return all,
            _ if started.elapsed() > DRAIN_MAX => return counts.map_or(-1, |c| c.0),
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

async fn compare(db: &PgPool, receiver: &Receiver) -> Result<Vec<String>, String> {
    let ids: Vec<i64> =
        sqlx::query_scalar("SELECT event_id FROM event_positions ORDER BY position")
            .fetch_all(db)
            .await
            .map_err(|e| e.to_string())?;
    let orders: HashMap<String, String> = sqlx::query_as("SELECT id::text, status FROM orders")
        .fetch_all(db)
        .await
        .map_err(|e| e.to_string())?
        .into_iter()
        .collect();
    let arrived = receiver.arrived.lock().unwrap_or_else(|e| e.into_inner());
    let Walk {
        mut violations,
        first,
        last_status,
    } = walk(arrived.iter());
    let expected: BTreeSet<String> = ids.iter().map(|id| format!("evt_{id}")).collect();
    let got: BTreeSet<String> = first.keys().map(|k| (*k).to_owned()).collect();
    for missing in expected.difference(&got).take(10) {
        violations.push(format!("{missing} committed but never delivered"));
    }
    for extra in got.difference(&expected).take(10) {
        violations.push(format!("{extra} delivered but not in the database"));
    }
    for (order, status) in &orders {
        if last_status.get(order) != Some(status) {
            violations.push(format!(
                "order {order} is {status}; its last event said {:?}",
                last_status.get(order)
            ));
        }
    }
    Ok(violations)
}

/// The arrivals, walked in order.
struct Walk<'a> {
    violations: Vec<String>,
    first: HashMap<&'a str, &'a Delivery>,
    last_status: HashMap<String, String>,
}

/// Checks every arrival: signed, the same body when repeated, and each order's (or deal's)
/// events in sequence; keeps each event's first arrival and each order's last status.
fn walk<'a>(arrived: impl IntoIterator<Item = &'a Delivery>) -> Walk<'a> {
    let mut violations = Vec::new();
    let mut first: HashMap<&str, &Delivery> = HashMap::new();
    let mut last_sequence: HashMap<String, i64> = HashMap::new();
    let mut last_status: HashMap<String, String> = HashMap::new();
    for delivery in arrived {
        if !delivery.signed {
            violations.push(format!(
                "event {} arrived with a wrong signature",
                delivery.id
            ));
        }
        if let Some(earlier) = first.get(delivery.id.as_str()) {
            if earlier.body != delivery.body {
                violations.push(format!(
                    "event {} arrived twice with different bodies",
                    delivery.id
                ));
            }
            continue;
        }
        first.insert(&delivery.id, delivery);
        let data = &delivery.body["data"];
        let object = object(&delivery.body);
        let sequence = data["sequence"].as_i64().unwrap_or(0);
        let previous = last_sequence.insert(object.clone(), sequence).unwrap_or(0);
        if sequence != previous + 1 {
            violations.push(format!(
                "{object}: event {sequence} arrived after {previous}"
            ));
        }
        if let Some(status) = data["status"].as_str() {
            last_status.insert(object, status.to_owned());
        }
    }
    Walk {
        violations,
        first,
        last_status,
    }
}

/// The order an event is about, or `deal:<id>` for a deal's.
fn object(body: &Value) -> String {
    let data = &body["data"];
    match data["order_id"].as_str() {
        Some(order) => order.to_owned(),
        None => format!("deal:{}", data["deal_id"].as_str().unwrap_or_default()),
    }
}
