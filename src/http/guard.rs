//! The checks every handler starts with: the per-IP limit after resolving the client
//! address, and the admin token; and the request headers they and the handlers read.
//! A module of its own so that handlers of every kind share it without importing one
//! another.

use std::net::SocketAddr;

use http::Request;
use http::header::{AUTHORIZATION, HeaderValue};

use super::State;
use super::problem::Problem;
use crate::admission::token::{TokenError, bearer_token, constant_time_eq};

/// The request header that carries a pass on `POST /v1/deals/{id}/orders`.
pub const PASS_HEADER: &str = "flashgate-pass";

/// The request header that carries a proof-of-work solution on `POST /v1/deals/{id}/queue`.
pub const POW_HEADER: &str = "flashgate-pow";

/// A request header's raw bytes.
pub(super) fn header<B>(
    request: &Request<B>,
    name: impl http::header::AsHeaderName,
) -> Option<&[u8]> {
    request.headers().get(name).map(HeaderValue::as_bytes)
}

/// Per-IP limit, after resolving the client address.
pub(super) fn check_ip<B>(
    state: &State,
    peer: SocketAddr,
    request: &Request<B>,
) -> Result<(), Problem> {
    let values = request.headers().get_all(&state.client_ip_header).iter();
    let ip = state
        .admission
        .client_ip(peer.ip(), values.map(HeaderValue::as_bytes));
    Ok(state.admission.check_ip(ip)?)
}

/// Only the configured admin token opens /admin; compared in constant time.
pub(super) fn require_admin<B>(state: &State, request: &Request<B>) -> Result<(), Problem> {
    let token = bearer_token(header(request, AUTHORIZATION)).map_err(|error| match error {
        TokenError::WrongScheme => Problem::unauthorized(error.to_string()),
        _ => Problem::unauthorized("admin bearer token required"),
    })?;
    if constant_time_eq(token, state.settings.auth.admin_token.as_bytes()) {
        Ok(())
    } else {
        Err(Problem::forbidden("this token may not use the admin API"))
    }
}
