//! Request bodies the gateway refuses on a pipelined keep-alive connection: one over
//! `server.body_bytes_max` is refused and the answer says the connection closes; one
//! refused before it is read (a sold-out deal, an unauthorized cancel) is read to its end,
//! slowly if it arrives slowly, so the next request on the connection is still answered,
//! unless the body stops arriving.

use std::time::Duration;

use flashgate::config::Settings;
use tokio::io::AsyncWriteExt;

use crate::helpers::{new_deal, spawn_app_with};
use crate::pipelining::{
    Answer, Answers, Cut, Framing, READ_BYTES, order, pipeline, rand_id, sold_out_deal, write_cut,
};

/// An order whose declared body is `length` bytes, of which only `sent` are written.
fn oversized_order(deal: &str, token: &str, length: usize, sent: usize) -> Vec<u8> {
    let mut request = format!(
        "POST /v1/deals/{deal}/orders HTTP/1.1\r\nHost: gateway\r\n\
         Authorization: Bearer {token}\r\nIdempotency-Key: oversized\r\n\
         X-Request-Id: big-0\r\nContent-Type: application/json\r\n\
         Content-Length: {length}\r\n\r\n"
    )
    .into_bytes();
    request.extend(std::iter::repeat_n(b' ', sent));
    request
}

#[tokio::test]
async fn an_oversized_body_is_refused_and_the_answer_closes_the_connection() {
    let app = spawn_app_with(|_| {}).await;
    let sold_out = sold_out_deal(&app).await;
    let open = app
        .given_deal(&new_deal(&format!("pipe-{}", rand_id()), 1000, 4))
        .await;
    let token = app.token("pipelining-user");
    let over = app.settings.server.body_bytes_max + 1;

    for (deal, status) in [(&sold_out, 409), (&open, 413)] {
        // The next request follows the part of the body written so far.
        let mut requests = vec![oversized_order(deal, &token, over, 3 * READ_BYTES)];
        requests.push(order(deal, &token, "big", 1, Framing::Length));
        let (mut answers, mut writer) = Answers::connect(app.addr).await;
        assert!(write_cut(&mut writer, &requests.concat(), Cut::Whole).await);

        let first = answers
            .next()
            .await
            .expect("the oversized request is answered");

        assert_eq!(
            first.status,
            status,
            "{:?}",
            String::from_utf8_lossy(&first.body)
        );
        assert!(
            first.closes(),
            "the {status} answer does not say the connection closes"
        );
        assert!(
            answers.ended().await,
            "the connection stays open after Connection: close"
        );
    }
    app.cleanup().await;
}

/// An order on `deal` declaring a body of `length` bytes; the body is written separately.
fn order_head(deal: &str, token: &str, tag: &str, length: usize) -> Vec<u8> {
    format!(
        "POST /v1/deals/{deal}/orders HTTP/1.1\r\nHost: gateway\r\n\
         Authorization: Bearer {token}\r\nIdempotency-Key: {tag}-key\r\n\
         X-Request-Id: {tag}\r\nContent-Type: application/json\r\n\
         Content-Length: {length}\r\n\r\n"
    )
    .into_bytes()
}

/// Header and body timeouts short enough for a test to outlast them.
const SHORT_HEADER_READ_MS: u64 = 150;
const SHORT_BODY_READ_MS: u64 = 600;

/// Short timeouts, and the deal cached for longer than the test: when a cached deal goes
/// stale, the request that re-reads it reads its body first, and a stalled body would be
/// a 408 rather than the refusal from memory under test.
fn short_timeouts(s: &mut Settings) {
    s.server.header_read_timeout_ms = SHORT_HEADER_READ_MS;
    s.server.body_read_timeout_ms = SHORT_BODY_READ_MS;
    s.deals.cache_ttl_ms = 60_000;
}

#[tokio::test]
async fn a_refused_body_arriving_slowly_is_read_to_its_end_and_the_connection_kept() {
    let app = spawn_app_with(short_timeouts).await;
    let deal = sold_out_deal(&app).await;
    let token = app.token("pipelining-user");
    let body = br#"{"quantity":1}"#;
    let (mut answers, mut writer) = Answers::connect(app.addr).await;

    // The body takes longer than the header read timeout, within the body read timeout.
    writer
        .write_all(&order_head(&deal, &token, "slow-0", body.len()))
        .await
        .unwrap();
    for piece in body.chunks(5) {
        // The slow client is the case under test.
        crate::helpers::pace(Duration::from_millis(SHORT_HEADER_READ_MS)).await;
        let sent = writer.write_all(piece).await;
        sent.expect("the connection stays open while the body arrives");
    }
    let mut next = order_head(&deal, &token, "slow-1", body.len());
    next.extend_from_slice(body);
    writer.write_all(&next).await.unwrap();

    for tag in ["slow-0", "slow-1"] {
        let answer = answers.next().await.expect("answered");
        assert_eq!(answer.status, 409);
        assert_eq!(answer.header("x-request-id"), Some(tag));
        assert!(!answer.closes(), "{tag} closes the connection");
    }
    app.cleanup().await;
}

#[tokio::test]
async fn a_refused_body_that_stops_arriving_is_answered_and_the_connection_closed() {
    let app = spawn_app_with(short_timeouts).await;
    let deal = sold_out_deal(&app).await;
    let token = app.token("pipelining-user");
    let (mut answers, mut writer) = Answers::connect(app.addr).await;

    let mut request = order_head(&deal, &token, "stalled", 100);
    request.extend_from_slice(br#"{"quantity""#);
    writer.write_all(&request).await.unwrap();

    let answer = answers.next().await.expect("the refusal is answered");
    assert_eq!(answer.status, 409);
    assert!(
        answer.closes(),
        "the answer does not say the connection closes"
    );
    assert!(
        answers.ended().await,
        "the connection stays open after Connection: close"
    );
    app.cleanup().await;
}

/// A request to cancel an order without a token, with a body of varying size: refused
/// before the body is read, after the router has matched it.
fn unauthorized_cancel(tag: &str, i: usize) -> Vec<u8> {
    let padding = "p".repeat((i * 211) % 2600);
    // Up to three of the gateway's reads: hyper itself drains at most one more.
    let body = format!(
        "{{\"reason\":\"{}\"}}",
        "r".repeat((i * 797) % (3 * READ_BYTES))
    );
    format!(
        "POST /v1/orders/{}/cancel HTTP/1.1\r\nHost: gateway\r\n\
         X-Request-Id: {tag}-{i}\r\nX-Padding: {padding}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        uuid::Uuid::now_v7(),
        body.len()
    )
    .into_bytes()
}

#[tokio::test]
async fn a_request_refused_before_its_body_after_routing_is_answered_or_says_the_connection_closes()
{
    let app = spawn_app_with(|_| {}).await;

    for (depth, count, cut) in [
        (1, 100, Cut::Whole),
        (10, 200, Cut::Whole),
        (50, 200, Cut::Odd),
        (5, 10, Cut::Slow),
    ] {
        let tag = format!("cancel-{depth}-{cut:?}");
        let requests: Vec<Vec<u8>> = (0..count).map(|i| unauthorized_cancel(&tag, i)).collect();
        let got = pipeline(&app, &requests, depth, cut).await;

        // Answered in order, until an answer says the connection closes (then it ends).
        for (i, answer) in got.iter().enumerate() {
            assert_eq!(answer.status, 401, "answer {i}");
            assert_eq!(
                answer.header("x-request-id"),
                Some(format!("{tag}-{i}").as_str())
            );
            assert!(
                !answer.closes() || i + 1 == got.len(),
                "answers after a close"
            );
        }
        let closed = got.last().is_some_and(Answer::closes);
        assert!(
            got.len() == requests.len() || closed,
            "depth {depth}: {} of {} answered, and no answer said the connection closes",
            got.len(),
            requests.len()
        );
    }
    app.cleanup().await;
}
