//! Problem details (RFC 9457): the one place where errors become HTTP.
//!
//! Every error enum of the layers below is mapped here, and only here, to a status code,
//! a problem type and the headers a client needs to react (`Retry-After`, `RateLimit`).

use std::borrow::Cow;
use std::cell::RefCell;
use std::fmt;

use bytes::Bytes;
use http::header::{
    CACHE_CONTROL, CONTENT_TYPE, HeaderName, HeaderValue, RETRY_AFTER, WWW_AUTHENTICATE,
};
use http::{HeaderMap, Response, StatusCode};
use http_body_util::Full;
use serde::{Serialize, Serializer};

use super::request_id::{self, RequestId};
use crate::admission::Rejection;
use crate::admission::limits::Limited;
use crate::admission::token::TokenError;
use crate::deals::{DealError, Window};
use crate::domain::InvalidInput;
use crate::inventory::StockError;
use crate::ops::rebalance::RebalanceError;
use crate::orders::OrderError;
use crate::payments::checkout::CheckoutError;
use crate::payments::provider::WebhookError;
use crate::payments::webhook::WebhookRejection;
use crate::sale::SaleError;
use crate::store::StoreError;

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

/// Room for a whole problem body, so rendering it does not grow the buffer.
const BODY_BYTES_TYPICAL: usize = 256;

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

    /// The problem type's slug, as it ends the `type` URI (logged as the outcome).
    pub fn slug(&self) -> &'static str {
        self.kind.slug_and_title().0
    }

    /// The answer to the request `id`, which `instance` names (`urn:flashgate:request:<id>`),
    /// carrying it in `X-Request-Id` too.
    pub fn into_response(self, id: &RequestId) -> Response<Full<Bytes>> {
        LAST_ANSWER.with_borrow_mut(|last| {
            let prepared = match last {
                Some(prepared) if prepared.problem == self => prepared,
                _ => last.insert(Prepared::new(self)),
            };
            prepared.answer(id)
        })
    }

    /// Appends the whole HTTP/1.1 answer to the request `id` to `out`, byte for byte what
    /// hyper writes for [`Problem::into_response`] on a keep-alive connection (its headers
    /// in the same order, then `content-length` and `date`): the connection's front answers
    /// a refusal without hyper. `date` is the `Date` header's value.
    pub fn write_http1(self, id: &RequestId, date: &[u8], out: &mut Vec<u8>) {
        LAST_ANSWER.with_borrow_mut(|last| {
            let prepared = match last {
                Some(prepared) if prepared.problem == self => prepared,
                _ => last.insert(Prepared::new(self)),
            };
            prepared.write_http1(id, date, out);
        });
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

thread_local! {
    /// This thread's last problem answer. A flood gets one refusal over and over, whose
    /// answers differ only by the request id: the status, the headers and the body up to
    /// the id are made once, and each answer copies them.
    static LAST_ANSWER: RefCell<Option<Prepared>> = const { RefCell::new(None) };
}

/// A problem's answer but for the request id.
struct Prepared {
    problem: Problem,
    /// Every header of the answer, the request id's with a stand-in value: an answer
    /// replaces it, so a copy of the map never grows.
    headers: HeaderMap,
    /// The body up to the request id; `BODY_TAIL` follows the id.
    body_head: Vec<u8>,
    /// The status line and every header up to the request id's value, as hyper writes them.
    http1_head: Vec<u8>,
}

/// What follows the request id in a problem body: the end of `instance` and of the object.
const BODY_TAIL: &[u8] = br#""}"#;

impl Prepared {
    fn new(problem: Problem) -> Self {
        let mut headers = HeaderMap::with_capacity(4 + problem.headers.len());
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        for (name, value) in problem.rate_limit.iter().flat_map(rate_limit_headers) {
            headers.insert(name, value);
        }
        for (name, value) in &problem.headers {
            headers.insert(name.clone(), value.clone());
        }
        headers.insert(request_id::HEADER, HeaderValue::from_static(""));
        Self {
            body_head: problem.body_head(),
            http1_head: http1_head(problem.status, &headers),
            headers,
            problem,
        }
    }

    fn write_http1(&self, id: &RequestId, date: &[u8], out: &mut Vec<u8>) {
        let id_text = id.as_str().as_bytes();
        let length = self.body_head.len() + id_text.len() + BODY_TAIL.len();
        let mut digits = [0; 20];
        let length_text = format_length(length, &mut digits);
        for part in [
            &self.http1_head[..],
            id_text,
            b"\r\ncontent-length: ",
            length_text,
            b"\r\ndate: ",
            date,
            b"\r\n\r\n",
            &self.body_head,
            id_text,
            BODY_TAIL,
        ] {
            out.extend_from_slice(part);
        }
    }

    fn answer(&self, id: &RequestId) -> Response<Full<Bytes>> {
        let id_text = id.as_str().as_bytes();
        let mut json = Vec::with_capacity(self.body_head.len() + id_text.len() + BODY_TAIL.len());
        for part in [&self.body_head[..], id_text, BODY_TAIL] {
            json.extend_from_slice(part);
        }
        // Exactly sized: `Bytes` takes a full vector over without allocating again.
        let mut response = Response::new(Full::new(Bytes::from(json.into_boxed_slice())));
        *response.status_mut() = self.problem.status;
        let headers = response.headers_mut();
        *headers = self.headers.clone();
        // Replaced in place: an insert first makes room for one more header, and a copy of a
        // map has none to spare, so every answer would reallocate its map.
        if let Some(value) = headers.get_mut(request_id::HEADER) {
            *value = id.header_value();
        }
        response
    }
}

/// The status line and the headers of `headers` in their order, the request id's last
/// and without its value (hyper writes names in lower case, as the map holds them).
fn http1_head(status: StatusCode, headers: &HeaderMap) -> Vec<u8> {
    let mut head = Vec::with_capacity(256);
    head.extend_from_slice(b"HTTP/1.1 ");
    head.extend_from_slice(status.as_str().as_bytes());
    head.push(b' ');
    head.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    head.extend_from_slice(b"\r\n");
    for (name, value) in headers {
        if name == request_id::HEADER {
            continue;
        }
        head.extend_from_slice(name.as_str().as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(request_id::HEADER.as_str().as_bytes());
    head.extend_from_slice(b": ");
    head
}

/// `length` in decimal, written at the end of `digits`.
fn format_length(mut length: usize, digits: &mut [u8; 20]) -> &[u8] {
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b'0' + (length % 10) as u8;
        length /= 10;
        if length == 0 {
            return &digits[start..];
        }
    }
}

impl Problem {
    /// The problem+json body up to the request id, which ends `instance`. The type URI and
    /// the title need no escaping (fixed ASCII), so only the detail goes through the JSON
    /// writer.
    fn body_head(&self) -> Vec<u8> {
        let (slug, title) = self.kind.slug_and_title();
        let mut json = Vec::with_capacity(BODY_BYTES_TYPICAL);
        for part in [r#"{"type":""#, TYPE_BASE, slug, r#"","title":""#, title] {
            json.extend_from_slice(part.as_bytes());
        }
        json.extend_from_slice(br#"","status":"#);
        json.extend_from_slice(self.status.as_str().as_bytes());
        json.extend_from_slice(br#","detail":"#);
        if serde_json::to_writer(&mut json, &self.detail).is_err() {
            json.extend_from_slice(b"\"\"");
        }
        json.extend_from_slice(br#","instance":"urn:flashgate:request:"#);
        json
    }
}

type RateLimitHeaders = [(HeaderName, HeaderValue); 3];

/// `Retry-After`, and the policy and state of the limit (`RateLimit-Policy`, `RateLimit`).
fn rate_limit_headers(limited: &Limited) -> RateLimitHeaders {
    let name = limited.scope.as_str();
    let retry = limited.retry_after_seconds;
    let header =
        |text: String| HeaderValue::from_str(&text).unwrap_or(HeaderValue::from_static("1"));
    [
        (RETRY_AFTER, HeaderValue::from(retry)),
        (
            HeaderName::from_static("ratelimit-policy"),
            header(format!(
                "\"{name}\";q={};w={}",
                limited.quota, limited.window_seconds
            )),
        ),
        (
            HeaderName::from_static("ratelimit"),
            header(format!("\"{name}\";r=0;t={retry}")),
        ),
    ]
}

impl Problem {
    /// A JSON body that does not fit its request: the field and the reason in the words of
    /// the API (`quantity must be an integer (got string "2")`), never serde's or Rust's
    /// type names. `well_formed` tells whether the body is JSON at all: a value of the wrong
    /// kind for a field of fixed values is reported by serde_json as a syntax error.
    pub fn invalid_json(
        error: &serde_path_to_error::Error<serde_json::Error>,
        well_formed: bool,
    ) -> Self {
        let inner = error.inner();
        let path = error.path().to_string();
        if !well_formed {
            return Problem::invalid(format!(
                "the body is not valid JSON (line {}, column {})",
                inner.line(),
                inner.column()
            ));
        }
        if inner.classify() != serde_json::error::Category::Data {
            return Problem::invalid(format!("{path} is not one of the accepted values"));
        }
        Problem::invalid(json_detail(&path, &json_message(inner)))
    }
}

/// serde_json's message without its position.
fn json_message(error: &serde_json::Error) -> String {
    let message = error.to_string();
    match message.rfind(" at line ") {
        Some(end) => message[..end].to_owned(),
        None => message,
    }
}

/// The detail for `message` about the field at `path` (`.` for the body itself).
fn json_detail(path: &str, message: &str) -> String {
    let prefix = match path {
        "." => String::new(),
        path => format!("{path}."),
    };
    if let Some(rest) = message.strip_prefix("missing field `") {
        return format!("{prefix}{} is required", rest.trim_end_matches('`'));
    }
    if message.starts_with("unknown field") {
        // The path ends with the unknown field itself; name the object that has it.
        return match path.rsplit_once('.') {
            Some((parent, _)) => format!("{parent}: {message}"),
            None => message.to_owned(),
        };
    }
    let subject = match path {
        "." => "the body",
        path => path,
    };
    let invalid = message
        .strip_prefix("invalid type: ")
        .or_else(|| message.strip_prefix("invalid value: "));
    match invalid.and_then(|rest| rest.split_once(", expected ")) {
        Some((got, expected)) => {
            format!(
                "{subject} must be {} (got {got})",
                plain_expectation(expected)
            )
        }
        None => format!("{subject}: {message}"),
    }
}

/// What serde expected, in the API's words instead of Rust's.
fn plain_expectation(expected: &str) -> &str {
    const INTEGERS: [&str; 12] = [
        "i8", "i16", "i32", "i64", "i128", "isize", "u8", "u16", "u32", "u64", "u128", "usize",
    ];
    match expected {
        e if INTEGERS.contains(&e) => "an integer",
        "f32" | "f64" => "a number",
        "a map" => "an object",
        "a sequence" => "an array",
        "a borrowed string" | "a string" => "a string",
        e if e.starts_with("struct ") => "an object",
        e if e.starts_with("enum ") || e.starts_with("variant ") => "one of the documented values",
        e => e,
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
            StoreError::Retryable(error) | StoreError::Unexpected(error) => {
                tracing::error!(%error, "database error");
                Problem::overloaded("temporarily unable to serve this request; retry shortly")
            }
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

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Outer {
        name: String,
        inner: Option<Inner>,
        policy: Option<crate::domain::LatePaymentPolicy>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        count: u32,
    }

    fn detail(json: &str) -> String {
        let mut reader = serde_json::Deserializer::from_str(json);
        let error = serde_path_to_error::deserialize::<_, Outer>(&mut reader).unwrap_err();
        let well_formed = serde_json::from_str::<serde::de::IgnoredAny>(json).is_ok();
        Problem::invalid_json(&error, well_formed)
            .detail
            .to_string()
    }

    #[test]
    fn json_details_speak_of_fields_not_rust_types() {
        let cases = [
            (r#"{"inner":null}"#, "name is required"),
            (r#"{"name":5}"#, "name must be a string (got integer `5`)"),
            (
                r#"{"name":"a","inner":1}"#,
                "inner must be an object (got integer `1`)",
            ),
            (
                r#"{"name":"a","inner":{"count":-1}}"#,
                "inner.count must be an integer",
            ),
            (
                r#"{"name":"a","policy":7}"#,
                "policy is not one of the accepted values",
            ),
            (
                r#"{"name":"a","policy":"x"}"#,
                "policy: unknown variant `x`",
            ),
            (r#"{"name":"a","x":1}"#, "unknown field `x`"),
            (
                r#"{"name":"a","inner":{"count":1,"y":2}}"#,
                "inner: unknown field `y`",
            ),
            (
                r#"{"name":"#,
                "the body is not valid JSON (line 1, column 8)",
            ),
        ];
        for (json, starts) in cases {
            let detail = detail(json);
            assert!(detail.starts_with(starts), "{json}: {detail}");
            for rust in [
                "u32",
                "struct",
                "enum",
                "Inner",
                "Outer",
                "LatePaymentPolicy",
            ] {
                assert!(!detail.contains(rust), "{json}: {detail}");
            }
        }
    }
    #[test]
    fn each_answer_carries_its_own_request_id_and_each_header_once() {
        let limited = Limited {
            scope: crate::admission::limits::Scope::Ip,
            retry_after_seconds: 2,
            quota: 1,
            window_seconds: 1,
        };
        let problems: [&dyn Fn() -> Problem; 3] = [
            &|| Problem::not_found("no such deal").cacheable(5),
            &|| Problem::rate_limited(&limited),
            &|| Problem::overloaded("busy"),
        ];
        for problem in problems {
            // The second answer of a kind is made from the first one's prepared parts.
            for _ in 0..2 {
                let id = RequestId::generate();
                let response = problem().into_response(&id);
                let headers = response.headers();
                for name in headers.keys() {
                    assert_eq!(headers.get_all(name).iter().count(), 1, "{name}");
                }
                assert_eq!(headers[request_id::HEADER], id.header_value());
            }
        }
        let cacheable = Problem::not_found("x")
            .cacheable(5)
            .into_response(&RequestId::generate());
        assert_eq!(cacheable.headers()[CACHE_CONTROL], "public, max-age=5");
    }
}
