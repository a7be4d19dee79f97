//! The waiting page of a priority group's buyer, in a real browser (Debian's chromium): far
//! back in its own line it follows that line on the public state (`priority`), not the
//! general line's, so it neither checks in early nor shows the other line's places.

use std::time::Duration;

use serde_json::{Value, json};

use crate::helpers::{send, spawn_app_with, wait_until};
use crate::waiting_room::{join, room_deal};
use crate::waiting_room_page::Browser;
use crate::waiting_room_report::set_paused;

/// The line's outflow, and the check-in window in seconds: a window of five tickets.
const ADMIT_PER_SECOND: u64 = 5;
const CHECKIN_WINDOW_SECONDS: u64 = 1;
/// General buyers admitted before the line pauses: the general line's `admitted_through`.
const ADMITTED_FIRST: u64 = 5;
/// Priority buyers waiting ahead of the page's.
const VIP_AHEAD: usize = 9;

/// The place and the tickets ahead as the page shows them.
async fn shown(browser: &Browser) -> (String, String) {
    let script = "return [document.querySelector('[data-live=position]').textContent, \
        document.querySelector('[data-live=ahead]').textContent]";
    let value = browser.eval(script).await;
    let text = |i: usize| value[i].as_str().unwrap_or_default().to_owned();
    (text(0), text(1))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_priority_buyer_far_back_follows_the_priority_line() {
    // Arrange: five general buyers admitted, then the line paused; ten more general buyers
    // and nine of the priority group wait.
    let app = spawn_app_with(|s| {
        crate::waiting_room_edge::fast_room(s);
        s.waiting_room.checkin_window_seconds = CHECKIN_WINDOW_SECONDS;
        s.waiting_room.refresh_after_seconds_max = 1;
    })
    .await;
    let room = json!({"admit_per_second": ADMIT_PER_SECOND, "max_active": 1000,
                      "pass_ttl_seconds": 600,
                      "priority": {"claim": "tier", "values": ["vip"], "share_percent": 50}});
    let deal = app
        .given_deal(&room_deal("wrgroups", 100, room, json!({})))
        .await;
    for n in 0..ADMITTED_FIRST {
        join(&app, &format!("first{n}"), &deal).await.expect(201);
    }
    let minute = Duration::from_secs(60);
    let report = app.url(&format!("/admin/deals/{deal}/report"));
    wait_until("the first buyers admitted", minute, || async {
        let body = send(app.client.get(report.clone()).bearer_auth(&app.admin_token))
            .await
            .expect(200);
        match body["admitted"].as_u64() == Some(ADMITTED_FIRST) {
            true => Ok(()),
            false => Err(body),
        }
    })
    .await;
    set_paused(&app, &deal, true).await;
    for n in 0..10 {
        join(&app, &format!("later{n}"), &deal).await.expect(201);
    }
    let vip = |user: &str| {
        let claims = json!({"tier": "vip"})
            .as_object()
            .cloned()
            .unwrap_or_default();
        flashgate::auth::mint_token_with_claims(&app.jwt_secret, user, claims)
    };
    for n in 0..VIP_AHEAD {
        let url = app.url(&format!("/v1/deals/{deal}/queue"));
        let joined = send(app.client.post(url).bearer_auth(vip(&format!("vip{n}")))).await;
        assert_eq!(joined.expect(201)["group"], "priority");
    }
    let browser = Browser::start_speaking(Some("en")).await;

    // Act: the priority buyer opens the page.
    let token = vip("vip-page");
    browser
        .open(&app.url(&format!("/wait/{deal}#token={token}")))
        .await;
    browser
        .wait_for("waiting", minute, |state, _| state == "waiting")
        .await;
    wait_until("three reads of the public state", minute, || async {
        let (public, _) = browser.line_requests().await;
        match public >= 3 {
            true => Ok(()),
            false => Err(format!("{public} requests to the public state")),
        }
    })
    .await;

    // Assert: tenth in the priority line, nine ahead, and no check-in: measured against the
    // general line's admitted_through (5) it would be within the window of five.
    let (_, personal) = browser.line_requests().await;
    assert_eq!(personal, 0, "no ticket poll while far back in its own line");
    let expected = ((VIP_AHEAD + 1).to_string(), VIP_AHEAD.to_string());
    assert_eq!(shown(&browser).await, expected);
    let line: Value = send(app.client.get(app.url(&format!("/v1/deals/{deal}/queue"))))
        .await
        .expect(200);
    assert_eq!(line["admitted_through"], ADMITTED_FIRST, "{line}");
    browser.quit().await;
    app.cleanup().await;
}
