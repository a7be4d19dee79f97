//! What a line did, counted for a finished sale: a known crowd joins, some give up, some
//! are admitted and let their pass run out, some order and some pay; the report
//! (`GET /admin/deals/{id}/report`, `flashgate deals report`) matches count for count, from
//! another gateway after the first stopped, and as the CLI's JSON and table.

use std::time::Duration;

use serde_json::{Value, json};

use crate::helpers::{Api, send, spawn_pay_app_with, spawn_sibling, wait_until};
use crate::ops_cli::flashgate_cli;
use crate::waiting_room::{join, order_with_pass, poll, room_deal};

const EVENTUALLY: Duration = Duration::from_secs(20);

async fn report(api: &Api, deal: &str) -> Value {
    let url = api.url(&format!("/admin/deals/{deal}/report"));
    send(api.client.get(url).bearer_auth(&api.admin_token))
        .await
        .expect(200)
}

pub(crate) async fn set_paused(api: &Api, deal: &str, paused: bool) {
    let action = if paused { "pause" } else { "resume" };
    let url = api.url(&format!("/admin/deals/{deal}/{action}"));
    send(api.client.post(url).bearer_auth(&api.admin_token))
        .await
        .expect(200);
}

/// Polls every ticket of `users` each round (so none looks abandoned) until all are
/// admitted; returns their passes.
async fn poll_all_until_admitted(api: &Api, deal: &str, users: &[(String, String)]) -> Vec<String> {
    wait_until("every keen buyer admitted", EVENTUALLY, || async {
        let mut passes = Vec::new();
        for (user, ticket) in users {
            let body = poll(api, user, deal, ticket).await.expect(200);
            if let Some(pass) = body["pass"].as_str() {
                passes.push(pass.to_owned());
            }
        }
        if passes.len() == users.len() {
            Ok(passes)
        } else {
            Err(passes.len())
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_finished_sale_reports_its_crowd_count_for_count() {
    // Arrange: a paused line, so the crowd waits; 8 join, 2 stop polling.
    let mut app = spawn_pay_app_with(|s| {
        s.waiting_room.stock_refresh_ms = 100;
        s.waiting_room.abandon_after_seconds = 2;
        s.waiting_room.refresh_after_seconds_max = 1;
        s.waiting_room.paid_sample_interval_ms = 1000;
    })
    .await;
    let room = json!({"admit_per_second": 100, "max_active": 100, "pass_ttl_seconds": 2});
    let deal = app
        .given_deal(&room_deal("wrreport", 20, room, json!({})))
        .await;
    set_paused(&app, &deal, true).await;
    let mut keen = Vec::new();
    for n in 0..8 {
        let user = format!("buyer{n}");
        let body = join(&app, &user, &deal).await.expect(201);
        if n >= 2 {
            keen.push((user, body["ticket"].as_str().expect("a ticket").to_owned()));
        }
    }

    // Act: the keen six keep polling past the grace of the two who left, then the sale
    // resumes; four order, two of them pay, two let their pass run out.
    let grace_passed = std::time::Instant::now() + Duration::from_millis(2600);
    while std::time::Instant::now() < grace_passed {
        for (user, ticket) in &keen {
            poll(&app, user, &deal, ticket).await.expect(200);
        }
        crate::helpers::pace(Duration::from_millis(300)).await;
    }
    set_paused(&app, &deal, false).await;
    let passes = poll_all_until_admitted(&app, &deal, &keen).await;
    for (n, ((user, _), pass)) in keen.iter().zip(&passes).take(4).enumerate() {
        let order = order_with_pass(&app, user, &deal, Some(pass))
            .await
            .expect(201);
        if n < 2 {
            let intent = crate::helpers::intent_id(&order);
            assert_eq!(app.sim.pay(&intent).await.0, 200);
            let id = order["order_id"].as_str().expect("an order id");
            app.wait_for_order(&app.token(user), id, &["PAID"], EVENTUALLY)
                .await;
        }
    }
    let settled = wait_until("the two unused passes expired", EVENTUALLY, || async {
        let body = report(&app, &deal).await;
        if body["passes_expired_unused"] == 2 {
            Ok(body)
        } else {
            Err(body)
        }
    })
    .await;

    // Assert: count for count, on the /metrics of the gateway that moved the line too.
    let expected = [
        ("joined", 8),
        ("tickets_issued", 8),
        ("admitted", 6),
        ("abandoned", 2),
        ("passes_expired_unused", 2),
        ("waiting", 0),
        ("passes_active", 0),
        ("admitted_who_ordered", 4),
        ("orders_with_pass", 4),
        ("orders_paid", 2),
    ];
    for (field, value) in expected {
        assert_eq!(settled[field], value, "{field} in {settled}");
    }
    let wait = &settled["wait_seconds"];
    assert_eq!(wait["count"], 6, "{settled}");
    let figure = |name: &str| {
        wait[name]
            .as_f64()
            .unwrap_or_else(|| panic!("{name}: {wait}"))
    };
    assert!(figure("max") >= 2.0 && figure("max") < 60.0, "{wait}");
    assert!(
        figure("p50") <= figure("p90") && figure("p90") <= figure("p99"),
        "{wait}"
    );
    assert!(
        figure("p99") <= figure("max") && figure("p50") >= 2.0,
        "{wait}"
    );
    let metrics = app.metrics().await;
    let label = format!("deal=\"{deal}\"");
    for (name, value) in [
        ("flashgate_waiting_room_joined_total", 8.0),
        ("flashgate_waiting_room_admitted_total", 6.0),
        ("flashgate_waiting_room_abandoned_total", 2.0),
        ("flashgate_waiting_room_orders_total", 4.0),
        ("flashgate_waiting_room_wait_seconds_count", 6.0),
    ] {
        let seen = crate::helpers::metric_value(&metrics, name, &label);
        assert_eq!(seen, value, "{name}");
    }
    let paid = "flashgate_waiting_room_orders_paid";
    wait_until(
        "the paid orders counted from PostgreSQL",
        EVENTUALLY,
        || async {
            let seen = crate::helpers::metric_value(&app.metrics().await, paid, &label);
            if seen == 2.0 { Ok(seen) } else { Err(seen) }
        },
    )
    .await;

    // Assert: the same report from another gateway once the first has stopped, and from
    // the CLI, as JSON and as a table.
    app.app.stop().await.expect("the first gateway stops");
    let restarted = spawn_sibling(&app.settings).await;
    assert_eq!(report(&restarted, &deal).await, settled);
    let cli = flashgate_cli(&app.settings, &["deals", "report", &deal, "--json"]).await;
    assert!(cli.success, "{}", cli.stderr);
    let printed: Value = serde_json::from_str(&cli.stdout).expect("JSON");
    assert_eq!(printed, settled);
    let table = flashgate_cli(&app.settings, &["deals", "report", &deal]).await;
    assert!(table.success, "{}", table.stderr);
    eprintln!("flashgate deals report {deal}:\n{}", table.stdout);
    for line in [
        "joined                 8",
        "admitted               6",
        "abandoned              2",
        "passes expired unused  2",
        "admitted who ordered   4 (66.7%)",
        "orders paid            2 (50.0%)",
    ] {
        assert!(table.stdout.contains(line), "{line:?} in\n{}", table.stdout);
    }
    restarted.stop().await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_report_needs_a_known_deal_with_a_waiting_room() {
    let app = crate::helpers::spawn_app().await;
    let plain = app
        .given_deal(&crate::helpers::new_deal("plain", 5, 1))
        .await;
    let url = |deal: &str| app.url(&format!("/admin/deals/{deal}/report"));
    send(app.client.get(url(&plain)).bearer_auth(&app.admin_token))
        .await
        .expect_problem(409, "invalid-request");
    send(
        app.client
            .get(url("nosuchdeal"))
            .bearer_auth(&app.admin_token),
    )
    .await
    .expect_problem(404, "not-found");
    let anonymous = send(app.client.get(url(&plain))).await;
    assert_eq!(anonymous.status, 401);
    app.cleanup().await;
}
