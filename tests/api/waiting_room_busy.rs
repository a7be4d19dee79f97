//! A line in force only while the sale is busy (`"activation": "when_busy"`): calm arrivals
//! are admitted at once in one request, a burst past the outflow forms a line in arrival
//! order that nobody later passes, the line turns calm again once empty, and two gateways
//! sharing the line admit at once no more than the outflow together.

use std::collections::BTreeMap;
use std::time::Duration;

use flashgate::config::Settings;
use serde_json::{Value, json};

use crate::helpers::{
    Api, TestApp, TestRedis, metric_value, redis_connection, send, spawn_app_with, spawn_sibling,
    unique_suffix, wait_until,
};
use crate::waiting_room::{join, order_with_pass, poll, room_deal};

/// Longest the line takes to drain or turn calm in these tests.
const SETTLED_MAX: Duration = Duration::from_secs(20);

fn fast_room(s: &mut Settings) {
    s.waiting_room.stock_refresh_ms = 100;
    s.waiting_room.lease_ttl_ms = 1000;
    s.waiting_room.when_busy_calm_seconds = 1;
}

async fn app() -> TestApp {
    spawn_app_with(fast_room).await
}

fn busy_room(admit_per_second: i64, max_active: i64) -> Value {
    json!({"enabled": true, "activation": "when_busy", "admit_per_second": admit_per_second,
           "max_active": max_active, "pass_ttl_seconds": 60})
}

/// The deal's `waiting_room` as `GET /admin/deals/{id}` shows it.
async fn admin_room(api: &Api, deal: &str) -> Value {
    let url = api.url(&format!("/admin/deals/{deal}"));
    let request = api.client.get(url).bearer_auth(&api.admin_token);
    send(request).await.expect(200)["waiting_room"].clone()
}

async fn wait_line_active(api: &Api, deal: &str, active: bool) {
    let what = format!("the line of {deal} to read line_active {active}");
    wait_until(&what, SETTLED_MAX, || async {
        let room = admin_room(api, deal).await;
        if room["line_active"] == json!(active) {
            Ok(())
        } else {
            Err(room)
        }
    })
    .await
}

fn state(body: &Value) -> &str {
    body["state"].as_str().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn calm_arrivals_are_admitted_at_once_with_a_pass_and_no_poll() {
    // Arrange
    let app = app().await;
    let deal = app
        .given_deal(&room_deal("wb1", 100, busy_room(1000, 1000), json!({})))
        .await;
    let always = json!({"enabled": true, "admit_per_second": 1000, "max_active": 1000});
    let queued = app
        .given_deal(&room_deal("wb1q", 100, always, json!({})))
        .await;
    app.create_deal(&room_deal(
        "wbbad",
        10,
        json!({"activation": "sometimes"}),
        json!({}),
    ))
    .await
    .expect_problem(400, "invalid-request");

    // Act: twenty buyers one after the other, well below 1,000 a second.
    let mut answers = Vec::new();
    for k in 0..20 {
        answers.push(join(&app, &format!("calm{k}"), &deal).await.expect(201));
    }

    // Assert: every join answered with a pass at once, positions dense; the pass orders.
    for (k, body) in answers.iter().enumerate() {
        assert_eq!(state(body), "admitted", "{body}");
        assert_eq!(body["position"], json!(k + 1));
        assert_eq!(body["ahead"], 0);
        assert!(
            body["pass"].as_str().is_some_and(|p| !p.is_empty()),
            "{body}"
        );
    }
    let pass = answers[0]["pass"].as_str().map(str::to_owned);
    order_with_pass(&app, "calm0", &deal, pass.as_deref())
        .await
        .expect(201);
    let room = admin_room(&app, &deal).await;
    assert_eq!(room["activation"], "when_busy");
    assert_eq!(room["line_active"], false);
    // A deal left at `always` queues as before.
    assert_eq!(
        state(&join(&app, "calm0", &queued).await.expect(201)),
        "waiting"
    );
    assert_eq!(admin_room(&app, &queued).await["activation"], "always");
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn passes_at_max_active_or_a_prequeue_start_the_line() {
    // Arrange: three passes at most; a second deal whose tickets open before the sale.
    let app = app().await;
    let deal = app
        .given_deal(&room_deal("wb2", 100, busy_room(1000, 3), json!({})))
        .await;
    let later = chrono::Utc::now() + chrono::Duration::hours(1);
    let mut early = busy_room(1000, 1000);
    early["prequeue_opens_at"] = json!(chrono::Utc::now() - chrono::Duration::hours(1));
    let opens = app
        .given_deal(&room_deal("wb2p", 100, early, json!({"starts_at": later})))
        .await;

    // Act
    let mut states = Vec::new();
    for k in 0..5 {
        let body = join(&app, &format!("cap{k}"), &deal).await.expect(201);
        states.push(state(&body).to_owned());
    }
    let before = join(&app, "early", &opens).await.expect(201);

    // Assert: the fourth buyer finds the passes used up and waits, and so does the fifth.
    assert_eq!(
        states,
        ["admitted", "admitted", "admitted", "waiting", "waiting"]
    );
    wait_line_active(&app, &deal, true).await;
    assert_eq!(state(&before), "waiting");
    wait_line_active(&app, &opens, true).await;
    app.cleanup().await;
}

/// Polls the waiting tickets from the back of the line to its front until all are admitted,
/// checking that nobody was admitted before someone ahead of them.
async fn drain_in_order(api: &Api, deal: &str, waiting: &[(String, String, u64)]) {
    wait_until("the line to drain", SETTLED_MAX, || async {
        let mut seen_admitted = None;
        let mut all = true;
        for (user, ticket, position) in waiting.iter().rev() {
            let body = poll(api, user, deal, ticket).await.expect(200);
            match state(&body) {
                "admitted" => {
                    seen_admitted.get_or_insert(*position);
                }
                "waiting" => {
                    all = false;
                    assert!(
                        seen_admitted.is_none(),
                        "ticket {position} still waits though {seen_admitted:?} behind it was admitted"
                    );
                }
                other => panic!("unexpected state {other}: {body}"),
            }
        }
        all
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_burst_forms_a_line_in_arrival_order_that_turns_calm_once_drained() {
    // Arrange: five a second.
    let app = app().await;
    let deal = app
        .given_deal(&room_deal("wb3", 1000, busy_room(5, 1000), json!({})))
        .await;
    let switches = |to: &str| format!("to=\"{to}\"");
    let before = app.metrics().await;
    let name = "flashgate_waiting_room_line_switches_total";
    let (active_before, calm_before) = (
        metric_value(&before, name, &switches("active")),
        metric_value(&before, name, &switches("calm")),
    );

    // Act: thirty buyers in a row, then one more once the line formed.
    let mut answers = Vec::new();
    for k in 0..30 {
        let user = format!("burst{k}");
        let body = join(&app, &user, &deal).await.expect(201);
        answers.push((user, body));
    }
    let late = join(&app, "late", &deal).await.expect(201);

    // Assert: a few at once, then everyone waits, in arrival order.
    let first_waiting = answers
        .iter()
        .position(|(_, body)| state(body) == "waiting")
        .expect("the burst formed a line");
    assert!((1..=5).contains(&first_waiting), "{first_waiting} at once");
    let mut waiting = Vec::new();
    for (k, (user, body)) in answers.iter().enumerate() {
        assert_eq!(body["position"], json!(k + 1));
        let expected = if k < first_waiting {
            "admitted"
        } else {
            "waiting"
        };
        assert_eq!(state(body), expected, "{user}: {body}");
        if expected == "waiting" {
            let ticket = body["ticket"].as_str().expect("a ticket").to_owned();
            waiting.push((user.clone(), ticket, k as u64 + 1));
        }
    }
    assert_eq!(
        state(&late),
        "waiting",
        "a later arrival passed the line: {late}"
    );
    waiting.push((
        "late".into(),
        late["ticket"].as_str().unwrap().to_owned(),
        31,
    ));
    wait_line_active(&app, &deal, true).await;
    drain_in_order(&app, &deal, &waiting).await;
    wait_line_active(&app, &deal, false).await;
    let after = join(&app, "after", &deal).await.expect(201);
    assert_eq!(state(&after), "admitted", "{after}");
    let metrics = app.metrics().await;
    assert!(metric_value(&metrics, name, &switches("active")) > active_before);
    assert!(metric_value(&metrics, name, &switches("calm")) > calm_before);
    let gauge = "flashgate_waiting_room_line_active";
    assert_eq!(
        metric_value(&metrics, gauge, &format!("deal=\"{deal}\"")),
        0.0
    );
    app.cleanup().await;
}

/// Waits until Redis's clock, which counts the arrivals, is `within` milliseconds into a
/// second.
async fn redis_second_at(redis: &TestRedis, within: std::ops::Range<i64>) {
    let what = format!("Redis's clock {within:?} ms into a second");
    wait_until(&what, Duration::from_secs(5), || {
        let (mut redis, within) = (redis.clone(), within.clone());
        async move {
            let (_, micros): (i64, i64) = redis::cmd("TIME")
                .query_async(&mut redis)
                .await
                .expect("Redis answers TIME");
            let millis = micros / 1000;
            if within.contains(&millis) {
                Ok(())
            } else {
                Err(millis)
            }
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_burst_across_a_seconds_boundary_counts_as_one_burst() {
    // Arrange: five a second; Redis's clock, which the arrivals are counted on, read here.
    let app = app().await;
    let deal = app
        .given_deal(&room_deal("wb5", 1000, busy_room(5, 1000), json!({})))
        .await;
    let redis = redis_connection(&app.settings.redis.url)
        .await
        .expect("redis");

    // Act: four buyers late in one second of that clock, four more early in the next: no
    // second holds more than five, the last second always does.
    redis_second_at(&redis, 600..700).await;
    let mut states = Vec::new();
    for k in 0..4 {
        let body = join(&app, &format!("edge{k}"), &deal).await.expect(201);
        states.push(state(&body).to_owned());
    }
    redis_second_at(&redis, 0..200).await;
    for k in 4..8 {
        let body = join(&app, &format!("edge{k}"), &deal).await.expect(201);
        states.push(state(&body).to_owned());
    }

    // Assert: five admitted at once (the outflow of a second), then the line formed.
    assert_eq!(
        states,
        [
            "admitted", "admitted", "admitted", "admitted", "admitted", "waiting", "waiting",
            "waiting"
        ]
    );
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn two_gateways_admit_at_once_no_more_than_the_outflow_together() {
    // Arrange: ten a second, one line shared by two gateways.
    let app = app().await;
    let sibling = spawn_sibling(&app.settings).await;
    let id = format!("wb4{}", &unique_suffix()[..6]);
    let deal = app
        .given_deal(&room_deal(&id, 1000, busy_room(10, 1000), json!({})))
        .await;

    // Act: forty buyers at once, half on each gateway.
    let mut joins = tokio::task::JoinSet::new();
    for k in 0..40 {
        let api: Api = if k % 2 == 0 {
            app.api.clone()
        } else {
            sibling.api.clone()
        };
        let deal = deal.clone();
        joins.spawn(async move { join(&api, &format!("pair{k}"), &deal).await.expect(201) });
    }
    let answers = joins.join_all().await;

    // Assert: positions dense; at most ten admitted at once in any second of Redis's clock
    // (a pass expires 60 s after the second it was handed out in).
    let mut positions: Vec<u64> = answers
        .iter()
        .map(|b| b["position"].as_u64().expect("a position"))
        .collect();
    positions.sort_unstable();
    assert_eq!(positions, (1..=40).collect::<Vec<_>>());
    let mut per_second: BTreeMap<String, usize> = BTreeMap::new();
    for body in answers.iter().filter(|b| state(b) == "admitted") {
        let second = body["pass_expires_at"]
            .as_str()
            .expect("an expiry")
            .to_owned();
        *per_second.entry(second).or_default() += 1;
    }
    assert!(!per_second.is_empty(), "nobody was admitted at once");
    assert!(per_second.values().all(|n| *n <= 10), "{per_second:?}");
    let waiting = answers.iter().filter(|b| state(b) == "waiting").count();
    assert!(waiting >= 20, "only {waiting} of 40 waited");
    // Nobody admitted at once arrived after someone who waits.
    let first_waiting = answers
        .iter()
        .filter(|b| state(b) == "waiting")
        .filter_map(|b| b["position"].as_u64())
        .min()
        .unwrap_or(u64::MAX);
    let last_at_once = answers
        .iter()
        .filter(|b| state(b) == "admitted")
        .filter_map(|b| b["position"].as_u64())
        .max()
        .unwrap_or(0);
    assert!(
        last_at_once < first_waiting,
        "{last_at_once} after {first_waiting}"
    );
    wait_line_active(&sibling, &deal, true).await;
    sibling.stop().await;
    app.cleanup().await;
}
