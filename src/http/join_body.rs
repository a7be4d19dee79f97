//! The body of a join (`POST /v1/deals/{id}/queue`): read only for a deal whose line takes
//! access codes, so a join to any other line never waits for a body.

use http::Request;
use hyper::body::Incoming;
use serde::Deserialize;

use super::State;
use super::body;
use super::problem::Problem;
use crate::deals::Deal;

/// The body a join may carry: an access code for an invitation-only line.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JoinBody {
    #[serde(default)]
    access_code: Option<String>,
}

/// The access code a join carries, read only for a deal whose line takes codes (any
/// other ignores the body); an empty body carries none.
pub(super) async fn access_code(
    state: &State,
    deal: &Deal,
    request: Request<Incoming>,
) -> Result<Option<String>, Problem> {
    let takes_codes = deal
        .waiting_room
        .invitation
        .as_ref()
        .is_some_and(|i| i.codes);
    if !takes_codes {
        return Ok(None);
    }
    let (_, bytes) = body::split(request, &state.settings.server).await?;
    if bytes.trim_ascii().is_empty() {
        return Ok(None);
    }
    Ok(body::json::<JoinBody>(&bytes)?.access_code)
}
