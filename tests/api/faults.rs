//! Faults that are not a crash of the gateway: one client holding every connection it can,
//! Redis coming back with an old sold-out flag, PostgreSQL down for over a minute (the
//! gateways stay up, answer 503 with `Retry-After`, recover) and deal changes announced
//! again after PostgreSQL restarts. In each, the provider delivers a payment's webhook
//! meanwhile, and the payment still reaches its order.

use std::time::{Duration, Instant};

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::helpers::{
    EVENTUALLY, PrivatePostgres, SETTLE, Sim, eventually, intent_id, new_deal, payment_settings,
    send, spawn_pay_app_with, spawn_sibling, test_settings, unique_suffix, wait_until,
};

/// A connection from `local` that sent a request and got an answer, or was closed unheard.
async fn answered_from(local: &str, addr: std::net::SocketAddr) -> Option<tokio::net::TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{local}:0").parse().unwrap()).unwrap();
    let mut stream = socket.connect(addr).await.ok()?;
    let request = format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut buf = [0u8; 512];
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await;
    match read {
        Ok(Ok(n)) if n > 0 && buf.starts_with(b"HTTP/1.1 200") => Some(stream),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn one_client_cannot_take_every_connection() {
    // Arrange: at most 4 connections per client address, 8 in all; an order waiting for
    // its payment.
    let app = spawn_pay_app_with(|s| {
        s.server.connections_per_client_max = 4;
        s.server.connections_max = 8;
    })
    .await;
    let deal = app.given_deal(&new_deal("capped", 10, 1)).await;
    let alice = app.token("alice");
    let order = app.place_order(&alice, &deal, "k1", 1).await.expect(201);

    // Act: one client tries to open every connection the gateway allows; another client
    // comes, and the provider delivers the payment's webhook.
    let mut held = Vec::new();
    for _ in 0..app.settings.server.connections_max {
        held.push(answered_from("127.0.0.2", app.addr).await);
    }
    let other = answered_from("127.0.0.3", app.addr).await;
    let (status, body) = app.sim.pay(&intent_id(&order)).await;
    assert_eq!(status, 200, "pay: {body}");

    // Assert
    let served = held.iter().filter(|c| c.is_some()).count();
    assert_eq!(served, 4, "one client gets its 4 connections and no more");
    assert!(other.is_some(), "another client is still served");
    let order_id = order["order_id"].as_str().unwrap();
    app.wait_for_order(&alice, order_id, &["PAID"], SETTLE)
        .await;
    // The gateway commits before it answers, so the simulator records the delivery just
    // after the order reads paid.
    wait_until("the webhook to get through", SETTLE, || async {
        let (_, delivered) = app.sim.succeeded_deliveries(&intent_id(&order)).await;
        delivered > 0
    })
    .await;
    drop(held);
    app.cleanup().await;
}

/// Sessions on `database_url` listening for deal changes (a listener's last statement is
/// its `LISTEN`), 0 while PostgreSQL cannot be reached.
async fn change_listeners(database_url: &str) -> i64 {
    use sqlx::Connection;
    let Ok(mut conn) = sqlx::PgConnection::connect(database_url).await else {
        return 0;
    };
    let sql = "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN %' || $1 || '%'";
    let listening = sqlx::query_scalar(sql)
        .bind(flashgate::deals::changes::CHANNEL)
        .fetch_one(&mut conn)
        .await;
    let _ = conn.close().await;
    listening.unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn an_old_sold_out_flag_restored_in_redis_does_not_stick() {
    // Arrange: a deal sold out, then restocked, then Redis comes back from an old snapshot
    // holding the sold-out flag.
    let app = spawn_pay_app_with(|s| s.sweeper.interval_ms = 100).await;
    let deal = app.given_deal(&new_deal("stale", 1, 1)).await;
    let first = app.token("first");
    let order = app.place_order(&first, &deal, "k1", 1).await.expect(201);
    app.wait_for_deal_state(&deal, "sold_out").await;
    app.adjust_stock(&deal, 5).await.expect(200);
    app.wait_for_deal_state(&deal, "open").await;
    let mut redis = crate::helpers::redis_connection(&app.settings.redis.url)
        .await
        .unwrap();
    let key = format!("{}soldout", app.settings.redis.key_prefix);

    // Act
    let _: i64 = redis::cmd("SADD")
        .arg(&key)
        .arg(&deal)
        .query_async(&mut redis)
        .await
        .unwrap();

    let (status, body) = app.sim.pay(&intent_id(&order)).await;
    assert_eq!(status, 200, "pay: {body}");

    // Assert: within a few refreshes the flag is gone and orders are taken; the payment's
    // webhook, sent while the flag was back, settled its order.
    let url = &app.settings.redis.url;
    wait_until(
        "the stale flag to be removed from Redis",
        Duration::from_millis(400),
        || async {
            let mut redis = crate::helpers::redis_connection(url).await.unwrap();
            let flagged: bool = redis::cmd("SISMEMBER")
                .arg(&key)
                .arg(&deal)
                .query_async(&mut redis)
                .await
                .unwrap();
            !flagged
        },
    )
    .await;
    assert_eq!(app.deal_state(&deal).await, "open");
    app.order("second", &deal, 1).await.expect(201);
    let order_id = order["order_id"].as_str().unwrap();
    app.wait_for_order(&first, order_id, &["PAID"], SETTLE)
        .await;
    // Counted by the simulator once it reads the answer sent after the commit.
    wait_until("the webhook to get through", SETTLE, || async {
        let (_, delivered) = app.sim.succeeded_deliveries(&intent_id(&order)).await;
        delivered > 0
    })
    .await;
    app.assert_invariants(&deal).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_down_for_over_a_minute_then_back() {
    // Arrange: two gateways on a PostgreSQL of their own; deal settings cached for a
    // minute, so only an announcement can spread a pause quickly. An order waits for its
    // payment, whose webhook goes to the first gateway.
    let postgres = PrivatePostgres::start().await;
    let sim = Sim::start().await;
    let mut settings = test_settings(&postgres.url());
    payment_settings(&mut settings, &sim.base);
    settings.deals.cache_ttl_ms = 60_000;
    settings.redis.key_prefix = format!("fgtest:{}:", unique_suffix());
    let a = spawn_sibling(&settings).await;
    let b = spawn_sibling(&settings).await;
    sim.set_webhook_url(&a.public_url("/v1/webhooks/sim")).await;
    let deal = a.given_deal(&new_deal("outage", 1000, 4)).await;
    let payer = b.token("payer");
    let order = b.place_order(&payer, &deal, "before", 1).await.expect(201);
    let intent = intent_id(&order);

    // Act 1: PostgreSQL is down for 65 s; the payer pays meanwhile.
    postgres.down();
    let (status, body) = sim.pay(&intent).await;
    assert_eq!(status, 200, "pay: {body}");
    let down_until = Instant::now() + Duration::from_secs(65);
    let mut orders = Vec::new();
    let mut n = 0;
    while Instant::now() < down_until {
        for api in [&a.api, &b.api] {
            assert_eq!(
                api.get("/healthz").await.status,
                200,
                "the gateway stays up"
            );
            assert_eq!(
                api.get("/readyz").await.status,
                503,
                "not ready without PostgreSQL"
            );
            n += 1;
            orders.push(api.order(&format!("during-{n}"), &deal, 1).await);
        }
        // The outage lasts its minute whatever the gateways do: it is the input here.
        crate::helpers::pace(Duration::from_secs(5)).await;
    }
    let (tries, acknowledged) = sim.succeeded_deliveries(&intent).await;
    postgres.up();

    // Assert 1: every order during the outage was 503 with Retry-After, none stored; the
    // webhook was tried and never acknowledged, so it cannot have been lost.
    assert!(tries > 0, "the webhook was sent during the outage");
    assert_eq!(
        acknowledged, 0,
        "no webhook acknowledged without PostgreSQL"
    );
    for reply in &orders {
        assert_eq!(reply.status, 503, "{}", reply.text);
        assert!(reply.header("retry-after").is_some(), "{:?}", reply.headers);
    }
    for api in [&a.api, &b.api] {
        let recovered = eventually(Duration::from_secs(20), || async {
            (api.order(&unique_suffix(), &deal, 1).await.status == 201).then_some(())
        })
        .await;
        assert!(
            recovered.is_some(),
            "{} never took an order again",
            api.base
        );
    }
    let paid = eventually(Duration::from_secs(30), || async {
        let reply = a
            .get_order(&payer, order["order_id"].as_str().unwrap())
            .await;
        (reply.status == 200 && reply.json()["status"] == "PAID").then_some(())
    })
    .await;
    assert!(
        paid.is_some(),
        "the payment made during the outage was lost"
    );

    // Act 2: once both listeners are back (each retries every second; ten seconds leave
    // room for a loaded runner), a pause on one instance...
    wait_until(
        "both deal change listeners back",
        Duration::from_secs(10),
        || async { change_listeners(&postgres.url()).await >= 2 },
    )
    .await;
    let request = a.client.post(a.url(&format!("/admin/deals/{deal}/pause")));
    send(request.bearer_auth(&a.admin_token).json(&json!({})))
        .await
        .expect(200);

    // Assert 2: ...reaches the other through the announcement, not the minute-long cache.
    let paused = eventually(EVENTUALLY, || async {
        let reply = b.order(&unique_suffix(), &deal, 1).await;
        (reply.status == 409 && reply.problem_slug().as_deref() == Some("sale-not-open"))
            .then_some(())
    })
    .await;
    assert!(
        paused.is_some(),
        "the pause never reached the other instance"
    );
    tokio::join!(a.stop(), b.stop());
    crate::helpers::delete_redis_keys(&settings.redis.url, &settings.redis.key_prefix).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn without_postgresql_the_waiting_page_is_the_standard_one_uncached() {
    // Arrange: a gateway that reads deals afresh each time, on a PostgreSQL of its own.
    let postgres = PrivatePostgres::start().await;
    let mut settings = test_settings(&postgres.url());
    settings.deals.cache_ttl_ms = 0;
    settings.redis.key_prefix = format!("fgtest:{}:", unique_suffix());
    let gateway = spawn_sibling(&settings).await;
    let deal = gateway.given_deal(&new_deal("page", 10, 1)).await;
    let before = gateway.get(&format!("/wait/{deal}")).await;
    assert_eq!(before.status, 200, "{}", before.text);
    assert_ne!(before.header("cache-control"), Some("no-store"));

    // Act: PostgreSQL goes away.
    postgres.down();
    let page = gateway.get(&format!("/wait/{deal}")).await;
    postgres.up();

    // Assert: the page a buyer opens is still the waiting page, kept by no cache.
    assert_eq!(page.status, 200, "{}", page.text);
    assert_eq!(page.header("cache-control"), Some("no-store"));
    assert!(page.text.contains("flashgate-i18n"), "{}", page.text);
}
