//! Rules about time run on the application's clock: a gateway started on a manual clock
//! opens and closes a sale, and lets a token run out, when that clock is moved, with no
//! sleep and whatever the system's clock says.

use std::time::Duration;

use chrono::Utc;
use flashgate::auth::mint_token_at;
use flashgate::clock::ManualClock;
use serde_json::json;

use crate::helpers::{new_deal, spawn_app_on};

const MINUTE: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread")]
async fn a_sale_opens_and_closes_when_the_gateway_s_clock_reaches_its_times() {
    // Arrange: a sale open on PostgreSQL's clock (which re-checks the window as it places
    // an order) from five minutes ago for twenty minutes; the gateway's clock stands ten
    // minutes before its start.
    let now = Utc::now();
    let (starts, ends) = (
        now - chrono::Duration::minutes(5),
        now + chrono::Duration::minutes(15),
    );
    let clock = ManualClock::starting_at(starts - chrono::Duration::minutes(10));
    let app = spawn_app_on(clock.clock(), |_| {}).await;
    let mut deal = new_deal("clocked", 10, 2);
    deal["starts_at"] = json!(starts.to_rfc3339());
    deal["ends_at"] = json!(ends.to_rfc3339());
    let deal = app.given_deal(&deal).await;
    // Tokens issued on the gateway's clock.
    let order = async |user: &str| {
        let token = mint_token_at(&app.settings.auth.jwt_secret, user, 3600, clock.now());
        app.place_order(&token, &deal, user, 1).await
    };

    // Act and assert: refused before the start, sold once the clock reaches it, refused
    // again at the end; the public state follows the same clock.
    order("early").await.expect_problem(409, "sale-not-open");
    assert_eq!(app.deal_state(&deal).await, "upcoming");

    clock.advance(10 * MINUTE);
    order("on-time").await.expect(201);
    assert_eq!(app.deal_state(&deal).await, "open");

    clock.advance(20 * MINUTE);
    order("late").await.expect_problem(409, "sale-not-open");
    assert_eq!(app.deal_state(&deal).await, "ended");
    app.assert_invariants(&deal).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_token_runs_out_on_the_gateway_s_clock() {
    // Arrange: a token good for a minute.
    let clock = ManualClock::starting_at(Utc::now());
    let app = spawn_app_on(clock.clock(), |s| s.auth.jwt_leeway_seconds = 0).await;
    let deal = app.given_deal(&new_deal("tokens", 10, 2)).await;
    let token = mint_token_at(&app.settings.auth.jwt_secret, "alice", 60, clock.now());
    app.place_order(&token, &deal, "first", 1).await.expect(201);

    // Act: two minutes pass on the gateway's clock, none on the system's.
    clock.advance(2 * MINUTE);

    // Assert: the same token is refused as expired.
    let refused = app.place_order(&token, &deal, "second", 1).await;
    assert_eq!(refused.status, 401, "{}", refused.text);
    app.cleanup().await;
}
