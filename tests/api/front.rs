//! The connection's front, which answers refusals from prepared bytes before hyper takes
//! the connection: its answers are hyper's byte for byte (but the date), whatever the cut
//! of the request into reads; and the first request it does not answer itself (another
//! method or route, `Connection: close`, an order it lets through) is answered by hyper,
//! in order after the front's answers, with the refusals behind it.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helpers::{TestApp, new_deal, spawn_app_with, unique_suffix};
use crate::pipelining::sold_out_deal;

const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// An order for `deal` with `X-Request-Id: {id}` and any `extra` header lines.
fn order(deal: &str, token: &str, id: &str, extra: &str) -> String {
    let body = r#"{"quantity":1}"#;
    format!(
        "POST /v1/deals/{deal}/orders HTTP/1.1\r\nHost: gateway\r\n\
         Authorization: Bearer {token}\r\nIdempotency-Key: key-{id}\r\n\
         X-Request-Id: {id}\r\n{extra}Content-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// One answer as it came: its head's lines and its body.
#[derive(Debug, PartialEq)]
struct Raw {
    lines: Vec<String>,
    body: Vec<u8>,
}

impl Raw {
    fn status(&self) -> u16 {
        self.lines[0]
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.lines[1..].iter().find_map(|line| {
            let (n, v) = line.split_once(": ")?;
            n.eq_ignore_ascii_case(name).then_some(v)
        })
    }

    /// The answer without its `date` line, which changes every second.
    fn undated(&self) -> (Vec<&String>, &[u8]) {
        let lines = self
            .lines
            .iter()
            .filter(|l| !l.starts_with("date: "))
            .collect();
        (lines, &self.body)
    }
}

/// Reads answers off one connection.
struct Reader {
    stream: TcpStream,
    buffer: Vec<u8>,
}

impl Reader {
    async fn connect(app: &TestApp) -> Self {
        let stream = TcpStream::connect(app.addr).await.expect("connect");
        stream.set_nodelay(true).unwrap();
        Self {
            stream,
            buffer: Vec::new(),
        }
    }

    async fn write(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.expect("write");
    }

    /// The next answer; `head_only` for the answer to a HEAD request, which has no body.
    async fn next(&mut self, head_only: bool) -> Option<Raw> {
        let head_end = self.fill(|b| find(b, b"\r\n\r\n").map(|at| at + 4)).await?;
        let head = String::from_utf8(self.buffer[..head_end - 4].to_vec()).expect("ASCII");
        let lines: Vec<String> = head.split("\r\n").map(str::to_owned).collect();
        let mut raw = Raw {
            lines,
            body: Vec::new(),
        };
        let length: usize = match head_only {
            true => 0,
            false => raw
                .header("content-length")
                .map_or(0, |v| v.parse().unwrap()),
        };
        let end = self
            .fill(|b| (b.len() >= head_end + length).then_some(head_end + length))
            .await?;
        raw.body = self.buffer[head_end..end].to_vec();
        self.buffer.drain(..end);
        Some(raw)
    }

    async fn fill(&mut self, complete: impl Fn(&[u8]) -> Option<usize>) -> Option<usize> {
        loop {
            if let Some(end) = complete(&self.buffer) {
                return Some(end);
            }
            let mut chunk = [0u8; 4096];
            let read = tokio::time::timeout(ANSWER_TIMEOUT, self.stream.read(&mut chunk)).await;
            match read {
                Ok(Ok(n)) if n > 0 => self.buffer.extend_from_slice(&chunk[..n]),
                _ => return None,
            }
        }
    }

    /// True when the gateway closed the connection with nothing more written.
    async fn ended(&mut self) -> bool {
        let mut chunk = [0u8; 64];
        let read = tokio::time::timeout(ANSWER_TIMEOUT, self.stream.read(&mut chunk)).await;
        matches!(read, Ok(Ok(0) | Err(_))) && self.buffer.is_empty()
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The answer to `request` alone on a new connection.
async fn answer_to(app: &TestApp, request: &str) -> Raw {
    let mut reader = Reader::connect(app).await;
    reader.write(request.as_bytes()).await;
    reader.next(false).await.expect("answered")
}

#[tokio::test]
async fn the_fronts_refusals_are_hypers_byte_for_byte() {
    let app = spawn_app_with(|_| {}).await;
    let limited = spawn_app_with(|s| {
        s.limits.per_ip.rate_per_second = 1;
        s.limits.per_ip.burst = 1;
    })
    .await;
    let token = app.token("front-user");
    let deal = sold_out_deal(&app).await;
    // The one request `limited` allows a second; every later one is refused 429.
    let _ = answer_to(&limited, &order(&deal, &token, "spend", "")).await;

    for (app, code) in [(&app, 409), (&limited, 429)] {
        // `Connection: keep-alive` changes nothing in the answer, but the front leaves
        // such a request to hyper.
        let front = answer_to(app, &order(&deal, &token, "same-id", "")).await;
        let keep_alive = "Connection: keep-alive\r\n";
        let hyper = answer_to(app, &order(&deal, &token, "same-id", keep_alive)).await;

        assert_eq!(front.status(), code, "{front:?}");
        assert_eq!(front.undated(), hyper.undated());
        assert!(front.header("date").is_some());
    }
    app.cleanup().await;
    limited.cleanup().await;
}

#[tokio::test]
async fn a_refusal_cut_at_every_byte_is_answered_and_the_connection_kept() {
    let app = spawn_app_with(|_| {}).await;
    let token = app.token("front-user");
    let deal = sold_out_deal(&app).await;
    let first = order(&deal, &token, "first", "");
    let second = order(&deal, &token, "second", "");

    for cut in 1..first.len() {
        let mut reader = Reader::connect(&app).await;
        reader.write(&first.as_bytes()[..cut]).await;
        // Its own segment: the gateway reads the first piece alone when it is quick.
        tokio::task::yield_now().await;
        reader.write(&first.as_bytes()[cut..]).await;
        reader.write(second.as_bytes()).await;

        for id in ["first", "second"] {
            let answer = reader.next(false).await;
            let answer = answer.unwrap_or_else(|| panic!("cut at {cut}: {id} unanswered"));
            assert_eq!(answer.status(), 409, "cut at {cut}: {answer:?}");
            assert_eq!(answer.header("x-request-id"), Some(id), "cut at {cut}");
            assert_eq!(answer.header("connection"), None, "cut at {cut}");
        }
    }
    app.cleanup().await;
}

#[tokio::test]
async fn requests_the_front_leaves_to_hyper_are_answered_in_order() {
    let app = spawn_app_with(|_| {}).await;
    let token = app.token("front-user");
    let deal = sold_out_deal(&app).await;
    let refusal = |id: &str| order(&deal, &token, id, "");
    let plain =
        |line: &str, id: &str| format!("{line} HTTP/1.1\r\nHost: g\r\nX-Request-Id: {id}\r\n\r\n");
    // (request, whether its answer has no body, the status it gets)
    let requests = [
        (refusal("r0"), false, 409),
        (plain(&format!("HEAD /v1/deals/{deal}"), "head"), true, 200),
        (plain("GET /healthz", "health"), false, 200),
        (refusal("r1"), false, 409),
        (
            plain(&format!("DELETE /v1/deals/{deal}/orders"), "delete"),
            false,
            405,
        ),
        (refusal("r2"), false, 409),
    ];
    let mut reader = Reader::connect(&app).await;
    reader
        .write(
            requests
                .iter()
                .map(|(r, ..)| r.as_str())
                .collect::<String>()
                .as_bytes(),
        )
        .await;

    for (request, head_only, status) in &requests {
        let answer = reader.next(*head_only).await.expect("answered");
        assert_eq!(answer.status(), *status, "{request:?}: {answer:?}");
        let id = request
            .split("X-Request-Id: ")
            .nth(1)
            .and_then(|r| r.split("\r\n").next());
        assert_eq!(answer.header("x-request-id"), id);
    }

    // Then `Connection: close`: answered, and the connection closed after it.
    reader
        .write(order(&deal, &token, "last", "Connection: close\r\n").as_bytes())
        .await;
    reader.write(refusal("unsent").as_bytes()).await;
    let last = reader.next(false).await.expect("answered");
    assert_eq!(
        (last.status(), last.header("connection")),
        (409, Some("close"))
    );
    assert!(
        reader.ended().await,
        "nothing is answered after `Connection: close`"
    );
    app.cleanup().await;
}

#[tokio::test]
async fn an_oversize_token_is_refused_401_and_any_other_oversize_head_431_in_a_pipeline() {
    let app = spawn_app_with(|_| {}).await;
    let token = app.token("front-user");
    let deal = sold_out_deal(&app).await;
    let head_max = app.settings.server.header_bytes_max;
    let big_token = "t".repeat(100 * 1024);
    let cookie = format!("Cookie: c={}\r\n", "c".repeat(head_max));
    // (request, the status it gets): the first two on their own connection, each first on
    // it, so the front reads them; then all of them pipelined on one.
    let requests = [
        (order(&deal, &big_token, "big-token", ""), 401),
        (order(&deal, &token, "big-cookie", &cookie), 431),
        (order(&deal, &token, "r0", ""), 409),
        (order(&deal, &big_token, "big-token", ""), 401),
        (order(&deal, &token, "r1", ""), 409),
        (order(&deal, &token, "big-cookie", &cookie), 431),
        (order(&deal, &token, "r2", ""), 409),
    ];
    for (request, status) in &requests[..2] {
        let answer = answer_to(&app, request).await;
        assert_eq!(answer.status(), *status, "{answer:?}");
    }
    let mut reader = Reader::connect(&app).await;
    let pipeline: String = requests[2..].iter().map(|(r, _)| r.as_str()).collect();
    // In pieces, so heads arrive over several reads.
    for piece in pipeline.as_bytes().chunks(3000) {
        reader.write(piece).await;
        tokio::task::yield_now().await;
    }
    for (request, status) in &requests[2..] {
        let answer = reader.next(false).await.expect("answered");
        assert_eq!(answer.status(), *status, "{answer:?}");
        let id = request.split("X-Request-Id: ").nth(1).unwrap();
        assert_eq!(answer.header("x-request-id"), id.split("\r\n").next());
        let body: serde_json::Value = serde_json::from_slice(&answer.body).unwrap();
        let slug = match status {
            401 => "unauthorized",
            431 => "invalid-request",
            _ => "sold-out",
        };
        assert!(body["type"].as_str().unwrap().ends_with(slug), "{body}");
    }
    app.cleanup().await;
}

#[tokio::test]
async fn an_order_the_front_lets_through_is_checked_once() {
    // Two orders a second from one address: were the front's checks made again by hyper,
    // the second would be refused.
    let app = spawn_app_with(|s| {
        s.limits.per_ip.rate_per_second = 1;
        s.limits.per_ip.burst = 2;
    })
    .await;
    let deal = app
        .given_deal(&new_deal(
            &format!("front-{}", &unique_suffix()[..8]),
            10,
            1,
        ))
        .await;

    for user in ["first", "second"] {
        let token = app.token(user);
        let answer = answer_to(&app, &order(&deal, &token, user, "")).await;
        assert_eq!(answer.status(), 201, "{user}: {answer:?}");
    }
    app.cleanup().await;
}
