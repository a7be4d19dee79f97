//! How series come and go: a deal's series leave `/metrics` once it ended
//! `deals.metrics_retain_seconds` ago while others stay, outcome counters are exported at
//! zero from the start, a sold-out waiting-room line shows no queue and no wait, and an
//! instance that lost the advancer lease stops reporting the lines it advanced.

use std::time::Duration;

use serde_json::json;

use crate::helpers::{eventually, metric_value, new_deal, redis_connection, spawn_app_with};
use crate::waiting_room::{join, order_with_pass, poll_until, room_deal};

const SETTLE: Duration = Duration::from_secs(15);

fn has_deal(metrics: &str, deal: &str) -> bool {
    let label = format!("deal=\"{deal}\"");
    metrics
        .lines()
        .any(|line| !line.starts_with('#') && line.contains(&label))
}

#[tokio::test(flavor = "multi_thread")]
async fn series_of_an_ended_deal_are_dropped_after_the_retention() {
    // Arrange
    let app = spawn_app_with(|s| {
        s.deals.metrics_interval_ms = 200;
        s.deals.metrics_retain_seconds = 1;
    })
    .await;
    let mut ending = new_deal("ending", 5, 2);
    ending["ends_at"] = json!((chrono::Utc::now() + chrono::Duration::seconds(3)).to_rfc3339());
    let ending = app.given_deal(&ending).await;
    let staying = app.given_deal(&new_deal("staying", 5, 2)).await;
    app.order("a", &ending, 1).await.expect(201);
    let both = eventually(SETTLE, || async {
        let text = app.metrics().await;
        (has_deal(&text, &ending) && has_deal(&text, &staying)).then_some(())
    })
    .await;
    assert!(
        both.is_some(),
        "both deals get series:\n{}",
        app.metrics().await
    );

    // Act: the deal ends, and its retention passes.
    let gone = eventually(SETTLE, || async {
        let text = app.metrics().await;
        (!has_deal(&text, &ending)).then_some(text)
    })
    .await;

    // Assert
    let Some(text) = gone else {
        panic!("the ended deal's series stay:\n{}", app.metrics().await);
    };
    assert!(
        has_deal(&text, &staying),
        "an open deal keeps its series:\n{text}"
    );
    for series in [
        "flashgate_sweeper_runs_total{outcome=\"panic\"} 0",
        "flashgate_audit_runs_total{outcome=\"panic\"} 0",
        "flashgate_db_retries_total{operation=\"reservation\"} 0",
    ] {
        assert!(
            text.lines().any(|l| l == series),
            "{series} exported at zero:\n{text}"
        );
    }
    assert!(
        text.lines()
            .any(|l| l.starts_with("flashgate_build_info{") && l.ends_with(" 1")),
        "build info:\n{text}"
    );
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sold_out_line_shows_no_queue_and_no_wait() {
    // Arrange: one unit, one pass at a time, two buyers waiting behind the first.
    let app = spawn_app_with(|s| {
        s.waiting_room.stock_refresh_ms = 100;
        s.soldout.refresh_interval_ms = 100;
    })
    .await;
    let room = json!({"admit_per_second": 100, "max_active": 1, "pass_ttl_seconds": 120});
    let deal = app
        .given_deal(&room_deal("last-unit", 1, room, json!({})))
        .await;
    let first = join(&app, "first", &deal).await.expect(201)["ticket"]
        .as_str()
        .unwrap()
        .to_owned();
    join(&app, "second", &deal).await.expect(201);
    join(&app, "third", &deal).await.expect(201);
    let admitted = poll_until(&app, "first", &deal, &first, &["admitted"], SETTLE).await;
    let label = format!("deal=\"{deal}\"");
    let queued = eventually(SETTLE, || async {
        let text = app.metrics().await;
        (metric_value(&text, "flashgate_waiting_room_queue_length", &label) >= 2.0).then_some(())
    })
    .await;
    assert!(
        queued.is_some(),
        "the line shows its queue:\n{}",
        app.metrics().await
    );

    // Act: the first buyer takes the last unit.
    let pass = admitted["pass"].as_str().unwrap();
    order_with_pass(&app, "first", &deal, Some(pass))
        .await
        .expect(201);

    // Assert
    let cleared = eventually(SETTLE, || async {
        let text = app.metrics().await;
        let queue = metric_value(&text, "flashgate_waiting_room_queue_length", &label);
        let wait = metric_value(
            &text,
            "flashgate_waiting_room_estimated_wait_seconds",
            &label,
        );
        (queue == 0.0 && wait == 0.0).then_some(())
    })
    .await;
    assert!(
        cleared.is_some(),
        "a sold-out line still shows a queue:\n{}",
        app.metrics().await
    );
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_instance_that_loses_the_advancer_lease_reports_its_lines_at_zero() {
    // Arrange: a line with buyers waiting behind one pass, advanced by this instance.
    let app = spawn_app_with(|s| {
        s.waiting_room.stock_refresh_ms = 100;
    })
    .await;
    let room = json!({"admit_per_second": 100, "max_active": 1, "pass_ttl_seconds": 120});
    let deal = app
        .given_deal(&room_deal("moving-lease", 10, room, json!({})))
        .await;
    for user in ["first", "second", "third"] {
        join(&app, user, &deal).await.expect(201);
    }
    let label = format!("deal=\"{deal}\"");
    let reported = eventually(SETTLE, || async {
        let text = app.metrics().await;
        (metric_value(&text, "flashgate_waiting_room_queue_length", &label) >= 2.0).then_some(())
    })
    .await;
    assert!(
        reported.is_some(),
        "the line shows its queue:\n{}",
        app.metrics().await
    );

    // Act: another instance holds the lease now (as after this one missed its renewals).
    let lease = format!("{}wr:{{advancer}}:lease", app.settings.redis.key_prefix);
    let mut redis = redis_connection(&app.settings.redis.url).await.unwrap();
    let _: () = redis::cmd("SET")
        .arg(&lease)
        .arg("another-instance")
        .arg("PX")
        .arg(60_000)
        .query_async(&mut redis)
        .await
        .unwrap();

    // Assert: the line still has buyers waiting, but this instance no longer reports them.
    let cleared = eventually(SETTLE, || async {
        let text = app.metrics().await;
        let queue = metric_value(&text, "flashgate_waiting_room_queue_length", &label);
        let wait = metric_value(
            &text,
            "flashgate_waiting_room_estimated_wait_seconds",
            &label,
        );
        (queue == 0.0 && wait == 0.0).then_some(())
    })
    .await;
    assert!(
        cleared.is_some(),
        "the old holder still reports the line:\n{}",
        app.metrics().await
    );
    app.cleanup().await;
}

/// The routes whose 5xx series are exported at zero are spelled as the router names them:
/// a request to each lands on a series of that very template.
#[tokio::test(flavor = "multi_thread")]
async fn the_zero_exported_routes_are_real_route_templates() {
    // Arrange
    let app = spawn_app_with(|_| {}).await;
    let id = "0190a000-0000-7000-8000-000000000000";
    let read = [
        "/v1/deals/{id}",
        "/v1/deals/{id}/queue/{ticket}",
        "/v1/orders/{id}",
    ];

    // Act: one request to each template, placeholders filled.
    for template in flashgate::telemetry::ZERO_ROUTES {
        let path = template
            .replace("{id}", id)
            .replace("{ticket}", "t")
            .replace("{provider}", "sim");
        let url = app.url(&path);
        let request = if read.contains(&template) {
            app.client.get(url)
        } else {
            app.client.post(url).body("{}")
        };
        request.send().await.expect("the gateway answers");
    }

    // Assert
    let text = app.metrics().await;
    for template in flashgate::telemetry::ZERO_ROUTES {
        let answered = text.lines().any(|line| {
            line.starts_with("flashgate_http_requests_total{")
                && line.contains(&format!("route=\"{template}\""))
                && !line.contains("status=\"500\"")
                && !line.contains("status=\"503\"")
        });
        assert!(
            answered,
            "no answered request counted under {template}:\n{text}"
        );
    }
    app.cleanup().await;
}
