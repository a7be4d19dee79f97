//! The socket of one connection, shared by hyper, the connection's front and the drain.
//!
//! `SharedStream` reads and writes the socket without zeroing hyper's buffers and lets the
//! drain ask the kernel (`MSG_PEEK`) whether bytes wait unread; `Rewind` gives hyper the
//! bytes the front read but did not answer before the socket's, and `Leftover` tells the
//! drain how many of them hyper has not taken yet.

use std::io::{self, IoSlice, Read};
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;

/// The most bytes one read takes from the socket; a longer request takes several reads.
const READ_BYTES_MAX: usize = 2048;

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
        // A safe read needs initialized memory, and hyper offers its whole spare buffer
        // (8 KiB or more) uninitialized on every read: zeroing it all for a request of a
        // few hundred bytes, and again for the read that finds the socket empty, cost
        // more than parsing the request.
        let unfilled = buf.remaining().min(READ_BYTES_MAX);
        let read = ready!(self.read_into(cx, buf.initialize_unfilled_to(unfilled)))?;
        buf.advance(read);
        Poll::Ready(Ok(()))
    }
}

impl SharedStream {
    /// Reads into `into` once the socket is readable. A read that fills less than `into`
    /// emptied the socket's receive buffer, so the socket is marked not ready, as tokio's
    /// own stream does: hyper reads again after every request, and that read then waits
    /// for the reactor instead of asking the kernel only to be told to wait.
    fn read_into(&self, cx: &mut Context<'_>, into: &mut [u8]) -> Poll<io::Result<usize>> {
        let asked = into.len();
        loop {
            ready!(self.0.poll_read_ready(cx))?;
            let mut read = 0;
            let outcome = self.0.try_io(Interest::READABLE, || {
                read = (&*socket2::SockRef::from(&*self.0)).read(into)?;
                if read > 0 && read < asked {
                    // Clears the readiness this read was made on; bytes arriving since
                    // set it again.
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                Ok(())
            });
            match outcome {
                Ok(()) => return Poll::Ready(Ok(read)),
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                    if read > 0 {
                        return Poll::Ready(Ok(read));
                    }
                }
                Err(error) => return Poll::Ready(Err(error)),
            }
        }
    }
}

impl SharedStream {
    /// Appends what the socket holds, at most `READ_BYTES_MAX`, to `read`; 0 at its end.
    /// Cancel-safe: between polls `read` holds only what was read.
    pub(super) async fn read_more(&self, read: &mut Vec<u8>) -> io::Result<usize> {
        std::future::poll_fn(|cx| {
            let filled = read.len();
            read.resize(filled + READ_BYTES_MAX, 0);
            let polled = self.read_into(cx, &mut read[filled..]);
            let got = match &polled {
                Poll::Ready(Ok(got)) => *got,
                _ => 0,
            };
            read.truncate(filled + got);
            polled
        })
        .await
    }

    /// Writes all of `bytes`, waiting for the socket to take them.
    pub(super) async fn write_all(&self, mut bytes: &[u8]) -> io::Result<()> {
        while !bytes.is_empty() {
            self.0.writable().await?;
            match self.0.try_write(bytes) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(written) => bytes = &bytes[written..],
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }
}

/// What hyper reads and writes once the connection's front hands it over: first the bytes
/// the front read but did not answer, then the socket.
pub struct Rewind {
    read: Bytes,
    stream: SharedStream,
    left: Arc<AtomicUsize>,
}

impl Rewind {
    /// Also returns how the drain sees what hyper has not taken of `read` yet.
    pub fn new(read: Bytes, stream: SharedStream) -> (Self, Leftover) {
        let left = Arc::new(AtomicUsize::new(read.len()));
        let leftover = Leftover(left.clone());
        (Self { read, stream, left }, leftover)
    }
}

/// The bytes the front read that hyper has not taken yet: requests that arrived before the
/// drain, which it lets hyper answer as it does those still in the socket.
#[derive(Clone, Default)]
pub struct Leftover(Arc<AtomicUsize>);

impl Leftover {
    pub(super) fn any(&self) -> bool {
        self.0.load(Ordering::Relaxed) > 0
    }
}

impl AsyncRead for Rewind {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.read.is_empty() {
            return Pin::new(&mut this.stream).poll_read(cx, buf);
        }
        let taken = this.read.split_to(this.read.len().min(buf.remaining()));
        buf.put_slice(&taken);
        this.left.store(this.read.len(), Ordering::Relaxed);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Rewind {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn hyper_reads_what_the_front_left_before_the_socket() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let stream = SharedStream::new(listener.accept().await.unwrap().0);
        let (mut rewind, leftover) = Rewind::new(Bytes::from_static(b"abc"), stream);
        let mut two = [0; 2];

        rewind.read_exact(&mut two).await.unwrap();
        assert_eq!((&two, leftover.any()), (b"ab", true));
        client.write_all(b"de").await.unwrap();
        let mut rest = [0; 3];
        rewind.read_exact(&mut rest).await.unwrap();

        assert_eq!((&rest, leftover.any()), (b"cde", false));
    }
}
