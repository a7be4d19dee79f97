//! Public and user endpoints: deal status, placing, reading and cancelling orders.

use std::net::SocketAddr;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use http::header::{AUTHORIZATION, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::State;
use super::body::{self, Caching};
use super::guard::{self, Headers, check_ip, header};
use super::problem::Problem;
use crate::admission::{Rejection, SoldOutChecked};
use crate::domain::{DealId, IdempotencyKey, OrderStatus, Quantity, UserId};
use crate::orders::Order;
use crate::payments::attempts::Attempt;
use crate::payments::checkout::PaymentView;
use crate::sale::{self, OrderOutcome};

type Reply = Result<Response<Full<Bytes>>, Problem>;

#[derive(Serialize)]
struct DealView<'a> {
    id: &'a str,
    name: &'a str,
    state: &'static str,
    unit_price_minor: i64,
    currency: &'a str,
    starts_at: Option<DateTime<Utc>>,
    ends_at: Option<DateTime<Utc>>,
}

#[derive(Serialize)]
pub(super) struct OrderView<'a> {
    order_id: Uuid,
    deal_id: &'a str,
    /// The deal's name when the order was placed (read back with the order).
    #[serde(skip_serializing_if = "Option::is_none")]
    deal_name: Option<&'a str>,
    status: &'static str,
    quantity: i32,
    amount_minor: i64,
    currency: &'a str,
    expires_at: DateTime<Utc>,
    created_at: DateTime<Utc>,
    /// Present when payments are enabled: where and until when to pay.
    #[serde(skip_serializing_if = "Option::is_none")]
    payment: Option<PaymentView>,
    /// Present when payments are enabled: the latest moment the units stay held, `expires_at`
    /// plus `payments.expiry_grace_seconds` (while a payment already under way is confirmed).
    #[serde(skip_serializing_if = "Option::is_none")]
    hold_ends_at: Option<DateTime<Utc>>,
}

impl<'a> OrderView<'a> {
    pub(super) fn new(order: &'a Order, status: OrderStatus, attempt: Option<&Attempt>) -> Self {
        // The reservation follows the provider's session when that ends first.
        let session_end = attempt.and_then(|a| a.provider_expires_at);
        Self {
            order_id: order.id,
            deal_id: &order.deal_id,
            deal_name: order.deal_name.as_deref(),
            status: status.as_str(),
            quantity: order.quantity,
            amount_minor: order.amount_minor,
            currency: &order.currency,
            expires_at: session_end.map_or(order.expires_at, |end| end.min(order.expires_at)),
            created_at: order.created_at,
            payment: attempt.map(PaymentView::of),
            hold_ends_at: None,
        }
    }

    /// An order with its payment, showing when the hold ends at the latest on a gateway
    /// taking payments.
    fn of(outcome: &'a OrderOutcome, status: OrderStatus) -> Self {
        let mut view = Self::new(&outcome.order, status, outcome.attempt.as_ref());
        view.hold_ends_at = outcome.hold_grace.map(|grace| view.expires_at + grace);
        view
    }
}

#[derive(Deserialize)]
struct OrderRequest {
    #[serde(deserialize_with = "super::integer::exact")]
    quantity: i64,
}

async fn authenticate<B>(
    state: &State,
    peer: SocketAddr,
    request: &Request<B>,
) -> Result<UserId, Problem> {
    check_ip(state, peer, request.headers())?;
    let user = state
        .admission
        .authenticate(header(request, AUTHORIZATION))
        .await?;
    crate::telemetry::record_user(&user);
    Ok(user)
}

fn parse_deal_id(raw: &str) -> Result<DealId, Problem> {
    DealId::parse(raw).map_err(|_| Problem::not_found("no such deal"))
}

fn parse_order_id(raw: &str) -> Result<Uuid, Problem> {
    Uuid::parse_str(raw).map_err(|_| Problem::not_found("no such order"))
}

pub async fn get_deal(
    state: &State,
    peer: SocketAddr,
    request: &Request<Incoming>,
    raw_id: &str,
) -> Reply {
    check_ip(state, peer, request.headers())?;
    let max_age = state.settings.server.public_cache_max_age_seconds;
    // "No such deal" is the same for everyone: a CDN may keep it as briefly as a deal.
    let id = parse_deal_id(raw_id).map_err(|p| p.cacheable(max_age))?;
    let deal = state
        .admission
        .deal(&state.pools.request, id.as_str())
        .await
        .map_err(|rejection| match rejection {
            Rejection::UnknownDeal => Problem::from(rejection).cacheable(max_age),
            other => Problem::from(other),
        })?;
    let view = DealView {
        id: &deal.id,
        name: &deal.name,
        state: deal.public_state(
            state.clock.now(),
            state.admission.sold_out().is_sold_out(&deal.id),
        ),
        unit_price_minor: deal.unit_price_minor,
        currency: &deal.currency,
        starts_at: deal.starts_at,
        ends_at: deal.ends_at,
    };
    Ok(body::respond(
        StatusCode::OK,
        &view,
        Caching::Public(max_age),
    ))
}

/// The checks of an order that need nothing but memory, made before its body is read:
/// the per-IP limit and the sold-out mirror. A flood after a sell-out ends here.
pub fn check_order(
    state: &State,
    peer: SocketAddr,
    headers: &impl Headers,
    raw_id: &str,
) -> Result<SoldOutChecked, Problem> {
    check_ip(state, peer, headers)?;
    let authorization = headers.first(&AUTHORIZATION);
    Ok(state.admission.check_sold_out(raw_id, authorization)?)
}

/// Places an order that the per-IP limit and the sold-out mirror let through.
pub async fn place_admissible(
    state: &State,
    request: Request<Incoming>,
    deal: SoldOutChecked,
) -> Reply {
    let (parts, bytes) = body::split(request, &state.settings.server).await?;
    let request = Request::from_parts(parts, ());
    let orders_settings = &state.settings.orders;
    let key = header(&request, "idempotency-key")
        .ok_or_else(|| Problem::invalid("the Idempotency-Key header is required"))?;
    let key = IdempotencyKey::parse(key, orders_settings.idempotency_key_bytes_max)?;
    let asked: OrderRequest = body::json(&bytes)?;
    let order = sale::OrderRequest {
        deal,
        authorization: header(&request, AUTHORIZATION),
        pass: header(&request, guard::PASS_HEADER),
        key,
        quantity: Quantity::new(asked.quantity, orders_settings.quantity_max),
    };
    let placed = state.sale.place(order).await?;
    let view = OrderView::of(&placed, OrderStatus::PendingPayment);
    let mut response = body::respond(StatusCode::CREATED, &view, Caching::Private);
    if placed.replayed {
        response
            .headers_mut()
            .insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    Ok(response)
}

pub async fn get_order(
    state: &State,
    peer: SocketAddr,
    request: &Request<Incoming>,
    raw_id: &str,
) -> Reply {
    let user = authenticate(state, peer, request).await?;
    let order_id = parse_order_id(raw_id)?;
    let found = state.sale.order(&user, order_id).await?;
    Ok(body::respond(
        StatusCode::OK,
        &OrderView::of(&found, found.order.status()),
        Caching::Private,
    ))
}

pub async fn cancel_order(
    state: &State,
    peer: SocketAddr,
    request: &Request<Incoming>,
    raw_id: &str,
) -> Reply {
    let user = authenticate(state, peer, request).await?;
    let order_id = parse_order_id(raw_id)?;
    let order = state.sale.cancel(&user, order_id).await?;
    Ok(body::respond(
        StatusCode::OK,
        &OrderView::new(&order, order.status(), None),
        Caching::Private,
    ))
}
