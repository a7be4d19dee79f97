//! `flashgate deals drain-queue`: closing a deal's waiting room from the operator CLI while
//! buyers wait in it.

use std::time::Duration;

use serde_json::json;

use crate::helpers::{holds_for, new_deal, spawn_app_with};
use crate::ops_cli::flashgate_cli;
use crate::waiting_room::{join, line, order_with_pass, poll, poll_until, room_deal};

const EVENTUALLY: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread")]
async fn draining_a_line_tells_every_waiting_buyer_and_admits_nobody_afterwards() {
    // Arrange: one pass at a time, so after the first buyer everyone else waits.
    let app = spawn_app_with(|s| {
        s.waiting_room.stock_refresh_ms = 100;
        s.waiting_room.lease_ttl_ms = 1000;
    })
    .await;
    let room = json!({"admit_per_second": 100, "max_active": 1, "pass_ttl_seconds": 60});
    let deal = app
        .given_deal(&room_deal("wrdrain", 10, room, json!({})))
        .await;
    let plain = app.given_deal(&new_deal("no-room", 10, 1)).await;
    let mut tickets = Vec::new();
    for i in 0..5 {
        let user = format!("d{i}");
        let body = join(&app, &user, &deal).await.expect(201);
        tickets.push((user, body["ticket"].as_str().unwrap().to_owned()));
    }
    let (first, first_ticket) = &tickets[0];
    let admitted = poll_until(&app, first, &deal, first_ticket, &["admitted"], EVENTUALLY).await;
    let first_pass = admitted["pass"].as_str().unwrap().to_owned();
    for (user, ticket) in &tickets[1..] {
        let body = poll(&app, user, &deal, ticket).await.expect(200);
        assert_eq!(body["state"], "waiting", "{user}: {body}");
    }

    // Act
    let drained = flashgate_cli(&app.settings, &["deals", "drain-queue", &deal]).await;
    let again = flashgate_cli(&app.settings, &["deals", "drain-queue", &deal]).await;
    let unknown = flashgate_cli(&app.settings, &["deals", "drain-queue", "no-such-deal"]).await;
    let no_room = flashgate_cli(&app.settings, &["deals", "drain-queue", &plain]).await;

    // Assert: the four waiting tickets were expired; the pass already handed out is counted.
    assert!(drained.success, "{}", drained.stderr);
    let report = drained.json();
    assert_eq!(report["deal_id"], json!(deal));
    assert_eq!(report["closed"], json!(true));
    assert_eq!(report["tickets_expired"], json!(4));
    assert_eq!(report["passes_active"], json!(1));
    assert!(again.success, "{}", again.stderr);
    assert_eq!(
        again.json()["tickets_expired"],
        json!(0),
        "draining twice is harmless"
    );
    assert!(!unknown.success);
    assert!(unknown.stderr.contains("not found"), "{}", unknown.stderr);
    assert!(!no_room.success);
    assert!(
        no_room.stderr.contains("has no waiting room"),
        "{}",
        no_room.stderr
    );

    // Every waiting buyer reads `expired` at the next poll, with nothing left to wait for.
    for (user, ticket) in &tickets[1..] {
        let body = poll(&app, user, &deal, ticket).await.expect(200);
        assert_eq!(body["state"], "expired", "{user}: {body}");
        assert_eq!(body["estimated_wait_seconds"], 0);
        assert_eq!(body["ahead"], 0);
        assert!(body.get("pass").is_none(), "{user}: {body}");
    }
    assert_eq!(line(&app, &deal).await["waiting"], 0);

    // The pass handed out before the drain still orders, which frees its slot; the line
    // still admits nobody after several advancer steps.
    order_with_pass(&app, first, &deal, Some(&first_pass))
        .await
        .expect(201);
    // Through several advancer steps, nobody is admitted.
    let drained = &tickets[1..];
    holds_for(
        "the drained line admits nobody",
        Duration::from_millis(600),
        || async {
            let mut none = true;
            for (user, ticket) in drained {
                let body = poll(&app, user, &deal, ticket).await.expect(200);
                none &= body["state"] == "expired" && body.get("pass").is_none();
            }
            none
        },
    )
    .await;
    for (user, _) in drained {
        order_with_pass(&app, user, &deal, None)
            .await
            .expect_problem(403, "waiting-room-required");
    }

    // Nobody new gets into a closed line; a drained buyer gets the same expired ticket back.
    join(&app, "late", &deal)
        .await
        .expect_problem(409, "sale-not-open");
    let (user, ticket) = &tickets[1];
    let rejoined = join(&app, user, &deal).await.expect(201);
    assert_eq!(rejoined["ticket"], json!(ticket));
    assert_eq!(rejoined["state"], "expired");
    app.cleanup().await;
}
