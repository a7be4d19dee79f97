//! The waiting room beyond the basics, on one gateway: the first-second burst, the sold-out
//! admission bound over a crowd much larger than the stock, honest odds, the proof-of-work
//! challenge, and Ed25519 passes checked by a verifier written here from the published keys.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::Utc;
use ed25519_dalek::{Signature, VerifyingKey};
use flashgate::config::Settings;
use flashgate::waiting_room::{Challenges, Passes};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::helpers::{Api, Reply, TestApp, send, spawn_app_with};
use crate::waiting_room::{join, line, order_with_pass, poll, poll_until, room_deal};

const EVENTUALLY: Duration = Duration::from_secs(5);

fn fast_room(s: &mut Settings) {
    s.waiting_room.stock_refresh_ms = 100;
    s.waiting_room.lease_ttl_ms = 1000;
}

fn ticket_of(body: &Value) -> String {
    body["ticket"].as_str().expect("a ticket").to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_sale_opens_with_a_burst_not_a_second_late() {
    // Arrange: 2 admissions a second with a 2-second burst; eight people pre-queued.
    let app = spawn_app_with(|s| {
        fast_room(s);
        s.waiting_room.burst_ms = 2000;
    })
    .await;
    let starts = Utc::now() + chrono::Duration::seconds(3);
    let room = json!({"admit_per_second": 2, "max_active": 100, "pass_ttl_seconds": 60,
                      "prequeue_opens_at": Utc::now() - chrono::Duration::seconds(5)});
    let deal = app
        .given_deal(&room_deal(
            "wrburst",
            50,
            room,
            json!({"starts_at": starts}),
        ))
        .await;
    for i in 0..8 {
        join(&app, &format!("b{i}"), &deal).await.expect(201);
    }
    assert_eq!(line(&app, &deal).await["admitted_through"], 0);

    // Act: wait for the opening, then watch the line.
    let until_open = (starts - Utc::now()).to_std().unwrap_or_default();
    tokio::time::sleep(until_open).await;
    let opened = Instant::now();
    let (mut first, mut four) = (None, None);
    while four.is_none() && opened.elapsed() < Duration::from_secs(5) {
        let through = line(&app, &deal).await["admitted_through"]
            .as_u64()
            .unwrap();
        if through >= 1 && first.is_none() {
            first = Some(opened.elapsed());
        }
        if through >= 4 {
            four = Some(opened.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Assert: the burst (2/s × 2 s = 4) is admitted at the opening; at the bare rate the
    // fourth admission would take two seconds and the first half a second.
    let (first, four) = (first.expect("admitted"), four.expect("four admitted"));
    eprintln!("burst: first admission {first:?}, fourth {four:?} after the opening");
    assert!(
        four < Duration::from_millis(900),
        "fourth admitted after {four:?}"
    );
    assert!(
        first < Duration::from_millis(500),
        "first admitted after {first:?}"
    );
    app.cleanup().await;
}

/// What the crowd test measured.
#[derive(Default)]
struct Tally {
    ordered: AtomicUsize,
    refused_sold_out: AtomicUsize,
    abandoned: AtomicUsize,
    cancelled: AtomicUsize,
    told_sold_out: AtomicUsize,
    /// Buyers too slow for their pass (a loaded machine): refused 403, not sold out.
    too_late: AtomicUsize,
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crowd_ten_times_the_stock_is_never_admitted_into_a_sold_out_sale() {
    // Arrange: 20 units, 200 buyers, passes valid 8 s. Some admitted buyers never use their
    // pass, some cancel at once (the unit returns), the rest buy.
    let app = Arc::new(
        spawn_app_with(|s| {
            fast_room(s);
            s.waiting_room.refresh_after_seconds_max = 1;
        })
        .await,
    );
    let room = json!({"admit_per_second": 100, "max_active": 8, "pass_ttl_seconds": 8});
    let deal = app
        .given_deal(&room_deal("wrcrowd", 20, room, json!({})))
        .await;
    let users: Vec<String> = (0..200).map(|i| format!("c{i}")).collect();
    let mut tickets = Vec::new();
    for user in &users {
        tickets.push((
            user.clone(),
            ticket_of(&join(&app, user, &deal).await.expect(201)),
        ));
    }
    let tally = Arc::new(Tally::default());
    let finished = Arc::new(AtomicBool::new(false));

    // Act: every buyer polls until admitted (then acts) or until the sale is over.
    let monitor = tokio::spawn(watch_bound(app.clone(), deal.clone(), finished.clone()));
    let mut buyers = Vec::new();
    for (i, (user, ticket)) in tickets.into_iter().enumerate() {
        let (app, deal, tally, finished) =
            (app.clone(), deal.clone(), tally.clone(), finished.clone());
        buyers.push(tokio::spawn(async move {
            buyer(&app, i, &user, &deal, &ticket, &tally, &finished).await
        }));
    }
    let over_max = monitor.await.unwrap();
    for buyer in buyers {
        buyer.await.unwrap();
    }

    // Assert: nobody holding a pass met a sold-out sale; every unit was bought; everyone
    // still waiting was told the sale is sold out.
    let t = |c: &AtomicUsize| c.load(Ordering::SeqCst);
    eprintln!(
        "crowd: ordered {}, cancelled {}, abandoned {}, too late {}, refused sold out {}, \
         told sold out {}, max(passes outstanding - units available) sampled {over_max}",
        t(&tally.ordered),
        t(&tally.cancelled),
        t(&tally.abandoned),
        t(&tally.too_late),
        t(&tally.refused_sold_out),
        t(&tally.told_sold_out)
    );
    assert_eq!(
        t(&tally.refused_sold_out),
        0,
        "admitted into a sold-out sale"
    );
    assert_eq!(
        t(&tally.ordered) - t(&tally.cancelled),
        20,
        "every unit sold"
    );
    assert!(
        t(&tally.told_sold_out) >= 150,
        "the waiting crowd was told sold out"
    );
    let active: i64 = sqlx::query_scalar(
        "SELECT COALESCE(sum(available), 0)::bigint FROM inventory_buckets WHERE deal_id = $1",
    )
    .bind(&deal)
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(active, 0);
    app.assert_invariants(&deal).await;
    Arc::into_inner(app)
        .expect("all tasks done")
        .cleanup()
        .await;
}

/// One buyer of the crowd test.
async fn buyer(
    app: &TestApp,
    i: usize,
    user: &str,
    deal: &str,
    ticket: &str,
    tally: &Tally,
    finished: &AtomicBool,
) {
    let deadline = Instant::now() + Duration::from_secs(90);
    let url = app.url(&format!("/v1/deals/{deal}/queue/{ticket}"));
    let token = app.token(user);
    while Instant::now() < deadline {
        // A loaded machine may drop a connection or answer 503: poll again.
        let reply = app.client.get(&url).bearer_auth(&token).send().await;
        let Some(body) = ok_json(reply).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        match body["state"].as_str().unwrap_or_default() {
            "admitted" => return act(app, i, user, deal, &body, tally).await,
            "expired" => return,
            "sold_out" if finished.load(Ordering::SeqCst) => {
                tally.told_sold_out.fetch_add(1, Ordering::SeqCst);
                return;
            }
            _ => {}
        }
        let refresh = body["refresh_after_seconds"].as_u64().unwrap_or(1);
        let jitter = (i % 10) as u64 * 30;
        tokio::time::sleep(Duration::from_millis(refresh * 800 + jitter)).await;
    }
    panic!("{user} was never decided");
}

/// Orders with one idempotency key, again after a dropped connection.
async fn order_retrying(app: &TestApp, user: &str, deal: &str, pass: &str) -> Reply {
    let key = crate::helpers::unique_suffix();
    for _ in 0..10 {
        let request = app
            .client
            .post(app.url(&format!("/v1/deals/{deal}/orders")))
            .bearer_auth(app.token(user))
            .header("Idempotency-Key", &key)
            .header("Flashgate-Pass", pass)
            .json(&json!({ "quantity": 1 }));
        if let Ok(response) = request.send().await {
            return Reply::from(response).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("{user}: the order never reached the gateway");
}

async fn ok_json(reply: Result<reqwest::Response, reqwest::Error>) -> Option<Value> {
    let response = reply.ok().filter(|r| r.status() == 200)?;
    response.json().await.ok()
}

/// An admitted buyer: one in seven walks away, one in five cancels at once, the rest buy.
async fn act(app: &TestApp, i: usize, user: &str, deal: &str, body: &Value, tally: &Tally) {
    if i % 7 == 3 {
        tally.abandoned.fetch_add(1, Ordering::SeqCst);
        return;
    }
    let placed = order_retrying(app, user, deal, body["pass"].as_str().unwrap_or_default()).await;
    match placed.status {
        201 => {
            tally.ordered.fetch_add(1, Ordering::SeqCst);
            if i % 5 == 1 {
                let order = placed.json()["order_id"].as_str().unwrap().to_owned();
                app.cancel_order(&app.token(user), &order).await.expect(200);
                tally.cancelled.fetch_add(1, Ordering::SeqCst);
            }
        }
        409 if placed.problem_slug().as_deref() == Some("sold-out") => {
            tally.refused_sold_out.fetch_add(1, Ordering::SeqCst);
        }
        403 if placed.text.contains("expired") => {
            tally.too_late.fetch_add(1, Ordering::SeqCst);
        }
        _ => panic!("{user}: unexpected order answer {}", placed.text),
    }
}

/// Samples passes outstanding against units available until the sale has been sold out,
/// with no pass outstanding, for a second; returns the largest excess seen (orders in
/// flight between the two reads show as +1 each).
async fn watch_bound(app: Arc<TestApp>, deal: String, finished: Arc<AtomicBool>) -> i64 {
    let mut redis = redis::Client::open(app.settings.redis.url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let active_key = format!("{}wr:{deal}:active", app.settings.redis.key_prefix);
    let over_max = AtomicI64::new(i64::MIN);
    let mut quiet_since: Option<Instant> = None;
    let deadline = Instant::now() + Duration::from_secs(80);
    while Instant::now() < deadline {
        let now_ms = Utc::now().timestamp_millis();
        let active: Result<i64, _> = redis::cmd("ZCOUNT")
            .arg(&active_key)
            .arg(now_ms)
            .arg("+inf")
            .query_async(&mut redis)
            .await;
        let Ok(active) = active else {
            continue; // a slow answer on a loaded machine: sample again
        };
        let available: i64 = sqlx::query_scalar(
            "SELECT COALESCE(sum(available), 0)::bigint FROM inventory_buckets WHERE deal_id = $1",
        )
        .bind(&deal)
        .fetch_one(&app.db)
        .await
        .unwrap();
        over_max.fetch_max(active - available, Ordering::SeqCst);
        let quiet = available == 0 && active == 0;
        quiet_since = if quiet {
            quiet_since.or(Some(Instant::now()))
        } else {
            None
        };
        if quiet_since.is_some_and(|q| q.elapsed() > Duration::from_secs(1)) {
            finished.store(true, Ordering::SeqCst);
            return over_max.load(Ordering::SeqCst);
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the sale never finished");
}

#[tokio::test(flavor = "multi_thread")]
async fn polls_tell_the_odds_from_what_the_line_keeps() {
    // Arrange: 3 units, one pass at a time, six people in line.
    let app = spawn_app_with(fast_room).await;
    let room = json!({"admit_per_second": 100, "max_active": 1, "pass_ttl_seconds": 60});
    let deal = app
        .given_deal(&room_deal("wrodds", 3, room, json!({})))
        .await;
    let mut tickets = Vec::new();
    for i in 0..6 {
        let user = format!("o{i}");
        tickets.push((
            user.clone(),
            ticket_of(&join(&app, &user, &deal).await.expect(201)),
        ));
    }
    let (first, first_ticket) = &tickets[0];
    poll_until(&app, first, &deal, first_ticket, &["admitted"], EVENTUALLY).await;

    // Act
    let (second, second_ticket) = &tickets[1];
    let (last, last_ticket) = &tickets[5];
    let near = poll(&app, second, &deal, second_ticket).await.expect(200);
    let far = poll(&app, last, &deal, last_ticket).await.expect(200);

    // Assert: one pass promises one of the three units; two are left for the line.
    for body in [&near, &far] {
        assert_eq!(body["units_left"], 2, "{body}");
        let ahead = body["ahead"].as_f64().unwrap();
        let chance = body["chance_of_units"].as_f64().unwrap();
        assert!(
            (chance - (2.0 / (ahead + 1.0)).min(1.0)).abs() < 1e-9,
            "{body}"
        );
    }
    assert_eq!(near["ahead"], 0);
    assert_eq!(near["likely_sold_out"], false);
    assert_eq!(far["ahead"], 4);
    assert_eq!(far["likely_sold_out"], true);
    app.cleanup().await;
}

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
    join_with(&app, "alice", &deal, Some(&solution))
        .await
        .expect(201);
    let replayed = join_with(&app, "alice", &deal, Some(&solution)).await;
    replayed.expect_problem(403, "challenge-required");
    assert!(replayed.text.contains("already used"), "{}", replayed.text);

    // Expired, and too easy (issued below the deal's floor, or a nonce that misses it).
    let secret = &app.settings.waiting_room.pass_secret;
    let minted = Challenges::new(secret, app.settings.waiting_room.pow_challenge_ttl_seconds);
    let old = minted.issue(&deal, "carol", 8, Utc::now().timestamp_millis() - 600_000);
    let old = format!("{}:{}", old.challenge, solve(&old.challenge, 8));
    let expired = join_with(&app, "carol", &deal, Some(&old)).await;
    expired.expect_problem(403, "challenge-required");
    assert!(expired.text.contains("expired"), "{}", expired.text);
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
    let raised = fetch_challenge(&app, "dave", &deal).await;
    assert!(
        raised["difficulty_bits"].as_u64().unwrap() >= 10,
        "{raised}"
    );
    let metrics = app.metrics().await;
    assert!(metrics.contains("flashgate_waiting_room_challenges_total"));
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
