//! Pipelined keep-alive connections: every request a client writes is answered, in order,
//! unless an earlier answer said `Connection: close`, however its bytes are cut into the
//! gateway's reads (a read boundary inside a body, requests longer than one read, a byte
//! at a time, a slow client) and whatever refuses it (the sold-out mirror, the per-IP
//! limit, a paused deal). Refused bodies on such a connection: `pipelining_bodies`.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

use crate::helpers::{EVENTUALLY, TestApp, eventually, new_deal, send, spawn_app_with};

/// How long a test waits for one answer before it counts the request unanswered.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// The gateway's own read size: requests are sized around it so that its boundaries fall
/// in heads, in bodies and past a whole read.
pub(crate) const READ_BYTES: usize = 2048;

/// How a client cuts what it writes into `write` calls (each its own TCP segment).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Cut {
    /// A window of requests in one write.
    Whole,
    /// Pieces of odd sizes, some longer than one of the gateway's reads.
    Odd,
    /// One byte per write.
    Bytes,
    /// Odd pieces with a pause after each, as a slow network delivers them.
    Slow,
}

const ODD_PIECES: [usize; 8] = [1, 7, 13, 61, 509, READ_BYTES - 1, READ_BYTES + 1, 3];
/// The pause of a slow client between two pieces.
const SLOW_PAUSE: Duration = Duration::from_millis(15);

/// How the `i`-th order of a connection is framed.
#[derive(Clone, Copy)]
pub(crate) enum Framing {
    Length,
    Chunked,
}

/// The `i`-th order of a connection tagged `tag`. Its header padding and body padding vary
/// with `i` (0 to 2,600 and 0 to 300 bytes), so over a connection the gateway's read
/// boundaries fall anywhere in heads and bodies, and some requests need two reads.
pub(crate) fn order(deal: &str, token: &str, tag: &str, i: usize, framing: Framing) -> Vec<u8> {
    let padding = "p".repeat((i * 211) % 2600);
    let body = format!("{{\"quantity\":1{}}}", " ".repeat((i * 29) % 300));
    let framed = match framing {
        Framing::Length => format!("Content-Length: {}\r\n\r\n{body}", body.len()),
        Framing::Chunked => {
            let (first, second) = body.split_at(body.len() / 2);
            format!(
                "Transfer-Encoding: chunked\r\n\r\n{:x}\r\n{first}\r\n{:x}\r\n{second}\r\n0\r\n\r\n",
                first.len(),
                second.len()
            )
        }
    };
    format!(
        "POST /v1/deals/{deal}/orders HTTP/1.1\r\nHost: gateway\r\n\
         Authorization: Bearer {token}\r\nIdempotency-Key: {tag}-key-{i}\r\n\
         X-Request-Id: {tag}-{i}\r\nX-Padding: {padding}\r\n\
         Content-Type: application/json\r\n{framed}"
    )
    .into_bytes()
}

/// One parsed answer.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
}

impl Answer {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub(crate) fn closes(&self) -> bool {
        self.header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
    }

    pub(crate) fn slug(&self) -> Option<String> {
        let problem: serde_json::Value = serde_json::from_slice(&self.body).ok()?;
        let kind = problem["type"].as_str()?;
        kind.strip_prefix("https://flashgate.dev/problems/")
            .map(str::to_owned)
    }
}

/// Reads answers off a connection, one at a time.
pub(crate) struct Answers {
    pub(crate) reader: OwnedReadHalf,
    pub(crate) buffer: Vec<u8>,
}

impl Answers {
    /// A connection to `addr` (Nagle off, so each write leaves at once): its answers, and
    /// the half to write requests on.
    pub(crate) async fn connect(addr: std::net::SocketAddr) -> (Self, OwnedWriteHalf) {
        let stream = TcpStream::connect(addr).await.expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        let (reader, writer) = stream.into_split();
        let answers = Self {
            reader,
            buffer: Vec::new(),
        };
        (answers, writer)
    }

    /// The next answer, or `None` when the connection ended (or stayed silent) first.
    pub(crate) async fn next(&mut self) -> Option<Answer> {
        let head_end = self
            .fill_until(|b| find(b, b"\r\n\r\n").map(|at| at + 4))
            .await?;
        let head = String::from_utf8(self.buffer[..head_end].to_vec()).expect("ASCII head");
        let mut lines = head.split("\r\n");
        let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
            .collect();
        let length: usize = headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
            .map_or(0, |(_, v)| v.parse().expect("numeric Content-Length"));
        let end = self
            .fill_until(|b| (b.len() >= head_end + length).then_some(head_end + length))
            .await?;
        let body = self.buffer[head_end..end].to_vec();
        self.buffer.drain(..end);
        Some(Answer {
            status,
            headers,
            body,
        })
    }

    /// Reads until `complete` finds where the next piece ends in the buffer.
    async fn fill_until(&mut self, complete: impl Fn(&[u8]) -> Option<usize>) -> Option<usize> {
        loop {
            if let Some(end) = complete(&self.buffer) {
                return Some(end);
            }
            let mut chunk = [0u8; 4096];
            let read = tokio::time::timeout(ANSWER_TIMEOUT, self.reader.read(&mut chunk)).await;
            match read {
                Ok(Ok(n)) if n > 0 => self.buffer.extend_from_slice(&chunk[..n]),
                _ => return None,
            }
        }
    }

    /// True when the gateway closes the connection with nothing more written.
    pub(crate) async fn ended(&mut self) -> bool {
        let mut chunk = [0u8; 64];
        matches!(
            tokio::time::timeout(ANSWER_TIMEOUT, self.reader.read(&mut chunk)).await,
            Ok(Ok(0) | Err(_))
        ) && self.buffer.is_empty()
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Writes `bytes` cut as `cut` says; false when the gateway closed the connection first.
pub(crate) async fn write_cut(stream: &mut OwnedWriteHalf, bytes: &[u8], cut: Cut) -> bool {
    let mut rest = bytes;
    let mut piece = 0;
    while !rest.is_empty() {
        let size = match cut {
            Cut::Whole => rest.len(),
            Cut::Bytes => 1,
            Cut::Odd | Cut::Slow => ODD_PIECES[piece % ODD_PIECES.len()],
        };
        let (now, later) = rest.split_at(size.min(rest.len()));
        if stream.write_all(now).await.is_err() {
            return false;
        }
        rest = later;
        piece += 1;
        match cut {
            // A client that trickles its bytes: the case under test.
            Cut::Slow => crate::helpers::pace(SLOW_PAUSE).await,
            Cut::Bytes => tokio::task::yield_now().await,
            Cut::Whole | Cut::Odd => {}
        }
    }
    true
}

/// Sends `requests` on one connection, `depth` at a time written before their answers are
/// read, and returns every answer it got before the connection ended. Each request
/// carries `X-Request-Id: {tag}-{i}`; answers are checked to come back in order.
pub(crate) async fn pipeline(
    app: &TestApp,
    requests: &[Vec<u8>],
    depth: usize,
    cut: Cut,
) -> Vec<Answer> {
    let (mut answers, mut writer) = Answers::connect(app.addr).await;
    let mut got = Vec::new();
    for window in requests.chunks(depth) {
        // A refused write still leaves the answers the gateway wrote before it closed.
        let written = write_cut(&mut writer, &window.concat(), cut).await;
        for _ in window {
            match answers.next().await {
                Some(answer) => got.push(answer),
                None => return got,
            }
        }
        if !written {
            break;
        }
    }
    got
}

/// Asserts that each of the `sent` requests got its own answer, in order, none of them
/// closing the connection, with a status from `statuses`.
fn assert_all_answered(what: &str, tag: &str, sent: usize, got: &[Answer], statuses: &[u16]) {
    assert_eq!(
        got.len(),
        sent,
        "{what}: {} of {sent} requests answered, then the connection ended",
        got.len()
    );
    for (i, answer) in got.iter().enumerate() {
        assert_eq!(
            answer.header("x-request-id"),
            Some(format!("{tag}-{i}").as_str()),
            "{what}: answer {i} is not its request's"
        );
        assert!(
            statuses.contains(&answer.status),
            "{what}: answer {i} is {} ({:?})",
            answer.status,
            String::from_utf8_lossy(&answer.body)
        );
        assert!(!answer.closes(), "{what}: answer {i} closes the connection");
    }
}

/// The orders of one connection tagged `tag`.
fn orders(deal: &str, token: &str, tag: &str, count: usize, framing: Framing) -> Vec<Vec<u8>> {
    (0..count)
        .map(|i| order(deal, token, tag, i, framing))
        .collect()
}

/// Sends orders on one connection per `(depth, count, cut, framing)` and checks each
/// connection answered every one with a status from `statuses`.
async fn every_order_answered(
    app: &TestApp,
    deal: &str,
    runs: &[(usize, usize, Cut, Framing)],
    statuses: &[u16],
) -> Vec<Answer> {
    let token = app.token("pipelining-user");
    let connections = runs
        .iter()
        .enumerate()
        .map(|(n, &(depth, count, cut, framing))| {
            let tag = format!("c{n}");
            let requests = orders(deal, &token, &tag, count, framing);
            async move {
                let got = pipeline(app, &requests, depth, cut).await;
                (
                    format!("depth {depth}, {cut:?}, connection {tag}"),
                    tag,
                    count,
                    got,
                )
            }
        });
    let mut all = Vec::new();
    for (what, tag, count, got) in futures_util::future::join_all(connections).await {
        assert_all_answered(&what, &tag, count, &got, statuses);
        all.extend(got);
    }
    all
}

/// A deal with no stock, refused from memory: the sold-out mirror knows it.
pub(crate) async fn sold_out_deal(app: &TestApp) -> String {
    let deal = app
        .given_deal(&new_deal(&format!("pipe-{}", rand_id()), 0, 1))
        .await;
    let token = app.token("pipelining-probe");
    let refused = eventually(EVENTUALLY, || async {
        // Only the mirror refuses it as sold out: read, the body would be invalid (400).
        let probe = app
            .client
            .post(app.url(&format!("/v1/deals/{deal}/orders")))
            .bearer_auth(&token)
            .header("Idempotency-Key", "pipelining-probe")
            .body("not JSON");
        (send(probe).await.status == 409).then_some(())
    })
    .await;
    assert!(refused.is_some(), "the deal with no stock is never refused");
    deal
}

pub(crate) fn rand_id() -> String {
    crate::helpers::unique_suffix()[..12].to_owned()
}

const DEPTHS: [(usize, usize, Cut, Framing); 3] = [
    (1, 40, Cut::Whole, Framing::Length),
    (10, 300, Cut::Whole, Framing::Length),
    (50, 300, Cut::Whole, Framing::Length),
];

#[tokio::test]
async fn sold_out_refusals_answer_every_pipelined_order() {
    let app = spawn_app_with(|_| {}).await;
    let deal = sold_out_deal(&app).await;

    let answers = every_order_answered(&app, &deal, &DEPTHS, &[409]).await;

    assert!(
        answers
            .iter()
            .all(|a| a.slug().as_deref() == Some("sold-out"))
    );
    app.cleanup().await;
}

#[tokio::test]
async fn refusals_answer_orders_cut_into_odd_pieces_bytes_and_chunks() {
    let app = spawn_app_with(|_| {}).await;
    let deal = sold_out_deal(&app).await;

    every_order_answered(
        &app,
        &deal,
        &[
            (10, 120, Cut::Odd, Framing::Length),
            (50, 150, Cut::Odd, Framing::Length),
            (1, 12, Cut::Bytes, Framing::Length),
            (10, 20, Cut::Bytes, Framing::Length),
            (10, 100, Cut::Whole, Framing::Chunked),
            (10, 40, Cut::Odd, Framing::Chunked),
        ],
        &[409],
    )
    .await;
    app.cleanup().await;
}

#[tokio::test]
async fn a_slow_client_gets_every_refusal() {
    let app = spawn_app_with(|_| {}).await;
    let deal = sold_out_deal(&app).await;

    every_order_answered(
        &app,
        &deal,
        &[
            (1, 6, Cut::Slow, Framing::Length),
            (10, 20, Cut::Slow, Framing::Length),
            (5, 10, Cut::Slow, Framing::Chunked),
        ],
        &[409],
    )
    .await;
    app.cleanup().await;
}

#[tokio::test]
async fn rate_limited_refusals_answer_every_pipelined_order() {
    let app = spawn_app_with(|s| {
        s.limits.per_ip.rate_per_second = 1;
        s.limits.per_ip.burst = 1;
    })
    .await;
    let deal = app
        .given_deal(&new_deal(&format!("pipe-{}", rand_id()), 0, 1))
        .await;

    let mut runs = DEPTHS.to_vec();
    runs.push((10, 60, Cut::Odd, Framing::Length));
    let answers = every_order_answered(&app, &deal, &runs, &[409, 429]).await;

    // One request a second is let through (and refused as sold out): nearly all are 429.
    let limited = answers.iter().filter(|a| a.status == 429).count();
    assert!(
        limited * 10 > answers.len() * 9,
        "{limited} of {} limited",
        answers.len()
    );
    app.cleanup().await;
}

#[tokio::test]
async fn a_paused_deal_answers_every_pipelined_order() {
    let app = spawn_app_with(|_| {}).await;
    let deal = app
        .given_deal(&new_deal(&format!("pipe-{}", rand_id()), 1000, 4))
        .await;
    let pause = app
        .client
        .post(app.url(&format!("/admin/deals/{deal}/pause")));
    send(pause.bearer_auth(&app.admin_token)).await.expect(200);
    let paused = eventually(EVENTUALLY, || async {
        let reply = app.order("pipelining-probe", &deal, 1).await;
        (reply.problem_slug().as_deref() == Some("sale-not-open")).then_some(())
    })
    .await;
    assert!(paused.is_some(), "the paused deal still takes orders");

    let answers = every_order_answered(
        &app,
        &deal,
        &[
            (1, 30, Cut::Whole, Framing::Length),
            (10, 150, Cut::Whole, Framing::Length),
            (50, 150, Cut::Whole, Framing::Length),
            (10, 60, Cut::Odd, Framing::Chunked),
        ],
        &[409],
    )
    .await;

    assert!(
        answers
            .iter()
            .all(|a| a.slug().as_deref() == Some("sale-not-open"))
    );
    app.cleanup().await;
}
