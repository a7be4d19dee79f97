//! The Grafana dashboard and the alert rules only query metrics the gateway exports: every
//! metric name in every expression must appear on `/metrics` after a small sale, paid
//! through the real payment-provider simulator, with a waiting room in front of one deal.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::helpers::{
    PayApp, SETTLE, eventually, intent_id, metric_value, new_deal, spawn_pay_app_with,
};
use crate::waiting_room::{join, order_with_pass, poll_until, room_deal};

const DASHBOARD: &str = include_str!("../../config/grafana/flashgate.json");
const ALERTS: &str = include_str!("../../config/prometheus/alerts.yml");
const OPERATIONS: &str = include_str!("../../docs/OPERATIONS.md");

/// Series Prometheus itself makes (the scrape's health), not the gateway.
const PROMETHEUS_SERIES: [&str; 1] = ["up"];

/// PromQL words that look like identifiers but are not metric names.
const KEYWORDS: [&str; 12] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "and",
    "or",
    "unless",
    "inf",
];

/// Removes every `open … close` span (not nested across kinds), e.g. label matchers.
fn strip_spans(expr: &str, open: char, close: char) -> String {
    let mut out = String::with_capacity(expr.len());
    let mut depth = 0;
    for c in expr.chars() {
        if c == open {
            depth += 1;
        } else if c == close && depth > 0 {
            depth -= 1;
        } else if depth == 0 {
            out.push(c);
        }
    }
    out
}

/// Removes string literals, so label values and regexes are not read as names.
fn strip_strings(expr: &str) -> String {
    let mut out = String::with_capacity(expr.len());
    let mut quote = None;
    let mut escaped = false;
    for c in expr.chars() {
        match quote {
            Some(q) => {
                if escaped {
                    escaped = false;
                } else if c == '\\' {
                    escaped = true;
                } else if c == q {
                    quote = None;
                }
            }
            None if c == '"' || c == '\'' || c == '`' => quote = Some(c),
            None => out.push(c),
        }
    }
    out
}

/// The metric names a PromQL expression reads: identifiers that are not functions,
/// keywords, label lists of `by`/`without`/`on`/`ignoring`/`group_*`, durations, numbers
/// or Grafana variables. Histogram series keep their suffix (`_bucket`, `_sum`,
/// `_count`), which is how they appear on `/metrics`.
pub fn metric_names(expr: &str) -> BTreeSet<String> {
    let text = strip_spans(&strip_spans(&strip_strings(expr), '{', '}'), '[', ']');
    let chars: Vec<char> = text.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    let mut skip_group = false;
    while i < chars.len() {
        let c = chars[i];
        if c.is_ascii_digit() || c == '$' {
            // A number, a duration or a Grafana variable: consume it whole.
            i += 1;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || "._".contains(chars[i])) {
                i += 1;
            }
            continue;
        }
        if !(c.is_ascii_alphabetic() || c == '_' || c == ':') {
            if c == '(' && skip_group {
                // The label list after `by`, `on`, … : skip to its closing parenthesis.
                while i < chars.len() && chars[i] != ')' {
                    i += 1;
                }
                skip_group = false;
            }
            i += 1;
            continue;
        }
        let start = i;
        while i < chars.len()
            && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
        {
            i += 1;
        }
        let word: String = chars[start..i].iter().collect();
        let next = chars[i..].iter().find(|c| !c.is_whitespace());
        let lower = word.to_ascii_lowercase();
        if KEYWORDS.contains(&lower.as_str()) {
            skip_group = matches!(
                lower.as_str(),
                "by" | "without" | "on" | "ignoring" | "group_left" | "group_right"
            );
            continue;
        }
        let rest: String = chars[i..].iter().collect();
        let rest = rest.trim_start();
        let grouped = ["by", "without"].iter().any(|k| {
            rest.strip_prefix(k)
                .is_some_and(|after| after.trim_start().starts_with('('))
        });
        if next == Some(&'(') || grouped || lower == "nan" {
            // A function or an aggregation (`sum by (…) (…)`), not a metric.
            continue;
        }
        names.insert(word);
    }
    names
}

/// Every `expr` in the dashboard, and the metrics its template variables list values of.
fn dashboard_expressions(value: &Value, found: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("expr", Value::String(expr)) => found.push(expr.clone()),
                    ("definition", Value::String(query)) if query.starts_with("label_values(") => {
                        let inner = &query["label_values(".len()..];
                        let metric = inner.split([',', ')']).next().unwrap_or_default();
                        found.push(metric.trim().to_owned());
                    }
                    _ => dashboard_expressions(value, found),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| dashboard_expressions(v, found)),
        _ => {}
    }
}

fn alert_rules() -> Vec<Value> {
    let rules: Value = serde_norway::from_str(ALERTS).expect("alerts.yml is YAML");
    rules["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").iter().cloned())
        .collect()
}

fn alert_expressions() -> Vec<String> {
    alert_rules()
        .iter()
        .map(|r| {
            r["expr"]
                .as_str()
                .expect("every rule has an expr")
                .to_owned()
        })
        .collect()
}

/// Names of every series on `/metrics`.
fn exported_names(exposition: &str) -> BTreeSet<String> {
    exposition
        .lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .filter_map(|line| line.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect()
}

/// Series the payment part of the sale must have moved, as `(metric, label)`: proof that
/// each payment path really ran, not only that its metric was registered.
const PAYMENT_SERIES: [(&str, &str); 11] = [
    ("flashgate_webhook_events_total", "result=\"accepted\""),
    ("flashgate_webhook_events_total", "result=\"duplicate\""),
    ("flashgate_webhook_lag_seconds_count", ""),
    ("flashgate_payment_outcomes_total", "outcome=\"paid\""),
    ("flashgate_payment_outcomes_total", "outcome=\"released\""),
    ("flashgate_late_payments_total", "resolution=\"refunded\""),
    (
        "flashgate_outbox_processed_total",
        "kind=\"refund\",result=\"done\"",
    ),
    (
        "flashgate_outbox_processed_total",
        "kind=\"order_paid\",result=\"done\"",
    ),
    (
        "flashgate_reconciler_findings_total",
        "kind=\"paid_at_provider_pending_locally\"",
    ),
    (
        "flashgate_provider_call_duration_seconds_count",
        "op=\"create\"",
    ),
    (
        "flashgate_provider_call_duration_seconds_count",
        "op=\"refund\"",
    ),
];

/// Series the waiting-room part of the sale must have moved, as `(metric, label)`.
const WAITING_ROOM_SERIES: [(&str, &str); 3] = [
    (
        "flashgate_waiting_room_admitted_total",
        "deal=\"dashboard-queue\"",
    ),
    (
        "flashgate_waiting_room_abandoned_total",
        "deal=\"dashboard-queue\"",
    ),
    (
        "flashgate_waiting_room_pass_rejections_total",
        "reason=\"missing\"",
    ),
];

/// A small sale: orders, a sell-out, a rejection, a cancel; then payments through the
/// simulator: one paid at the checkout (its webhook delivered twice), one declined, one
/// that arrives after its order expired and is refunded, and one whose webhook is lost and
/// which the reconciler settles; alongside, a deal behind a waiting room (one pass at a
/// time): a buyer admitted who orders with the pass, one refused without a pass, and one
/// who stops polling and is skipped; then the background gauges.
pub(crate) async fn small_sale(app: &PayApp) -> String {
    // An event endpoint nobody listens at: its deliveries fail and its backlog shows.
    let closed = format!("http://127.0.0.1:{}/hooks", crate::helpers::free_port());
    let endpoint = app.client.post(app.url("/admin/event-endpoints"));
    let endpoint = endpoint
        .bearer_auth(&app.admin_token)
        .json(&json!({"url": closed}));
    crate::helpers::send(endpoint).await.expect(201);
    // The waiting room: q is admitted, gone queues behind q and never polls again.
    let room = json!({"admit_per_second": 100, "max_active": 1, "pass_ttl_seconds": 120});
    let queued = app
        .given_deal(&room_deal("dashboard-queue", 5, room, json!({})))
        .await;
    let q_ticket = join(app, "q", &queued).await.expect(201)["ticket"]
        .as_str()
        .unwrap()
        .to_owned();
    join(app, "gone", &queued).await.expect(201);
    let gone_joined = Instant::now();
    let admitted = poll_until(app, "q", &queued, &q_ticket, &["admitted"], SETTLE).await;
    let q_pass = admitted["pass"].as_str().unwrap().to_owned();
    order_with_pass(app, "r", &queued, None)
        .await
        .expect_problem(403, "waiting-room-required");

    let deal = app.given_deal(&new_deal("dashboard", 3, 2)).await;
    app.place_order("not a token", &deal, "k", 1)
        .await
        .expect_problem(401, "unauthorized");
    let token = app.token("a");
    let first = app.place_order(&token, &deal, "k", 1).await.expect(201);
    let paid = app.order("b", &deal, 1).await.expect(201);
    let declined = app.order("c", &deal, 1).await.expect(201);
    app.order("d", &deal, 1)
        .await
        .expect_problem(409, "sold-out");
    let id = first["order_id"].as_str().unwrap();
    app.cancel_order(&token, id).await.expect(200);
    app.get_deal(&deal).await.expect(200);

    // b pays at the hosted checkout; the simulator delivers the webhook twice.
    app.sim.faults(json!({"webhook_duplicates": 1})).await;
    assert_eq!(app.sim.pay(&intent_id(&paid)).await.0, 200);
    let paid_id = paid["order_id"].as_str().unwrap();
    app.wait_for_order(&app.token("b"), paid_id, &["PAID"], SETTLE)
        .await;
    app.sim.reset_faults().await;

    // c declines: the order is cancelled and its unit released.
    assert_eq!(app.sim.decline(&intent_id(&declined)).await.0, 200);
    let declined_id = declined["order_id"].as_str().unwrap();
    app.wait_for_order(&app.token("c"), declined_id, &["CANCELLED"], SETTLE)
        .await;

    // e's webhook is lost: the reconciler finds the payment at the provider and settles it.
    let lost = app.order("e", &deal, 1).await.expect(201);
    app.sim.faults(json!({"webhook_drop": true})).await;
    assert_eq!(app.sim.pay(&intent_id(&lost)).await.0, 200);
    let lost_id = lost["order_id"].as_str().unwrap();
    app.wait_for_order(&app.token("e"), lost_id, &["PAID"], SETTLE)
        .await;
    app.sim.reset_faults().await;

    // f pays after the order expired, on a deal that refunds late money.
    let mut late_deal = new_deal("dashboard-late", 2, 1);
    late_deal["reservation_ttl_seconds"] = json!(1);
    late_deal["late_payment_policy"] = json!("refund");
    let late_deal = app.given_deal(&late_deal).await;
    let late = app.order("f", &late_deal, 1).await.expect(201);
    let late_id = late["order_id"].as_str().unwrap();
    let f = app.token("f");
    app.wait_for_order(&f, late_id, &["EXPIRED"], SETTLE).await;
    app.sim.force_succeed(&intent_id(&late)).await;
    app.wait_for_order(&f, late_id, &["REFUNDED"], SETTLE).await;

    // q orders with the pass once gone has been silent past the abandonment grace: the
    // freed slot reaches gone, who is skipped. The grace runs on Redis's clock, which a
    // test cannot move, so it is waited out.
    let grace = Duration::from_secs(app.settings.waiting_room.abandon_after_seconds);
    let silent = grace + Duration::from_millis(500);
    tokio::time::sleep(silent.saturating_sub(gone_joined.elapsed())).await;
    order_with_pass(app, "q", &queued, Some(&q_pass))
        .await
        .expect(201);

    let wanted = [
        "flashgate_inventory_units",
        "flashgate_invariant_violations",
        "flashgate_redis_up",
        "flashgate_refunds_pending",
        "flashgate_outbox_backlog",
        "flashgate_waiting_room_queue_length",
        "flashgate_waiting_room_passes_active",
        "flashgate_waiting_room_estimated_wait_seconds",
        "flashgate_waiting_room_admission_rate",
        "flashgate_waiting_room_orders_paid",
        "flashgate_event_endpoint_pending",
        "flashgate_event_endpoint_oldest_pending_seconds",
        "flashgate_event_endpoint_failing",
        "flashgate_event_deliveries_total",
        "flashgate_event_delivery_seconds_count",
    ];
    let exposition = eventually(Duration::from_secs(10), || async {
        let text = app.metrics().await;
        let names = exported_names(&text);
        let gauges = wanted.iter().all(|w| names.contains(*w));
        let moved = PAYMENT_SERIES
            .iter()
            .chain(&WAITING_ROOM_SERIES)
            .all(|(name, label)| metric_value(&text, name, label) > 0.0);
        (gauges && moved).then_some(text)
    })
    .await;
    let Some(exposition) = exposition else {
        let text = app.metrics().await;
        let stuck: Vec<_> = PAYMENT_SERIES
            .iter()
            .chain(&WAITING_ROOM_SERIES)
            .filter(|(name, label)| metric_value(&text, name, label) <= 0.0)
            .collect();
        panic!(
            "within 10 s the background gauges {wanted:?} did not all appear or these payment or waiting-room series did not move: {stuck:?}\n{text}"
        );
    };
    exposition
}

/// A gateway with payments through the simulator and background work sped up, for
/// [`small_sale`].
pub(crate) async fn sale_app() -> PayApp {
    spawn_pay_app_with(|s| {
        s.deals.metrics_interval_ms = 200;
        s.ops.audit_interval_ms = 1000;
        s.payments.reconcile_interval_ms = 200;
        s.payments.reconcile_after_seconds = 1;
        s.waiting_room.stock_refresh_ms = 100;
        s.waiting_room.abandon_after_seconds = 2;
        s.waiting_room.refresh_after_seconds_max = 1;
        s.waiting_room.paid_sample_interval_ms = 1000;
        s.events.enabled = true;
        s.events.allow_private_targets = true;
        s.events.leader_retry_ms = 200;
        s.events.maintenance_interval_ms = 200;
        s.events.retry_initial_ms = 100;
        s.events.retry_max_ms = 500;
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn every_dashboard_and_alert_metric_is_exported() {
    // Arrange
    let dashboard: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    let mut expressions = Vec::new();
    dashboard_expressions(&dashboard, &mut expressions);
    let alerts = alert_expressions();
    assert!(
        expressions.len() >= 15,
        "only {} dashboard expressions",
        expressions.len()
    );
    assert!(alerts.len() >= 6, "only {} alert rules", alerts.len());
    let app = sale_app().await;

    // Act
    let exported = exported_names(&small_sale(&app).await);

    // Assert
    let mut missing = Vec::new();
    for expr in expressions.iter().chain(&alerts) {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "no metric found in {expr:?}");
        for name in names {
            if !exported.contains(&name) && !PROMETHEUS_SERIES.contains(&name.as_str()) {
                missing.push(format!("{name} (in {expr})"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "never exported: {missing:#?}\nexported: {exported:#?}"
    );
    app.cleanup().await;
}

/// Every alert pages or raises a ticket, links its runbook section by an absolute URL built
/// from the `runbook_base_url` external label, has that section in docs/OPERATIONS.md, and
/// has a promtool test.
#[test]
fn every_alert_has_a_severity_a_runbook_and_a_test() {
    let tests: String = std::fs::read_dir(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/config/prometheus/tests"
    ))
    .expect("config/prometheus/tests")
    .flatten()
    .map(|entry| std::fs::read_to_string(entry.path()).expect("a test file"))
    .collect();
    let mut problems = Vec::new();
    for rule in alert_rules() {
        let name = rule["alert"].as_str().expect("every rule is an alert");
        let severity = rule["labels"]["severity"].as_str().unwrap_or_default();
        if !["page", "ticket"].contains(&severity) {
            problems.push(format!(
                "{name}: severity {severity:?} is neither page nor ticket"
            ));
        }
        let anchor = name.to_ascii_lowercase();
        let url = format!("{{{{ $externalLabels.runbook_base_url }}}}/OPERATIONS.md#{anchor}");
        if rule["annotations"]["runbook_url"].as_str() != Some(url.as_str()) {
            problems.push(format!("{name}: runbook_url is not {url:?}"));
        }
        if !OPERATIONS.lines().any(|line| line == format!("### {name}")) {
            problems.push(format!(
                "{name}: no section \"### {name}\" in docs/OPERATIONS.md"
            ));
        }
        if !tests.contains(&format!("alertname: {name}\n")) {
            problems.push(format!(
                "{name}: no promtool test in config/prometheus/tests/"
            ));
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn metric_names_skip_functions_labels_and_durations() {
    let names = |e: &str| metric_names(e).into_iter().collect::<Vec<_>>();
    assert_eq!(
        names(
            r#"histogram_quantile(0.99, sum by (le, route) (rate(flashgate_http_request_duration_seconds_bucket{instance=~"$instance", route!="/metrics"}[$__rate_interval])))"#
        ),
        ["flashgate_http_request_duration_seconds_bucket"]
    );
    assert_eq!(
        names(
            "max by (deal) (a_total{x=\"y\"}) / on (deal) group_left (name) (-deriv(b[5m:]) > 0) unless c offset 5m"
        ),
        ["a_total", "b", "c"]
    );
    assert_eq!(names("sum without (pool) (x) > bool 1e-9"), ["x"]);
    assert!(names("vector(1)").is_empty());
}
