//! Graceful shutdown: stop accepting, let requests in flight finish, then exit.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::helpers::{EVENTUALLY, new_deal, order_count, spawn_app, spawn_app_with, wait_until};

#[tokio::test(flavor = "multi_thread")]
async fn request_in_flight_at_shutdown_still_completes() {
    // Arrange: an order whose body is only half sent.
    let mut app = spawn_app().await;
    let deal = app.given_deal(&new_deal("drain", 5, 1)).await;
    let body: &'static [u8] = br#"{"quantity":1}"#;
    let head = format!(
        "POST /v1/deals/{deal}/orders HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\n\
         Idempotency-Key: in-flight\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        app.addr,
        app.token("alice"),
        body.len()
    );
    let mut stream = TcpStream::connect(app.addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(&body[..5]).unwrap();
    // Nothing observable says the server has parsed the head; give it a moment.
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Act: shut down, then finish the request once the server accepts no more connections.
    app.begin_shutdown();
    let addr = app.addr;
    wait_until("the listener to close", EVENTUALLY, || async {
        TcpStream::connect(addr).is_err()
    })
    .await;
    let response = tokio::task::spawn_blocking(move || {
        stream.write_all(&body[5..])?;
        let mut response = String::new();
        stream.read_to_string(&mut response)?;
        Ok::<_, std::io::Error>(response)
    })
    .await
    .unwrap()
    .expect("the in-flight request gets its response");

    // Assert
    assert!(response.starts_with("HTTP/1.1 201"), "response: {response}");
    app.stop()
        .await
        .expect("run() returns Ok after a graceful shutdown");
    assert!(
        TcpStream::connect(app.addr).is_err(),
        "the port still accepts connections"
    );
    assert_eq!(order_count(&app.db).await, 1);
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn shutdown_with_only_idle_connections_is_prompt() {
    // Arrange: the client keeps idle keep-alive connections to the server.
    let mut app = spawn_app().await;
    let deal = app.given_deal(&new_deal("idle", 5, 1)).await;
    app.get_deal(&deal).await.expect(200);

    // Act
    let started = Instant::now();
    let stopped = app.stop().await;

    // Assert: idle connections do not hold the process for the whole grace period.
    stopped.expect("run() returns Ok");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "shutdown took {:?}",
        started.elapsed()
    );
    assert!(
        TcpStream::connect(app.addr).is_err(),
        "the port still accepts connections"
    );
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn readiness_fails_at_once_while_requests_are_still_served() {
    // Arrange
    let mut app = spawn_app_with(|s| s.server.drain_delay_ms = 1500).await;
    let deal = app.given_deal(&new_deal("ready", 5, 1)).await;
    app.get("/readyz").await.expect(200);

    // Act
    app.begin_shutdown();
    let ready = wait_until("readiness to fail", Duration::from_millis(500), || async {
        let ready = app.get("/readyz").await;
        if ready.status == 503 {
            Ok(ready)
        } else {
            Err(ready.text)
        }
    })
    .await;
    let served = app.get_deal(&deal).await;

    // Assert: not ready, still serving, each answer closing its connection.
    assert_eq!(ready.json()["shutting_down"], true);
    served.expect(200);
    assert_eq!(served.header("connection"), Some("close"));
    let started = Instant::now();
    app.stop().await.expect("run() returns Ok");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(TcpStream::connect(app.addr).is_err());
    app.cleanup().await;
}

/// Reads one connection until the server closes it.
async fn read_all(mut stream: tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut response = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut response));
    let _ = read.await;
    String::from_utf8_lossy(&response).into_owned()
}

/// Keeps `clients` keep-alive connections busy with deal reads until the gateway stops.
fn keep_busy(app: &crate::helpers::TestApp, deal: &str, clients: usize) {
    for _ in 0..clients {
        let api = app.api.clone();
        let url = api.url(&format!("/v1/deals/{deal}"));
        tokio::spawn(async move { while api.client.get(&url).send().await.is_ok() {} });
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_burst_written_just_before_the_signal_is_answered_in_full() {
    use tokio::io::AsyncWriteExt;
    for drain_delay_ms in [0, 200, 0] {
        // Arrange: 32 busy keep-alive clients and 200 connections, each with a complete
        // order written just before the signal.
        // Connections may be slow to come on a loaded machine: this is about draining, not
        // about the pool's acquire timeout.
        let mut app = spawn_app_with(|s| {
            s.server.drain_delay_ms = drain_delay_ms;
            s.database.acquire_timeout_ms = 10_000;
        })
        .await;
        let mut deal_body = new_deal("burst", 100_000, 8);
        deal_body["per_user_limit"] = 1.into();
        let deal = app.given_deal(&deal_body).await;
        keep_busy(&app, &deal, 32);
        let body = r#"{"quantity":1}"#;
        let requests: Vec<String> = (0..200)
            .map(|i| {
                format!(
                    "POST /v1/deals/{deal}/orders HTTP/1.1\r\nHost: {}\r\n\
                     Authorization: Bearer {}\r\nIdempotency-Key: burst\r\n\
                     Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                    app.addr,
                    app.token(&format!("user-{i}")),
                    body.len()
                )
            })
            .collect();
        let mut connections = Vec::new();
        for request in &requests {
            let mut stream = tokio::net::TcpStream::connect(app.addr).await.unwrap();
            stream.write_all(request.as_bytes()).await.unwrap();
            connections.push(stream);
        }

        // Act
        app.begin_shutdown();
        let readers: Vec<_> = connections
            .into_iter()
            .map(|stream| tokio::spawn(read_all(stream)))
            .collect();
        let mut lost = Vec::new();
        for (i, reader) in readers.into_iter().enumerate() {
            let response = reader.await.unwrap();
            if !response.starts_with("HTTP/1.1 201") || !response.contains("order_id") {
                lost.push(format!("user-{i}: {response:?}"));
            }
        }
        let stopped = app.stop().await;

        // Assert: every request whose bytes had arrived was answered and exists.
        assert!(
            lost.is_empty(),
            "drain delay {drain_delay_ms} ms: {} of 200 lost:\n{}",
            lost.len(),
            lost.join("\n")
        );
        stopped.expect("run() returns Ok");
        assert_eq!(order_count(&app.db).await, 200);
        app.cleanup().await;
    }
}
