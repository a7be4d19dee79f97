//! `flashgate events` and `flashgate event-endpoints` against a running gateway's database:
//! an endpoint created from the command line receives the sale (verified by the reference
//! library's receiver), a replay sends it all again with the same ids, and bad input is
//! refused with nothing saved.

use serde_json::Value;

use crate::events_delivery::{fast_events, wait_delivered};
use crate::helpers::{Receiver, distinct_ids, new_deal, spawn_app_with, wait_until};
use crate::ops_cli::cli_command;

const SETTLE: std::time::Duration = std::time::Duration::from_secs(30);

/// Runs the CLI with the test's settings, private targets allowed or not; `(ok, stdout)`.
async fn cli(
    settings: &flashgate::config::Settings,
    private: bool,
    args: &[&str],
) -> (bool, Value, String) {
    let mut command = cli_command(settings, args);
    command.env(
        "FLASHGATE__EVENTS__ALLOW_PRIVATE_TARGETS",
        private.to_string(),
    );
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let json = serde_json::from_str(&stdout).unwrap_or(Value::Null);
    (
        output.status.success(),
        json,
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn endpoints_are_managed_and_replayed_from_the_cli() {
    let app = spawn_app_with(fast_events).await;
    let settings = &app.settings;
    let receiver = Receiver::start(&[]).await;
    let url = receiver.url();

    let (ok, _, stderr) = cli(
        settings,
        false,
        &["event-endpoints", "create", "--url", &url],
    )
    .await;
    assert!(!ok && stderr.contains("private"), "{stderr}");
    let (ok, _, stderr) = cli(
        settings,
        true,
        &["event-endpoints", "create", "--url", "ftp://x.example/"],
    )
    .await;
    assert!(!ok && stderr.contains("http"), "{stderr}");
    let (_, listed, _) = cli(settings, true, &["event-endpoints", "list"]).await;
    assert_eq!(listed["endpoints"], serde_json::json!([]), "nothing saved");

    let (ok, created, stderr) = cli(
        settings,
        true,
        &["event-endpoints", "create", "--url", &url],
    )
    .await;
    assert!(ok, "{stderr}");
    let id = created["id"].as_str().unwrap().to_owned();
    receiver
        .control(serde_json::json!({"secrets": [created["secret"]]}))
        .await;
    let deal = app.given_deal(&new_deal("ev-cli", 10, 2)).await;
    for user in ["a", "b", "c"] {
        app.order(user, &deal, 1).await.expect(201);
    }
    let first = wait_delivered(&app, &receiver, SETTLE).await;
    assert_eq!(distinct_ids(&first), 3);

    let (ok, page, _) = cli(settings, true, &["events", "list", "--limit", "2"]).await;
    assert!(ok);
    assert_eq!(page["events"].as_array().unwrap().len(), 2);
    let next = page["next"].as_str().unwrap().to_owned();
    let (_, rest, _) = cli(settings, true, &["events", "list", "--after", &next]).await;
    assert_eq!(rest["events"].as_array().unwrap().len(), 1);
    assert!(rest["next"].is_null());
    let (ok, _, stderr) = cli(settings, true, &["events", "list", "--after", "nowhere"]).await;
    assert!(!ok && stderr.contains("unknown cursor"), "{stderr}");

    let (ok, _, stderr) = cli(settings, true, &["event-endpoints", "replay", &id]).await;
    assert!(ok, "{stderr}");
    wait_until("the replay to arrive", SETTLE, || async {
        receiver.received().await.len() >= 6
    })
    .await;
    let received = receiver.received().await;
    assert_eq!(distinct_ids(&received), 3, "a replay sends the same ids");

    let (ok, rotated, _) = cli(
        settings,
        true,
        &[
            "event-endpoints",
            "rotate-secret",
            &id,
            "--overlap-seconds",
            "60",
        ],
    )
    .await;
    assert!(ok && rotated["secret"].as_str().unwrap().starts_with("whsec_"));
    let (ok, shown, _) = cli(
        settings,
        true,
        &["event-endpoints", "update", &id, "--enabled", "false"],
    )
    .await;
    assert!(ok);
    assert_eq!(shown["enabled"], false);
    assert_eq!(shown["state"], "active");
    let (ok, _, _) = cli(settings, true, &["event-endpoints", "delete", &id]).await;
    assert!(ok);
    let (ok, _, _) = cli(settings, true, &["event-endpoints", "show", &id]).await;
    assert!(!ok);
    app.cleanup().await;
}
