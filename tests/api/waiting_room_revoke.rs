//! Ending a session on the line across `flashgate serve` processes: an operator's revocation
//! and a cancelled order stop the buyer's pass on every instance within a second.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::helpers::{Api, unique_suffix};
use crate::waiting_room::room_deal;
use crate::waiting_room_multi::{Cluster, join, order_with_pass, poll};

/// Orders `quantity` 2 (over the per-user limit of 1) with `pass`: the pass check comes
/// first, so 409 per-user-limit means the pass still works and 403 that it was refused,
/// without placing an order.
async fn probe_pass(api: &Api, user: &str, deal: &str, pass: &str) -> u16 {
    let request = api
        .client
        .post(api.url(&format!("/v1/deals/{deal}/orders")))
        .bearer_auth(api.token(user))
        .header("Idempotency-Key", unique_suffix())
        .header("Flashgate-Pass", pass)
        .json(&json!({ "quantity": 2 }));
    crate::helpers::send(request).await.status
}

/// Waits until `pass` is refused on every gateway; returns how long after `started` the
/// slowest refused it.
async fn refused_everywhere(
    apis: &[Api],
    user: &str,
    deal: &str,
    pass: &str,
    started: Instant,
) -> Duration {
    let mut slowest = Duration::ZERO;
    for api in apis {
        while probe_pass(api, user, deal, pass).await != 403 {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "{user}'s pass still works"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        slowest = slowest.max(started.elapsed());
    }
    slowest
}

#[tokio::test(flavor = "multi_thread")]
async fn a_revoked_or_cancelled_session_ends_on_every_instance_within_a_second() {
    // Arrange: two gateways; alice and bob admitted, their passes good on both.
    let cluster = Cluster::start(2).await;
    let (a, b) = (&cluster.apis[0], &cluster.apis[1]);
    let room = json!({"admit_per_second": 100, "max_active": 10, "pass_ttl_seconds": 120});
    let deal = a
        .given_deal(&room_deal("wrrevoke", 10, room, json!({})))
        .await;
    let mut passes = HashMap::new();
    for user in ["alice", "bob", "carol"] {
        let ticket = join(a, user, &deal).await.expect(201)["ticket"]
            .as_str()
            .unwrap()
            .to_owned();
        let deadline = Instant::now() + Duration::from_secs(10);
        let pass = loop {
            let body = poll(b, user, &deal, &ticket).await.expect(200);
            if let Some(pass) = body["pass"].as_str() {
                break pass.to_owned();
            }
            assert!(Instant::now() < deadline, "{user} never admitted");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        for api in [a, b] {
            assert_eq!(probe_pass(api, user, &deal, &pass).await, 409);
        }
        passes.insert(user, pass);
    }

    // Act 1: an operator revokes alice on gateway A.
    let revoke = a
        .client
        .post(a.url(&format!("/admin/deals/{deal}/queue/revoke")))
        .bearer_auth(&a.admin_token)
        .json(&json!({"user_id": "alice"}));
    let revoked_at = Instant::now();
    let body = crate::helpers::send(revoke).await.expect(200);
    assert_eq!(body["revoked"], true);
    let alice = &passes["alice"];
    let operator = refused_everywhere(&cluster.apis, "alice", &deal, alice, revoked_at).await;

    // Act 2: bob buys on B and cancels there.
    let placed = order_with_pass(b, "bob", &deal, Some(&passes["bob"])).await;
    let order = placed.expect(201)["order_id"].as_str().unwrap().to_owned();
    let cancelled_at = Instant::now();
    b.cancel_order(&b.token("bob"), &order).await.expect(200);
    let bob = &passes["bob"];
    let cancelled = refused_everywhere(&cluster.apis, "bob", &deal, bob, cancelled_at).await;

    // Assert: within a second everywhere; carol, not revoked, still gets in.
    eprintln!(
        "revocation reached both gateways in {operator:?} (operator), {cancelled:?} (cancel)"
    );
    assert!(operator < Duration::from_secs(1), "{operator:?}");
    assert!(cancelled < Duration::from_secs(1), "{cancelled:?}");
    for api in [a, b] {
        assert_eq!(probe_pass(api, "carol", &deal, &passes["carol"]).await, 409);
    }
    let unknown = a
        .client
        .post(a.url(&format!("/admin/deals/{deal}/queue/revoke")))
        .bearer_auth(&a.admin_token)
        .json(&json!({"user_id": "nobody"}));
    assert_eq!(
        crate::helpers::send(unknown).await.expect(200)["revoked"],
        false
    );
    cluster.cleanup().await;
}
