//! Faults between the gateway and a receiver that verifies with the Standard Webhooks
//! reference library: it answers 500 for a minute, hangs past the timeout, has its port
//! closed, or gets a rotated secret in the middle of the sale. Each time nothing is lost
//! and every order's events arrive in sequence; an endpoint failing past its limit is marked
//! failing, keeps its events and gets them on a replay.
//!
//! The minute of 500s passes on a manual clock: the gateway runs on it with the shipped
//! retry schedule, whose back-off waits on the application's clock, and the test moves it
//! a second at a time while the receiver refuses.

use std::time::Duration;

use flashgate::clock::ManualClock;
use flashgate::config::Settings;
use serde_json::{Value, json};

use crate::events_delivery::{check_against_database, fast_events, subscribe, wait_delivered};
use crate::helpers::{Receiver, TestApp, new_deal, send, spawn_app_on, spawn_app_with, wait_until};

const DELIVERED: Duration = Duration::from_secs(60);

/// How long the receiver refuses, on the gateway's clock.
const OUTAGE: Duration = Duration::from_secs(60);

/// Real time given to the gateway after each second the clock moves.
const STEP_PAUSE: Duration = Duration::from_millis(100);

/// Some sale traffic: each user reserves one unit and every other one cancels.
async fn traffic(app: &TestApp, deal: &str, users: std::ops::Range<u32>) {
    for n in users {
        let user = format!("u{n}");
        let order = app.order(&user, deal, 1).await.expect(201);
        if n % 2 == 0 {
            let id = order["order_id"].as_str().unwrap();
            app.cancel_order(&app.token(&user), id).await.expect(200);
        }
    }
}

async fn admin(app: &TestApp, method: reqwest::Method, path: &str, body: Value) -> Value {
    let request = app
        .client
        .request(method, app.url(path))
        .bearer_auth(&app.admin_token);
    let reply = send(request.json(&body)).await;
    assert!(
        reply.status < 300,
        "{path}: {} {}",
        reply.status,
        reply.text
    );
    serde_json::from_str(&reply.text).unwrap_or(Value::Null)
}

/// The shipped settings, with only the pacing that does not decide a rule shortened (how
/// soon the sequencer and an idle endpoint look again).
fn shipped_schedule(s: &mut Settings) {
    s.events.enabled = true;
    s.events.allow_private_targets = true;
    s.events.leader_retry_ms = 200;
    s.events.poll_interval_max_ms = 100;
    s.events.maintenance_interval_ms = 200;
}

/// Moves `clock` a second at a time, giving the gateway a moment after each, for `seconds`
/// or until `done` holds; true when it did.
async fn advance_until<F, Fut>(clock: &ManualClock, seconds: u32, mut done: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..seconds {
        if done().await {
            return true;
        }
        clock.advance(Duration::from_secs(1));
        crate::helpers::pace(STEP_PAUSE).await;
    }
    done().await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_receiver_answering_500_for_a_minute_loses_nothing_on_the_shipped_schedule() {
    // Ahead of the system's clock, so tokens minted on it as the test goes are already
    // valid; behind it by less than the receiver's five minutes of tolerance at the end.
    let clock = ManualClock::starting_at(chrono::Utc::now() + chrono::Duration::seconds(30));
    let app = spawn_app_on(clock.clock(), shipped_schedule).await;
    let shipped = Settings::defaults().events;
    assert_eq!(
        (
            app.settings.events.retry_initial_ms,
            app.settings.events.retry_max_ms
        ),
        (shipped.retry_initial_ms, shipped.retry_max_ms)
    );
    let receiver = Receiver::start(&[]).await;
    let (id, _) = subscribe(&app, &receiver).await;
    let deal = app.given_deal(&new_deal("ev-outage", 1000, 4)).await;
    traffic(&app, &deal, 0..10).await;
    let before = wait_delivered(&app, &receiver, DELIVERED).await.len();

    receiver.fail().await;
    traffic(&app, &deal, 10..20).await;
    let seconds = u32::try_from(OUTAGE.as_secs()).unwrap();
    advance_until(&clock, seconds, || async { false }).await;
    assert_eq!(
        receiver.received().await.len(),
        before,
        "nothing accepted while failing"
    );
    let refused = receiver.refused().await;
    let first = refused
        .first()
        .expect("the gateway tried during the outage");
    let attempts = refused.iter().filter(|r| *r == first).count();
    // Back-off from 1 s doubling with jitter over the upper half: the first try and 5 to 7
    // retries fit in a minute; a shortened schedule would try dozens of times.
    assert!(
        (4..=10).contains(&attempts),
        "{attempts} attempts of one event in a minute of 500s"
    );
    let path = format!("/admin/event-endpoints/{id}");
    let view = admin(&app, reqwest::Method::GET, &path, Value::Null).await;
    assert_eq!(
        view["state"], "active",
        "a minute is short of failing: {view}"
    );
    assert!(
        view["last_error"].as_str().unwrap().contains("500"),
        "{view}"
    );

    receiver.heal().await;
    let all: i64 = sqlx::query_scalar("SELECT count(*) FROM events")
        .fetch_one(&app.db)
        .await
        .unwrap();
    // The next retry comes at most one doubled back-off (64 s) after the outage.
    let arrived = advance_until(&clock, 120, || async {
        crate::helpers::distinct_ids(&receiver.received().await) as i64 == all
    })
    .await;
    assert!(
        arrived,
        "the backlog arrives within two minutes of recovery"
    );
    let received = wait_delivered(&app, &receiver, DELIVERED).await;
    let events = check_against_database(&app, &received).await;
    assert_eq!(events, 30, "twenty reservations and ten cancellations");
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_receiver_hanging_or_closed_loses_nothing() {
    let app = spawn_app_with(fast_events).await;
    let mut receiver = Receiver::start(&[]).await;
    let (_, secret) = subscribe(&app, &receiver).await;
    let deal = app.given_deal(&new_deal("ev-faults", 1000, 4)).await;
    traffic(&app, &deal, 0..10).await;
    wait_delivered(&app, &receiver, DELIVERED).await;

    receiver.control(json!({"mode": "hang"})).await;
    traffic(&app, &deal, 10..20).await;
    wait_counted(&app, "timeout").await;
    receiver.stop().await;
    traffic(&app, &deal, 20..30).await;
    wait_counted(&app, "unreachable").await;
    receiver.restart(&[&secret]).await;

    let received = wait_delivered(&app, &receiver, DELIVERED).await;
    let events = check_against_database(&app, &received).await;
    assert_eq!(events, 45, "thirty reservations and fifteen cancellations");
    assert!(
        counted(&app, "accepted").await,
        "no accepted delivery counted"
    );
    app.cleanup().await;
}

/// Whether a delivery with `outcome` was counted.
async fn counted(app: &TestApp, outcome: &str) -> bool {
    let metrics = app.metrics().await;
    metrics.lines().any(|l| {
        l.starts_with("flashgate_event_deliveries_total")
            && l.contains(&format!("outcome=\"{outcome}\""))
    })
}

/// Waits until a delivery with `outcome` was counted: the receiver's fault has been met.
async fn wait_counted(app: &TestApp, outcome: &str) {
    let what = format!("a delivery counted as {outcome}");
    wait_until(&what, DELIVERED, || counted(app, outcome)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rotated_secret_signs_beside_the_old_one_during_the_overlap_only() {
    let app = spawn_app_with(fast_events).await;
    let receiver = Receiver::start(&[]).await;
    let (id, old) = subscribe(&app, &receiver).await;
    let deal = app.given_deal(&new_deal("ev-rotate", 1000, 2)).await;
    traffic(&app, &deal, 0..4).await;
    wait_delivered(&app, &receiver, DELIVERED).await;

    let overlap = 4;
    let rotated = admin(
        &app,
        reqwest::Method::POST,
        &format!("/admin/event-endpoints/{id}/rotate-secret"),
        json!({"overlap_seconds": overlap}),
    )
    .await;
    let new = rotated["secret"].as_str().unwrap().to_owned();
    receiver.control(json!({"secrets": [old, new]})).await;
    traffic(&app, &deal, 4..8).await;
    let during = wait_delivered(&app, &receiver, DELIVERED).await;
    // The overlap runs on the database's clock, which a test cannot move: it is checked to
    // be the one asked for, then its end is brought forward to now.
    let granted: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM previous_until - updated_at)::float8 FROM event_endpoints WHERE id = $1::uuid",
    )
    .bind(&id)
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(granted, overlap as f64, "the overlap granted");
    sqlx::query("UPDATE event_endpoints SET previous_until = now() WHERE id = $1::uuid")
        .bind(&id)
        .execute(&app.db)
        .await
        .unwrap();
    traffic(&app, &deal, 8..12).await;
    let after = wait_delivered(&app, &receiver, DELIVERED).await;

    let first = 6;
    let overlapping: Vec<&Value> = during[first..].iter().collect();
    assert!(!overlapping.is_empty());
    for delivery in overlapping {
        assert_eq!(delivery["signatures"], 2, "{delivery}");
        assert_eq!(
            delivery["verified_by"],
            json!([0, 1]),
            "both secrets verify during the overlap: {delivery}"
        );
    }
    for delivery in &after[during.len()..] {
        assert_eq!(delivery["signatures"], 1, "{delivery}");
        assert_eq!(
            delivery["verified_by"],
            json!([1]),
            "only the new secret after it: {delivery}"
        );
    }
    assert_eq!(check_against_database(&app, &after).await, 18);
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_endpoint_failing_past_its_limit_is_marked_failing_and_replayed() {
    let app = spawn_app_with(|s| {
        fast_events(s);
        s.events.failing_after_seconds = 2;
    })
    .await;
    let receiver = Receiver::start(&[]).await;
    let (id, _) = subscribe(&app, &receiver).await;
    receiver.fail().await;
    let deal = app.given_deal(&new_deal("ev-failing", 1000, 2)).await;
    traffic(&app, &deal, 0..6).await;
    let path = format!("/admin/event-endpoints/{id}");
    let failing = wait_until("the endpoint to be marked failing", DELIVERED, || async {
        let view = admin(&app, reqwest::Method::GET, &path, Value::Null).await;
        if view["state"] == "failing" {
            Ok(view)
        } else {
            Err(view.to_string())
        }
    })
    .await;
    assert_eq!(failing["pending"], 9, "its events are kept: {failing}");
    assert!(failing["last_error"].as_str().unwrap().contains("500"));
    wait_until("the failing gauge", DELIVERED, || async {
        let metrics = app.metrics().await;
        metrics.contains(&format!(
            "flashgate_event_endpoint_failing{{endpoint=\"{id}\"}} 1"
        ))
    })
    .await;
    receiver.heal().await;
    crate::helpers::holds_for(
        "a failing endpoint is not tried",
        Duration::from_secs(1),
        || async { receiver.received().await.is_empty() },
    )
    .await;

    let replayed = admin(
        &app,
        reqwest::Method::POST,
        &format!("{path}/replay"),
        json!({}),
    )
    .await;
    assert_eq!(replayed["state"], "active");
    let received = wait_delivered(&app, &receiver, DELIVERED).await;
    assert_eq!(check_against_database(&app, &received).await, 9);
    app.cleanup().await;
}
