//! The invariant audit: silent on a healthy sale, and naming each kind of corruption in
//! `GET /admin/audit`, `flashgate check` (non-zero exit) and the exported gauge.

use std::time::Duration;

use serde_json::{Value, json};

use crate::helpers::{TestApp, eventually, new_deal, send, spawn_app_with, unique_suffix};
use crate::ops_cli::flashgate_cli;

async fn audit(app: &TestApp) -> Value {
    let request = app
        .client
        .get(app.url("/admin/audit"))
        .bearer_auth(&app.admin_token);
    send(request).await.expect(200)
}

fn checks(report: &Value) -> Vec<String> {
    let mut checks: Vec<String> = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["check"].as_str().unwrap().to_owned())
        .collect();
    checks.sort();
    checks.dedup();
    checks
}

/// The value of `flashgate_invariant_violations{check="<check>"}` on /metrics.
async fn violations_gauge(app: &TestApp, check: &str) -> Option<f64> {
    let wanted = format!("flashgate_invariant_violations{{check=\"{check}\"}} ");
    app.metrics().await.lines().find_map(|line| {
        line.strip_prefix(&wanted)
            .map(|v| v.trim().parse().unwrap())
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_healthy_sale_passes_and_corruption_is_reported_everywhere() {
    // Arrange: a sale with orders in every holding state the core knows, audited each second.
    let app = spawn_app_with(|s| s.ops.audit_interval_ms = 1000).await;
    let deal = app.given_deal(&new_deal("audited", 20, 4)).await;
    let kept = app.order("alice", &deal, 2).await.expect(201);
    let token = app.token("bob");
    let cancelled = app.place_order(&token, &deal, "k1", 1).await.expect(201);
    let id = cancelled["order_id"].as_str().unwrap();
    app.cancel_order(&token, id).await.expect(200);

    // Act + Assert: nothing to report.
    let report = audit(&app).await;
    assert_eq!(report["findings"], json!([]), "{report}");
    assert_eq!(report["deals_checked"], json!(1));
    assert_eq!(report["sold_out_flag_checked"], json!(true));
    let check = flashgate_cli(&app.settings, &["check"]).await;
    assert!(check.success, "{}\n{}", check.stdout, check.stderr);
    assert_eq!(check.json()["findings"], json!([]));
    let zero = eventually(Duration::from_secs(3), || async {
        violations_gauge(&app, "stock_total")
            .await
            .filter(|v| *v == 0.0)
    })
    .await;
    assert!(zero.is_some(), "no flashgate_invariant_violations gauge");

    // Corrupt: a unit appears from nowhere, and a pending order is marked expired without
    // its units being released.
    sqlx::query(
        "UPDATE inventory_buckets SET available = available + 1 WHERE deal_id = $1 AND bucket = 0",
    )
    .bind(&deal)
    .execute(&app.db)
    .await
    .unwrap();
    let kept_id: uuid::Uuid = kept["order_id"].as_str().unwrap().parse().unwrap();
    sqlx::query("UPDATE orders SET status = 'EXPIRED' WHERE id = $1")
        .bind(kept_id)
        .execute(&app.db)
        .await
        .unwrap();

    let report = audit(&app).await;
    assert_eq!(
        checks(&report),
        ["order_state", "reserved_lines", "stock_total", "user_units"],
        "{report}"
    );
    assert!(
        report["findings"]
            .as_array()
            .unwrap()
            .iter()
            .all(|f| f["deal_id"] == json!(deal))
    );
    let check = flashgate_cli(&app.settings, &["check"]).await;
    assert!(
        !check.success,
        "flashgate check must fail: {}",
        check.stdout
    );
    assert_eq!(checks(&check.json()), checks(&report));
    assert!(
        check.stderr.contains("invariant violation"),
        "{}",
        check.stderr
    );
    let flagged = eventually(Duration::from_secs(5), || async {
        violations_gauge(&app, "stock_total")
            .await
            .filter(|v| *v == 1.0)
    })
    .await;
    assert!(
        flagged.is_some(),
        "the periodic audit did not export the violation"
    );
    app.cleanup().await;
}

#[tokio::test]
async fn a_sold_out_flag_contradicted_by_stock_is_a_finding() {
    // Arrange: a deal with stock, and a sold-out flag for it under a prefix no gateway
    // refreshes (a running gateway would drop the stale flag at once, as it should).
    let app = spawn_app_with(|_| {}).await;
    let deal = app.given_deal(&new_deal("flagged", 5, 1)).await;
    let mut settings = app.settings.clone();
    settings.redis.key_prefix = format!("fgtest:{}:", unique_suffix());
    let mut redis = crate::helpers::redis_connection(&settings.redis.url)
        .await
        .unwrap();
    let key = format!("{}soldout", settings.redis.key_prefix);
    redis::cmd("SADD")
        .arg(&key)
        .arg(&deal)
        .query_async::<i64>(&mut redis)
        .await
        .unwrap();

    // Act
    let check = flashgate_cli(&settings, &["check"]).await;

    // Assert
    redis::cmd("DEL")
        .arg(&key)
        .query_async::<i64>(&mut redis)
        .await
        .unwrap();
    assert!(!check.success, "{}", check.stdout);
    let report = check.json();
    assert_eq!(checks(&report), ["sold_out_flag"], "{report}");
    assert_eq!(report["findings"][0]["deal_id"], json!(deal));
    app.cleanup().await;
}
