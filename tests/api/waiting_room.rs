//! The waiting room on one gateway: tickets, polls, passes on orders, sold-out propagation,
//! abandonment and the verifiable random order.

use std::time::{Duration, Instant};

use flashgate::config::Settings;
use flashgate::waiting_room::Passes;
use flashgate::waiting_room::shuffle;
use serde_json::{Value, json};

use crate::helpers::{
    Api, Reply, TestApp, holds_for, send, spawn_app_with, unique_suffix, wait_until,
};

/// A deal with a waiting room (open now unless `extra` says otherwise).
pub fn room_deal(id: &str, stock: i64, room: Value, extra: Value) -> Value {
    let mut deal = json!({
        "id": id,
        "name": format!("Deal {id}"),
        "stock": stock,
        "buckets": 4,
        "unit_price_minor": 1000,
        "currency": "EUR",
        "per_user_limit": 1,
        "reservation_ttl_seconds": 300,
        "waiting_room": room,
    });
    if let (Some(deal), Some(extra)) = (deal.as_object_mut(), extra.as_object()) {
        deal.extend(extra.clone());
    }
    deal
}

pub async fn join(api: &Api, user: &str, deal: &str) -> Reply {
    let request = api.client.post(api.url(&format!("/v1/deals/{deal}/queue")));
    send(request.bearer_auth(api.token(user))).await
}

pub async fn poll(api: &Api, user: &str, deal: &str, ticket: &str) -> Reply {
    let request = api
        .client
        .get(api.url(&format!("/v1/deals/{deal}/queue/{ticket}")));
    send(request.bearer_auth(api.token(user))).await
}

pub async fn line(api: &Api, deal: &str) -> Value {
    api.get(&format!("/v1/deals/{deal}/queue"))
        .await
        .expect(200)
}

pub async fn order_with_pass(api: &Api, user: &str, deal: &str, pass: Option<&str>) -> Reply {
    let request = api
        .client
        .post(api.url(&format!("/v1/deals/{deal}/orders")))
        .bearer_auth(api.token(user))
        .header("Idempotency-Key", unique_suffix())
        .json(&json!({ "quantity": 1 }));
    let request = match pass {
        Some(pass) => request.header("Flashgate-Pass", pass),
        None => request,
    };
    send(request).await
}

/// Polls `user`'s ticket until its state is one of `states`; panics after `timeout`. A
/// 503 (Redis slower than the gateway's command timeout on a loaded runner) is polled
/// again, as the waiting page does; any other answer but 200 fails.
pub async fn poll_until(
    api: &Api,
    user: &str,
    deal: &str,
    ticket: &str,
    states: &[&str],
    timeout: Duration,
) -> Value {
    let what = format!("{user} to reach {states:?}");
    wait_until(&what, timeout, || async {
        let reply = poll(api, user, deal, ticket).await;
        if reply.status == 503 {
            return Err(reply.json());
        }
        let body = reply.expect(200);
        if states.contains(&body["state"].as_str().unwrap_or_default()) {
            Ok(body)
        } else {
            Err(body)
        }
    })
    .await
}

fn fast_room(s: &mut Settings) {
    s.waiting_room.stock_refresh_ms = 100;
    s.waiting_room.lease_ttl_ms = 1000;
}

async fn app() -> TestApp {
    spawn_app_with(fast_room).await
}

fn ticket_of(body: &Value) -> String {
    body["ticket"].as_str().expect("a ticket").to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn tickets_polls_and_passes_follow_the_contract() {
    // Arrange
    let app = app().await;
    let room = json!({"enabled": true, "admit_per_second": 50, "max_active": 100,
                      "pass_ttl_seconds": 60});
    let deal = app
        .given_deal(&room_deal("wr1", 10, room.clone(), json!({})))
        .await;
    let invalid = json!({"queue_order": "lifo"});
    app.create_deal(&room_deal("wrbad", 10, invalid, json!({})))
        .await
        .expect_problem(400, "invalid-request");
    let unknown = json!({"enabled": true, "colour": "red"});
    app.create_deal(&room_deal("wrbad", 10, unknown, json!({})))
        .await
        .expect_problem(400, "invalid-request");
    let other = app.given_deal(&room_deal("wr2", 10, room, json!({}))).await;

    // Act: alice joins twice, bob once.
    let first = join(&app, "alice", &deal).await;
    let again = join(&app, "alice", &deal).await;
    let bob = join(&app, "bob", &deal).await;

    // Assert: one place per user, dense positions, personal caching.
    let first_body = first.expect(201);
    assert_eq!(again.expect(201)["ticket"], first_body["ticket"]);
    assert_eq!(again.json()["position"], first_body["position"]);
    assert_eq!(first_body["position"], 1);
    assert_eq!(bob.expect(201)["position"], 2);
    assert_eq!(first.header("cache-control"), Some("private, no-store"));
    assert!(
        first
            .header("vary")
            .is_some_and(|v| v.to_ascii_lowercase().contains("authorization"))
    );
    let alice_ticket = ticket_of(&first_body);
    let bob_ticket = ticket_of(&bob.json());
    poll(&app, "bob", &deal, &alice_ticket)
        .await
        .expect_problem(404, "not-found");
    poll(&app, "alice", &other, &alice_ticket)
        .await
        .expect_problem(404, "not-found");

    // The public line is cacheable by a CDN.
    let public = app.get(&format!("/v1/deals/{deal}/queue")).await;
    assert_eq!(public.header("cache-control"), Some("public, max-age=1"));
    let public = public.expect(200);
    for field in ["admitted_through", "waiting", "admit_per_second", "state"] {
        assert!(public.get(field).is_some(), "{field} missing: {public}");
    }

    // No pass, no order.
    order_with_pass(&app, "alice", &deal, None)
        .await
        .expect_problem(403, "waiting-room-required");

    // Admitted: the poll carries a pass that places exactly the user's order.
    let alice = poll_until(
        &app,
        "alice",
        &deal,
        &alice_ticket,
        &["admitted"],
        EVENTUALLY,
    )
    .await;
    for field in [
        "position",
        "admitted_through",
        "ahead",
        "estimated_wait_seconds",
        "state",
        "pass",
        "refresh_after_seconds",
    ] {
        assert!(alice.get(field).is_some(), "{field} missing: {alice}");
    }
    let alice_pass = alice["pass"].as_str().unwrap().to_owned();
    let bob_body = poll_until(&app, "bob", &deal, &bob_ticket, &["admitted"], EVENTUALLY).await;
    let bob_pass = bob_body["pass"].as_str().unwrap().to_owned();

    // Forged, expired, other-user and other-deal passes are refused.
    let secret = &app.settings.waiting_room.pass_secret;
    let expired = Passes::new(secret).mint(&deal, "alice", chrono_now() - 1, &alice_ticket);
    let forged = Passes::new("not-the-gateway-secret").mint(&deal, "alice", chrono_now() + 60, "x");
    let (payload, _) = alice_pass.split_once('.').unwrap();
    let tampered = format!("{payload}.AAAA");
    for (pass, user, deal_id) in [
        (expired.as_str(), "alice", deal.as_str()),
        (forged.as_str(), "alice", deal.as_str()),
        (tampered.as_str(), "alice", deal.as_str()),
        (bob_pass.as_str(), "alice", deal.as_str()),
        (alice_pass.as_str(), "alice", other.as_str()),
        ("garbage", "alice", deal.as_str()),
    ] {
        order_with_pass(&app, user, deal_id, Some(pass))
            .await
            .expect_problem(403, "waiting-room-required");
    }
    let placed = order_with_pass(&app, "alice", &deal, Some(&alice_pass)).await;
    placed.expect(201);

    // Replaying the pass cannot go past the per-user limit.
    order_with_pass(&app, "alice", &deal, Some(&alice_pass))
        .await
        .expect_problem(409, "per-user-limit");
    let metrics = app.metrics().await;
    assert!(
        metrics.contains("flashgate_waiting_room_pass_rejections_total"),
        "pass rejections are counted"
    );
    assert_eq!(crate::helpers::order_count(&app.db).await, 1);
    let mut redis = crate::helpers::redis_connection(&app.settings.redis.url)
        .await
        .unwrap();
    let prefix = &app.settings.redis.key_prefix;
    for name in ["meta", "users", "t_adm", "active"] {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(format!("{prefix}wr:{{{deal}}}:{name}"))
            .query_async(&mut redis)
            .await
            .unwrap();
        assert!(ttl > 0, "{name} expires on its own (pttl {ttl})");
    }
    app.cleanup().await;
}

const EVENTUALLY: Duration = Duration::from_secs(5);

fn chrono_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

#[tokio::test(flavor = "multi_thread")]
async fn sold_out_reaches_waiting_users_and_returning_stock_resumes_the_line() {
    // Arrange: 2 units, 2 passes at a time (valid 3 s), 8 users in line.
    let app = app().await;
    let room = json!({"admit_per_second": 100, "max_active": 2, "pass_ttl_seconds": 3});
    let deal = app
        .given_deal(&room_deal("wrsold", 2, room, json!({})))
        .await;
    let mut tickets = Vec::new();
    for i in 0..8 {
        let user = format!("u{i}");
        let body = join(&app, &user, &deal).await.expect(201);
        tickets.push((user, ticket_of(&body)));
    }

    // Act: the first two buy the two units.
    let mut orders = Vec::new();
    for (user, ticket) in &tickets[..2] {
        let body = poll_until(&app, user, &deal, ticket, &["admitted"], EVENTUALLY).await;
        let reply = order_with_pass(&app, user, &deal, body["pass"].as_str()).await;
        orders.push((
            user.clone(),
            reply.expect(201)["order_id"].as_str().unwrap().to_owned(),
        ));
    }

    // Assert: everyone still waiting is told sold_out at their next poll, and stays unadmitted.
    app.wait_for_deal_state(&deal, "sold_out").await;
    let mut waiting = Vec::new();
    for (user, ticket) in &tickets[2..] {
        let body = poll(&app, user, &deal, ticket).await.expect(200);
        if body["state"] == "admitted" || body["state"] == "expired" {
            continue; // admitted before the sell-out was seen; its order would fail
        }
        let body = poll_until(&app, user, &deal, ticket, &["sold_out"], EVENTUALLY).await;
        assert_eq!(body["estimated_wait_seconds"], 0);
        waiting.push((user.clone(), ticket.clone()));
    }
    assert!(waiting.len() >= 4, "most of the line was told sold_out");
    assert_eq!(line(&app, &deal).await["state"], "sold_out");
    // Nothing changes while the line keeps moving.
    holds_for(
        "the line stays sold out",
        Duration::from_millis(500),
        || async {
            let mut sold_out = true;
            for (user, ticket) in &waiting {
                sold_out &=
                    poll(&app, user, &deal, ticket).await.expect(200)["state"] == "sold_out";
            }
            sold_out
        },
    )
    .await;

    // A cancelled order returns a unit: the line moves again once a slot is free (passes
    // handed out before the sell-out was seen hold theirs until they expire).
    let (user, order) = &orders[0];
    app.cancel_order(&app.token(user), order).await.expect(200);
    let (user, ticket) = &waiting[0];
    let resumed = Duration::from_secs(10);
    poll_until(&app, user, &deal, ticket, &["admitted"], resumed).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn abandoned_tickets_are_skipped() {
    // Arrange: one pass at a time, so the line waits behind the first buyer.
    let app = spawn_app_with(|s| {
        fast_room(s);
        s.waiting_room.abandon_after_seconds = 2;
        s.waiting_room.refresh_after_seconds_max = 1;
    })
    .await;
    let room = json!({"admit_per_second": 100, "max_active": 1, "pass_ttl_seconds": 60});
    let deal = app
        .given_deal(&room_deal("wrgone", 10, room, json!({})))
        .await;
    let first = ticket_of(&join(&app, "first", &deal).await.expect(201));
    let gone = ticket_of(&join(&app, "gone", &deal).await.expect(201));
    let keen = ticket_of(&join(&app, "keen", &deal).await.expect(201));
    let pass = poll_until(&app, "first", &deal, &first, &["admitted"], EVENTUALLY).await;

    // Act: "gone" stops polling; "keen" keeps polling for longer than the grace period.
    let until = Instant::now() + Duration::from_millis(2600);
    while Instant::now() < until {
        let body = poll(&app, "keen", &deal, &keen).await.expect(200);
        assert_eq!(body["state"], "waiting", "the slot is still taken: {body}");
        assert_eq!(body["ahead"], 1);
        // The grace period runs on the gateway's clock; keen polls at a client's pace.
        crate::helpers::pace(Duration::from_millis(300)).await;
    }
    order_with_pass(&app, "first", &deal, pass["pass"].as_str())
        .await
        .expect(201);

    // Assert: the used pass freed its slot, "gone" is skipped and "keen" admitted.
    let keen_body = poll_until(&app, "keen", &deal, &keen, &["admitted"], EVENTUALLY).await;
    assert_eq!(keen_body["admitted_through"], 3);
    let gone_body = poll(&app, "gone", &deal, &gone).await.expect(200);
    assert_eq!(gone_body["state"], "expired", "{gone_body}");
    assert!(
        app.metrics()
            .await
            .contains("flashgate_waiting_room_abandoned_total"),
        "abandonment is counted"
    );
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn random_order_is_a_permutation_reproducible_from_the_published_seed() {
    // Arrange: the pre-queue is open, the sale opens in three seconds.
    let app = app().await;
    let starts = chrono::Utc::now() + chrono::Duration::seconds(3);
    let room = json!({"admit_per_second": 1000, "max_active": 1000, "pass_ttl_seconds": 60,
                      "queue_order": "random",
                      "prequeue_opens_at": chrono::Utc::now() - chrono::Duration::seconds(5)});
    let extra = json!({"starts_at": starts});
    let deal = app.given_deal(&room_deal("wrrand", 100, room, extra)).await;
    let users: Vec<String> = (0..40).map(|i| format!("r{i}")).collect();
    let mut issued = Vec::new();
    for user in &users {
        let body = join(&app, user, &deal).await.expect(201);
        assert_eq!(body["state"], "waiting");
        issued.push((
            user.clone(),
            ticket_of(&body),
            body["position"].as_u64().unwrap(),
        ));
    }
    let mut positions: Vec<u64> = issued.iter().map(|(_, _, p)| *p).collect();
    positions.sort_unstable();
    assert_eq!(
        positions,
        (1..=40).collect::<Vec<u64>>(),
        "dense pre-queue positions"
    );
    let before = line(&app, &deal).await;
    assert_eq!(before["state"], "upcoming");
    let commitment = before["seed_sha256"]
        .as_str()
        .expect("hash published")
        .to_owned();
    assert!(
        before.get("seed").is_none(),
        "seed kept secret before opening"
    );
    order_with_pass(&app, "r0", &deal, None)
        .await
        .expect_problem(409, "sale-not-open");

    // Act: the sale opens.
    let after = wait_until(
        "the seed to be published",
        Duration::from_secs(10),
        || async {
            let body = line(&app, &deal).await;
            if body.get("seed").is_some() {
                Ok(body)
            } else {
                Err(body)
            }
        },
    )
    .await;

    // Assert: the seed matches the commitment and explains every new position.
    let seed = after["seed"].as_str().unwrap();
    assert_eq!(shuffle::commitment(seed), commitment);
    assert_eq!(after["seed_sha256"], commitment.as_str());
    assert_eq!(after["prequeue_size"], 40);
    let expected = shuffle::positions(seed, 40);
    for (user, ticket, issue) in &issued {
        let body = poll(&app, user, &deal, ticket).await.expect(200);
        assert_eq!(
            body["position"].as_u64().unwrap(),
            expected[*issue as usize - 1],
            "{user}"
        );
    }
    assert_ne!(
        expected,
        (1..=40).collect::<Vec<u64>>(),
        "the order was shuffled"
    );
    // A ticket taken after opening queues behind the shuffled pre-queue.
    assert_eq!(join(&app, "late", &deal).await.expect(201)["position"], 41);
    app.cleanup().await;
}
