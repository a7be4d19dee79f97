//! The simulator's HTTP side: accept loop, routing, body limits and JSON answers.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use super::Sim;
use super::handlers;
use super::model::SimError;
use super::route::{Reply, Route};

/// Largest request body read, in bytes; larger bodies are answered 413.
pub const BODY_BYTES_MAX: usize = 64 * 1024;
/// Connections served at once; further connections are closed at once.
const CONNECTIONS_MAX: usize = 4_096;
/// How long in-flight requests may run after shutdown starts.
const SHUTDOWN_GRACE_SECONDS: u64 = 5;
/// A client that has not sent its request head within this long is disconnected.
const HEADER_READ_TIMEOUT_SECONDS: u64 = 10;

async fn read_body(body: Incoming) -> Result<Bytes, SimError> {
    match Limited::new(body, BODY_BYTES_MAX).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => {
            Err(SimError::PayloadTooLarge)
        }
        Err(error) => Err(SimError::invalid(format!("cannot read the body: {error}"))),
    }
}

async fn handle(
    sim: Arc<Sim>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = request.into_parts();
    let reply = match Route::of(&parts.method, parts.uri.path()) {
        Err(error) => Reply::error(&error),
        Ok(route) => match read_body(body).await {
            Err(error) => Reply::error(&error),
            Ok(body) => handlers::dispatch(&sim, route, &parts.headers, &body).await,
        },
    };
    Ok(reply.into_response())
}

/// Serves until `shutdown`, then lets in-flight requests finish for a short grace period.
/// With `tls`, every connection first completes a TLS handshake.
pub async fn serve(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    sim: Arc<Sim>,
    shutdown: CancellationToken,
) {
    let connections = Arc::new(Semaphore::new(CONNECTIONS_MAX));
    let graceful = GracefulShutdown::new();
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(HEADER_READ_TIMEOUT_SECONDS))
        .keep_alive(true);
    let builder = Arc::new(builder);
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(error) => {
                tracing::warn!(%error, "psp-sim accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (sim, tls, watcher, builder) = (
            sim.clone(),
            tls.clone(),
            graceful.watcher(),
            builder.clone(),
        );
        tokio::spawn(async move {
            match tls {
                None => serve_connection(stream, sim, watcher, &builder).await,
                Some(tls) => {
                    let handshake = Duration::from_secs(HEADER_READ_TIMEOUT_SECONDS);
                    match tokio::time::timeout(handshake, tls.accept(stream)).await {
                        Ok(Ok(stream)) => {
                            serve_connection(stream, sim, watcher, &builder).await;
                        }
                        Ok(Err(error)) => tracing::debug!(%error, "psp-sim TLS handshake failed"),
                        Err(_) => tracing::debug!("psp-sim TLS handshake timed out"),
                    }
                }
            }
            drop(permit);
        });
    }
    drop(listener);
    let grace = Duration::from_secs(SHUTDOWN_GRACE_SECONDS);
    let _ = tokio::time::timeout(grace, graceful.shutdown()).await;
}

/// Serves HTTP/1.1 on one connection, plain or already through its TLS handshake.
async fn serve_connection<I>(io: I, sim: Arc<Sim>, watcher: Watcher, builder: &http1::Builder)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |request| handle(sim.clone(), request));
    let connection = watcher.watch(builder.serve_connection(TokioIo::new(io), service));
    if let Err(error) = connection.await {
        tracing::debug!(%error, "psp-sim connection ended with an error");
    }
}
