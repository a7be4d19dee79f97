//! Graceful shutdown: stop accepting, let requests in flight finish, then exit.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::helpers::{new_deal, order_count, spawn_app};

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

    // Act: shut down, then finish the request.
    app.begin_shutdown();
    tokio::time::sleep(Duration::from_millis(300)).await;
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
