//! One accepted connection, served by hyper until it ends or the drain closes it.
//!
//! hyper's own graceful shutdown closes a connection it believes idle, and it believes so
//! whenever it has not parsed a request head yet, even when a complete request is already
//! waiting in the socket (the reactor has not woken the connection yet). Such a request
//! was sent before the gateway stopped and would be lost. So the socket is shared with
//! the drain, which asks the kernel directly (`MSG_PEEK`) whether bytes are waiting and
//! lets hyper read and answer them before it closes the connection.

use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// How often a draining connection with unread bytes is looked at again.
const DRAIN_RECHECK: Duration = Duration::from_millis(5);

/// A TCP stream that hyper reads and writes while the drain can still look at the socket.
#[derive(Clone)]
pub struct SharedStream(Arc<TcpStream>);

impl SharedStream {
    pub fn new(stream: TcpStream) -> Self {
        Self(Arc::new(stream))
    }

    /// True when the kernel holds received bytes nobody has read yet.
    pub fn has_unread_bytes(&self) -> bool {
        let mut probe = [MaybeUninit::<u8>::uninit(); 1];
        matches!(socket2::SockRef::from(&*self.0).peek(&mut probe), Ok(n) if n > 0)
    }
}

impl AsyncRead for SharedStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            ready!(self.0.poll_read_ready(cx))?;
            match self.0.try_read(buf.initialize_unfilled()) {
                Ok(read) => {
                    buf.advance(read);
                    return Poll::Ready(Ok(()));
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                Err(error) => return Poll::Ready(Err(error)),
            }
        }
    }
}

impl AsyncWrite for SharedStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.0.poll_write_ready(cx))?;
            match self.0.try_write(buf) {
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                done => return Poll::Ready(done),
            }
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.0.poll_write_ready(cx))?;
            match self.0.try_write_vectored(bufs) {
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                done => return Poll::Ready(done),
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let shut = socket2::SockRef::from(&*self.0).shutdown(std::net::Shutdown::Write);
        Poll::Ready(match shut {
            Err(error) if error.kind() == io::ErrorKind::NotConnected => Ok(()),
            other => other,
        })
    }
}

/// The two moments of the drain every connection watches.
#[derive(Clone)]
pub struct Drain {
    /// The gateway stopped accepting: idle connections close, busy ones after their answer.
    pub closing: CancellationToken,
    /// The grace period is over: whatever is still open is dropped.
    pub abort: CancellationToken,
}

/// Serves `connection` (hyper's, over `stream`) until it ends; once the drain closes, lets
/// every request whose bytes already arrived be answered, then closes.
pub async fn drive<C>(connection: C, stream: SharedStream, drain: Drain)
where
    C: GracefulConnection,
{
    tokio::pin!(connection);
    tokio::select! {
        biased;
        ended = connection.as_mut() => return report(ended),
        () = drain.abort.cancelled() => return,
        () = drain.closing.cancelled() => {}
    }
    // Leave hyper running while bytes wait in the socket: it will read the request, answer
    // it with `Connection: close` and end the connection itself.
    while stream.has_unread_bytes() {
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
