//! A priority group (`waiting_room.priority`): its buyers, by token claim or by access
//! code, wait in a line of their own that gets its share of the admissions while both lines
//! wait, never more than the outflow in all; each ticket is shown its place, wait and odds
//! in its own group.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::helpers::{Api, EVENTUALLY, TestApp, send, spawn_app_with, spawn_sibling, wait_until};
use crate::waiting_room::room_deal;
use crate::waiting_room_invite::{codes_of, issue_codes, join_as};
use crate::waiting_room_report::set_paused;

/// The line's outflow in the share test: slow enough to watch it step by step.
const ADMIT_PER_SECOND: u32 = 10;
/// Each group's crowd in the share test.
const CROWD: usize = 30;
/// Watched until this many were admitted: both lines still wait then.
const WATCHED: u64 = 40;
const WATCH_LIMIT: Duration = Duration::from_secs(30);

async fn app() -> TestApp {
    spawn_app_with(|s| {
        s.waiting_room.stock_refresh_ms = 100;
        s.waiting_room.access_codes_per_request_max = 50;
    })
    .await
}

fn priority_room(priority: Value) -> Value {
    json!({"admit_per_second": ADMIT_PER_SECOND, "max_active": 1000, "pass_ttl_seconds": 60,
           "priority": priority})
}

/// (admitted, of them the priority group's) as the deal's report counts them.
async fn admitted(api: &Api, deal: &str) -> (u64, u64) {
    let url = api.url(&format!("/admin/deals/{deal}/report"));
    let report = send(api.client.get(url).bearer_auth(&api.admin_token))
        .await
        .expect(200);
    let count = |field: &str| report[field].as_u64().unwrap_or(0);
    (count("admitted"), count("admitted_priority"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_half_share_splits_the_admissions_within_one_ticket_and_never_passes_the_outflow() {
    // Arrange: a paused line; the general crowd joins first, then the claim's holders, half
    // of each through a second gateway.
    let app = app().await;
    let sibling = spawn_sibling(&app.settings).await;
    let priority = json!({"claim": "tier", "values": ["vip"], "share_percent": 50});
    let deal = app
        .given_deal(&room_deal(
            "prio1",
            1000,
            priority_room(priority),
            json!({}),
        ))
        .await;
    set_paused(&app, &deal, true).await;
    let mut general = Vec::new();
    let mut vip = Vec::new();
    for (claims, tickets) in [
        (json!({}), &mut general),
        (json!({"tier": "vip"}), &mut vip),
    ] {
        for n in 0..CROWD {
            let api = if n % 2 == 0 { &app.api } else { &sibling.api };
            let user = format!(
                "{}{n}",
                if claims["tier"] == "vip" {
                    "vip"
                } else {
                    "gen"
                }
            );
            let body = join_as(api, &user, claims.clone(), &deal, Value::Null)
                .await
                .expect(201);
            tickets.push(body);
        }
    }

    // Act: the line resumes; its admissions are watched until both lines are still long.
    let resumed = Instant::now();
    set_paused(&app, &deal, false).await;
    let mut seen = Vec::new();
    loop {
        let (total, priority) = admitted(&app, &deal).await;
        seen.push((resumed.elapsed(), total, priority));
        if total >= WATCHED || resumed.elapsed() > WATCH_LIMIT {
            break;
        }
        crate::helpers::pace(Duration::from_millis(100)).await;
    }

    // Assert: each group counts its own places, and its estimates the other's share;
    // admissions follow the share to within one ticket and stay within the outflow (the
    // line's budget of a burst, then the rate).
    for (n, (g, v)) in general.iter().zip(&vip).enumerate() {
        let place = n as u64 + 1;
        assert_eq!(
            (g["group"].as_str(), g["position"].as_u64()),
            (Some("general"), Some(place)),
            "{g}"
        );
        assert_eq!(
            (v["group"].as_str(), v["position"].as_u64()),
            (Some("priority"), Some(place)),
            "{v}"
        );
        assert_eq!(v["ahead"].as_u64(), Some(n as u64), "{v}");
        let vip_wait = v["estimated_wait_seconds"].as_u64().expect("a wait");
        let shared = (2 * n as u64 + 2).div_ceil(u64::from(ADMIT_PER_SECOND));
        assert_eq!(vip_wait, shared, "{v}");
    }
    let last = seen.last().expect("one look at least");
    assert!(last.1 >= WATCHED, "admissions stalled: {seen:?}");
    for &(elapsed, total, priority) in &seen {
        let gap = (2 * priority).abs_diff(total);
        assert!(
            gap <= 2,
            "{priority} of {total} admitted were the priority group's: {seen:?}"
        );
        let allowed = 1.0 + f64::from(ADMIT_PER_SECOND) * (elapsed.as_secs_f64() + 0.25);
        assert!(
            total as f64 <= allowed,
            "{total} admitted {elapsed:?} after resuming: {seen:?}"
        );
    }
    sibling.stop().await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_code_places_its_redeemer_in_the_priority_group_and_a_wrong_one_is_refused() {
    // Arrange: a line whose priority group is the code holders; anyone may join.
    let app = app().await;
    let priority = json!({"codes": true, "share_percent": 30});
    let deal = app
        .given_deal(&room_deal("prio2", 10, priority_room(priority), json!({})))
        .await;
    let codes = codes_of(&issue_codes(&app, &deal, 2).await.expect(201));
    set_paused(&app, &deal, true).await;

    // Act
    let plain = join_as(&app, "plain", json!({}), &deal, Value::Null).await;
    let code = json!({"access_code": codes[0]});
    let holder = join_as(&app, "holder", json!({}), &deal, code.clone()).await;
    let again = join_as(&app, "holder", json!({}), &deal, Value::Null).await;
    let thief = join_as(&app, "thief", json!({}), &deal, code).await;
    let made_up = json!({"access_code": "0123456789abcdef0123456789abcdef"});
    let forger = join_as(&app, "forger", json!({}), &deal, made_up).await;

    // Assert: the holder waits first in the priority line, the plain buyer in the general
    // one (its estimate counting the priority ticket ahead of it); a code that is not the
    // joiner's is refused and takes no place.
    let plain = plain.expect(201);
    assert_eq!(
        (plain["group"].as_str(), plain["position"].as_u64()),
        (Some("general"), Some(1))
    );
    assert_eq!(plain["ahead"], 0, "{plain}");
    let holder = holder.expect(201);
    assert_eq!(
        (holder["group"].as_str(), holder["position"].as_u64()),
        (Some("priority"), Some(1))
    );
    assert_eq!(again.expect(201)["ticket"], holder["ticket"]);
    thief.expect_problem(409, "access-code-used");
    forger.expect_problem(403, "access-code-invalid");
    let url = app.url(&format!("/admin/deals/{deal}/report"));
    let report = send(app.client.get(url).bearer_auth(&app.admin_token))
        .await
        .expect(200);
    assert_eq!(report["waiting"], 2, "{report}");
    let url = app.url(&format!("/v1/deals/{deal}/queue"));
    let public = wait_until("the public line shows both lines", EVENTUALLY, || async {
        let public = send(app.client.get(url.clone())).await.expect(200);
        if public["waiting"] == 2 {
            Ok(public)
        } else {
            Err(public)
        }
    })
    .await;
    let expected = json!({"share_percent": 30, "admitted_through": 0, "waiting": 1});
    assert_eq!(public["priority"], expected, "{public}");
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_priority_group_out_of_bounds_or_on_a_random_line_is_refused() {
    let app = app().await;
    let cases = [
        (
            json!({"claim": "tier", "values": ["vip"], "share_percent": 0}),
            400,
        ),
        (
            json!({"claim": "tier", "values": ["vip"], "share_percent": 100}),
            400,
        ),
        (json!({"claim": "tier", "share_percent": 50}), 422),
        (json!({"share_percent": 50}), 422),
        (
            json!({"claim": "tier", "values": ["vip"], "share_percent": 50, "extra": 1}),
            400,
        ),
    ];
    for (priority, status) in cases {
        app.create_deal(&room_deal(
            "priobad",
            10,
            priority_room(priority.clone()),
            json!({}),
        ))
        .await
        .expect_problem(status, "invalid-request");
    }
    let mut random = priority_room(json!({"codes": true, "share_percent": 50}));
    random["queue_order"] = json!("random");
    app.create_deal(&room_deal("priobad", 10, random, json!({})))
        .await
        .expect_problem(422, "invalid-request");
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM deals WHERE id = 'priobad'")
        .fetch_one(&app.db)
        .await
        .expect("deals read");
    assert_eq!(stored, 0);
    app.cleanup().await;
}
