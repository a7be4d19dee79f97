//! The accept loop: connection limits, HTTP/1.1 with bounded heads, graceful drain.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::State;
use super::router;
use crate::telemetry;

/// Serves `listener` until `shutdown`, then stops accepting, lets in-flight requests finish
/// for up to `server.shutdown_grace_seconds`, and returns.
pub async fn serve(listener: TcpListener, state: Arc<State>, shutdown: CancellationToken) {
    let server = &state.settings.server;
    let connections = Arc::new(Semaphore::new(server.connections_max));
    let graceful = GracefulShutdown::new();
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(server.header_read_timeout_ms))
        .max_buf_size(server.header_bytes_max)
        .keep_alive(true);
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(pair) => pair,
            Err(error) => {
                // Usually out of file descriptors: back off instead of spinning.
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            metrics::counter!(telemetry::CONNECTIONS_REFUSED).increment(1);
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let state = state.clone();
        let service = service_fn(move |request| router::handle(state.clone(), peer, request));
        let connection = graceful.watch(builder.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "connection ended with an error");
            }
            drop(permit);
        });
    }
    state.ready.store(false, Ordering::Relaxed);
    drop(listener);
    let grace = Duration::from_secs(server.shutdown_grace_seconds);
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("shutdown grace period over; closing remaining connections");
    }
}
