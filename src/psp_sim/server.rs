//! The simulator's HTTP side: accept loop, routing, body limits and JSON answers.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::Sim;
use super::handlers;
use super::model::SimError;

/// Largest request body read, in bytes; larger bodies are answered 413.
pub const BODY_BYTES_MAX: usize = 64 * 1024;
/// Connections served at once; further connections are closed at once.
const CONNECTIONS_MAX: usize = 4_096;
/// How long in-flight requests may run after shutdown starts.
const SHUTDOWN_GRACE_SECONDS: u64 = 5;
/// A client that has not sent its request head within this long is disconnected.
const HEADER_READ_TIMEOUT_SECONDS: u64 = 10;

/// A matched route; ids are raw path segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route<'a> {
    Healthz,
    CreateIntent,
    GetIntent(&'a str),
    Capture(&'a str),
    Cancel(&'a str),
    IntentRefunds(&'a str),
    CreateRefund,
    GetRefund(&'a str),
    CheckoutPage(&'a str),
    Pay(&'a str),
    Decline(&'a str),
    GetFaults,
    SetFaults,
    ResetFaults,
    ForceSucceed(&'a str),
    Amend(&'a str),
    FlushWebhooks,
    Events,
    ListIntents,
    AdvanceClock,
    GetWebhookUrl,
    SetWebhookUrl,
}

impl<'a> Route<'a> {
    /// `Err` is 404 for an unknown path and 405 for a known path with another method.
    pub fn of(method: &Method, path: &'a str) -> Result<Self, SimError> {
        let segments: Vec<&'a str> = path.trim_start_matches('/').split('/').collect();
        if let Some(route) = Self::matching(method, &segments) {
            return Ok(route);
        }
        let other_method = [Method::GET, Method::POST, Method::DELETE]
            .iter()
            .any(|m| Self::matching(m, &segments).is_some());
        if other_method {
            Err(SimError::MethodNotAllowed)
        } else {
            Err(SimError::NotFound(format!("no route for {path}")))
        }
    }

    fn matching(method: &Method, segments: &[&'a str]) -> Option<Self> {
        let get = *method == Method::GET || *method == Method::HEAD;
        let post = *method == Method::POST;
        let delete = *method == Method::DELETE;
        let route = match segments {
            ["healthz"] if get => Route::Healthz,
            ["v1", "payment_intents"] if post => Route::CreateIntent,
            ["v1", "payment_intents", id] if get => Route::GetIntent(id),
            ["v1", "payment_intents", id, "capture"] if post => Route::Capture(id),
            ["v1", "payment_intents", id, "cancel"] if post => Route::Cancel(id),
            ["v1", "payment_intents", id, "refunds"] if get => Route::IntentRefunds(id),
            ["v1", "refunds"] if post => Route::CreateRefund,
            ["v1", "refunds", id] if get => Route::GetRefund(id),
            ["checkout", id] if get => Route::CheckoutPage(id),
            ["checkout", id, "pay"] if post => Route::Pay(id),
            ["checkout", id, "decline"] if post => Route::Decline(id),
            ["control", "faults"] if get => Route::GetFaults,
            ["control", "faults"] if post => Route::SetFaults,
            ["control", "faults"] if delete => Route::ResetFaults,
            ["control", "payment_intents"] if get => Route::ListIntents,
            ["control", "payment_intents", id, "succeed"] if post => Route::ForceSucceed(id),
            ["control", "payment_intents", id, "amend"] if post => Route::Amend(id),
            ["control", "webhooks", "flush"] if post => Route::FlushWebhooks,
            ["control", "events"] if get => Route::Events,
            ["control", "clock", "advance"] if post => Route::AdvanceClock,
            ["control", "webhook_url"] if get => Route::GetWebhookUrl,
            ["control", "webhook_url"] if post => Route::SetWebhookUrl,
            _ => return None,
        };
        Some(route)
    }

    /// The provider API proper: bearer token required, API faults apply.
    pub fn is_api(&self) -> bool {
        matches!(
            self,
            Route::CreateIntent
                | Route::GetIntent(_)
                | Route::Capture(_)
                | Route::Cancel(_)
                | Route::IntentRefunds(_)
                | Route::CreateRefund
                | Route::GetRefund(_)
        )
    }
}

/// An answer before it becomes a hyper response.
pub struct Reply {
    pub status: StatusCode,
    pub content_type: &'static str,
    pub body: Bytes,
    pub replayed: bool,
}

impl Reply {
    pub fn json(value: &Value) -> Self {
        Reply {
            status: StatusCode::OK,
            content_type: "application/json",
            body: Bytes::from(value.to_string()),
            replayed: false,
        }
    }

    pub fn html(page: String) -> Self {
        Reply {
            status: StatusCode::OK,
            content_type: "text/html; charset=utf-8",
            body: Bytes::from(page),
            replayed: false,
        }
    }

    pub fn error(error: &SimError) -> Self {
        let mut reply = Reply::json(&error.body());
        reply.status =
            StatusCode::from_u16(error.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        reply
    }

    fn into_response(self) -> Response<Full<Bytes>> {
        let mut response = Response::new(Full::new(self.body));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(self.content_type));
        if self.replayed {
            headers.insert("idempotent-replayed", HeaderValue::from_static("true"));
        }
        response
    }
}

impl From<Result<Reply, SimError>> for Reply {
    fn from(result: Result<Reply, SimError>) -> Self {
        result.unwrap_or_else(|error| Reply::error(&error))
    }
}

/// Parses a JSON body; an empty body is `{}` so that bodiless POSTs work.
pub fn json_body(body: &[u8]) -> Result<Value, SimError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Object(serde_json::Map::new()));
    }
    serde_json::from_slice(body).map_err(|e| SimError::invalid(format!("body is not JSON: {e}")))
}

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
pub async fn serve(listener: TcpListener, sim: Arc<Sim>, shutdown: CancellationToken) {
    let connections = Arc::new(Semaphore::new(CONNECTIONS_MAX));
    let graceful = GracefulShutdown::new();
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(HEADER_READ_TIMEOUT_SECONDS))
        .keep_alive(true);
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
        let sim = sim.clone();
        let service = service_fn(move |request| handle(sim.clone(), request));
        let connection = graceful.watch(builder.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "psp-sim connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    let grace = Duration::from_secs(SHUTDOWN_GRACE_SECONDS);
    let _ = tokio::time::timeout(grace, graceful.shutdown()).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_by_method_and_path() {
        assert_eq!(
            Route::of(&Method::POST, "/v1/payment_intents/pi_1/capture"),
            Ok(Route::Capture("pi_1"))
        );
        assert_eq!(
            Route::of(&Method::DELETE, "/control/faults"),
            Ok(Route::ResetFaults)
        );
        assert_eq!(
            Route::of(&Method::GET, "/v1/refunds"),
            Err(SimError::MethodNotAllowed)
        );
        assert!(matches!(
            Route::of(&Method::GET, "/nope"),
            Err(SimError::NotFound(_))
        ));
    }
}
