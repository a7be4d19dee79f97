//! Proof of work and Ed25519 passes on one gateway: every misuse of a challenge refused, the
//! difficulty raised by the crowd, and passes checked by a verifier written here from the
//! published key set alone, across a key rotation.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::Utc;
use ed25519_dalek::{Signature, VerifyingKey};
use flashgate::waiting_room::{Challenges, Passes};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::helpers::{Api, Reply, send, spawn_app_with, wait_until};
use crate::waiting_room::{join, order_with_pass, poll_until, room_deal};
use crate::waiting_room_edge::{EVENTUALLY, fast_room, ticket_of};

async fn fetch_challenge(api: &Api, user: &str, deal: &str) -> Value {
    let url = api.url(&format!("/v1/deals/{deal}/queue/challenge"));
    send(api.client.get(url).bearer_auth(api.token(user)))
        .await
        .expect(200)
}

/// A client's solver: counts up until SHA-256(`challenge:nonce`) has `bits` leading zeros.
fn solve(challenge: &str, bits: u32) -> String {
    (0u64..)
        .map(|n| n.to_string())
        .find(|n| {
            let hash = Sha256::digest(format!("{challenge}:{n}").as_bytes());
            let zeros = hash
                .iter()
                .position(|b| *b != 0)
                .map_or(256, |i| i as u32 * 8 + hash[i].leading_zeros());
            zeros >= bits
        })
        .unwrap()
}

async fn join_with(api: &Api, user: &str, deal: &str, solution: Option<&str>) -> Reply {
    let request = api
        .client
        .post(api.url(&format!("/v1/deals/{deal}/queue")))
        .bearer_auth(api.token(user));
    match solution {
        Some(solution) => send(request.header("Flashgate-Pow", solution)).await,
        None => send(request).await,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn joining_a_deal_with_a_challenge_takes_a_fresh_solution_of_the_user_for_the_deal() {
    // Arrange: two deals asking 8 bits; from 4 people waiting, each doubling adds a bit.
    let app = spawn_app_with(|s| {
        fast_room(s);
        s.waiting_room.pow_crowd_step = 4;
    })
    .await;
    let room = json!({"admit_per_second": 1, "max_active": 1, "pass_ttl_seconds": 60,
                      "pow_bits": 8});
    let deal = app
        .given_deal(&room_deal("wrpow", 10, room.clone(), json!({})))
        .await;
    let other = app
        .given_deal(&room_deal("wrpow2", 10, room, json!({})))
        .await;
    let issued = fetch_challenge(&app, "alice", &deal).await;
    assert_eq!(issued["difficulty_bits"], 8);
    assert_eq!(issued["algorithm"], "sha256-leading-zero-bits");
    let challenge = issued["challenge"].as_str().unwrap();
    let solution = format!("{challenge}:{}", solve(challenge, 8));

    // Act / Assert: without a solution, refused; with it, a ticket; never twice.
    join_with(&app, "alice", &deal, None)
        .await
        .expect_problem(403, "challenge-required");
    join_with(&app, "bob", &deal, Some(&solution))
        .await
        .expect_problem(403, "challenge-required");
    join_with(&app, "alice", &other, Some(&solution))
        .await
        .expect_problem(403, "challenge-required");
    let first = join_with(&app, "alice", &deal, Some(&solution))
        .await
        .expect(201);
    // A second use buys no second place: alice gets her one ticket back.
    let again = join_with(&app, "alice", &deal, Some(&solution)).await;
    assert_eq!(again.expect(201)["ticket"], first["ticket"]);

    // Expired, and too easy (issued below the deal's floor, or a nonce that misses it).
    let secret = &app.settings.waiting_room.pass_secret;
    let minted = Challenges::new(secret, app.settings.waiting_room.pow_challenge_ttl_seconds);
    let old = minted.issue(&deal, "carol", 8, Utc::now().timestamp_millis() - 600_000);
    let old = format!("{}:{}", old.challenge, solve(&old.challenge, 8));
    let expired = join_with(&app, "carol", &deal, Some(&old)).await;
    expired.expect_problem(403, "challenge-required");
    assert!(expired.text.contains("expired"), "{}", expired.text);
    // Issued by instances with other TTLs: the expiry they published is the one that
    // counts, not this gateway's own TTL (120 s).
    let now = Utc::now().timestamp_millis();
    let short = Challenges::new(secret, 10).issue(&deal, "carol", 8, now - 20_000);
    let short = format!("{}:{}", short.challenge, solve(&short.challenge, 8));
    let past_its_expiry = join_with(&app, "carol", &deal, Some(&short)).await;
    past_its_expiry.expect_problem(403, "challenge-required");
    assert!(
        past_its_expiry.text.contains("expired"),
        "{}",
        past_its_expiry.text
    );
    let long = Challenges::new(secret, 600).issue(&deal, "erin", 8, now - 300_000);
    let long = format!("{}:{}", long.challenge, solve(&long.challenge, 8));
    join_with(&app, "erin", &deal, Some(&long))
        .await
        .expect(201);
    let easy = minted.issue(&deal, "carol", 2, Utc::now().timestamp_millis());
    let easy = format!("{}:{}", easy.challenge, solve(&easy.challenge, 2));
    let weak = fetch_challenge(&app, "carol", &deal).await;
    let weak_challenge = weak["challenge"].as_str().unwrap();
    let miss = (0u64..)
        .find(|n| {
            let hash = Sha256::digest(format!("{weak_challenge}:{n}").as_bytes());
            hash[0] != 0
        })
        .unwrap();
    for bad in [easy, format!("{weak_challenge}:{miss}")] {
        let reply = join_with(&app, "carol", &deal, Some(&bad)).await;
        reply.expect_problem(403, "challenge-required");
        assert!(reply.text.contains("difficulty"), "{}", reply.text);
    }

    // The crowd raises the bar: 8 more people waiting (two doublings over 4) → 10 bits.
    for i in 0..8 {
        let user = format!("p{i}");
        let c = fetch_challenge(&app, &user, &deal).await;
        let challenge = c["challenge"].as_str().unwrap();
        let bits = c["difficulty_bits"].as_u64().unwrap() as u32;
        let solution = format!("{challenge}:{}", solve(challenge, bits));
        join_with(&app, &user, &deal, Some(&solution))
            .await
            .expect(201);
    }
    // The crowd is counted on the line state each instance holds, read again at most once
    // per `line_state_refresh_ms`.
    wait_until("the difficulty to rise", EVENTUALLY, || async {
        let raised = fetch_challenge(&app, "dave", &deal).await;
        match raised["difficulty_bits"].as_u64().unwrap() >= 10 {
            true => Ok(()),
            false => Err(raised.to_string()),
        }
    })
    .await;
    let metrics = app.metrics().await;
    assert!(metrics.contains("flashgate_waiting_room_challenges_total"));
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn joining_again_keeps_the_ticket_without_a_new_proof_of_work() {
    // Arrange: a deal asking 8 bits; alice pays for her place once.
    let app = spawn_app_with(fast_room).await;
    let room = json!({"admit_per_second": 1, "max_active": 1, "pass_ttl_seconds": 60,
                      "pow_bits": 8});
    let deal = app
        .given_deal(&room_deal("wrrejoin", 10, room, json!({})))
        .await;
    let issued = fetch_challenge(&app, "alice", &deal).await;
    let challenge = issued["challenge"].as_str().unwrap();
    let solution = format!("{challenge}:{}", solve(challenge, 8));
    let first = join_with(&app, "alice", &deal, Some(&solution))
        .await
        .expect(201);

    // Act: she leaves the page and comes back showing her signed position, with no
    // solution or a stale one.
    let token = first["position_token"].as_str().unwrap();
    let rejoin = |solution: Option<&'static str>| {
        let request = app
            .client
            .post(app.url(&format!("/v1/deals/{deal}/queue")))
            .bearer_auth(app.token("alice"))
            .header("Flashgate-Position", token);
        match solution {
            Some(solution) => send(request.header("Flashgate-Pow", solution)),
            None => send(request),
        }
    };
    let bare = rejoin(None).await;
    let stale = rejoin(Some("stale:0")).await;

    // Assert: the same ticket and place both times; a user without a ticket still pays,
    // and so does one who shows someone else's position.
    for again in [bare, stale] {
        let again = again.expect(201);
        assert_eq!(again["ticket"], first["ticket"]);
        assert_eq!(again["position"], first["position"]);
    }
    join_with(&app, "bob", &deal, None)
        .await
        .expect_problem(403, "challenge-required");
    let borrowed = app
        .client
        .post(app.url(&format!("/v1/deals/{deal}/queue")))
        .bearer_auth(app.token("bob"))
        .header("Flashgate-Position", token);
    send(borrowed)
        .await
        .expect_problem(403, "challenge-required");
    app.cleanup().await;
}

/// A verifier as a CDN worker would write it: only the published key set, no flashgate code.
fn verify_independently(pass: &str, key_set: &Value) -> Result<Value, String> {
    let parts: Vec<&str> = pass.split('.').collect();
    let [header, payload, signature] = parts[..] else {
        return Err("not a JWS compact serialization".into());
    };
    let decode = |part: &str| URL_SAFE_NO_PAD.decode(part).map_err(|e| e.to_string());
    let header: Value = serde_json::from_slice(&decode(header)?).map_err(|e| e.to_string())?;
    if header["alg"] != "EdDSA" {
        return Err("not EdDSA".into());
    }
    let jwk = key_set["keys"]
        .as_array()
        .and_then(|keys| keys.iter().find(|k| k["kid"] == header["kid"]))
        .ok_or("unknown key id")?;
    if jwk["kty"] != "OKP" || jwk["crv"] != "Ed25519" {
        return Err("not an Ed25519 key".into());
    }
    let x: [u8; 32] = decode(jwk["x"].as_str().ok_or("no x")?)?
        .try_into()
        .map_err(|_| "x is not 32 bytes")?;
    let key = VerifyingKey::from_bytes(&x).map_err(|e| e.to_string())?;
    let signature = Signature::from_slice(&decode(signature)?).map_err(|e| e.to_string())?;
    let signed = &pass[..pass.rfind('.').unwrap()];
    key.verify_strict(signed.as_bytes(), &signature)
        .map_err(|e| e.to_string())?;
    serde_json::from_slice(&decode(payload)?).map_err(|e| e.to_string())
}

fn seed(byte: u8) -> String {
    URL_SAFE_NO_PAD.encode([byte; 32])
}

#[tokio::test(flavor = "multi_thread")]
async fn ed25519_passes_verify_from_the_published_keys_and_rotate_with_overlap() {
    // Arrange: key A signs, key B is published ahead of its turn.
    let app = spawn_app_with(|s| {
        fast_room(s);
        s.waiting_room.pass_signing_keys = vec![seed(1), seed(2)];
    })
    .await;
    let room = json!({"admit_per_second": 100, "max_active": 10, "pass_ttl_seconds": 60});
    let deal = app
        .given_deal(&room_deal("wred", 10, room, json!({})))
        .await;
    let ticket = ticket_of(&join(&app, "alice", &deal).await.expect(201));
    let admitted = poll_until(&app, "alice", &deal, &ticket, &["admitted"], EVENTUALLY).await;
    let pass = admitted["pass"].as_str().unwrap().to_owned();

    // Act: fetch the key set as a CDN would.
    let reply = app.get("/.well-known/flashgate-keys.json").await;
    let cache = reply.header("cache-control").unwrap_or_default().to_owned();
    let key_set = reply.expect(200);

    // Assert: both keys published; the pass verifies with them alone and binds the sale.
    assert!(cache.starts_with("public"), "{cache}");
    assert_eq!(key_set["keys"].as_array().unwrap().len(), 2);
    let claims = verify_independently(&pass, &key_set).expect("pass verifies");
    assert_eq!(claims["d"], deal.as_str());
    assert_eq!(claims["u"], "alice");
    assert_eq!(claims["p"], ticket.as_str());
    assert!(claims["e"].as_i64().unwrap() > Utc::now().timestamp());
    let mut tampered = pass.clone().into_bytes();
    let at = pass.find('.').unwrap() + 3;
    tampered[at] = if tampered[at] == b'A' { b'B' } else { b'A' };
    let tampered = String::from_utf8(tampered).unwrap();
    assert!(verify_independently(&tampered, &key_set).is_err());

    // Rotation: B moves first (A still verifies), then A is dropped.
    let with_keys = |keys: Vec<String>| {
        let mut settings = app.settings.waiting_room.clone();
        settings.pass_signing_keys = keys;
        settings.pass_format = "ed25519".into();
        Passes::from_settings(&settings)
    };
    let now = Utc::now().timestamp();
    let rotated = with_keys(vec![seed(2), seed(1)]);
    assert!(
        rotated
            .verify(Some(pass.as_bytes()), &deal, "alice", now)
            .is_ok()
    );
    let new_pass = rotated.mint(&deal, "alice", now + 60, &ticket);
    assert!(
        verify_independently(&new_pass, &key_set).is_ok(),
        "B was published early"
    );
    assert_ne!(
        new_pass.split('.').next(),
        pass.split('.').next(),
        "a new key id"
    );
    let after = with_keys(vec![seed(2)]);
    assert!(
        after
            .verify(Some(pass.as_bytes()), &deal, "alice", now)
            .is_err()
    );
    assert!(
        after
            .verify(Some(new_pass.as_bytes()), &deal, "alice", now)
            .is_ok()
    );
    // The gateway accepts the pass for the order.
    order_with_pass(&app, "alice", &deal, Some(&pass))
        .await
        .expect(201);
    app.cleanup().await;
}
