//! A whole refusal in-process: the bytes of an order request in, the bytes of its answer
//! out, through hyper, the router, admission and problem+json, exactly as the public
//! listener serves a connection, with no socket and no other process involved.
//!
//! Each measured connection reads one request per read (as a keep-alive client sends
//! them) and writes every answer to a counter; the time per request is the whole loop
//! divided by the requests. Neither PostgreSQL nor Redis is reached while measuring: the
//! gateway's pools point nowhere, and a refusal must not need either. Before, the sold-out
//! mirror learns from PostgreSQL that nobody holds the deal, as in a running gateway (while
//! it does not know, it lets requests through to PostgreSQL): the deal is created with no
//! stock in a database of its own (`DATABASE_URL`, default the local `test` database's
//! server), which is dropped once the mirror has read it.
//!
//! Run with `cargo bench --bench refusal`.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use flashgate::admission::Admission;
use flashgate::auth::mint_token_for;
use flashgate::clock::Clock;
use flashgate::config::Settings;
use flashgate::deals::{self, NewDeal};
use flashgate::domain::DealId;
use flashgate::http::{State, serve_public};
use flashgate::inventory::StockEvents;
use flashgate::redis_link::{RedisHandle, RedisTimeouts};
use flashgate::store::Pools;
use hyper::rt::{Read, ReadBufCursor, Write};

#[path = "support/database.rs"]
mod database;

use database::BenchDatabase;

const DEAL: &str = "sold-out";

/// Fewer bytes than any refusal's answer (head and problem+json body).
const ANSWER_BYTES_MIN: usize = 200;

/// One connection's worth of identical requests, fed one per read; answers are counted.
/// The client hangs up (end of file) once every request is answered, as a keep-alive
/// client would: hyper treats an end of file before its answer as an aborted request.
struct Loopback<'a> {
    request: &'a [u8],
    requests: usize,
    requests_left: usize,
    offset: usize,
    answers: usize,
    hang_up: Option<Waker>,
    written: Vec<u8>,
    keep_written: bool,
    written_bytes: usize,
}

impl<'a> Loopback<'a> {
    fn new(request: &'a [u8], requests: usize, keep_written: bool) -> Self {
        Self {
            request,
            requests,
            requests_left: requests,
            offset: 0,
            answers: 0,
            hang_up: None,
            written: Vec::new(),
            keep_written,
            written_bytes: 0,
        }
    }
}

impl Loopback<'_> {
    /// Counts what hyper wrote; each answer starts a write of its own.
    fn wrote(&mut self, bufs: &[io::IoSlice<'_>]) -> usize {
        if bufs.first().is_some_and(|b| b.starts_with(b"HTTP/1.1 ")) {
            self.answers += 1;
            if self.answers == self.requests
                && let Some(waker) = self.hang_up.take()
            {
                waker.wake();
            }
        }
        let mut total = 0;
        for buf in bufs {
            total += buf.len();
            if self.keep_written {
                self.written.extend_from_slice(buf);
            }
        }
        self.written_bytes += total;
        total
    }
}

impl Read for Loopback<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        if self.requests_left == 0 {
            if self.answers == self.requests {
                return Poll::Ready(Ok(()));
            }
            self.hang_up = Some(cx.waker().clone());
            return Poll::Pending;
        }
        let rest = &self.request[self.offset..];
        let n = rest.len().min(buf.remaining());
        buf.put_slice(&rest[..n]);
        self.offset += n;
        if self.offset == self.request.len() {
            self.offset = 0;
            self.requests_left -= 1;
        }
        Poll::Ready(Ok(()))
    }
}

impl Write for Loopback<'_> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.wrote(&[io::IoSlice::new(buf)]);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Poll::Ready(Ok(self.wrote(bufs)))
    }

    fn is_write_vectored(&self) -> bool {
        // As a TCP stream: hyper then writes head and body with one writev.
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// A gateway's state with no reachable PostgreSQL or Redis.
fn state(runtime: &tokio::runtime::Runtime, per_ip_limited: bool) -> Arc<State> {
    let mut settings = Settings::defaults();
    settings.database.url = "postgres://bench@127.0.0.1:1/bench".into();
    settings.database.acquire_timeout_ms = 1;
    settings.auth.jwt_secret = "bench-secret-bench-secret-bench-secret".into();
    if per_ip_limited {
        settings.limits.per_ip.rate_per_second = 1;
        settings.limits.per_ip.burst = 1;
    } else {
        settings.limits.per_ip.rate_per_second = u32::MAX / 2;
        settings.limits.per_ip.burst = u32::MAX / 2;
    }
    runtime.block_on(async {
        let pools = Pools::new(&settings.database).unwrap();
        let redis = RedisHandle::new(
            "redis://127.0.0.1:1",
            "bench:",
            RedisTimeouts {
                command: Duration::from_millis(1),
                unresponsive_after: Duration::from_millis(1),
            },
            Duration::from_secs(60),
        );
        let admission = Admission::new(settings.admission(), redis.clone(), Clock::system(), None);
        let holders = BenchDatabase::create().await;
        deals::create(&holders.pool, &sold_out_deal())
            .await
            .unwrap();
        admission.sold_out().mark(&holders.pool, DEAL).await;
        holders.drop().await;
        State::new(
            settings.handlers(),
            settings.lanes(),
            pools,
            redis,
            admission,
            None,
            StockEvents::default(),
        )
    })
}

fn sold_out_deal() -> NewDeal {
    NewDeal {
        id: DealId::parse(DEAL).unwrap(),
        name: DEAL.into(),
        stock: 0,
        buckets: 1,
        unit_price_minor: 100,
        currency: "EUR".into(),
        per_user_limit: 1,
        reservation_ttl_seconds: 600,
        starts_at: None,
        ends_at: None,
        payment_terms: Default::default(),
        waiting_room: Default::default(),
    }
}

fn order_request(state: &State) -> Vec<u8> {
    let auth = &state.settings.auth;
    let token = mint_token_for(
        &auth.jwt_secret,
        flashgate::admission::token::Audience::of(auth),
        "bench-user",
        3600,
    );
    let body = br#"{"quantity":1}"#;
    let mut request = format!(
        "POST /v1/deals/{DEAL}/orders HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\
         Authorization: Bearer {token}\r\nIdempotency-Key: wrk-refusal-0001\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    request
}

/// Serves `requests` requests on one in-memory connection; returns it, answers counted.
async fn serve<'a>(
    state: &Arc<State>,
    request: &'a [u8],
    requests: usize,
    keep: bool,
) -> Loopback<'a> {
    let peer: SocketAddr = "192.0.2.10:40000".parse().unwrap();
    let mut io = Loopback::new(request, requests, keep);
    serve_public(state.clone(), &mut io, peer).await.unwrap();
    io
}

fn refusal(c: &mut Criterion, name: &str, status: &str, per_ip_limited: bool) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let state = state(&runtime, per_ip_limited);
    let request = order_request(&state);
    // With the per-IP limit at one request a second, the first passes (and is refused as
    // sold out), and so does one a second while measuring: a negligible share.
    runtime.block_on(serve(&state, &request, 1, false));
    let probe = runtime.block_on(serve(&state, &request, 2, true));
    let answer = String::from_utf8_lossy(&probe.written);
    assert!(
        answer.matches(&format!("HTTP/1.1 {status}")).count() == 2,
        "not two {status} answers: {answer}"
    );
    c.bench_function(name, |b| {
        b.iter_custom(|iterations| {
            let requests = usize::try_from(iterations).unwrap();
            let started = Instant::now();
            let io = runtime.block_on(serve(&state, &request, requests, false));
            let elapsed = started.elapsed();
            assert!(
                io.written_bytes >= requests * ANSWER_BYTES_MIN,
                "a request unanswered"
            );
            elapsed
        })
    });
}

fn sold_out(c: &mut Criterion) {
    refusal(c, "refusal/sold_out_409", "409", false);
}

fn rate_limited(c: &mut Criterion) {
    refusal(c, "refusal/per_ip_limit_429", "429", true);
}

criterion_group!(benches, sold_out, rate_limited);
criterion_main!(benches);
