//! Payment endpoints: starting another payment attempt, and the provider's webhooks.

use std::net::SocketAddr;

use bytes::Bytes;
use http::header::{AUTHORIZATION, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use serde_json::json;
use uuid::Uuid;

use super::State;
use super::body::{self, Caching};
use super::problem::Problem;
use crate::domain::IdempotencyKey;
use crate::payments::checkout::PaymentView;
use crate::payments::webhook::Received;

type Reply = Result<Response<Full<Bytes>>, Problem>;

/// `POST /v1/orders/{order_id}/payments`: a new attempt for an order still waiting for
/// payment, under the client's `Idempotency-Key`.
pub async fn start_payment(
    state: &State,
    peer: SocketAddr,
    request: Request<Incoming>,
    raw_id: &str,
) -> Reply {
    super::guard::check_ip(state, peer, request.headers())?;
    let values = request
        .headers()
        .get(AUTHORIZATION)
        .map(HeaderValue::as_bytes);
    let user = state.admission.authenticate(values).await?;
    crate::telemetry::record_user(&user);
    let order_id = Uuid::parse_str(raw_id).map_err(|_| Problem::not_found("no such order"))?;
    let key = request
        .headers()
        .get("idempotency-key")
        .ok_or_else(|| Problem::invalid("the Idempotency-Key header is required"))?;
    let key = IdempotencyKey::parse(
        key.as_bytes(),
        state.settings.orders.idempotency_key_bytes_max,
    )?;
    let (_, bytes) = body::split(request, &state.settings.server).await?;
    if !bytes.trim_ascii().is_empty() {
        body::json::<serde_json::Map<String, serde_json::Value>>(&bytes)?;
    }
    let (attempt, replayed) = state.sale.pay(&user, order_id, &key).await?;
    let mut response = body::respond(
        StatusCode::CREATED,
        &PaymentView::of(&attempt),
        Caching::Private,
    );
    if replayed {
        response
            .headers_mut()
            .insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    Ok(response)
}

/// `POST /v1/webhooks/{provider}`: the signature is checked on the raw body before anything
/// else; the answer is fast, slow work is left to the outbox.
pub async fn webhook(state: &State, request: Request<Incoming>, provider: &str) -> Reply {
    if state.sale.payments().is_none() {
        return Err(Problem::not_found("payments are not enabled"));
    }
    let (parts, raw) = body::split(request, &state.settings.server).await?;
    let signature = parts
        .headers
        .get("flashgate-signature")
        .map(HeaderValue::as_bytes);
    let received = state.sale.settle(provider, signature, &raw).await?;
    let answer = match &received {
        Received::Accepted(applied) => {
            json!({ "received": true, "duplicate": false, "outcome": applied.label() })
        }
        Received::Duplicate => json!({ "received": true, "duplicate": true }),
    };
    Ok(body::respond(StatusCode::OK, &answer, Caching::Private))
}
