//! The body of a join (`POST /v1/deals/{id}/queue`): empty, or the documented object with
//! an access code. Every join's body is checked, so one that is not what the API documents
//! is refused alike on every line; only a line that takes codes uses the code.

use http::Request;
use hyper::body::Incoming;
use serde::Deserialize;

use super::State;
use super::body;
use super::problem::Problem;
use crate::deals::Deal;

/// The body a join may carry: an access code for a line that takes codes (to be invited,
/// or placed in the priority group).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JoinBody {
    #[serde(default)]
    access_code: Option<String>,
}

/// The access code a join carries, for a deal whose line takes codes (any other line
/// ignores it); an empty body carries none, and a body that is not the documented object
/// is refused (400) on every line.
pub(super) async fn access_code(
    state: &State,
    deal: &Deal,
    request: Request<Incoming>,
) -> Result<Option<String>, Problem> {
    let (_, bytes) = body::split(request, &state.settings.server).await?;
    if bytes.trim_ascii().is_empty() {
        return Ok(None);
    }
    let code = body::json::<JoinBody>(&bytes)?.access_code;
    let takes_codes = deal.waiting_room.takes_codes();
    Ok(code.filter(|_| takes_codes))
}
