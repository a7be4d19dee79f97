//! The Grafana dashboard and the alert rules only query metrics the gateway exports: every
//! metric name in every expression must appear on `/metrics` after a small sale.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::Value;

use crate::helpers::{TestApp, eventually, new_deal, spawn_app_with};

const DASHBOARD: &str = include_str!("../../config/grafana/flashgate.json");
const ALERTS: &str = include_str!("../../config/prometheus/alerts.yml");

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

fn alert_expressions() -> Vec<String> {
    let rules: Value = serde_norway::from_str(ALERTS).expect("alerts.yml is YAML");
    rules["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").iter())
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

/// A small sale: orders, a sell-out, a rejection, a cancel, then the background gauges.
async fn small_sale(app: &TestApp) -> String {
    let deal = app.given_deal(&new_deal("dashboard", 3, 2)).await;
    app.place_order("not a token", &deal, "k", 1)
        .await
        .expect_problem(401, "unauthorized");
    let token = app.token("a");
    let first = app.place_order(&token, &deal, "k", 1).await.expect(201);
    for user in ["b", "c"] {
        app.order(user, &deal, 1).await.expect(201);
    }
    app.order("d", &deal, 1)
        .await
        .expect_problem(409, "sold-out");
    let id = first["order_id"].as_str().unwrap();
    app.cancel_order(&token, id).await.expect(200);
    app.get_deal(&deal).await.expect(200);
    let wanted = [
        "flashgate_inventory_units",
        "flashgate_invariant_violations",
        "flashgate_redis_up",
    ];
    let exposition = eventually(Duration::from_secs(10), || async {
        let text = app.metrics().await;
        let names = exported_names(&text);
        wanted.iter().all(|w| names.contains(*w)).then_some(text)
    })
    .await;
    exposition.expect("the background gauges appear within 10 s")
}

#[tokio::test]
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
    let app = spawn_app_with(|s| {
        s.deals.metrics_interval_ms = 200;
        s.ops.audit_interval_ms = 1000;
    })
    .await;

    // Act
    let exported = exported_names(&small_sale(&app).await);

    // Assert
    let mut missing = Vec::new();
    for expr in expressions.iter().chain(&alerts) {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "no metric found in {expr:?}");
        for name in names {
            if !exported.contains(&name) {
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
