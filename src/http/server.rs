//! The accept loops of the public and the operations listener: connection limits (in all
//! and per client address), HTTP/1.1 with bounded heads, and the drain on shutdown.
//!
//! The drain has one path. The signal turns readiness false while both listeners keep
//! serving for `server.drain_delay_ms`, every answer saying `Connection: close`, so a load
//! balancer sees `/readyz` fail and moves traffic away without a refused request. Then
//! the listeners stop accepting (after taking the connections the kernel already
//! completed), every request whose bytes have arrived is answered, and what is still
//! open when `server.shutdown_grace_seconds` (counted from the signal) ends is dropped.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONNECTION, HeaderValue};
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;

use dashmap::DashMap;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::ServerSettings;
use super::State;
use super::body::Unread;
use super::connection::{self, Drain, HeadClock};
use super::front::{self, Handoff};
use super::router::{self, Begun};
use super::routes::Face;
use super::stream::{Rewind, SharedStream};
use crate::admission::SoldOutChecked;
use crate::telemetry;

/// The two bound listeners: sale traffic, and operators (metrics, admin API).
pub struct Listeners {
    pub public: TcpListener,
    pub ops: TcpListener,
}

/// Serves both listeners until `shutdown`, then drains (see the module comment).
pub async fn serve(listeners: Listeners, state: Arc<State>, shutdown: CancellationToken) {
    let server = &state.settings.server;
    let drain_delay = Duration::from_millis(server.drain_delay_ms);
    let grace = Duration::from_secs(server.shutdown_grace_seconds);
    let accepter = Arc::new(Accepter::new(state.clone()));
    let public = tokio::spawn(accept(listeners.public, Face::Public, accepter.clone()));
    let ops = tokio::spawn(accept(listeners.ops, Face::Ops, accepter.clone()));
    shutdown.cancelled().await;
    state.ready.store(false, Ordering::Relaxed);
    state.draining.store(true, Ordering::Relaxed);
    tracing::info!(?drain_delay, "draining: not ready, still serving");
    tokio::time::sleep(drain_delay).await;
    accepter.drain.closing.cancel();
    let _ = tokio::join!(public, ops);
    accepter.connections.close();
    let remaining = grace.saturating_sub(drain_delay);
    if tokio::time::timeout(remaining, accepter.connections.wait())
        .await
        .is_err()
    {
        tracing::warn!("shutdown grace period over; closing remaining connections");
        accepter.drain.abort.cancel();
        accepter.connections.wait().await;
    }
}

/// Accepts on `listener` until the drain closes it, then takes the connections the kernel
/// had already completed, so a request written on one of them is answered, not reset.
async fn accept(listener: TcpListener, face: Face, accepter: Arc<Accepter>) {
    loop {
        let accepted = tokio::select! {
            biased;
            () = accepter.drain.closing.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => accepter.start(stream, peer, face),
            Err(error) => {
                // Usually out of file descriptors: back off instead of spinning.
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    let Ok(listener) = listener.into_std() else {
        return;
    };
    // Non-blocking: stops at the first `WouldBlock`.
    while let Ok((stream, peer)) = listener.accept() {
        let adopted = stream
            .set_nonblocking(true)
            .and_then(|()| TcpStream::from_std(stream));
        if let Ok(stream) = adopted {
            accepter.start(stream, peer, face);
        }
    }
}

/// What every accepted connection shares: limits, the HTTP settings and the drain.
struct Accepter {
    state: Arc<State>,
    builder: http1::Builder,
    connections_all: Arc<Semaphore>,
    per_client: Arc<PerClient>,
    connections: TaskTracker,
    drain: Drain,
    /// A client that keeps a connection waiting this long for a request head loses it.
    head_timeout: Duration,
}

/// hyper's HTTP/1.1 settings, the same for every connection. Without a timer hyper keeps
/// no header read timeout of its own (it would arm a timer for every request): the
/// connection's `HeadClock` keeps it. hyper reads a head up to `head_read_bytes_max`; the
/// router refuses one over `header_bytes_max` (`router::check_head`).
fn http1_builder(server: &ServerSettings) -> http1::Builder {
    let mut builder = http1::Builder::new();
    builder
        .header_read_timeout(None)
        .max_buf_size(server.head_read_bytes_max())
        .keep_alive(true);
    builder
}

/// Serves one connection of the public listener over `io`, coming from `peer`: the whole
/// request path (hyper, router, admission, handlers) without the connection limits and the
/// drain, so a benchmark can drive it in memory, request bytes in, answer bytes out.
pub async fn serve_public<I>(state: Arc<State>, io: I, peer: SocketAddr) -> hyper::Result<()>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
{
    let builder = http1_builder(&state.settings.server);
    let shared = Arc::new(ForConnection::new(state, HeadClock::new(), None));
    let service = service_fn(move |request| shared.respond(peer, Face::Public, request));
    builder.serve_connection(io, service).await
}

impl Accepter {
    fn new(state: Arc<State>) -> Self {
        let server = &state.settings.server;
        let builder = http1_builder(server);
        Self {
            connections_all: Arc::new(Semaphore::new(server.connections_max)),
            per_client: Arc::new(PerClient {
                open: DashMap::new(),
                max: server.connections_per_client_max,
            }),
            builder,
            connections: TaskTracker::new(),
            drain: Drain::default(),
            head_timeout: Duration::from_millis(server.header_read_timeout_ms),
            state,
        }
    }

    /// Serves one connection in its own task, or closes it at once when over a limit.
    fn start(&self, stream: TcpStream, peer: SocketAddr, face: Face) {
        let Some(permits) = self.admit(peer.ip(), face) else {
            metrics::counter!(telemetry::CONNECTIONS_REFUSED).increment(1);
            drop(stream);
            return;
        };
        let _ = stream.set_nodelay(true);
        let stream = SharedStream::new(stream);
        let (state, builder) = (self.state.clone(), self.builder.clone());
        let (drain, head_timeout) = (self.drain.clone(), self.head_timeout);
        self.connections.spawn(async move {
            let heads = HeadClock::new();
            let handoff = match face {
                Face::Public => {
                    front::serve(&state, peer, &stream, &drain, &heads, head_timeout).await
                }
                Face::Ops => Handoff::Hyper {
                    read: Bytes::new(),
                    admitted: None,
                },
            };
            if let Handoff::Hyper { read, admitted } = handoff {
                let shared = Arc::new(ForConnection::new(state, heads.clone(), admitted));
                let service = service_fn(move |request| shared.respond(peer, face, request));
                let (rewind, leftover) = Rewind::new(read, stream.clone());
                let connection = builder.serve_connection(TokioIo::new(rewind), service);
                connection::drive(connection, stream, leftover, drain, heads, head_timeout).await;
            }
            drop(permits);
        });
    }

    /// Permits for one more connection from `client`, if under both limits. Proxies the
    /// gateway trusts carry many users' connections, and operators are few: both are only
    /// held to the overall limit.
    fn admit(
        &self,
        client: IpAddr,
        face: Face,
    ) -> Option<(OwnedSemaphorePermit, Option<ClientSlot>)> {
        let slot = if face == Face::Ops || self.state.admission.is_trusted_proxy(client) {
            None
        } else {
            Some(PerClient::take(&self.per_client, client)?)
        };
        let permit = self.connections_all.clone().try_acquire_owned().ok()?;
        Some((permit, slot))
    }
}

/// What a connection's requests share. Each request holds a reference while it is
/// answered: taken from this count, which only its connection's task writes, rather than
/// from the state's, which every core would write for every request.
struct ForConnection {
    state: Arc<State>,
    heads: Arc<HeadClock>,
    /// The deal of the connection's first request, an order the front's checks let
    /// through; taken by that request.
    admitted: Mutex<Option<SoldOutChecked>>,
    /// Whether `admitted` may still hold a deal: read without the lock by every request.
    admitted_pending: AtomicBool,
}

impl ForConnection {
    fn new(state: Arc<State>, heads: Arc<HeadClock>, admitted: Option<SoldOutChecked>) -> Self {
        Self {
            state,
            heads,
            admitted_pending: AtomicBool::new(admitted.is_some()),
            admitted: Mutex::new(admitted),
        }
    }

    /// The deal the front admitted, for the first request only.
    fn take_admitted(&self) -> Option<SoldOutChecked> {
        if !self.admitted_pending.swap(false, Ordering::Relaxed) {
            return None;
        }
        self.admitted
            .lock()
            .ok()
            .and_then(|mut admitted| admitted.take())
    }

    /// The answer to `request`: at once when memory decides it (once what is left of its
    /// body is read), else from a boxed future that holds a reference to this connection's
    /// share while it waits.
    fn respond(
        self: &Arc<Self>,
        peer: SocketAddr,
        face: Face,
        request: Request<Incoming>,
    ) -> Answer {
        let admitted = self.take_admitted();
        match router::begin(&self.state, peer, face, request, admitted) {
            Begun::Answered { response, at, body } => {
                let server = &self.state.settings.server;
                let timeout = Duration::from_millis(server.body_read_timeout_ms);
                match Unread::of(body, server.body_bytes_max, timeout) {
                    None => {
                        self.heads.answered_at(at.into());
                        Answer::Now(Some(response))
                    }
                    Some(unread) => Answer::AfterBody(AfterBody {
                        reply: Some(response),
                        unread,
                        heads: self.heads.clone(),
                        at,
                    }),
                }
            }
            Begun::Waits(waiting) => {
                let shared = self.clone();
                Answer::Later(Box::pin(async move {
                    let _answering = shared.heads.answering();
                    let may_leave_body = waiting.may_leave_body_unread();
                    let reply = router::finish(&shared.state, peer, waiting).await;
                    if may_leave_body {
                        // hyper notices a dropped body when it reads and polls this future
                        // when it writes: an answer ready in the poll that dropped the body
                        // would be written as keep-alive, and the connection closed after
                        // it if hyper cannot drain the body. Yielding once lets it read
                        // first; such a body then makes the head say `Connection: close`.
                        tokio::task::yield_now().await;
                    }
                    reply
                }))
            }
        }
    }
}

type Reply = Response<Full<Bytes>>;

/// hyper's service future: an answer ready when it is made, one made but given once its
/// request's body is read, or one still being worked on.
enum Answer {
    Now(Option<Reply>),
    AfterBody(AfterBody),
    Later(Pin<Box<dyn Future<Output = Reply> + Send>>),
}

/// A refusal decided before its request's body was read. The body is read and thrown away
/// first, so that hyper keeps the connection for the requests behind it; a body that
/// cannot be (too long, too slow) is left, and the answer says the connection closes.
struct AfterBody {
    reply: Option<Reply>,
    unread: Unread,
    heads: Arc<HeadClock>,
    /// When the answer was made.
    at: std::time::Instant,
}

impl AfterBody {
    fn poll_reply(&mut self, cx: &mut Context<'_>) -> Poll<Reply> {
        let Poll::Ready(whole) = self.unread.poll_discard(cx) else {
            // The rest of the body is awaited: the header read timeout waits for the answer.
            self.heads.answering_until_answered();
            return Poll::Pending;
        };
        if self.unread.waited() {
            self.heads.answered();
        } else {
            self.heads.answered_at(self.at.into());
        }
        let Some(mut reply) = self.reply.take() else {
            return Poll::Pending;
        };
        if !whole {
            let close = HeaderValue::from_static("close");
            reply.headers_mut().insert(CONNECTION, close);
        }
        Poll::Ready(reply)
    }
}

impl Future for Answer {
    type Output = Result<Reply, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            Answer::Now(response) => match response.take() {
                Some(response) => Poll::Ready(Ok(response)),
                None => Poll::Pending,
            },
            Answer::AfterBody(refusal) => refusal.poll_reply(cx).map(Ok),
            Answer::Later(later) => later.as_mut().poll(cx).map(Ok),
        }
    }
}

/// Open connections per client address, so one client cannot take them all.
struct PerClient {
    open: DashMap<IpAddr, usize>,
    max: usize,
}

impl PerClient {
    fn take(this: &Arc<Self>, client: IpAddr) -> Option<ClientSlot> {
        let mut open = this.open.entry(client).or_insert(0);
        if *open >= this.max {
            return None;
        }
        *open += 1;
        Some(ClientSlot {
            owner: this.clone(),
            client,
        })
    }
}

/// One connection counted against its client; given back on drop.
struct ClientSlot {
    owner: Arc<PerClient>,
    client: IpAddr,
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        self.owner.open.remove_if_mut(&self.client, |_, open| {
            *open -= 1;
            *open == 0
        });
    }
}
