//! The manual-review queue for operators: list the late payments held for a person, and
//! fulfil (when units are left) or refund each one.

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use serde::Serialize;
use uuid::Uuid;

use super::State;
use super::body::{self, Caching};
use super::guard::{record, require_admin};
use super::problem::Problem;
use crate::operators::Operator;
use crate::payments::review::{self, ReviewItem, ReviewOutcome};

type Reply = Result<Response<Full<Bytes>>, Problem>;

/// Most orders one listing returns, oldest first.
const LIST_MAX: u32 = 500;

#[derive(Serialize)]
struct Queue {
    orders: Vec<ReviewItem>,
}

#[derive(Serialize)]
struct Settled {
    order_id: Uuid,
    status: &'static str,
}

/// `GET /admin/payments/review`.
pub async fn list<B>(state: &State, request: &Request<B>) -> Reply {
    require_admin(state, request).await?;
    let orders = review::list(&state.pools.admin, LIST_MAX).await?;
    Ok(body::respond(
        StatusCode::OK,
        &Queue { orders },
        Caching::Private,
    ))
}

/// `POST /admin/orders/{id}/review/fulfil`.
pub async fn fulfil<B>(state: &State, request: &Request<B>, raw_id: &str) -> Reply {
    let operator = require_admin(state, request).await?;
    let id = order_id(raw_id)?;
    let outcome = review::fulfil(&state.pools.admin, id).await?;
    decided(state, &operator, id, "review.fulfilled", &outcome).await;
    answer(id, outcome)
}

/// `POST /admin/orders/{id}/review/refund`.
pub async fn refund<B>(state: &State, request: &Request<B>, raw_id: &str) -> Reply {
    let operator = require_admin(state, request).await?;
    let id = order_id(raw_id)?;
    let outcome = review::refund(&state.pools.admin, id).await?;
    decided(state, &operator, id, "review.refunded", &outcome).await;
    answer(id, outcome)
}

/// Records a review decision that changed the order (a refusal changed nothing).
async fn decided(
    state: &State,
    operator: &Operator,
    order_id: Uuid,
    action: &'static str,
    outcome: &ReviewOutcome,
) {
    if matches!(
        outcome,
        ReviewOutcome::Fulfilled | ReviewOutcome::RefundQueued
    ) {
        let target = order_id.to_string();
        record(state, operator, action, &target, serde_json::json!({})).await;
    }
}

fn order_id(raw: &str) -> Result<Uuid, Problem> {
    Uuid::parse_str(raw).map_err(|_| Problem::not_found("no such order"))
}

fn answer(order_id: Uuid, outcome: ReviewOutcome) -> Reply {
    let status = match outcome {
        ReviewOutcome::Fulfilled => "PAID",
        ReviewOutcome::RefundQueued => "REFUND_PENDING",
        ReviewOutcome::NoStock => {
            return Err(Problem::conflict(
                "not enough units left (or the buyer's limit is reached): refund instead",
            ));
        }
        ReviewOutcome::NotFound => return Err(Problem::not_found("no such order")),
        ReviewOutcome::NotInReview(status) => {
            return Err(Problem::conflict(format!(
                "the order is {status}, not MANUAL_REVIEW"
            )));
        }
    };
    let view = Settled { order_id, status };
    Ok(body::respond(StatusCode::OK, &view, Caching::Private))
}
