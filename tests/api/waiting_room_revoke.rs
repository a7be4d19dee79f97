//! Ending a session on the line across `flashgate serve` processes: an operator's revocation
//! and a cancelled order stop the buyer's pass on every instance within a second, and ending
//! it again (an operator's retry, a cancel after a revocation) never brings the pass back.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::json;

use flashgate::config::Settings;

use crate::helpers::{Api, unique_suffix, wait_until};
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
        let limit = Duration::from_secs(5).saturating_sub(started.elapsed());
        let what = format!("{user}'s pass to be refused on {}", api.base);
        wait_until(&what, limit, || async {
            probe_pass(api, user, deal, pass).await == 403
        })
        .await;
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
    let passes = admitted_passes(&cluster.apis, &deal, &["alice", "bob", "carol"]).await;

    // Act 1: an operator revokes alice on gateway A.
    let revoked_at = Instant::now();
    assert_eq!(a.revoke_in_line(&deal, "alice").await["revoked"], true);
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
    assert_eq!(a.revoke_in_line(&deal, "nobody").await["revoked"], false);
    cluster.cleanup().await;
}

/// Admits each of `users` (joining on the first gateway, polling on the last) and checks
/// their passes work on every gateway.
async fn admitted_passes(apis: &[Api], deal: &str, users: &[&str]) -> HashMap<String, String> {
    let (first, last) = (&apis[0], &apis[apis.len() - 1]);
    let mut passes = HashMap::new();
    for &user in users {
        let ticket = join(first, user, deal).await.expect(201)["ticket"]
            .as_str()
            .unwrap()
            .to_owned();
        let what = format!("{user} to be admitted");
        let pass = wait_until(&what, Duration::from_secs(10), || async {
            let body = poll(last, user, deal, &ticket).await.expect(200);
            body["pass"].as_str().map(str::to_owned).ok_or(body)
        })
        .await;
        for api in apis {
            assert_eq!(probe_pass(api, user, deal, &pass).await, 409);
        }
        passes.insert(user.to_owned(), pass);
    }
    passes
}

/// Checks `pass` stays refused on every gateway while each follows the revocation stream
/// `polls` more times (`revocation_poll_ms` apart): an instance that forgot the revocation
/// at one of those reads would let the pass through.
async fn stays_refused(apis: &[Api], user: &str, deal: &str, pass: &str, polls: u32) {
    let poll_every = Duration::from_millis(Settings::defaults().waiting_room.revocation_poll_ms);
    let until = Instant::now() + poll_every * polls;
    while Instant::now() < until {
        for (i, api) in apis.iter().enumerate() {
            let status = probe_pass(api, user, deal, pass).await;
            assert_eq!(
                status, 403,
                "{user}'s ended pass works again on gateway {i}"
            );
        }
        // Probed at a steady pace through the whole span: the outcome is that nothing changes.
        crate::helpers::pace(poll_every / 4).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn ending_a_session_again_never_brings_its_pass_back() {
    // Arrange: two gateways; alice and bob admitted, both passes good on both gateways.
    let cluster = Cluster::start(2).await;
    let (a, b) = (&cluster.apis[0], &cluster.apis[1]);
    let room = json!({"admit_per_second": 100, "max_active": 10, "pass_ttl_seconds": 120});
    let deal = a
        .given_deal(&room_deal("wrrevoke2", 10, room, json!({})))
        .await;
    let passes = admitted_passes(&cluster.apis, &deal, &["alice", "bob"]).await;
    let (alice, bob) = (&passes["alice"], &passes["bob"]);

    // Act 1: an operator revokes alice on A, then retries on B.
    let revoked_at = Instant::now();
    assert_eq!(a.revoke_in_line(&deal, "alice").await["revoked"], true);
    refused_everywhere(&cluster.apis, "alice", &deal, alice, revoked_at).await;
    assert_eq!(b.revoke_in_line(&deal, "alice").await["revoked"], true);

    // Assert 1: the retry changed nothing; alice's pass stays refused everywhere.
    stays_refused(&cluster.apis, "alice", &deal, alice, 10).await;

    // Act 2: bob orders on B, an operator revokes him on A, then bob cancels his order on B
    // (which ends his session a second time).
    let placed = order_with_pass(b, "bob", &deal, Some(bob)).await;
    let order = placed.expect(201)["order_id"].as_str().unwrap().to_owned();
    let revoked_at = Instant::now();
    assert_eq!(a.revoke_in_line(&deal, "bob").await["revoked"], true);
    refused_everywhere(&cluster.apis, "bob", &deal, bob, revoked_at).await;
    b.cancel_order(&b.token("bob"), &order).await.expect(200);

    // Assert 2: the cancel did not restore bob's pass on either gateway.
    stays_refused(&cluster.apis, "bob", &deal, bob, 10).await;
    cluster.cleanup().await;
}
