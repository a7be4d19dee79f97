//! Traces through a real OTLP receiver (scripts/otlp_receiver.py, decoding with the
//! OpenTelemetry project's protobuf definitions): a sampled purchase is one trace under the
//! caller's `traceparent` with its request, admission, batch, PostgreSQL and Redis spans;
//! with the ratio at 0 an ordinary purchase is not traced, and a 503 or a slow one is; a
//! failed or slow webhook delivery attempt is a trace of its own.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};
use sqlx::Connection;

use crate::events_delivery::{fast_events, subscribe};
use crate::helpers::{
    ChildGuard, TestApp, free_port, new_deal, send, spawn_app_with, unique_suffix, wait_for_port,
    wait_until,
};
use crate::waiting_room::{join, poll_until, room_deal};
use crate::waiting_room_edge::{EVENTUALLY, fast_room, ticket_of};

const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// The receiver and the file it writes a JSON line per span to.
struct Receiver {
    url: String,
    spans: PathBuf,
    _process: ChildGuard,
}

impl Receiver {
    async fn start() -> Receiver {
        let port = free_port();
        let spans = std::env::temp_dir().join(format!("flashgate-otlp-{}.jsonl", unique_suffix()));
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/otlp_receiver.py");
        let child = std::process::Command::new("python3")
            .arg(script)
            .arg(port.to_string())
            .arg(&spans)
            .spawn()
            .expect("start the OTLP receiver (python3; scripts/otlp.sh installs its package)");
        let process = ChildGuard { child };
        assert!(
            wait_for_port(port, Duration::from_secs(20)).await,
            "the receiver did not listen"
        );
        Receiver {
            url: format!("http://127.0.0.1:{port}"),
            spans,
            _process: process,
        }
    }

    fn spans(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.spans).unwrap_or_default();
        text.lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    }

    fn trace(&self, trace_id: &str) -> Vec<Value> {
        self.spans()
            .into_iter()
            .filter(|s| s["trace_id"] == trace_id)
            .collect()
    }

    /// The trace ids of every request span of an order, in arrival order.
    fn order_traces(&self) -> Vec<String> {
        self.spans()
            .into_iter()
            .filter(|s| s["name"] == "POST /v1/deals/{id}/orders")
            .map(|s| s["trace_id"].as_str().unwrap_or_default().to_owned())
            .collect()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.spans);
    }
}

async fn traced_app(receiver: &Receiver, ratio: f64, slow_ms: u64) -> TestApp {
    let url = receiver.url.clone();
    spawn_app_with(move |s| {
        fast_room(s);
        s.telemetry.otlp_endpoint = url;
        s.telemetry.trace_ratio = ratio;
        s.telemetry.trace_slow_ms = slow_ms;
        s.server.request_timeout_ms = 3000;
    })
    .await
}

/// A pass earned on the line of `deal` by `user`.
async fn pass_of(app: &TestApp, user: &str, deal: &str) -> String {
    let ticket = ticket_of(&join(app, user, deal).await.expect(201));
    let admitted = poll_until(app, user, deal, &ticket, &["admitted"], EVENTUALLY).await;
    admitted["pass"].as_str().unwrap().to_owned()
}

async fn purchase(
    app: &TestApp,
    user: &str,
    deal: &str,
    pass: &str,
    traceparent: Option<&str>,
) -> u16 {
    let mut request = app
        .client
        .post(app.url(&format!("/v1/deals/{deal}/orders")))
        .bearer_auth(app.token(user))
        .header("Idempotency-Key", unique_suffix())
        .header("Flashgate-Pass", pass)
        .json(&json!({ "quantity": 1 }));
    if let Some(traceparent) = traceparent {
        request = request
            .header("traceparent", traceparent)
            .header("tracestate", "shop=edge");
    }
    request
        .send()
        .await
        .expect("the gateway answers")
        .status()
        .as_u16()
}

fn open_deal(id: &str) -> Value {
    let room = json!({"admit_per_second": 100, "max_active": 50, "pass_ttl_seconds": 60});
    room_deal(id, 50, room, json!({}))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sampled_purchase_is_one_trace_under_the_callers_traceparent_with_every_stage() {
    // Arrange: ratio 0, so only the caller's sampled flag traces a request.
    let receiver = Receiver::start().await;
    let app = traced_app(&receiver, 0.0, 60_000).await;
    let deal = app.given_deal(&open_deal("traced")).await;
    let pass = pass_of(&app, "tara", &deal).await;

    // Act
    let traceparent = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    assert_eq!(
        purchase(&app, "tara", &deal, &pass, Some(&traceparent)).await,
        201
    );

    // Assert: one trace, the caller's, with the request span under the caller's span and
    // the stages under it.
    let spans = wait_until("the purchase's trace", Duration::from_secs(10), || async {
        let spans = receiver.trace(CALLER_TRACE);
        let has = |name: &str| spans.iter().any(|s| s["name"] == name);
        let complete = has("POST /v1/deals/{id}/orders") && has("postgresql orders_place_batch");
        complete.then_some(spans)
    })
    .await;
    let named = |name: &str| -> Value {
        let found: Vec<&Value> = spans.iter().filter(|s| s["name"] == name).collect();
        assert_eq!(found.len(), 1, "one {name} span: {spans:#?}");
        found[0].clone()
    };
    let request = named("POST /v1/deals/{id}/orders");
    assert_eq!(request["parent_span_id"], CALLER_SPAN);
    assert_eq!(request["trace_state"], "shop=edge");
    assert_eq!(request["kind"], 2, "a server span");
    assert_eq!(request["service"], "flashgate");
    assert_eq!(request["attributes"]["http.response.status_code"], 201);
    assert_eq!(request["attributes"]["http.route"], "/v1/deals/{id}/orders");
    let root = request["span_id"].as_str().unwrap();
    let admission = named("admission");
    assert_eq!(admission["parent_span_id"], root);
    assert_eq!(admission["attributes"]["flashgate.admission"], "admitted");
    let batch = named("reservation batch");
    assert_eq!(batch["parent_span_id"], root);
    assert!(
        batch["attributes"]["flashgate.batch.size"]
            .as_i64()
            .unwrap()
            >= 1
    );
    assert!(
        batch["attributes"]["flashgate.batch.lane"]
            .as_i64()
            .is_some()
    );
    let statement = named("postgresql orders_place_batch");
    assert_eq!(statement["parent_span_id"], batch["span_id"]);
    assert_eq!(statement["attributes"]["db.system.name"], "postgresql");
    let redis: Vec<&Value> = spans.iter().filter(|s| s["name"] == "redis").collect();
    assert!(
        !redis.is_empty(),
        "the pass's release is a Redis call: {spans:#?}"
    );
    assert!(
        redis
            .iter()
            .all(|s| s["parent_span_id"] == root && s["kind"] == 3)
    );
    for span in &spans {
        let (start, end) = (
            span["start"].as_u64().unwrap(),
            span["end"].as_u64().unwrap(),
        );
        assert!(start > 0 && start <= end, "{span}");
        assert!(start >= request["start"].as_u64().unwrap(), "{span}");
    }
    assert_eq!(
        receiver.order_traces(),
        vec![CALLER_TRACE.to_owned()],
        "one trace"
    );

    // The latency histogram in OpenMetrics carries the trace as an exemplar.
    let exemplars = openmetrics_exemplars(&app).await;
    let ours = exemplars.iter().find(|e| e["trace_id"] == CALLER_TRACE);
    let ours = ours.unwrap_or_else(|| panic!("no exemplar of the trace: {exemplars:#?}"));
    assert_eq!(
        ours["sample"],
        "flashgate_http_request_duration_seconds_bucket"
    );
    assert_eq!(ours["labels"]["route"], "/v1/deals/{id}/orders");
    app.cleanup().await;
}

/// The exemplars of `/metrics` asked for as OpenMetrics, read by the Prometheus client's
/// strict OpenMetrics parser (which fails on anything the format does not allow).
async fn openmetrics_exemplars(app: &TestApp) -> Vec<Value> {
    use std::io::Write;
    let reply = app
        .client
        .get(app.url("/metrics"))
        .header("accept", "application/openmetrics-text; version=1.0.0")
        .send()
        .await
        .unwrap();
    let content_type = reply.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    let exposition = reply.text().await.unwrap();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/openmetrics_exemplars.py");
    let mut parser = std::process::Command::new("python3")
        .arg(script)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run the OpenMetrics parser");
    parser
        .stdin
        .take()
        .unwrap()
        .write_all(exposition.as_bytes())
        .unwrap();
    let output = parser.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "the OpenMetrics parser refused /metrics: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn at_ratio_zero_a_failed_or_slow_purchase_is_traced_and_an_ordinary_one_is_not() {
    // Arrange: ratio 0, slow from 1 s (an ordinary purchase stays below it on a busy
    // runner), requests answered 503 after 3 s.
    let receiver = Receiver::start().await;
    let app = traced_app(&receiver, 0.0, 1000).await;
    let deal = app.given_deal(&open_deal("tail")).await;
    let passes = [
        pass_of(&app, "quick", &deal).await,
        pass_of(&app, "slow", &deal).await,
        pass_of(&app, "stuck", &deal).await,
    ];
    let unsampled = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-00");

    // Act: an ordinary purchase (an unsampled caller); one held until PostgreSQL shows it
    // blocked 1.2 s and one held until it is answered (past the request timeout) by a
    // transaction locking the deal's buckets.
    assert_eq!(
        purchase(&app, "quick", &deal, &passes[0], Some(&unsampled)).await,
        201
    );
    let blocked = Hold::Blocked(Duration::from_millis(1200));
    let slow = held_purchase(&app, "slow", &deal, &passes[1], blocked).await;
    let stuck = held_purchase(&app, "stuck", &deal, &passes[2], Hold::Answered).await;

    // Assert: the slow one (201) and the failed one (503) are traced, the quick one is not.
    assert_eq!((slow, stuck), (201, 503));
    let statuses = wait_until("two traces", Duration::from_secs(10), || async {
        let statuses: Vec<i64> = receiver
            .spans()
            .iter()
            .filter(|s| s["name"] == "POST /v1/deals/{id}/orders")
            .filter_map(|s| s["attributes"]["http.response.status_code"].as_i64())
            .collect();
        (statuses.len() >= 2).then_some(statuses)
    })
    .await;
    let mut sorted = statuses.clone();
    sorted.sort();
    assert_eq!(sorted, vec![201, 503], "{statuses:?}");
    let failed = receiver
        .spans()
        .into_iter()
        .find(|s| s["attributes"]["http.response.status_code"] == 503)
        .unwrap();
    assert_eq!(failed["status"], 2, "a 5xx is an error span");
    assert!(
        receiver.trace(CALLER_TRACE).is_empty(),
        "the unsampled purchase was exported"
    );
    app.cleanup().await;
}

/// How long a transaction holds the deal's buckets against a purchase.
enum Hold {
    /// Until PostgreSQL shows the purchase's statement waiting on the lock this long.
    Blocked(Duration),
    /// Until the purchase is answered.
    Answered,
}

/// A purchase while another transaction holds the deal's buckets as `hold` says; its status.
async fn held_purchase(app: &TestApp, user: &str, deal: &str, pass: &str, hold: Hold) -> u16 {
    let mut locker = sqlx::PgConnection::connect(&app.settings.database.url)
        .await
        .unwrap();
    let mut transaction = locker.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM inventory_buckets WHERE deal_id = $1 FOR UPDATE")
        .bind(deal)
        .execute(&mut *transaction)
        .await
        .unwrap();
    let sent = purchase(app, user, deal, pass, None);
    match hold {
        Hold::Answered => {
            let status = sent.await;
            transaction.rollback().await.unwrap();
            status
        }
        Hold::Blocked(blocked) => {
            let release = async {
                blocked_on_a_lock(app, blocked).await;
                transaction.rollback().await.unwrap();
            };
            tokio::join!(sent, release).0
        }
    }
}

/// Waits until a statement of the app's database has waited on a lock for `blocked`, as
/// PostgreSQL's `pg_stat_activity` tells.
async fn blocked_on_a_lock(app: &TestApp, blocked: Duration) {
    let what = format!("a statement blocked on a lock for {blocked:?}");
    wait_until(&what, blocked + Duration::from_secs(10), || async {
        let longest: Option<f64> = sqlx::query_scalar(
            "SELECT max(extract(epoch FROM clock_timestamp() - query_start))::float8 \
             FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .fetch_one(&app.db)
        .await
        .unwrap();
        longest.filter(|seconds| *seconds >= blocked.as_secs_f64())
    })
    .await;
}

/// Refusals sent by one buyer past its limit in the test below.
const REFUSALS: usize = 400;
/// The trace a caller sampled, sent last: once it arrives, every trace before it has.
const LAST_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";

#[tokio::test(flavor = "multi_thread")]
async fn refusals_answered_from_memory_are_traced_at_the_ratio() {
    // Arrange: ratio one half, nothing slow enough to be traced for it; one order a second
    // per address (a limit each instance keeps in memory).
    let receiver = Receiver::start().await;
    let url = receiver.url.clone();
    let app = spawn_app_with(move |s| {
        s.telemetry.otlp_endpoint = url;
        s.telemetry.trace_ratio = 0.5;
        s.telemetry.trace_slow_ms = 60_000;
        s.limits.per_ip.rate_per_second = 1;
        s.limits.per_ip.burst = 1;
    })
    .await;
    let deal = app.given_deal(&new_deal("refused", 10, 1)).await;

    // Act: orders from one address, all but about one a second refused from memory (429);
    // then one more whose caller sampled it.
    let token = app.token("eager");
    let mut refused = 0;
    for _ in 0..REFUSALS {
        let reply = app.place_order(&token, &deal, &unique_suffix(), 1).await;
        refused += usize::from(reply.status == 429);
    }
    let last = app
        .client
        .post(app.url(&format!("/v1/deals/{deal}/orders")))
        .bearer_auth(&token)
        .header("Idempotency-Key", unique_suffix())
        .header("traceparent", format!("00-{LAST_TRACE}-{CALLER_SPAN}-01"))
        .json(&json!({ "quantity": 1 }));
    send(last).await.expect_problem(429, "rate-limited");
    wait_until(
        "the sampled refusal's trace",
        Duration::from_secs(10),
        || async { !receiver.trace(LAST_TRACE).is_empty() },
    )
    .await;

    // Assert: about half the refusals were traced, each as one span (not a half of a half:
    // the head's one draw decides).
    let traced = receiver
        .spans()
        .iter()
        .filter(|s| s["attributes"]["http.response.status_code"] == 429)
        .filter(|s| s["trace_id"] != LAST_TRACE)
        .count();
    let (expected, spread) = (refused as f64 / 2.0, (refused as f64 / 4.0).sqrt());
    assert!(refused >= REFUSALS * 3 / 4, "{refused} refused");
    assert!(
        (traced as f64 - expected).abs() <= 5.0 * spread,
        "{traced} of {refused} refusals traced at a ratio of 0.5"
    );
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn at_ratio_zero_a_failed_and_a_slow_webhook_delivery_are_each_traced() {
    // Arrange: ratio 0, slow from 300 ms; a shop's receiver that answers 500.
    let receiver = Receiver::start().await;
    let url = receiver.url.clone();
    let app = spawn_app_with(move |s| {
        fast_events(s);
        s.telemetry.otlp_endpoint = url;
        s.telemetry.trace_ratio = 0.0;
        s.telemetry.trace_slow_ms = 300;
    })
    .await;
    let shop = crate::helpers::Receiver::start(&[]).await;
    let (endpoint, _) = subscribe(&app, &shop).await;
    shop.fail().await;
    let deal = app.given_deal(&new_deal("hooked", 5, 1)).await;

    // Act: pausing the deal is an event to deliver; it fails until the receiver answers
    // again, and then takes 600 ms to be accepted.
    let pause = app
        .client
        .post(app.url(&format!("/admin/deals/{deal}/pause")));
    send(pause.bearer_auth(&app.admin_token)).await.expect(200);
    let delivery = |outcome: &'static str| {
        let receiver = &receiver;
        let endpoint = endpoint.clone();
        async move {
            receiver.spans().into_iter().find(|s| {
                s["name"] == "webhook delivery"
                    && s["attributes"]["flashgate.webhook.outcome"] == outcome
                    && s["attributes"]["flashgate.webhook.endpoint"] == endpoint.as_str()
            })
        }
    };
    let refused = wait_until(
        "a refused delivery's trace",
        Duration::from_secs(15),
        || delivery("refused"),
    )
    .await;
    shop.control(json!({"mode": "ok", "delay_ms": 600})).await;
    let accepted = wait_until(
        "an accepted delivery's trace",
        Duration::from_secs(15),
        || delivery("accepted"),
    )
    .await;

    // Assert: each attempt is a client span, the root of a trace of its own, naming the
    // endpoint, the event and the answer; the refused one is an error.
    assert_eq!(refused["attributes"]["http.response.status_code"], 500);
    assert_eq!(refused["status"], 2, "a failed delivery is an error span");
    assert_eq!(accepted["attributes"]["http.response.status_code"], 204);
    assert_ne!(accepted["status"], 2);
    let event = shop.received().await[0]["webhook_id"].clone();
    for span in [&refused, &accepted] {
        assert_eq!(span["kind"], 3, "a client span: {span}");
        assert!(
            span["parent_span_id"]
                .as_str()
                .unwrap_or_default()
                .is_empty(),
            "{span}"
        );
        assert_eq!(span["attributes"]["flashgate.webhook.event_id"], event);
        assert_eq!(span["service"], "flashgate");
    }
    assert_ne!(refused["trace_id"], accepted["trace_id"]);
    let took = accepted["end"].as_u64().unwrap() - accepted["start"].as_u64().unwrap();
    assert!(took >= 300_000_000, "traced because it was slow: {took} ns");
    app.cleanup().await;
}
