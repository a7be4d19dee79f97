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
use super::problem::Problem;
use crate::admission::Rejection;
use crate::deals::{Deal, Window};
use crate::domain::{DealId, IdempotencyKey, OrderStatus, Quantity, UserId};
use crate::orders::{self, Order, OrderError};
use crate::payments::Payments;
use crate::payments::attempts::{self, Attempt};
use crate::payments::checkout::PaymentView;

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

/// The public state of a deal: its window first, then the sold-out mirror.
pub fn deal_state(deal: &Deal, sold_out: bool) -> &'static str {
    match deal.window(Utc::now()) {
        Window::Upcoming => "upcoming",
        Window::Ended => "ended",
        Window::Open if sold_out => "sold_out",
        Window::Open => "open",
    }
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

    /// Shows when the hold ends at the latest, for an order of a gateway taking payments.
    pub(super) fn with_hold_end(mut self, state: &State) -> Self {
        if let Some(payments) = &state.payments {
            let grace = chrono::Duration::seconds(payments.settings.expiry_grace_seconds.into());
            self.hold_ends_at = Some(self.expires_at + grace);
        }
        self
    }
}

#[derive(Deserialize)]
struct OrderRequest {
    #[serde(deserialize_with = "super::integer::exact")]
    quantity: i64,
}

fn header<B>(request: &Request<B>, name: impl http::header::AsHeaderName) -> Option<&[u8]> {
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

fn authenticate<B>(
    state: &State,
    peer: SocketAddr,
    request: &Request<B>,
) -> Result<UserId, Problem> {
    check_ip(state, peer, request)?;
    let user = state
        .admission
        .authenticate(header(request, AUTHORIZATION))?;
    super::router::record_user(&user);
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
    check_ip(state, peer, request)?;
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
        state: deal_state(&deal, state.admission.sold_out().is_sold_out(&deal.id)),
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
pub fn check_order<B>(
    state: &State,
    peer: SocketAddr,
    request: &Request<B>,
    raw_id: &str,
) -> Result<DealId, Problem> {
    check_ip(state, peer, request)?;
    let authorization = header(request, AUTHORIZATION);
    // Only valid ids are ever flagged, so the raw id is checked first and a flood is
    // refused without a copy of it.
    state.admission.check_sold_out(raw_id, authorization)?;
    parse_deal_id(raw_id)
}

/// Places an order that the per-IP limit and the sold-out mirror let through.
pub async fn place_admissible(state: &State, request: Request<Incoming>, deal_id: DealId) -> Reply {
    let (parts, bytes) = body::split(request, &state.settings.server).await?;
    let request = Request::from_parts(parts, ());
    let orders_settings = &state.settings.orders;
    let key = header(&request, "idempotency-key")
        .ok_or_else(|| Problem::invalid("the Idempotency-Key header is required"))?;
    let key = IdempotencyKey::parse(key, orders_settings.idempotency_key_bytes_max)?;
    let asked: OrderRequest = body::json(&bytes)?;
    let pool = &state.pools.request;
    let quantity = Quantity::new(asked.quantity, orders_settings.quantity_max);
    // Admission (limits, window, pass) does not depend on the quantity: a quantity out of
    // range is refused after it, so that its key check below is held to the same limits.
    let mut admitted = state
        .admission
        .admit_order(
            pool,
            deal_id.as_str(),
            header(&request, AUTHORIZATION),
            header(&request, super::queue::PASS_HEADER),
            quantity.as_ref().map_or(Quantity::ONE, |q| *q),
        )
        .await?;
    super::router::record_user(&admitted.user);
    admitted.quantity = match quantity {
        Ok(quantity) => quantity,
        Err(invalid) => {
            return Err(Box::pin(refuse_quantity(pool, &admitted.user, &key, invalid)).await);
        }
    };
    let pass = admitted.pass.clone();
    let placed = state.orders.place(admitted, key).await?;
    if let Some(pass) = pass.as_ref().filter(|_| !placed.replayed) {
        let room = state.admission.waiting_room();
        Box::pin(room.release(&placed.order.deal_id, &pass.pass_id)).await;
    }
    let attempt = match state.payments.as_ref() {
        Some(payments) => Box::pin(payment_of_placed(state, payments, &placed.order)).await,
        None => None,
    };
    let view = OrderView::new(&placed.order, OrderStatus::PendingPayment, attempt.as_ref())
        .with_hold_end(state);
    let mut response = body::respond(StatusCode::CREATED, &view, Caching::Private);
    if placed.replayed {
        response
            .headers_mut()
            .insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    Ok(response)
}

/// The payment block of an order just placed or replayed. The order is committed by now,
/// so a failure here (the database gone for a moment, the pool exhausted) must not turn
/// the answer into a 5xx: a client told to retry may meet a sold-out mirror that does not
/// know it holds an order yet. The order is answered without its payment, which
/// `POST /v1/orders/{id}/payments` starts or returns.
async fn payment_of_placed(state: &State, payments: &Payments, order: &Order) -> Option<Attempt> {
    let pending = order.status() == OrderStatus::PendingPayment;
    payments
        .for_new_order(&state.pools.request, order.id, order.expires_at, pending)
        .await
        .inspect_err(|error| {
            tracing::warn!(%error, order = %order.id, "order placed; its payment not read");
        })
        .ok()
        .flatten()
}

/// A quantity out of range was never stored, so under a key already used it is a
/// conflict, answered before the range itself.
async fn refuse_quantity(
    pool: &sqlx::PgPool,
    user: &UserId,
    key: &IdempotencyKey,
    invalid: crate::domain::InvalidInput,
) -> Problem {
    match orders::key_used(pool, user, key.as_str()).await {
        Ok(true) => OrderError::IdempotencyConflict.into(),
        Ok(false) => invalid.into(),
        Err(error) => error.into(),
    }
}

pub async fn get_order(
    state: &State,
    peer: SocketAddr,
    request: &Request<Incoming>,
    raw_id: &str,
) -> Reply {
    let user = authenticate(state, peer, request)?;
    let order_id = parse_order_id(raw_id)?;
    let order = orders::get(&state.pools.request, &user, order_id).await?;
    let attempt = match state.payments {
        Some(_) => attempts::latest(&state.pools.request, order.id).await?,
        None => None,
    };
    Ok(body::respond(
        StatusCode::OK,
        &OrderView::new(&order, order.status(), attempt.as_ref()).with_hold_end(state),
        Caching::Private,
    ))
}

pub async fn cancel_order(
    state: &State,
    peer: SocketAddr,
    request: &Request<Incoming>,
    raw_id: &str,
) -> Reply {
    let user = authenticate(state, peer, request)?;
    let order_id = parse_order_id(raw_id)?;
    let order = state.orders.cancel(&user, order_id).await?;
    let room = state.admission.waiting_room();
    room.end_session(&order.deal_id, user.as_str()).await;
    if let Some(payments) = &state.payments
        && let Err(error) = payments
            .close_open_attempts(&state.pools.request, order.id)
            .await
    {
        // The reconciler and the late-payment path still cover a session left open.
        tracing::warn!(%error, order = %order.id, "checkout session of a cancelled order not closed");
    }
    Ok(body::respond(
        StatusCode::OK,
        &OrderView::new(&order, order.status(), None),
        Caching::Private,
    ))
}
