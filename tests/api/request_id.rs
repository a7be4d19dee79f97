//! Request ids: echoed in `X-Request-Id`, named in the problem's `instance`, and carried by
//! every log line of the request (here in the JSON log format).

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use crate::helpers::{Api, TestDb, eventually, new_deal, send, spawn_app, test_settings};
use crate::multi_process::{spawn_gateway_logging_to, wait_until_healthy};

#[tokio::test(flavor = "multi_thread")]
async fn a_valid_incoming_id_is_echoed_and_named_in_the_problem() {
    let app = spawn_app().await;

    let reply = send(
        app.client
            .get(app.url("/v1/deals/no-such-deal"))
            .header("X-Request-Id", "edge-4f2a:17.b_c"),
    )
    .await;

    assert_eq!(reply.header("x-request-id"), Some("edge-4f2a:17.b_c"));
    let body = reply.expect_problem(404, "not-found");
    assert_eq!(body["instance"], "urn:flashgate:request:edge-4f2a:17.b_c");
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_invalid_or_missing_id_is_replaced_by_a_fresh_one() {
    let app = spawn_app().await;
    let too_long = "a".repeat(app.settings.server.request_id_bytes_max + 1);
    let mut seen = Vec::new();

    for sent in [
        None,
        Some("has space"),
        Some("<script>"),
        Some(too_long.as_str()),
    ] {
        let mut request = app.client.get(app.url("/healthz"));
        if let Some(sent) = sent {
            request = request.header("X-Request-Id", sent);
        }
        let reply = send(request).await;
        assert_eq!(reply.status, 200);
        let id = reply.header("x-request-id").expect("an id").to_owned();
        assert_ne!(Some(id.as_str()), sent);
        assert!(
            id.len() <= 64
                && id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b)),
            "{id}"
        );
        seen.push(id);
    }

    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 4, "generated ids repeat: {seen:?}");
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn every_log_line_of_a_request_carries_its_id_route_deal_and_user() {
    // Arrange: a gateway writing JSON logs, with its per-request lines enabled.
    let database = TestDb::create().await;
    let settings = test_settings(&database.url);
    let api = Api::on_free_ports(&settings);
    let log_path = std::env::temp_dir().join(format!("flashgate-log-{}.jsonl", api.ops_listen()));
    let log = std::fs::File::create(&log_path).expect("create the log file");
    let extra = [
        ("FLASHGATE__TELEMETRY__LOG_FORMAT", "json"),
        ("RUST_LOG", "info,flashgate::http=debug"),
    ];
    let mut gateway = spawn_gateway_logging_to(&settings, &api, &extra, Stdio::from(log));
    wait_until_healthy(&mut gateway, &api).await;
    let deal = api.given_deal(&new_deal("logged", 10, 2)).await;

    // Act: an order, then a refused one, each with its own id.
    let order = send(
        api.client
            .post(api.url(&format!("/v1/deals/{deal}/orders")))
            .bearer_auth(api.token("alice"))
            .header("Idempotency-Key", "k1")
            .header("X-Request-Id", "order-1")
            .json(&serde_json::json!({"quantity": 1})),
    )
    .await;
    assert_eq!(order.status, 201, "{}", order.text);
    let refused = send(
        api.client
            .post(api.url(&format!("/v1/deals/{deal}/orders")))
            .bearer_auth(api.token("alice"))
            .header("Idempotency-Key", "k1")
            .header("X-Request-Id", "order-2")
            .json(&serde_json::json!({"quantity": 2})),
    )
    .await;
    refused.expect_problem(422, "idempotency-conflict");

    // Assert: each request's closing line names its id, route, deal, user and outcome.
    let line_of = |id: &'static str| {
        let path = log_path.clone();
        async move {
            let text = std::fs::read_to_string(&path).ok()?;
            text.lines()
                .filter_map(|line| serde_json::from_str::<Value>(line).ok())
                .find(|line| line["span"]["id"] == id && line["fields"]["message"] == "answered")
        }
    };
    let first = eventually(Duration::from_secs(10), || line_of("order-1")).await;
    let second = eventually(Duration::from_secs(10), || line_of("order-2")).await;
    let log_text = std::fs::read_to_string(&log_path).unwrap_or_default();
    let (first, second) = (
        first.unwrap_or_else(|| panic!("no line for order-1 in:\n{log_text}")),
        second.unwrap_or_else(|| panic!("no line for order-2 in:\n{log_text}")),
    );
    for (line, outcome, status) in [(&first, "ok", 201), (&second, "idempotency-conflict", 422)] {
        let span = &line["span"];
        assert_eq!(span["name"], "request", "{line}");
        assert_eq!(span["route"], "/v1/deals/{id}/orders", "{line}");
        assert_eq!(span["deal"], "logged", "{line}");
        assert_eq!(span["user"], "alice", "{line}");
        assert_eq!(span["outcome"], outcome, "{line}");
        assert!(span["latency_ms"].as_f64().is_some(), "{line}");
        assert_eq!(line["fields"]["status"], status, "{line}");
    }
    drop(gateway);
    let _ = std::fs::remove_file(&log_path);
    database.drop_database().await;
}
