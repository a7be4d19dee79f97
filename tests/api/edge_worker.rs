//! The edge Worker (edge/cloudflare/worker.js) in workerd in front of a live gateway: the
//! public state served from the edge cache, a corpus of passes judged by the Worker exactly
//! as by the gateway, a key rotation through the documented steps, and a revocation reaching
//! the edge within its bound.

use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::Utc;
use flashgate::config::Settings;
use flashgate::waiting_room::Passes;
use serde_json::{Value, json};

use crate::helpers::{
    Api, CountingProxy, Reply, TestApp, Workerd, send, spawn_app_with, spawn_sibling,
};
use crate::waiting_room::{join, order_with_pass, poll_until, room_deal};
use crate::waiting_room_edge::{EVENTUALLY, fast_room, ticket_of};

/// The address a CDN reports as the buyer's (`CF-Connecting-IP`).
const BUYER_IP: &str = "203.0.113.7";

fn seed(byte: u8) -> String {
    URL_SAFE_NO_PAD.encode([byte; 32])
}

/// Gateway settings for the edge tests: passes signed by `keys`, the proxy trusted to name
/// the client, and key sets cacheable for a second so the rotation's waits are short.
fn edge_settings(s: &mut Settings, keys: &[u8]) {
    fast_room(s);
    s.waiting_room.pass_signing_keys = keys.iter().map(|k| seed(*k)).collect();
    s.waiting_room.keys_max_age_seconds = 1;
    s.server.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
}

/// Passes as the gateway with these signing keys (first signs) would mint them.
fn passes_with(settings: &Settings, keys: &[u8]) -> Passes {
    let mut room = settings.waiting_room.clone();
    room.pass_signing_keys = keys.iter().map(|k| seed(*k)).collect();
    room.pass_format = "ed25519".into();
    Passes::from_settings(&room)
}

/// A client of the gateway through the edge, as a CDN's visitor.
fn through(edge: &Workerd, app: &TestApp) -> Api {
    Api::new(&edge.url, &app.ops_base, &app.settings)
}

async fn order_through(api: &Api, user: &str, deal: &str, pass: Option<&str>) -> Reply {
    let request = api
        .client
        .post(api.url(&format!("/v1/deals/{deal}/orders")))
        .bearer_auth(api.token(user))
        .header("Idempotency-Key", crate::helpers::unique_suffix())
        .header("CF-Connecting-IP", BUYER_IP)
        .json(&json!({ "quantity": 1 }));
    let request = match pass {
        Some(pass) => request.header("Flashgate-Pass", pass),
        None => request,
    };
    send(request).await
}

/// What must be the same whoever judged: the status and the problem's fields but its
/// `instance` (each names its own request id).
fn verdict(reply: &Reply) -> Value {
    let body: Value = serde_json::from_str(&reply.text).unwrap_or(Value::Null);
    match reply.status {
        201 => json!({"status": 201}),
        _ => json!({"status": reply.status, "type": body["type"], "title": body["title"],
                    "detail": body["detail"], "content_type": reply.header("content-type")}),
    }
}

/// A pass with its payload replaced by `payload`, the signature kept.
fn edited(pass: &str, payload: &Value) -> String {
    let parts: Vec<&str> = pass.split('.').collect();
    let payload = URL_SAFE_NO_PAD.encode(payload.to_string());
    format!("{}.{payload}.{}", parts[0], parts[2])
}

/// An admitted pass of `user`, earned on the line.
async fn earned_pass(api: &Api, user: &str, deal: &str) -> (String, String) {
    let ticket = ticket_of(&join(api, user, deal).await.expect(201));
    let admitted = poll_until(api, user, deal, &ticket, &["admitted"], EVENTUALLY).await;
    (ticket, admitted["pass"].as_str().unwrap().to_owned())
}

fn open_room_deal(id: &str) -> Value {
    let room = json!({"admit_per_second": 100, "max_active": 50, "pass_ttl_seconds": 60});
    let mut deal = room_deal(id, 100, room, json!({}));
    deal["per_user_limit"] = json!(20);
    deal
}

#[tokio::test(flavor = "multi_thread")]
async fn the_edge_serves_public_state_from_its_cache_and_judges_passes_as_the_gateway_does() {
    // Arrange: a gateway behind a counting proxy, the Worker in workerd in front of it.
    let app = spawn_app_with(|s| edge_settings(s, &[1, 2])).await;
    let deal = app.given_deal(&open_room_deal("edgecorpus")).await;
    let proxy = CountingProxy::start(&app.base).await;
    let edge = Workerd::start(&proxy.url()).await;
    let visitor = through(&edge, &app);

    // Act 1: a crowd reads the line and the deal through the edge for a while.
    let line_path = format!("/v1/deals/{deal}/queue");
    let deal_path = format!("/v1/deals/{deal}");
    let started = Instant::now();
    let mut reads = 0;
    while started.elapsed() < Duration::from_millis(2500) {
        for path in [&line_path, &deal_path] {
            let reply = visitor.get(path).await;
            assert_eq!(reply.status, 200, "{}", reply.text);
            reads += 1;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();

    // Assert 1: each read the origin about once per max-age (1 s), whatever the crowd.
    let max_age = f64::from(app.settings.server.public_cache_max_age_seconds);
    let bound = (elapsed / max_age).ceil() as usize + 1;
    for path in [&line_path, &deal_path] {
        let fetched = proxy.count(path);
        eprintln!("edge: {reads} reads in {elapsed:.1} s, {fetched} origin fetches of {path}");
        assert!(
            fetched >= 1 && fetched <= bound,
            "{fetched} fetches of {path}, bound {bound}"
        );
    }
    assert!(
        reads > 4 * bound,
        "too few reads ({reads}) to show the cache"
    );

    // Act 2: the corpus, each pass sent through the edge and straight to the gateway.
    let now = Utc::now().timestamp();
    let signer = passes_with(&app.settings, &[1, 2]);
    let second_key = passes_with(&app.settings, &[2, 1]);
    let unknown_key = passes_with(&app.settings, &[3]);
    let valid = signer.mint(&deal, "alice", now + 60, "t-valid");
    let (revoked_ticket, revoked) = earned_pass(&app, "rita", &deal).await;
    let corpus: Vec<(&str, &str, String, Option<&str>)> = vec![
        ("valid", "alice", valid.clone(), None),
        (
            "signed by the second published key",
            "alice",
            second_key.mint(&deal, "alice", now + 60, "t-2"),
            None,
        ),
        (
            "hmac",
            "alice",
            signer.mint_hmac(&deal, "alice", now + 60, "t-h"),
            None,
        ),
        (
            "edited",
            "bob",
            edited(
                &valid,
                &json!({"d": deal, "u": "bob", "e": now + 60, "p": "t-valid"}),
            ),
            Some("forged"),
        ),
        (
            "expired",
            "alice",
            signer.mint(&deal, "alice", now - 60, "t-old"),
            Some("expired"),
        ),
        (
            "other deal",
            "alice",
            signer.mint("another-deal", "alice", now + 60, "t-o"),
            Some("other_deal"),
        ),
        (
            "unpublished key",
            "alice",
            unknown_key.mint(&deal, "alice", now + 60, "t-u"),
            Some("forged"),
        ),
        ("garbage", "alice", "a.b.c".into(), Some("forged")),
        (
            "too long",
            "alice",
            format!("{valid}{}", "A".repeat(1100)),
            Some("forged"),
        ),
        ("other user", "bob", valid.clone(), None),
        ("revoked", "rita", revoked.clone(), Some("revoked")),
    ];
    let revoke = app
        .client
        .post(app.url(&format!("/admin/deals/{deal}/queue/revoke")))
        .bearer_auth(&app.admin_token)
        .json(&json!({"user_id": "rita"}));
    send(revoke).await.expect(200);
    tokio::time::sleep(revocation_bound(&app.settings)).await;

    // Assert 2: the same verdict from both; the edge itself refused what it can judge, and
    // those never reached the origin.
    let orders_path = format!("/v1/deals/{deal}/orders");
    for (name, user, pass, edge_refusal) in &corpus {
        let before = proxy.count(&orders_path);
        let at_edge = order_through(&visitor, user, &deal, Some(pass)).await;
        let at_origin = order_with_pass(&app, user, &deal, Some(pass)).await;
        assert_eq!(
            verdict(&at_edge),
            verdict(&at_origin),
            "{name}: {} / {}",
            at_edge.text,
            at_origin.text
        );
        let decided_by = at_edge.header("flashgate-edge").map(str::to_owned);
        match edge_refusal {
            Some(reason) => {
                assert_eq!(decided_by, Some(format!("refused {reason}")), "{name}");
                assert_eq!(
                    proxy.count(&orders_path),
                    before,
                    "{name} reached the origin"
                );
                at_edge.expect_problem(403, "waiting-room-required");
            }
            None => assert_eq!(decided_by, None, "{name}: {}", at_edge.text),
        }
    }
    let missing_edge = order_through(&visitor, "alice", &deal, None).await;
    let missing_origin = order_with_pass(&app, "alice", &deal, None).await;
    assert_eq!(verdict(&missing_edge), verdict(&missing_origin));
    assert_eq!(verdict(&missing_origin)["status"], 403);
    assert!(!revoked_ticket.is_empty());

    // The buyer's address reached the origin in the header the gateway trusts.
    let forwarded = proxy.forwarded_for();
    assert!(
        !forwarded.is_empty() && forwarded.iter().all(|f| f == BUYER_IP),
        "{forwarded:?}"
    );
    app.cleanup().await;
}

/// How long after a revocation the edge refuses the pass at the latest, as docs/EDGE.md
/// states it: the instance's revocation poll plus the feed's max-age, plus a fetch's time.
fn revocation_bound(settings: &Settings) -> Duration {
    Duration::from_millis(settings.waiting_room.revocation_poll_ms)
        + Duration::from_secs(u64::from(settings.server.public_cache_max_age_seconds))
        + Duration::from_millis(200)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_key_rotation_through_the_documented_steps_keeps_valid_passes_working_at_the_edge() {
    // Arrange: key 1 signs; a pass earned with it; the edge has cached the key set.
    let app = spawn_app_with(|s| edge_settings(s, &[1])).await;
    let deal = app.given_deal(&open_room_deal("edgerotate")).await;
    let proxy = CountingProxy::start(&app.base).await;
    let edge = Workerd::start(&proxy.url()).await;
    let visitor = through(&edge, &app);
    let (_, old_pass) = earned_pass(&app, "olga", &deal).await;
    order_through(&visitor, "olga", &deal, Some(&old_pass))
        .await
        .expect(201);
    let keys_max_age = Duration::from_secs(app.settings.waiting_room.keys_max_age_seconds);
    let restart = |keys: &'static [u8]| {
        let mut settings = app.settings.clone();
        edge_settings(&mut settings, keys);
        settings
    };

    // Act / Assert, step 1: key 2 is published second on every instance; wait for caches.
    let step1 = spawn_sibling(&restart(&[1, 2])).await;
    proxy.point_at(&step1.base);
    tokio::time::sleep(keys_max_age).await;
    // Step 2: key 2 signs. Passes of both keys work at the edge.
    let step2 = spawn_sibling(&restart(&[2, 1])).await;
    proxy.point_at(&step2.base);
    step1.stop().await;
    let (_, new_pass) = earned_pass(&step2, "nina", &deal).await;
    assert_ne!(
        new_pass.split('.').next(),
        old_pass.split('.').next(),
        "a new key id"
    );
    for (user, pass) in [("nina", &new_pass), ("olga", &old_pass)] {
        let reply = order_through(&visitor, user, &deal, Some(pass)).await;
        assert_eq!(
            reply.header("flashgate-edge"),
            None,
            "{user}: {}",
            reply.text
        );
        reply.expect(201);
    }
    // Step 3: key 1 is dropped; once cached key sets expire its passes are forged at the
    // edge too, and key 2's keep working.
    let step3 = spawn_sibling(&restart(&[2])).await;
    proxy.point_at(&step3.base);
    step2.stop().await;
    tokio::time::sleep(keys_max_age).await;
    let dropped = order_through(&visitor, "olga", &deal, Some(&old_pass)).await;
    assert_eq!(
        dropped.header("flashgate-edge"),
        Some("refused forged"),
        "{}",
        dropped.text
    );
    assert_eq!(
        verdict(&dropped),
        verdict(&order_with_pass(&step3, "olga", &deal, Some(&old_pass)).await)
    );
    order_through(&visitor, "nina", &deal, Some(&new_pass))
        .await
        .expect(201);
    step3.stop().await;
    app.cleanup().await;
}
