//! Problem details (RFC 9457): the one place where errors become HTTP.
//!
//! Every error enum of the layers below is mapped here, and only here, to a status code,
//! a problem type and the headers a client needs to react (`Retry-After`, `RateLimit`);
//! [`answer`] writes a problem as a response or, for the connection's front, as bytes.

mod answer;

use std::borrow::Cow;
use std::fmt;

use http::StatusCode;
use http::header::{CACHE_CONTROL, HeaderName, HeaderValue, RETRY_AFTER, WWW_AUTHENTICATE};
use serde::{Serialize, Serializer};

use crate::admission::Rejection;
use crate::admission::limits::Limited;
use crate::admission::token::TokenError;
use crate::deals::{DealError, Window};
use crate::domain::InvalidInput;
use crate::events::EventError;
use crate::inventory::StockError;
use crate::ops::rebalance::RebalanceError;
use crate::orders::OrderError;
use crate::payments::checkout::CheckoutError;
use crate::payments::provider::WebhookError;
use crate::payments::webhook::WebhookRejection;
use crate::sale::SaleError;
use crate::store::StoreError;
use crate::waiting_room::access_codes::IssueError;
use crate::waiting_room::invitation::InvitationError;

const TYPE_BASE: &str = "https://flashgate.dev/problems/";

/// The problem types flashgate answers with; the slug ends the `type` URI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    InvalidRequest,
    Unauthorized,
    Forbidden,
    NotFound,
    SoldOut,
    SaleNotOpen,
    PerUserLimit,
    RateLimited,
    IdempotencyConflict,
    Overloaded,
    WaitingRoomRequired,
    ReservationExpired,
    PaymentAttemptsExhausted,
    ChallengeRequired,
    InvitationRequired,
    AccessCodeInvalid,
    AccessCodeUsed,
    MethodNotAllowed,
    OrderNotPending,
    PayloadTooLarge,
}

impl Kind {
    fn slug_and_title(self) -> (&'static str, &'static str) {
        match self {
            Kind::InvalidRequest => ("invalid-request", "Invalid request"),
            Kind::Unauthorized => ("unauthorized", "Unauthorized"),
            Kind::Forbidden => ("forbidden", "Forbidden"),
            Kind::NotFound => ("not-found", "Not found"),
            Kind::SoldOut => ("sold-out", "Sold out"),
            Kind::SaleNotOpen => ("sale-not-open", "Sale not open"),
            Kind::PerUserLimit => ("per-user-limit", "Per-user limit reached"),
            Kind::RateLimited => ("rate-limited", "Too many requests"),
            Kind::IdempotencyConflict => ("idempotency-conflict", "Idempotency key reused"),
            Kind::Overloaded => ("overloaded", "Overloaded"),
            Kind::WaitingRoomRequired => ("waiting-room-required", "Waiting room pass required"),
            Kind::ReservationExpired => ("reservation-expired", "Reservation expired"),
            Kind::PaymentAttemptsExhausted => {
                ("payment-attempts-exhausted", "Too many payment attempts")
            }
            Kind::ChallengeRequired => ("challenge-required", "Proof of work required"),
            Kind::InvitationRequired => ("invitation-required", "Invitation required"),
            Kind::AccessCodeInvalid => ("access-code-invalid", "Access code invalid"),
            Kind::AccessCodeUsed => ("access-code-used", "Access code already used"),
            Kind::MethodNotAllowed => ("method-not-allowed", "Method not allowed"),
            Kind::OrderNotPending => ("order-not-pending", "Order not pending"),
            Kind::PayloadTooLarge => ("payload-too-large", "Payload too large"),
        }
    }
}

#[derive(Debug, PartialEq)]
pub struct Problem {
    kind: Kind,
    status: StatusCode,
    /// Borrowed for the fixed details of the refusals a flood gets, so those allocate nothing.
    detail: Detail,
    headers: Vec<(HeaderName, HeaderValue)>,
    /// The limit that refused the request, whose `RateLimit` headers the answer carries:
    /// made when the answer is rendered, so a flood of refusals compares limits instead
    /// of making headers.
    rate_limit: Option<Limited>,
}

/// A problem's `detail`: text, or a rate limit's, written into the body without being
/// formatted apart first.
#[derive(Debug, PartialEq)]
enum Detail {
    Text(Cow<'static, str>),
    RetryIn { limit: &'static str, seconds: u64 },
}

impl fmt::Display for Detail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Detail::Text(text) => f.write_str(text),
            Detail::RetryIn { limit, seconds } => {
                write!(f, "{limit} rate limit reached; retry in {seconds} s")
            }
        }
    }
}

impl Serialize for Detail {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Detail::Text(text) => serializer.serialize_str(text),
            Detail::RetryIn { .. } => serializer.collect_str(self),
        }
    }
}

impl Problem {
    pub fn new(kind: Kind, status: StatusCode, detail: impl Into<String>) -> Self {
        Self::with_detail(kind, status, Cow::Owned(detail.into()))
    }

    fn with_detail(kind: Kind, status: StatusCode, detail: Cow<'static, str>) -> Self {
        Self {
            kind,
            status,
            detail: Detail::Text(detail),
            headers: Vec::new(),
            rate_limit: None,
        }
    }

    pub fn invalid(detail: impl Into<String>) -> Self {
        Self::new(Kind::InvalidRequest, StatusCode::BAD_REQUEST, detail)
    }

    /// Well-formed input that breaks a rule across fields (an end before its start), which
    /// a schema of each field cannot state.
    pub fn unprocessable(detail: impl Into<String>) -> Self {
        Self::new(
            Kind::InvalidRequest,
            StatusCode::UNPROCESSABLE_ENTITY,
            detail,
        )
    }

    pub fn not_found(detail: impl Into<String>) -> Self {
        Self::new(Kind::NotFound, StatusCode::NOT_FOUND, detail)
    }

    /// The body is left unread, so the next request on the connection cannot be found:
    /// the answer says the connection closes.
    pub fn payload_too_large(bytes_max: usize) -> Self {
        Self::new(
            Kind::PayloadTooLarge,
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body exceeds {bytes_max} bytes"),
        )
        .with_header(http::header::CONNECTION, HeaderValue::from_static("close"))
    }

    /// A head over `server.header_bytes_max` that the parser read (it reads further for a
    /// long `Authorization` header, see `router::check_head`).
    pub fn head_too_large(bytes_max: usize) -> Self {
        Self::new(
            Kind::InvalidRequest,
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            format!("request head exceeds {bytes_max} bytes"),
        )
    }

    /// The client did not send its body in time: its fault, not an overload.
    pub fn request_timeout(detail: impl Into<String>) -> Self {
        Self::new(Kind::InvalidRequest, StatusCode::REQUEST_TIMEOUT, detail)
            .with_header(http::header::CONNECTION, HeaderValue::from_static("close"))
    }

    /// Lets shared caches keep this answer for `seconds` (a 404 for an unknown deal, say).
    pub fn cacheable(self, seconds: u32) -> Self {
        match HeaderValue::from_str(&format!("public, max-age={seconds}")) {
            Ok(value) => self.with_header(CACHE_CONTROL, value),
            Err(_) => self,
        }
    }

    pub fn method_not_allowed(allow: &'static str) -> Self {
        Self::new(
            Kind::MethodNotAllowed,
            StatusCode::METHOD_NOT_ALLOWED,
            format!("this resource answers {allow}"),
        )
        .with_header(http::header::ALLOW, HeaderValue::from_static(allow))
    }

    pub fn unauthorized(detail: impl Into<String>) -> Self {
        Self::new(Kind::Unauthorized, StatusCode::UNAUTHORIZED, detail)
            .with_header(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"))
    }

    pub fn forbidden(detail: impl Into<String>) -> Self {
        Self::new(Kind::Forbidden, StatusCode::FORBIDDEN, detail)
    }

    pub fn conflict(detail: impl Into<String>) -> Self {
        Self::new(Kind::InvalidRequest, StatusCode::CONFLICT, detail)
    }

    /// The order has left `PENDING_PAYMENT`: it can no longer be cancelled or paid.
    pub fn order_not_pending(detail: impl Into<String>) -> Self {
        Self::new(Kind::OrderNotPending, StatusCode::CONFLICT, detail)
    }

    pub fn overloaded(detail: impl Into<String>) -> Self {
        Self::new(Kind::Overloaded, StatusCode::SERVICE_UNAVAILABLE, detail)
            .with_header(RETRY_AFTER, HeaderValue::from_static("1"))
    }

    fn with_header(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.headers.push((name, value));
        self
    }

    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The problem's `detail`, as its body carries it.
    pub fn detail(&self) -> String {
        self.detail.to_string()
    }

    /// The problem type's slug, as it ends the `type` URI (logged as the outcome).
    pub fn slug(&self) -> &'static str {
        self.kind.slug_and_title().0
    }

    fn rate_limited(limited: &Limited) -> Self {
        Self {
            kind: Kind::RateLimited,
            status: StatusCode::TOO_MANY_REQUESTS,
            detail: Detail::RetryIn {
                limit: limited.scope.as_str(),
                seconds: limited.retry_after_seconds,
            },
            headers: Vec::new(),
            rate_limit: Some(limited.clone()),
        }
    }
}

impl From<InvalidInput> for Problem {
    fn from(error: InvalidInput) -> Self {
        Problem::invalid(error.0)
    }
}

impl From<StoreError> for Problem {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::PoolExhausted => {
                Problem::overloaded("no database capacity right now; retry shortly")
            }
            StoreError::Unavailable(error) => {
                crate::store::failover::record("request", &error);
                Problem::overloaded("the database is not accepting writes; retry shortly")
            }
            StoreError::Unstorable(_) => Problem::invalid(error.to_string()),
            StoreError::Retryable(error) | StoreError::Unexpected(error) => {
                tracing::error!(%error, "database error");
                Problem::overloaded("temporarily unable to serve this request; retry shortly")
            }
        }
    }
}

impl From<InvitationError> for Problem {
    fn from(error: InvitationError) -> Self {
        let (kind, status) = match error {
            InvitationError::Store(error) => return error.into(),
            InvitationError::Required => (Kind::InvitationRequired, StatusCode::FORBIDDEN),
            InvitationError::CodeInvalid => (Kind::AccessCodeInvalid, StatusCode::FORBIDDEN),
            InvitationError::CodeUsed => (Kind::AccessCodeUsed, StatusCode::CONFLICT),
        };
        Problem::new(kind, status, error.to_string())
    }
}

impl From<IssueError> for Problem {
    fn from(error: IssueError) -> Self {
        match error {
            IssueError::Store(error) => error.into(),
            IssueError::NotFound => Problem::not_found("no such deal"),
            IssueError::Count(_) => Problem::invalid(error.to_string()),
            IssueError::NoCodes => Problem::conflict(error.to_string()),
        }
    }
}

impl From<EventError> for Problem {
    fn from(error: EventError) -> Self {
        match error {
            EventError::Invalid(detail) => Problem::invalid(detail),
            EventError::NotFound => Problem::not_found("no such endpoint"),
            EventError::Store(error) => error.into(),
        }
    }
}

impl From<TokenError> for Problem {
    fn from(error: TokenError) -> Self {
        match error {
            TokenError::KeysUnavailable {
                retry_after_seconds,
            } => Problem::new(
                Kind::Overloaded,
                StatusCode::SERVICE_UNAVAILABLE,
                error.to_string(),
            )
            .with_header(RETRY_AFTER, HeaderValue::from(retry_after_seconds)),
            _ => Problem::unauthorized(error.to_string()),
        }
    }
}

fn sale_not_open(detail: impl Into<String>) -> Problem {
    Problem::new(Kind::SaleNotOpen, StatusCode::CONFLICT, detail)
}

fn sold_out(detail: impl Into<Cow<'static, str>>) -> Problem {
    Problem::with_detail(Kind::SoldOut, StatusCode::CONFLICT, detail.into())
}

fn per_user_limit(limit: i32) -> Problem {
    Problem::new(
        Kind::PerUserLimit,
        StatusCode::CONFLICT,
        format!("at most {limit} units per user"),
    )
}

impl From<Rejection> for Problem {
    fn from(rejection: Rejection) -> Self {
        match rejection {
            Rejection::RateLimited(limited) => Problem::rate_limited(&limited),
            Rejection::SoldOut => sold_out("this deal is sold out"),
            Rejection::Unauthorized(error) => error.into(),
            Rejection::UnknownDeal => Problem::not_found("no such deal"),
            Rejection::SaleNotOpen(Window::Upcoming) => sale_not_open("the sale has not started"),
            Rejection::SaleNotOpen(_) => sale_not_open("the sale has ended"),
            Rejection::SalePaused => sale_not_open("the sale is paused"),
            Rejection::PerUserLimit { limit } => per_user_limit(limit),
            Rejection::WaitingRoomRequired(error) => Problem::new(
                Kind::WaitingRoomRequired,
                StatusCode::FORBIDDEN,
                error.to_string(),
            ),
            Rejection::Store(error) => error.into(),
        }
    }
}

impl From<OrderError> for Problem {
    fn from(error: OrderError) -> Self {
        match error {
            OrderError::SoldOut { available: 0 } => sold_out("this deal is sold out"),
            OrderError::SoldOut { available } => sold_out(format!("only {available} units left")),
            OrderError::SaleNotOpen => sale_not_open("the sale is not open"),
            OrderError::PerUserLimit { limit } => per_user_limit(limit),
            OrderError::IdempotencyConflict => Problem::new(
                Kind::IdempotencyConflict,
                StatusCode::UNPROCESSABLE_ENTITY,
                "this Idempotency-Key was already used with a different request",
            ),
            OrderError::NotFound => Problem::not_found("no such order"),
            OrderError::InvalidState(status) => Problem::order_not_pending(format!(
                "the order is {status}; only PENDING_PAYMENT orders can be cancelled"
            )),
            OrderError::Store(error) => error.into(),
        }
    }
}

impl From<DealError> for Problem {
    fn from(error: DealError) -> Self {
        match error {
            DealError::Invalid(detail) => Problem::invalid(detail),
            DealError::Inconsistent(detail) => Problem::unprocessable(detail),
            DealError::AlreadyExists(id) => Problem::conflict(format!("deal {id} already exists")),
            DealError::NotFound => Problem::not_found("no such deal"),
            DealError::NoWaitingRoom(id) => {
                Problem::conflict(format!("deal {id} has no waiting room"))
            }
            DealError::Store(error) => error.into(),
        }
    }
}

impl From<StockError> for Problem {
    fn from(error: StockError) -> Self {
        match error {
            StockError::NotFound => Problem::not_found("no such deal"),
            error @ StockError::NotEnoughAvailable { .. } => Problem::conflict(error.to_string()),
            StockError::Store(error) => error.into(),
        }
    }
}

impl From<RebalanceError> for Problem {
    fn from(error: RebalanceError) -> Self {
        match error {
            error @ RebalanceError::InvalidCount => Problem::invalid(error.to_string()),
            RebalanceError::NotFound => Problem::not_found("no such deal"),
            RebalanceError::Store(error) => error.into(),
        }
    }
}

impl From<CheckoutError> for Problem {
    fn from(error: CheckoutError) -> Self {
        match error {
            CheckoutError::NotFound => Problem::not_found("no such order"),
            CheckoutError::NotPending => {
                Problem::order_not_pending("the order is not waiting for payment")
            }
            error @ CheckoutError::Expired => Problem::new(
                Kind::ReservationExpired,
                StatusCode::CONFLICT,
                error.to_string(),
            ),
            error @ CheckoutError::AttemptsExhausted(_) => Problem::new(
                Kind::PaymentAttemptsExhausted,
                StatusCode::CONFLICT,
                error.to_string(),
            ),
            CheckoutError::Store(error) => error.into(),
        }
    }
}

impl From<WebhookRejection> for Problem {
    fn from(rejection: WebhookRejection) -> Self {
        match rejection {
            WebhookRejection::UnknownProvider => Problem::not_found("no such payment provider"),
            WebhookRejection::Invalid(WebhookError::BadSignature) => {
                Problem::unauthorized("the webhook signature does not match")
            }
            WebhookRejection::Invalid(WebhookError::Stale) => {
                Problem::invalid("the webhook timestamp is outside the tolerance")
            }
            WebhookRejection::Invalid(WebhookError::Malformed) => {
                Problem::invalid("the webhook body is not a readable event")
            }
            WebhookRejection::Mismatch => Problem::new(
                Kind::InvalidRequest,
                StatusCode::UNPROCESSABLE_ENTITY,
                "the payment amount or currency does not match the order",
            ),
            WebhookRejection::UnknownPayment => {
                Problem::overloaded("no payment attempt matches this event yet; deliver it again")
            }
            WebhookRejection::Store(error) => error.into(),
        }
    }
}

impl From<SaleError> for Problem {
    fn from(error: SaleError) -> Self {
        match error {
            SaleError::Rejected(rejection) => rejection.into(),
            SaleError::Invalid(invalid) => invalid.into(),
            SaleError::Order(error) => error.into(),
            error @ SaleError::NotPayable(_) => Problem::order_not_pending(error.to_string()),
            error @ SaleError::PaymentsDisabled => Problem::not_found(error.to_string()),
            SaleError::Checkout(error) => error.into(),
            SaleError::Webhook(rejection) => rejection.into(),
            SaleError::Store(error) => error.into(),
        }
    }
}
