//! Operator endpoints: the kill switch, bucket rebalancing, the invariant audit, and the
//! API description.

use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use serde::{Deserialize, Serialize};

use super::State;
use super::admin::{admin_json, deal_reply};
use super::body::{self, Caching};
use super::guard::{record, require_admin};
use super::problem::Problem;
use crate::domain::DealId;
use crate::ops::{audit, pause, rebalance};
use serde_json::json;

type Reply = Result<Response<Full<Bytes>>, Problem>;

/// The OpenAPI document, written as YAML for people and served as JSON.
const OPENAPI_YAML: &str = include_str!("../../docs/openapi.yaml");

fn deal_id(raw: &str) -> Result<DealId, Problem> {
    DealId::parse(raw).map_err(|_| Problem::not_found("no such deal"))
}

/// Pauses or resumes a deal. This instance forgets its cached copy at once; the others
/// hear of it through the change announcement.
pub async fn set_paused<B>(
    state: &State,
    request: &Request<B>,
    raw_id: &str,
    paused: bool,
) -> Reply {
    let operator = require_admin(state, request).await?;
    let id = deal_id(raw_id)?;
    let deal = pause::set_paused(&state.pools.admin, id.as_str(), paused).await?;
    let action = if paused {
        "deal.paused"
    } else {
        "deal.resumed"
    };
    record(state, &operator, action, &deal.id, json!({})).await;
    state
        .admission
        .deals()
        .put(&deal.id, Some(Arc::new(deal.clone())));
    deal_reply(state, &deal).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RebalanceRequest {
    #[serde(deserialize_with = "super::integer::exact")]
    buckets: i64,
}

#[derive(Serialize)]
struct RebalanceView<'a> {
    deal_id: &'a str,
    buckets_before: i32,
    buckets_after: i32,
    units_moved: i64,
}

pub async fn rebalance(state: &State, request: Request<Incoming>, raw_id: &str) -> Reply {
    let (operator, asked): (_, RebalanceRequest) = admin_json(state, request).await?;
    let buckets =
        i32::try_from(asked.buckets).map_err(|_| rebalance::RebalanceError::InvalidCount)?;
    let id = deal_id(raw_id)?;
    let done = rebalance::rebalance(&state.pools.admin, id.as_str(), buckets).await?;
    state.admission.deals().evict(id.as_str());
    let detail =
        json!({"buckets_before": done.buckets_before, "buckets_after": done.buckets_after});
    record(state, &operator, "deal.rebalanced", &done.deal_id, detail).await;
    let view = RebalanceView {
        deal_id: &done.deal_id,
        buckets_before: done.buckets_before,
        buckets_after: done.buckets_after,
        units_moved: done.units_moved,
    };
    Ok(body::respond(StatusCode::OK, &view, Caching::Private))
}

/// Runs the audit now, on the admin pool, and publishes its gauges.
pub async fn audit<B>(state: &State, request: &Request<B>) -> Reply {
    require_admin(state, request).await?;
    let options = state.settings.audit;
    let report = audit::run(&state.pools.admin, Some(&state.redis), options).await?;
    audit::record(&report);
    Ok(body::respond(StatusCode::OK, &report, Caching::Private))
}

/// The OpenAPI document as JSON, converted once.
pub fn openapi() -> Response<Full<Bytes>> {
    static JSON: OnceLock<String> = OnceLock::new();
    let json = JSON.get_or_init(|| {
        let document: serde_json::Value = serde_norway::from_str(OPENAPI_YAML)
            .expect("docs/openapi.yaml is valid YAML (checked by a unit test)");
        document.to_string()
    });
    body::text(StatusCode::OK, "application/json", json.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_openapi_document_converts_to_json() {
        let document: serde_json::Value = serde_norway::from_str(OPENAPI_YAML).unwrap();
        assert_eq!(document["openapi"], "3.1.0");
        assert!(document["paths"]["/admin/audit"].is_object());
    }
}
