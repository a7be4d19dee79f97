//! One accepted connection, served by hyper until it ends or the drain closes it.
//!
//! hyper's own graceful shutdown closes a connection it believes idle, and it believes so
//! whenever it has not parsed a request head yet, even when a complete request is already
//! waiting in the socket (the reactor has not woken the connection yet). Such a request
//! was sent before the gateway stopped and would be lost. So the socket is shared with
//! the drain, which asks the kernel directly (`MSG_PEEK`) whether bytes are waiting and
//! lets hyper read and answer them before it closes the connection.
//!
//! Every connection watches the drain and the time its client takes to send a request
//! head, and is woken for every request it reads; watching must cost nothing per request
//! that a bare hyper server does not pay (see `Moment` and `HeadClock`). The streams hyper
//! and the front read from are in `stream`.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::time::{Instant, Sleep};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use super::stream::{Leftover, SharedStream};
use crate::clock::monotonic;

/// How often a draining connection with unread bytes is looked at again.
const DRAIN_RECHECK: Duration = Duration::from_millis(5);

/// The two moments of the drain every connection watches.
#[derive(Clone, Default)]
pub struct Drain {
    /// The gateway stopped accepting: idle connections close, busy ones after their answer.
    pub closing: Moment,
    /// The grace period is over: whatever is still open is dropped.
    pub abort: Moment,
}

/// A moment of the drain: a cancellation token and a flag set just before it is cancelled.
///
/// Polling a token's `cancelled()` takes two locks (the token's and its `Notify`'s) that
/// every connection shares, and a connection's task polls it on every wake-up, that is
/// several times per request. `Cancelled` registers with the token once per waker and then
/// reads the flag: one atomic load per wake-up.
#[derive(Clone, Default)]
pub struct Moment {
    token: CancellationToken,
    reached: Arc<AtomicBool>,
}

impl Moment {
    pub fn cancel(&self) {
        self.reached.store(true, Ordering::Release);
        self.token.cancel();
    }

    pub fn cancelled(&self) -> Cancelled<'_> {
        Cancelled {
            moment: self,
            registration: None,
            waker: None,
        }
    }
}

/// Resolves once its `Moment` is reached.
pub struct Cancelled<'a> {
    moment: &'a Moment,
    registration: Option<Pin<Box<WaitForCancellationFutureOwned>>>,
    /// The waker the token will wake; while the task polls with the same one, the
    /// registration stands and only the flag needs looking at.
    waker: Option<Waker>,
}

impl Future for Cancelled<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        // The flag is set before the token wakes anyone, so a wake-up finds it set.
        if this.moment.reached.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        if this.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            return Poll::Pending;
        }
        let token = &this.moment.token;
        let registration = this
            .registration
            .get_or_insert_with(|| Box::pin(token.clone().cancelled_owned()));
        if registration.as_mut().poll(cx).is_ready() {
            return Poll::Ready(());
        }
        this.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

/// Serves `connection` (hyper's, over `leftover` and then `stream`) until it ends, or until
/// its client has kept it waiting for a request head for `head_timeout`; once the drain closes, lets
/// every request whose bytes already arrived be answered, then closes.
pub async fn drive<C>(
    connection: C,
    stream: SharedStream,
    leftover: Leftover,
    drain: Drain,
    heads: Arc<HeadClock>,
    head_timeout: Duration,
) where
    C: GracefulConnection,
{
    tokio::pin!(connection);
    let (mut abort, mut closing) = (drain.abort.cancelled(), drain.closing.cancelled());
    let mut head_due = HeadTimer::new(head_timeout);
    loop {
        tokio::select! {
            biased;
            ended = connection.as_mut() => return report(ended),
            () = &mut abort => return,
            () = &mut closing => break,
            () = &mut head_due => match heads.next_due(head_timeout) {
                Some(due) => head_due.reset(due),
                None => {
                    tracing::debug!("no request head within the header read timeout");
                    return;
                }
            },
        }
    }
    // Leave hyper running while bytes wait in the socket: it will read the request, answer
    // it with `Connection: close` and end the connection itself.
    while leftover.any() || stream.has_unread_bytes() {
        tokio::select! {
            biased;
            ended = connection.as_mut() => return report(ended),
            () = drain.abort.cancelled() => return,
            () = tokio::time::sleep(DRAIN_RECHECK) => {}
        }
    }
    connection.as_mut().graceful_shutdown();
    tokio::select! {
        ended = connection.as_mut() => report(ended),
        () = drain.abort.cancelled() => {}
    }
}

/// The timer of the header read timeout, polled only when it may have fired.
///
/// A connection's task is woken for every request it reads, and polling a `Sleep` on
/// every wake-up registers the task's waker with the timer again each time. Once
/// registered with the task's waker, the timer wakes the task when it fires; until then,
/// looking at whether it fired is enough.
pub(super) struct HeadTimer {
    sleep: Pin<Box<Sleep>>,
    /// The waker the timer holds, until it fires or is reset.
    waker: Option<Waker>,
}

impl HeadTimer {
    pub(super) fn new(timeout: Duration) -> Self {
        Self {
            sleep: Box::pin(tokio::time::sleep(timeout)),
            waker: None,
        }
    }

    /// Fires at `due` instead; the next poll registers the waker again.
    pub(super) fn reset(&mut self, due: Instant) {
        self.sleep.as_mut().reset(due);
        self.waker = None;
    }
}

impl Future for HeadTimer {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let registered = this.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker()));
        if registered && !this.sleep.is_elapsed() {
            return Poll::Pending;
        }
        this.waker = Some(cx.waker().clone());
        // Outside the task's budget: a poll the budget turned away would not register
        // the waker, and the timer would never be looked at again.
        let sleep = &mut this.sleep;
        std::pin::pin!(tokio::task::unconstrained(std::future::poll_fn(|cx| {
            sleep.as_mut().poll(cx)
        })))
        .poll(cx)
    }
}

/// Tokio's monotonic time now (the head timers are tokio's).
fn now() -> Instant {
    Instant::from_std(monotonic())
}

/// When the connection began waiting for its next request head, or that it is answering
/// one. Marked twice per request (two atomic stores), it lets one timer per connection,
/// reset once per timeout at most, enforce the header read timeout: a timer per request
/// would be created, registered and cancelled for every request a keep-alive client sends.
pub struct HeadClock {
    origin: Instant,
    /// Nanoseconds from `origin` to when the last answer was given, or `ANSWERING`.
    waiting_since: AtomicU64,
}

const ANSWERING: u64 = u64::MAX;

impl HeadClock {
    /// A new connection waits for its first head from now.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            origin: now(),
            waiting_since: AtomicU64::new(0),
        })
    }

    /// A head arrived: the connection answers until the guard is dropped.
    pub fn answering(&self) -> Answering<'_> {
        self.answering_until_answered();
        Answering(self)
    }

    /// The connection answers until `answered` is called.
    pub fn answering_until_answered(&self) {
        self.waiting_since.store(ANSWERING, Ordering::Relaxed);
    }

    /// An answer was given: the connection waits for its next head from now.
    pub fn answered(&self) {
        self.answered_at(now());
    }

    /// An answer was given at `at`: the connection waits for its next head from then.
    pub fn answered_at(&self, at: Instant) {
        let since = at.saturating_duration_since(self.origin).as_nanos();
        let since = u64::try_from(since).unwrap_or(ANSWERING - 1);
        self.waiting_since.store(since, Ordering::Relaxed);
    }

    /// When the wait for the current head ends, or `None` when it has ended already.
    pub(super) fn next_due(&self, head_timeout: Duration) -> Option<Instant> {
        let now = now();
        match self.waiting_since.load(Ordering::Relaxed) {
            // The request's own timeout bounds an answer; the head clock starts after it.
            ANSWERING => Some(now + head_timeout),
            since => {
                let due = self.origin + Duration::from_nanos(since) + head_timeout;
                (due > now).then_some(due)
            }
        }
    }
}

/// Marks its connection waiting for the next head again when dropped.
pub struct Answering<'a>(&'a HeadClock);

impl Drop for Answering<'_> {
    fn drop(&mut self) {
        self.0.answered();
    }
}

fn report(ended: Result<(), hyper::Error>) {
    if let Err(error) = ended {
        tracing::debug!(%error, "connection ended with an error");
    }
}

/// A hyper connection that can be asked to finish gracefully.
pub trait GracefulConnection: Future<Output = Result<(), hyper::Error>> {
    fn graceful_shutdown(self: Pin<&mut Self>);
}

impl<I, S> GracefulConnection for hyper::server::conn::http1::Connection<I, S>
where
    S: hyper::service::HttpService<hyper::body::Incoming>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
    S::ResBody: hyper::body::Body + 'static,
    <S::ResBody as hyper::body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn graceful_shutdown(self: Pin<&mut Self>) {
        hyper::server::conn::http1::Connection::graceful_shutdown(self);
    }
}

#[cfg(test)]
mod tests {
    use tokio::net::TcpStream;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_head_clock_runs_only_while_waiting_for_a_head() {
        let timeout = Duration::from_millis(200);
        let clock = HeadClock::new();
        let due = clock.next_due(timeout).expect("waiting");
        assert!(due <= clock.origin + timeout);

        let answering = clock.answering();
        tokio::time::sleep(timeout).await;
        // Answering for longer than the timeout: not due, looked at a whole timeout later.
        let before = now();
        assert!(clock.next_due(timeout).expect("answering") >= before + timeout);

        drop(answering);
        let answered = now();
        let due = clock.next_due(timeout).expect("waiting again");
        assert!(due > answered && due <= answered + timeout);
        tokio::time::sleep_until(due).await;
        assert_eq!(clock.next_due(timeout), None);
    }

    /// A connection hyper would never finish: only the drive's own timers end it.
    struct Silent;

    impl Future for Silent {
        type Output = Result<(), hyper::Error>;

        fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Self::Output> {
            Poll::Pending
        }
    }

    impl GracefulConnection for Silent {
        fn graceful_shutdown(self: Pin<&mut Self>) {}
    }

    #[tokio::test(start_paused = true)]
    async fn the_head_timeout_counts_from_the_last_answer() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let _client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let stream = SharedStream::new(listener.accept().await.unwrap().0);
        let (timeout, answering_for) = (Duration::from_millis(100), Duration::from_millis(250));
        let heads = HeadClock::new();
        let start = now();
        let driven = tokio::spawn(drive(
            Silent,
            stream,
            Leftover::default(),
            Drain::default(),
            heads.clone(),
            timeout,
        ));
        let answering = heads.answering();
        // The timer fires twice meanwhile, and is set again each time.
        tokio::time::sleep(answering_for).await;
        drop(answering);
        tokio::time::timeout(Duration::from_secs(5), driven)
            .await
            .expect("closed after the timeout")
            .expect("no panic");
        assert!(now() - start >= answering_for + timeout);
    }

    #[tokio::test]
    async fn a_moment_wakes_its_watchers_once_reached() {
        let moment = Moment::default();
        let watcher = {
            let moment = moment.clone();
            tokio::spawn(async move { moment.cancelled().await })
        };
        tokio::task::yield_now().await;
        assert!(!watcher.is_finished());
        moment.cancel();
        tokio::time::timeout(Duration::from_secs(5), watcher)
            .await
            .expect("woken")
            .expect("no panic");
        moment.cancelled().await;
    }
}
