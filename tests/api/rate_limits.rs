//! Rate limits per client address and per user, and when `X-Forwarded-For` is believed.

use serde_json::json;

use crate::helpers::{
    Api, Reply, assert_invariants, buckets, new_deal, send, spawn_app_with, unique_suffix,
};

/// Asserts a 429 with the problem type and the rate-limit headers.
#[track_caller]
fn assert_rate_limited(reply: &Reply) {
    reply.expect_problem(429, "rate-limited");
    let retry_after = reply.header("retry-after").expect("Retry-After header");
    let seconds: u64 = retry_after
        .parse()
        .unwrap_or_else(|_| panic!("Retry-After {retry_after:?} is not whole seconds"));
    assert!(seconds >= 1, "Retry-After {seconds}");
    assert!(
        reply
            .header("ratelimit-policy")
            .is_some_and(|v| !v.is_empty()),
        "RateLimit-Policy missing"
    );
    assert!(
        reply.header("ratelimit").is_some_and(|v| !v.is_empty()),
        "RateLimit missing"
    );
}

/// An order by `user` whose request claims to come from `forwarded_for`.
async fn order_forwarded(api: &Api, user: &str, deal: &str, forwarded_for: &str) -> Reply {
    let request = api
        .client
        .post(api.url(&format!("/v1/deals/{deal}/orders")));
    let request = request
        .bearer_auth(api.token(user))
        .header("Idempotency-Key", unique_suffix())
        .header("X-Forwarded-For", forwarded_for);
    send(request.json(&json!({ "quantity": 1 }))).await
}

fn roomy_deal(id: &str) -> serde_json::Value {
    let mut deal = new_deal(id, 100, 2);
    deal["per_user_limit"] = json!(10);
    deal
}

#[tokio::test(flavor = "multi_thread")]
async fn per_ip_limit_refuses_the_request_beyond_the_burst() {
    // Arrange: burst 3, one per second; the deal is set up from another address.
    let app = spawn_app_with(|s| {
        s.limits.per_ip.rate_per_second = 1;
        s.limits.per_ip.burst = 3;
    })
    .await;
    let admin = app.seen_from("127.0.0.2");
    let deal = admin.given_deal(&roomy_deal("ip")).await;

    // Act: four quick orders by four users from one address.
    let mut replies = Vec::new();
    for n in 0..4 {
        replies.push(app.order(&format!("user-{n}"), &deal, 1).await);
    }
    let other_address = app.seen_from("127.0.0.3").order("user-9", &deal, 1).await;

    // Assert
    for reply in &replies[..3] {
        reply.expect(201);
    }
    assert_rate_limited(&replies[3]);
    other_address.expect(201);
    let reserved: i64 = buckets(&app.db, &deal)
        .await
        .iter()
        .map(|b| b.reserved)
        .sum();
    assert_eq!(reserved, 4, "the refused request reserved something");
    assert_invariants(&admin, &app.db, &deal).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn per_user_limit_refuses_the_order_beyond_the_burst() {
    let app = spawn_app_with(|s| {
        s.limits.per_user.rate_per_second = 1;
        s.limits.per_user.burst = 3;
    })
    .await;
    let deal = app.given_deal(&roomy_deal("user")).await;

    let mut replies = Vec::new();
    for _ in 0..4 {
        replies.push(app.order("alice", &deal, 1).await);
    }
    let bob = app.order("bob", &deal, 1).await;

    for reply in &replies[..3] {
        reply.expect(201);
    }
    assert_rate_limited(&replies[3]);
    bob.expect(201);
    assert_eq!(app.inventory(&deal).await["reserved"], 4);
    app.assert_invariants(&deal).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn forwarded_for_from_an_untrusted_peer_is_ignored() {
    // Arrange: no trusted proxies.
    let app = spawn_app_with(|s| {
        s.limits.per_ip.rate_per_second = 1;
        s.limits.per_ip.burst = 3;
        s.server.trusted_proxies = Vec::new();
    })
    .await;
    let admin = app.seen_from("127.0.0.2");
    let deal = admin.given_deal(&roomy_deal("spoof")).await;

    // Act: every request claims another client address.
    let mut replies = Vec::new();
    for n in 0..4 {
        replies.push(
            order_forwarded(
                &app.api,
                &format!("user-{n}"),
                &deal,
                &format!("203.0.113.{n}"),
            )
            .await,
        );
    }

    // Assert: the header did not buy a fresh allowance.
    for reply in &replies[..3] {
        reply.expect(201);
    }
    assert_rate_limited(&replies[3]);
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn forwarded_for_from_a_trusted_proxy_identifies_the_client() {
    // Arrange: the test client (127.0.0.1) is a trusted proxy.
    let app = spawn_app_with(|s| {
        s.limits.per_ip.rate_per_second = 1;
        s.limits.per_ip.burst = 3;
        s.server.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
    })
    .await;
    let admin = app.seen_from("127.0.0.2");
    let deal = admin.given_deal(&roomy_deal("proxied")).await;

    // Act: six clients behind the proxy, then one client four times.
    let mut distinct = Vec::new();
    for n in 0..6 {
        distinct.push(
            order_forwarded(
                &app.api,
                &format!("user-{n}"),
                &deal,
                &format!("203.0.113.{n}"),
            )
            .await,
        );
    }
    let mut same = Vec::new();
    for n in 0..4 {
        same.push(order_forwarded(&app.api, &format!("other-{n}"), &deal, "198.51.100.7").await);
    }

    // Assert: limited per forwarded client, not per proxy.
    for reply in distinct.iter().chain(&same[..3]) {
        reply.expect(201);
    }
    assert_rate_limited(&same[3]);
    app.cleanup().await;
}
