//! `GET /.well-known/flashgate-revoked.json`: the passes revoked before their expiry, for
//! an edge that verifies passes itself (edge/cloudflare/worker.js).
//!
//! An edge checks signatures from the published keys, but a revocation lives in each
//! instance's memory: without this feed an edge would accept a revoked pass until it
//! expired. The feed is public and cacheable for `server.public_cache_max_age_seconds`, so
//! an edge fetches it about once a second whatever its traffic, and a revoked pass is
//! refused at the edge within `waiting_room.revocation_poll_ms` (the instance learning of
//! it) plus that max-age. Its size is bounded by the revocations still in force: an entry
//! leaves the feed once the pass would have expired anyway.

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::Full;
use serde::Serialize;

use super::State;
use super::body::{self, Caching};

/// One revoked pass: its id (the `p` of its payload) and until when it is refused.
#[derive(Serialize)]
struct RevokedPass {
    pass: String,
    until_ms: i64,
}

#[derive(Serialize)]
struct Feed {
    revoked: Vec<RevokedPass>,
}

/// The feed, as this instance knows it.
pub fn feed(state: &State) -> Response<Full<Bytes>> {
    let room = state.admission.waiting_room();
    let revoked = room
        .revoked()
        .entries()
        .into_iter()
        .map(|(pass, until_ms)| RevokedPass { pass, until_ms })
        .collect();
    let max_age = state.settings.server.public_cache_max_age_seconds;
    body::respond(StatusCode::OK, &Feed { revoked }, Caching::Public(max_age))
}
