//! The checks every handler starts with: the per-IP limit after resolving the client
//! address, and the admin token; and the request headers they and the handlers read.
//! A module of its own so that handlers of every kind share it without importing one
//! another.

use std::net::SocketAddr;

use http::header::{AUTHORIZATION, HeaderName, HeaderValue};
use http::{HeaderMap, Request};

use super::State;
use super::problem::Problem;
use crate::admission::token::{TokenError, bearer_token, constant_time_eq};
use crate::operators::{self, Change, Operator};

/// The request header that carries a pass on `POST /v1/deals/{id}/orders`.
pub const PASS_HEADER: &str = "flashgate-pass";

/// The request header that carries a proof-of-work solution on `POST /v1/deals/{id}/queue`.
pub const POW_HEADER: &str = "flashgate-pow";

/// The request header that carries a ticket's signed `position_token` back: a re-join
/// without a new proof of work, and a ticket poll answered from far outside the check-in
/// window.
pub const POSITION_HEADER: &str = "flashgate-position";

/// The longest `Flashgate-Position` taken (a token the gateway signs is under 300 bytes); a
/// longer one is bad input, answered 400 before anything else reads it.
pub const POSITION_TOKEN_BYTES_MAX: usize = 512;

/// The request's `Flashgate-Position`, if any, within [`POSITION_TOKEN_BYTES_MAX`].
pub(super) fn position_header<B>(request: &Request<B>) -> Result<Option<&[u8]>, Problem> {
    match header(request, POSITION_HEADER) {
        Some(token) if token.len() > POSITION_TOKEN_BYTES_MAX => Err(Problem::invalid(format!(
            "Flashgate-Position is longer than {POSITION_TOKEN_BYTES_MAX} bytes"
        ))),
        shown => Ok(shown),
    }
}

/// A request header's raw bytes.
pub(super) fn header<B>(
    request: &Request<B>,
    name: impl http::header::AsHeaderName,
) -> Option<&[u8]> {
    request.headers().get(name).map(HeaderValue::as_bytes)
}

/// The headers of a request as the checks read them: from hyper's map, or from the head
/// the connection's front parsed itself (`front`).
pub(super) trait Headers {
    /// The first value of `name`.
    fn first(&self, name: &HeaderName) -> Option<&[u8]>;
    /// Every value of `name`, in the order received.
    fn every<'a>(&'a self, name: &'a HeaderName) -> impl DoubleEndedIterator<Item = &'a [u8]> + 'a;
}

impl Headers for HeaderMap {
    fn first(&self, name: &HeaderName) -> Option<&[u8]> {
        self.get(name).map(HeaderValue::as_bytes)
    }

    fn every<'a>(&'a self, name: &'a HeaderName) -> impl DoubleEndedIterator<Item = &'a [u8]> + 'a {
        self.get_all(name).iter().map(HeaderValue::as_bytes)
    }
}

/// Per-IP limit, after resolving the client address.
pub(super) fn check_ip(
    state: &State,
    peer: SocketAddr,
    headers: &impl Headers,
) -> Result<(), Problem> {
    let values = headers.every(&state.client_ip_header);
    let ip = state.admission.client_ip(peer.ip(), values);
    Ok(state.admission.check_ip(ip)?)
}

/// Who may use /admin: the static admin token (compared in constant time, while
/// `auth.admin_token_enabled`), or a provider token holding the operators' role. A valid
/// token without the role is 403; a token that is not valid is 401.
pub(super) async fn require_admin<B>(
    state: &State,
    request: &Request<B>,
) -> Result<Operator, Problem> {
    let authorization = header(request, AUTHORIZATION);
    let token = bearer_token(authorization).map_err(|error| match error {
        TokenError::WrongScheme => Problem::unauthorized(error.to_string()),
        _ => Problem::unauthorized("admin bearer token required"),
    })?;
    let auth = &state.settings.auth;
    if auth.admin_token_enabled && constant_time_eq(token, auth.admin_token.as_bytes()) {
        return Ok(Operator::admin_token());
    }
    if state.admission.provider().is_none() {
        return Err(Problem::forbidden("this token may not use the admin API"));
    }
    let identity = state.admission.identify(authorization).await?;
    if identity.admin {
        Ok(Operator::named(identity.user.as_str()))
    } else {
        Err(Problem::forbidden(
            "this token does not hold the operators' role",
        ))
    }
}

/// Records an admin change in the operator log, naming who made it.
pub(super) async fn record(
    state: &State,
    who: &Operator,
    action: &'static str,
    target: &str,
    detail: serde_json::Value,
) {
    let change = Change {
        action,
        target,
        detail,
    };
    operators::record(&state.pools.admin, who, change).await;
}
