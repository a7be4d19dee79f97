//! Waiting-room endpoints: take a ticket (after a proof of work when the deal asks one),
//! poll it, the public state of a line, the published pass keys, and an operator's
//! revocation.
//!
//! Polls are answered from Redis and the in-memory deal cache, never from PostgreSQL. The
//! public line status is the same for everyone at the same distance from the front: each
//! instance reads it from Redis at most once per `line_state_refresh_ms`, and a CDN may
//! cache it for a second. Ticket answers are personal (`private, no-store`,
//! `Vary: Authorization`) and carry the ticket's signed position, so a client reads the
//! public status until the line comes within `checkin_window_tickets` of it, and polls its
//! ticket only then; a poll that shows the signed position from far outside the window is
//! answered from memory (`waiting_room::follow`).

use std::net::SocketAddr;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use http::header::AUTHORIZATION;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use serde::{Deserialize, Serialize};

use super::State;
use super::body::{self, Caching};
use super::guard::{POW_HEADER, check_ip, header, position_header, record, require_admin};
use super::problem::Problem;
use super::ticket_view::{far_reply, follow_refresh, ticket_reply};
use crate::deals::{Deal, Window};
use crate::domain::{DealId, UserId};
use crate::waiting_room::priority;
use crate::waiting_room::{Position, Proof, QueueError};

type Reply = Result<Response<Full<Bytes>>, Problem>;

/// Longest ticket id accepted in a path; real ones are 32 hex digits.
const TICKET_BYTES_MAX: usize = 64;

#[derive(Serialize)]
struct LineView {
    admitted_through: u64,
    waiting: u64,
    admit_per_second: i32,
    /// `fixed` or `adaptive`: who sets the rate the line moves at.
    mode: &'static str,
    /// The rate the line moves at now (tickets per second): `admit_per_second` in fixed
    /// mode, the controller's in adaptive mode; absent before the line's first step.
    #[serde(skip_serializing_if = "Option::is_none")]
    outflow_per_second: Option<f64>,
    max_active: i32,
    state: &'static str,
    queue_order: String,
    /// Random order: SHA-256 of the shuffle seed, published before the sale opens.
    #[serde(skip_serializing_if = "Option::is_none")]
    seed_sha256: Option<String>,
    /// Random order: the seed itself, published once the pre-queue was shuffled.
    #[serde(skip_serializing_if = "Option::is_none")]
    seed: Option<String>,
    /// Random order: how many tickets (issue numbers 1..=n) the shuffle reordered.
    #[serde(skip_serializing_if = "Option::is_none")]
    prequeue_size: Option<u64>,
    /// A ticket whose position is at most this far past `admitted_through` checks in.
    checkin_window_tickets: u64,
    /// How long a client `behind` tickets from the front (the query parameter; 0 when
    /// absent) waits before reading this state again: longer the further back it is.
    refresh_after_seconds: u64,
    /// Units of the last stock snapshot not promised to an outstanding pass.
    #[serde(skip_serializing_if = "Option::is_none")]
    units_left: Option<u64>,
    /// A line with a priority group: that group's line, apart from the rest.
    #[serde(skip_serializing_if = "Option::is_none")]
    priority: Option<PriorityLineView>,
}

/// The priority group's line in the public state: `admitted_through` and `waiting` above
/// count the general group's places (`waiting`: both lines together).
#[derive(Serialize)]
struct PriorityLineView {
    share_percent: u8,
    admitted_through: u64,
    waiting: u64,
}

impl From<QueueError> for Problem {
    fn from(error: QueueError) -> Self {
        if let QueueError::Closed = error {
            return sale_not_open("the waiting room is closed");
        }
        if let QueueError::Challenge(challenge) = error {
            return Problem::new(
                super::problem::Kind::ChallengeRequired,
                StatusCode::FORBIDDEN,
                challenge.to_string(),
            );
        }
        tracing::debug!(%error, "waiting room unavailable");
        Problem::overloaded("the waiting room is unavailable right now; retry shortly")
    }
}

/// The deal, which must exist and have a waiting room.
async fn deal_with_room(state: &State, raw_id: &str) -> Result<std::sync::Arc<Deal>, Problem> {
    let id = DealId::parse(raw_id).map_err(|_| Problem::not_found("no such deal"))?;
    let deal = state
        .admission
        .deal(&state.pools.request, id.as_str())
        .await?;
    if !deal.waiting_room.enabled {
        return Err(Problem::not_found("this deal has no waiting room"));
    }
    Ok(deal)
}

async fn user<B>(state: &State, peer: SocketAddr, request: &Request<B>) -> Result<UserId, Problem> {
    check_ip(state, peer, request.headers())?;
    let authorization = request.headers().get(AUTHORIZATION).map(|v| v.as_bytes());
    let user = state.admission.authenticate(authorization).await?;
    crate::telemetry::record_user(&user);
    Ok(user)
}

/// `POST /v1/deals/{id}/queue`: the user's one ticket, issued on the first call.
pub async fn join(
    state: &State,
    peer: SocketAddr,
    request: Request<Incoming>,
    raw_id: &str,
) -> Reply {
    check_ip(state, peer, request.headers())?;
    let authorization = request.headers().get(AUTHORIZATION).map(|v| v.as_bytes());
    let (user, claims) = state.admission.authenticate_claims(authorization).await?;
    crate::telemetry::record_user(&user);
    let deal = deal_with_room(state, raw_id).await?;
    let now = state.clock.now();
    if deal.window(now) == Window::Ended {
        return Err(sale_not_open("the sale has ended"));
    }
    if !deal.waiting_room.queue_open(deal.starts_at, now) {
        return Err(sale_not_open("the waiting room is not open yet"));
    }
    let room = state.admission.waiting_room();
    let solution = header(&request, POW_HEADER).map(<[u8]>::to_vec);
    let position = position_header(&request)?.map(<[u8]>::to_vec);
    let code = super::join_body::access_code(state, &deal, request).await?;
    let pool = &state.pools.request;
    let group = priority::admit(pool, &deal, user.as_str(), &claims, code.as_deref()).await?;
    let proof = Proof {
        solution: solution.as_deref(),
        position: position.as_deref(),
    };
    let sold_out = state.admission.sold_out().is_sold_out(&deal.id);
    let status = room
        .join(&deal, user.as_str(), proof, sold_out, group)
        .await?;
    Ok(ticket_reply(
        state,
        &deal,
        &user,
        &status,
        StatusCode::CREATED,
    ))
}

/// `GET /v1/deals/{id}/queue/{ticket}`: the user's ticket; anyone else's is 404.
pub async fn poll(
    state: &State,
    peer: SocketAddr,
    request: &Request<Incoming>,
    raw_id: &str,
    ticket: &str,
) -> Reply {
    let user = user(state, peer, request).await?;
    let deal = deal_with_room(state, raw_id).await?;
    if ticket.is_empty()
        || ticket.len() > TICKET_BYTES_MAX
        || !ticket.bytes().all(|b| b.is_ascii_alphanumeric())
    {
        return Err(Problem::not_found("no such ticket"));
    }
    let room = state.admission.waiting_room();
    if let Some(shown) = shown_position(state, &deal, &user, ticket, request)? {
        let far = room.far(&deal.id, &deal.waiting_room, &shown).await?;
        if let Some(far) = far {
            return Ok(far_reply(state, &deal, &shown, &far, request));
        }
    }
    let status = room
        .poll(&deal.id, user.as_str(), ticket)
        .await?
        .ok_or_else(|| Problem::not_found("no such ticket"))?;
    Ok(ticket_reply(state, &deal, &user, &status, StatusCode::OK))
}

/// The position the poll shows in `Flashgate-Position`, verified in memory; a token that
/// does not verify for this user's `ticket` is refused before anything touches Redis.
fn shown_position(
    state: &State,
    deal: &Deal,
    user: &UserId,
    ticket: &str,
    request: &Request<Incoming>,
) -> Result<Option<Position>, Problem> {
    let Some(token) = position_header(request)? else {
        return Ok(None);
    };
    let positions = state.admission.waiting_room().positions();
    let shown = positions
        .verify(token, &deal.id, user.as_str())
        .map_err(|error| Problem::forbidden(error.to_string()))?;
    if shown.ticket != ticket {
        return Err(Problem::forbidden(
            "the position token is for another ticket, deal or user",
        ));
    }
    Ok(Some(shown))
}

/// `GET /v1/deals/{id}/queue`: the public line, cacheable for about a second.
pub async fn line(
    state: &State,
    peer: SocketAddr,
    request: &Request<Incoming>,
    raw_id: &str,
) -> Reply {
    check_ip(state, peer, request.headers())?;
    let behind = behind(request.uri().query())?;
    let deal = deal_with_room(state, raw_id).await?;
    let room = state.admission.waiting_room();
    let line = room.line(&deal.id).await?;
    let sold_out = line.sold_out || state.admission.sold_out().is_sold_out(&deal.id);
    let max_age = state.settings.server.public_cache_max_age_seconds;
    let view = LineView {
        checkin_window_tickets: room.checkin_window_tickets(&deal.waiting_room),
        refresh_after_seconds: follow_refresh(state, &deal, behind),
        units_left: line.units_left.filter(|_| !sold_out),
        admitted_through: line.admitted_through,
        waiting: line.waiting,
        admit_per_second: deal.waiting_room.admit_per_second,
        mode: deal.waiting_room.admission.mode.as_str(),
        outflow_per_second: line.outflow_per_second.map(round_rate),
        max_active: deal.waiting_room.max_active,
        state: deal.public_state(state.clock.now(), sold_out),
        queue_order: deal.waiting_room.queue_order.clone(),
        seed_sha256: line.seed_sha256,
        seed: line.seed,
        prequeue_size: line.prequeue_size.filter(|_| deal.waiting_room.is_random()),
        priority: deal
            .waiting_room
            .priority
            .as_ref()
            .map(|p| PriorityLineView {
                share_percent: p.share_percent,
                admitted_through: line.priority_through,
                waiting: line.priority_waiting,
            }),
    };
    Ok(body::respond(
        StatusCode::OK,
        &view,
        Caching::Public(max_age),
    ))
}

/// Largest `behind` the public state takes (2^40 tickets).
const BEHIND_MAX: u64 = 1 << 40;

/// The `behind` query parameter of the public state: 0 or a power of two up to
/// `BEHIND_MAX` (a client rounds its distance down to one), so an edge caches a few dozen
/// answers per line rather than one per position.
fn behind(query: Option<&str>) -> Result<u64, Problem> {
    let Some(query) = query.filter(|q| !q.is_empty()) else {
        return Ok(0);
    };
    let refused =
        || Problem::invalid("the only query parameter is behind: 0 or a power of two up to 2^40");
    let value = query.strip_prefix("behind=").ok_or_else(refused)?;
    let behind = value.parse::<u64>().map_err(|_| refused())?;
    // One spelling per value (no leading zeros, no repeats), so no query busts a cache.
    let canonical = value == behind.to_string();
    if !canonical || behind > BEHIND_MAX || (behind != 0 && !behind.is_power_of_two()) {
        return Err(refused());
    }
    Ok(behind)
}

/// An outflow as shown: two decimals are all a person reads.
pub(super) fn round_rate(rate: f64) -> f64 {
    (rate * 100.0).round() / 100.0
}

fn sale_not_open(detail: &str) -> Problem {
    Problem::new(
        super::problem::Kind::SaleNotOpen,
        StatusCode::CONFLICT,
        detail,
    )
}

/// `GET /v1/deals/{id}/queue/challenge`: a proof-of-work challenge for the user's join.
pub async fn challenge(
    state: &State,
    peer: SocketAddr,
    request: &Request<Incoming>,
    raw_id: &str,
) -> Reply {
    let user = user(state, peer, request).await?;
    let deal = deal_with_room(state, raw_id).await?;
    let room = state.admission.waiting_room();
    let challenge = room.challenge(&deal, user.as_str()).await?;
    let view = ChallengeView {
        algorithm: "sha256-leading-zero-bits",
        difficulty_bits: challenge.difficulty_bits,
        expires_at: DateTime::from_timestamp_millis(challenge.expires_at_ms),
        challenge: challenge.challenge,
    };
    Ok(body::respond(StatusCode::OK, &view, Caching::Private))
}

#[derive(Serialize)]
struct ChallengeView {
    challenge: String,
    algorithm: &'static str,
    difficulty_bits: u32,
    expires_at: Option<DateTime<Utc>>,
}

/// `GET /.well-known/flashgate-keys.json`: the Ed25519 keys that verify passes, and what an
/// edge needs to check the token provider's tokens (`provider`) when one is configured.
pub fn keys(state: &State) -> Reply {
    let room = state.admission.waiting_room();
    let max_age = u32::try_from(room.settings().keys_max_age_seconds).unwrap_or(u32::MAX);
    let mut document = room.passes().key_set();
    if let Some(provider) = state.admission.provider() {
        document["provider"] = provider.published();
    }
    Ok(body::respond(
        StatusCode::OK,
        &document,
        Caching::Public(max_age),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RevokeRequest {
    user_id: String,
}

#[derive(Serialize)]
struct RevokeView {
    deal_id: String,
    user_id: String,
    revoked: bool,
}

/// `POST /admin/deals/{id}/queue/revoke`: ends a user's session on the line; their pass
/// stops working on every instance within `revocation_poll_ms`.
pub async fn revoke(state: &State, request: Request<Incoming>, raw_id: &str) -> Reply {
    let operator = require_admin(state, &request).await?;
    let deal = deal_with_room(state, raw_id).await?;
    let (_, bytes) = body::split(request, &state.settings.server).await?;
    let asked: RevokeRequest = body::json(&bytes)?;
    let user = UserId::parse(&asked.user_id, state.settings.auth.user_id_bytes_max)
        .map_err(|_| Problem::invalid("user_id must be a user id"))?;
    let room = state.admission.waiting_room();
    let ticket = room.revoke(&deal.id, user.as_str()).await?;
    let detail = serde_json::json!({"user_id": user.as_str()});
    record(state, &operator, "queue.revoked", &deal.id, detail).await;
    let view = RevokeView {
        deal_id: deal.id.clone(),
        user_id: user.as_str().to_owned(),
        revoked: ticket.is_some(),
    };
    Ok(body::respond(StatusCode::OK, &view, Caching::Private))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn behind_takes_one_spelling_of_a_power_of_two() {
        assert_eq!(behind(None).ok(), Some(0));
        assert_eq!(behind(Some("")).ok(), Some(0));
        assert_eq!(behind(Some("behind=0")).ok(), Some(0));
        assert_eq!(behind(Some("behind=1024")).ok(), Some(1024));
        assert_eq!(behind(Some("behind=1099511627776")).ok(), Some(BEHIND_MAX));
        for refused in [
            "behind=3",
            "behind=0004",
            "behind=+4",
            "behind=4&behind=8",
            "behind=2199023255552",
            "other=1",
            "behind=",
        ] {
            assert!(behind(Some(refused)).is_err(), "{refused}");
        }
    }
}
