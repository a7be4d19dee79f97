//! Operator endpoints: deals, stock, inventory, and the probes and metrics.

use bytes::Bytes;
use chrono::{DateTime, Utc};
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::State;
use super::body::{self, Caching};
use super::guard::{record, require_admin};
use super::problem::Problem;
use crate::deals::{
    self, Activation, AdmissionMode, AdmissionTerms, Deal, DealError, Invitation, NewDeal,
    PaymentTerms, Priority, WaitingRoomTerms,
};
use crate::domain::{CaptureMethod, DealId, LatePaymentPolicy};
use crate::inventory;
use crate::operators::Operator;
use crate::telemetry;
use crate::waiting_room::report::ReportError;
use crate::waiting_room::{LineStatus, access_codes};
use serde_json::json;

type Reply = Result<Response<Full<Bytes>>, Problem>;

/// Deal ids may be sent as strings or non-negative integers; they are stored as strings.
struct IdInput(String);

impl<'de> Deserialize<'de> for IdInput {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Id;
        impl serde::de::Visitor<'_> for Id {
            type Value = String;
            fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
                formatter.write_str("a string or a non-negative integer")
            }
            fn visit_str<E: serde::de::Error>(self, value: &str) -> Result<String, E> {
                Ok(value.to_owned())
            }
            fn visit_u64<E: serde::de::Error>(self, value: u64) -> Result<String, E> {
                Ok(value.to_string())
            }
            fn visit_f64<E: serde::de::Error>(self, value: f64) -> Result<String, E> {
                let whole = value.fract() == 0.0 && (0.0..9.0e15).contains(&value);
                if whole {
                    Ok((value as u64).to_string())
                } else {
                    Err(E::invalid_type(serde::de::Unexpected::Float(value), &self))
                }
            }
        }
        deserializer.deserialize_any(Id).map(IdInput)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateDeal {
    id: IdInput,
    name: String,
    #[serde(deserialize_with = "super::integer::exact")]
    stock: i64,
    #[serde(deserialize_with = "super::integer::exact")]
    buckets: i32,
    #[serde(deserialize_with = "super::integer::exact")]
    unit_price_minor: i64,
    currency: String,
    #[serde(deserialize_with = "super::integer::exact")]
    per_user_limit: i32,
    #[serde(deserialize_with = "super::integer::exact")]
    reservation_ttl_seconds: i32,
    #[serde(default)]
    starts_at: Option<DateTime<Utc>>,
    #[serde(default)]
    ends_at: Option<DateTime<Utc>>,
    #[serde(default)]
    late_payment_policy: Option<LatePaymentPolicy>,
    #[serde(default)]
    capture_method: Option<CaptureMethod>,
    #[serde(default)]
    waiting_room: Option<WaitingRoomInput>,
}

impl CreateDeal {
    /// The parsed deal; the rules between its fields are checked by `deals` (422).
    fn into_new_deal(self) -> Result<NewDeal, Problem> {
        Ok(NewDeal {
            id: DealId::parse(&self.id.0)?,
            name: self.name,
            stock: self.stock,
            buckets: self.buckets,
            unit_price_minor: self.unit_price_minor,
            currency: self.currency.to_ascii_uppercase(),
            per_user_limit: self.per_user_limit,
            reservation_ttl_seconds: self.reservation_ttl_seconds,
            starts_at: self.starts_at,
            ends_at: self.ends_at,
            payment_terms: {
                let defaults = PaymentTerms::default();
                PaymentTerms {
                    late_payment_policy: self
                        .late_payment_policy
                        .unwrap_or(defaults.late_payment_policy),
                    capture_method: self.capture_method.unwrap_or(defaults.capture_method),
                }
            },
            waiting_room: self
                .waiting_room
                .map(WaitingRoomInput::into_terms)
                .unwrap_or_default(),
        })
    }
}

#[derive(Serialize)]
pub(super) struct AdminDealView<'a> {
    id: &'a str,
    name: &'a str,
    state: &'static str,
    stock_total: i64,
    buckets: i32,
    unit_price_minor: i64,
    currency: &'a str,
    per_user_limit: i32,
    reservation_ttl_seconds: i32,
    starts_at: Option<DateTime<Utc>>,
    ends_at: Option<DateTime<Utc>>,
    paused: bool,
    waiting_room: AdminWaitingRoom<'a>,
}

/// The deal's waiting-room terms, with who sets the outflow and the outflow now.
#[derive(Serialize)]
struct AdminWaitingRoom<'a> {
    #[serde(flatten)]
    terms: &'a deals::WaitingRoomTerms,
    mode: &'static str,
    /// The rate the line admits at: as last published by the advancer, or before its first
    /// step the rate it starts at (`admit_per_second`, or an adaptive line's minimum).
    outflow_per_second: f64,
    /// True while newcomers queue; false while a `when_busy` line admits joins at once.
    /// Absent when the line cannot be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    line_active: Option<bool>,
    /// An invitation-only line's access codes issued and redeemed.
    #[serde(skip_serializing_if = "Option::is_none")]
    access_codes: Option<access_codes::CodeCounts>,
}

impl<'a> AdminWaitingRoom<'a> {
    fn new(terms: &'a deals::WaitingRoomTerms, line: Option<&LineStatus>) -> Self {
        let published = line.and_then(|line| line.outflow_per_second);
        let line_active = line.map(|line| !terms.when_busy() || line.busy);
        let admission = &terms.admission;
        let start = if admission.is_adaptive() {
            admission.min_per_second
        } else {
            terms.admit_per_second
        };
        Self {
            terms,
            mode: admission.mode.as_str(),
            outflow_per_second: super::queue::round_rate(published.unwrap_or(f64::from(start))),
            line_active,
            access_codes: None,
        }
    }
}

impl<'a> AdminDealView<'a> {
    /// The view of `deal`; `line` is its line as last read, when known.
    pub(super) fn new(deal: &'a Deal, line: Option<&LineStatus>, now: DateTime<Utc>) -> Self {
        Self {
            id: &deal.id,
            name: &deal.name,
            state: deal.public_state(now, deal.stock_total == 0),
            stock_total: deal.stock_total,
            buckets: deal.bucket_count,
            unit_price_minor: deal.unit_price_minor,
            currency: &deal.currency,
            per_user_limit: deal.per_user_limit,
            reservation_ttl_seconds: deal.reservation_ttl_seconds,
            starts_at: deal.starts_at,
            ends_at: deal.ends_at,
            paused: deal.paused,
            waiting_room: AdminWaitingRoom::new(&deal.waiting_room, line),
        }
    }
}

/// The deal's line as last read; `None` without a waiting room or when Redis does not
/// answer.
pub(super) async fn published_line(state: &State, deal: &Deal) -> Option<LineStatus> {
    if !deal.waiting_room.enabled {
        return None;
    }
    let room = state.admission.waiting_room();
    room.line(&deal.id).await.ok()
}

/// `GET /admin/deals/{id}`: the deal as operators see it, with its line's outflow now.
pub async fn deal<B>(state: &State, request: &Request<B>, raw_id: &str) -> Reply {
    require_admin(state, request).await?;
    let id = DealId::parse(raw_id).map_err(|_| Problem::not_found("no such deal"))?;
    let deal = deals::load(&state.pools.admin, id.as_str())
        .await?
        .ok_or_else(|| Problem::not_found("no such deal"))?;
    deal_reply(state, &deal).await
}

/// `GET /admin/deals/{id}/report`: what the deal's line did (joins, waits, abandons, passes
/// expired unused) and what its admitted buyers did (orders, payments).
pub async fn report<B>(state: &State, request: &Request<B>, raw_id: &str) -> Reply {
    require_admin(state, request).await?;
    let id = DealId::parse(raw_id).map_err(|_| Problem::not_found("no such deal"))?;
    let deal = deals::load(&state.pools.admin, id.as_str())
        .await?
        .ok_or_else(|| Problem::not_found("no such deal"))?;
    if !deal.waiting_room.enabled {
        return Err(DealError::NoWaitingRoom(deal.id).into());
    }
    let room = state.admission.waiting_room();
    let report = room.report(&state.pools.admin, &deal.id).await?;
    Ok(body::respond(StatusCode::OK, &report, Caching::Private))
}

impl From<ReportError> for Problem {
    fn from(error: ReportError) -> Self {
        match error {
            ReportError::Queue(error) => error.into(),
            ReportError::Store(error) => error.into(),
        }
    }
}

/// A deal as the admin answers show it (200), with its line's outflow now.
pub(super) async fn deal_reply(state: &State, deal: &Deal) -> Reply {
    let line = published_line(state, deal).await;
    let mut view = AdminDealView::new(deal, line.as_ref(), state.clock.now());
    if deal.waiting_room.takes_codes() {
        let counts = access_codes::counts(&state.pools.admin, &deal.id).await?;
        view.waiting_room.access_codes = Some(counts);
    }
    Ok(body::respond(StatusCode::OK, &view, Caching::Private))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AdmissionChange {
    mode: String,
    #[serde(default, deserialize_with = "super::integer::optional")]
    admit_per_second: Option<i32>,
}

/// `POST /admin/deals/{id}/admission`: takes manual control of the line's outflow (`fixed`,
/// at the current outflow unless a rate is given) or hands it back (`adaptive`).
pub async fn set_admission(state: &State, request: Request<Incoming>, raw_id: &str) -> Reply {
    let (operator, change): (_, AdmissionChange) = admin_json(state, request).await?;
    let mode = AdmissionMode::parse(&change.mode)
        .ok_or_else(|| Problem::invalid("mode must be fixed or adaptive"))?;
    let id = DealId::parse(raw_id).map_err(|_| Problem::not_found("no such deal"))?;
    let room = state.admission.waiting_room();
    let deal = crate::ops::admission::set_mode(
        &state.pools.admin,
        room,
        id.as_str(),
        mode,
        change.admit_per_second,
    )
    .await?;
    state
        .admission
        .deals()
        .put(&deal.id, Some(std::sync::Arc::new(deal.clone())));
    let detail =
        json!({"mode": mode.as_str(), "admit_per_second": deal.waiting_room.admit_per_second});
    record(state, &operator, "deal.admission_set", &deal.id, detail).await;
    deal_reply(state, &deal).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct IssueCodes {
    #[serde(deserialize_with = "super::integer::exact")]
    count: i64,
}

/// `POST /admin/deals/{id}/access-codes`: issues access codes for an invitation-only line,
/// shown this once (only their digests are kept).
pub async fn issue_access_codes(state: &State, request: Request<Incoming>, raw_id: &str) -> Reply {
    let (operator, asked): (_, IssueCodes) = admin_json(state, request).await?;
    let id = DealId::parse(raw_id).map_err(|_| Problem::not_found("no such deal"))?;
    let max = state.settings.waiting_room.access_codes_per_request_max;
    let issued = access_codes::issue_for(&state.pools.admin, id.as_str(), asked.count, max).await?;
    let detail = json!({"count": issued.codes.len()});
    record(
        state,
        &operator,
        "deal.access_codes_issued",
        id.as_str(),
        detail,
    )
    .await;
    Ok(body::respond(
        StatusCode::CREATED,
        &issued,
        Caching::Private,
    ))
}

/// Who sent an authorised admin request, and its JSON body.
pub(super) async fn admin_json<T: DeserializeOwned>(
    state: &State,
    request: Request<Incoming>,
) -> Result<(Operator, T), Problem> {
    let operator = require_admin(state, &request).await?;
    let (_, bytes) = body::split(request, &state.settings.server).await?;
    Ok((operator, body::json(&bytes)?))
}

pub async fn create_deal(state: &State, request: Request<Incoming>) -> Reply {
    let (operator, asked) = admin_json::<CreateDeal>(state, request).await?;
    let new = asked.into_new_deal()?;
    let deal = deals::create(&state.pools.admin, &new).await?;
    let detail = json!({"name": deal.name, "stock": deal.stock_total});
    record(state, &operator, "deal.created", &deal.id, detail).await;
    state
        .admission
        .deals()
        .put(&deal.id, Some(Arc::new(deal.clone())));
    state
        .admission
        .sold_out()
        .record(&state.pools.admin, &deal.id, deal.stock_total)
        .await;
    Ok(body::respond(
        StatusCode::CREATED,
        &AdminDealView::new(&deal, None, state.clock.now()),
        Caching::Private,
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StockChange {
    #[serde(deserialize_with = "super::integer::exact")]
    delta: i64,
}

pub async fn adjust_stock(state: &State, request: Request<Incoming>, raw_id: &str) -> Reply {
    let (operator, change): (_, StockChange) = admin_json(state, request).await?;
    if change.delta.unsigned_abs() > deals::STOCK_MAX as u64 {
        return Err(Problem::invalid(format!(
            "delta must be within ±{}",
            deals::STOCK_MAX
        )));
    }
    let id = DealId::parse(raw_id).map_err(|_| Problem::not_found("no such deal"))?;
    crate::ops::stock::adjust(&state.pools.admin, id.as_str(), change.delta).await?;
    let detail = json!({"delta": change.delta});
    record(state, &operator, "deal.stock_adjusted", id.as_str(), detail).await;
    inventory_reply(state, &id).await
}

pub async fn inventory<B>(state: &State, request: &Request<B>, raw_id: &str) -> Reply {
    require_admin(state, request).await?;
    let id = DealId::parse(raw_id).map_err(|_| Problem::not_found("no such deal"))?;
    inventory_reply(state, &id).await
}

#[derive(Serialize)]
struct BucketView {
    bucket: i32,
    available: i64,
}

#[derive(Serialize)]
struct InventoryView<'a> {
    deal_id: &'a str,
    stock_total: i64,
    available: i64,
    reserved: i64,
    sold: i64,
    buckets: Vec<BucketView>,
    invariant_holds: bool,
}

/// Reads the inventory and, as a side effect, brings the sold-out flag in line with it.
async fn inventory_reply(state: &State, id: &DealId) -> Reply {
    let snapshot = inventory::snapshot(&state.pools.admin, id.as_str())
        .await?
        .ok_or_else(|| Problem::not_found("no such deal"))?;
    state
        .admission
        .sold_out()
        .record(&state.pools.admin, id.as_str(), snapshot.available)
        .await;
    let view = InventoryView {
        deal_id: id.as_str(),
        stock_total: snapshot.stock_total,
        available: snapshot.available,
        reserved: snapshot.reserved,
        sold: snapshot.sold,
        buckets: snapshot
            .buckets
            .iter()
            .map(|&(bucket, available)| BucketView { bucket, available })
            .collect(),
        invariant_holds: snapshot.invariant_holds,
    };
    Ok(body::respond(StatusCode::OK, &view, Caching::Private))
}

pub fn healthz() -> Response<Full<Bytes>> {
    body::respond(
        StatusCode::OK,
        &serde_json::json!({"status": "ok"}),
        Caching::Private,
    )
}

/// How long the readiness probe waits for PostgreSQL.
const READY_PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// Ready when PostgreSQL answers and shutdown has not begun; Redis is reported, not required,
/// as the last health probe found it (a connection that fails every command is down).
pub async fn readyz(state: &State) -> Response<Full<Bytes>> {
    let probe = sqlx::query_scalar::<_, i32>("SELECT 1").fetch_one(&state.pools.admin);
    let postgres = matches!(
        tokio::time::timeout(READY_PROBE_TIMEOUT, probe).await,
        Ok(Ok(1))
    );
    let redis = state.redis.is_up();
    let accepting = state.ready.load(Ordering::Relaxed);
    let ready = postgres && accepting;
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let report = serde_json::json!({
        "status": if ready { "ready" } else { "not_ready" },
        "postgres": if postgres { "up" } else { "down" },
        "redis": if redis { "up" } else { "down" },
        "shutting_down": !accepting,
    });
    body::respond(status, &report, Caching::Private)
}

pub fn metrics(state: &State, headers: &http::HeaderMap) -> Response<Full<Bytes>> {
    state.pools.record_metrics();
    let handle = telemetry::prometheus();
    handle.run_upkeep();
    // A scraper that asks for OpenMetrics gets it, with the latency histogram's exemplars.
    let openmetrics = headers
        .get_all(http::header::ACCEPT)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .any(|value| value.contains("application/openmetrics-text"));
    match openmetrics {
        true => body::text(
            StatusCode::OK,
            telemetry::openmetrics::CONTENT_TYPE,
            telemetry::openmetrics::render(&handle.render()),
        ),
        false => body::text(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            handle.render(),
        ),
    }
}

/// The `waiting_room` object of `POST /admin/deals`; missing fields take the defaults.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WaitingRoomInput {
    #[serde(default)]
    enabled: Option<bool>,
    #[serde(default, deserialize_with = "super::integer::optional")]
    admit_per_second: Option<i32>,
    #[serde(default, deserialize_with = "super::integer::optional")]
    max_active: Option<i32>,
    #[serde(default, deserialize_with = "super::integer::optional")]
    pass_ttl_seconds: Option<i32>,
    #[serde(default)]
    queue_order: Option<String>,
    #[serde(default)]
    prequeue_opens_at: Option<DateTime<Utc>>,
    #[serde(default, deserialize_with = "super::integer::optional")]
    pow_bits: Option<i32>,
    #[serde(default)]
    checkout_url: Option<String>,
    #[serde(default)]
    admission: Option<AdmissionInput>,
    #[serde(default)]
    activation: Option<Activation>,
    #[serde(default)]
    invitation: Option<Invitation>,
    #[serde(default)]
    priority: Option<PriorityInput>,
    #[serde(default)]
    page_template: Option<String>,
}

/// The `admission` object of a deal's `waiting_room`; without it the line is `fixed`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AdmissionInput {
    #[serde(default)]
    mode: Option<AdmissionMode>,
    #[serde(default, deserialize_with = "super::integer::optional")]
    min_per_second: Option<i32>,
    #[serde(default, deserialize_with = "super::integer::optional")]
    max_per_second: Option<i32>,
    #[serde(default, deserialize_with = "super::integer::optional")]
    target_p99_ms: Option<i32>,
}

impl AdmissionInput {
    fn into_terms(self) -> AdmissionTerms {
        let defaults = AdmissionTerms::default();
        AdmissionTerms {
            mode: self.mode.unwrap_or(defaults.mode),
            min_per_second: self.min_per_second.unwrap_or(defaults.min_per_second),
            max_per_second: self.max_per_second.unwrap_or(defaults.max_per_second),
            target_p99_ms: self.target_p99_ms.unwrap_or(defaults.target_p99_ms),
        }
    }
}

/// The `priority` object of a deal's `waiting_room`, its share read as any JSON integer.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PriorityInput {
    #[serde(default)]
    claim: Option<String>,
    #[serde(default)]
    values: Vec<String>,
    #[serde(default)]
    codes: bool,
    #[serde(deserialize_with = "super::integer::exact")]
    share_percent: u8,
}

impl PriorityInput {
    fn into_terms(self) -> Priority {
        Priority {
            claim: self.claim,
            values: self.values,
            codes: self.codes,
            share_percent: self.share_percent,
        }
    }
}

impl WaitingRoomInput {
    /// Terms to validate with the rest of the deal; an object without `enabled` enables.
    fn into_terms(self) -> WaitingRoomTerms {
        let defaults = WaitingRoomTerms::default();
        WaitingRoomTerms {
            enabled: self.enabled.unwrap_or(true),
            admit_per_second: self.admit_per_second.unwrap_or(defaults.admit_per_second),
            max_active: self.max_active.unwrap_or(defaults.max_active),
            pass_ttl_seconds: self.pass_ttl_seconds.unwrap_or(defaults.pass_ttl_seconds),
            queue_order: self.queue_order.unwrap_or(defaults.queue_order),
            prequeue_opens_at: self.prequeue_opens_at,
            pow_bits: self.pow_bits.unwrap_or(defaults.pow_bits),
            checkout_url: self.checkout_url,
            activation: self.activation.unwrap_or_default(),
            invitation: self.invitation,
            priority: self.priority.map(PriorityInput::into_terms),
            admission: self
                .admission
                .map_or(defaults.admission, AdmissionInput::into_terms),
            page_template: self.page_template,
        }
    }
}
