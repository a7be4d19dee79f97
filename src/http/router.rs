//! Hands a request to its handler (the route table is `routes`); times and counts every
//! request by route template.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{CONNECTION, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::{Body, Incoming};
use tracing::{Instrument, Span};

use super::guard::Headers;
use super::problem::Problem;
use super::request_id::{self, RequestId};
use super::routes::{Face, Route};
use super::{
    State, admin, events, operator_log, ops, payments, public, queue, review, revoked_feed, traced,
    wait_page,
};
use crate::admission::SoldOutChecked;
use crate::clock::{elapsed_since, monotonic};
use crate::domain::DealId;
use crate::telemetry;
use crate::telemetry::trace::{Trace, Tracer};

/// What the first stage of a request decided: an answer (every refusal that memory
/// decides, as a flood gets), or the request and what is known of it, to be served by a
/// future that waits.
pub enum Begun {
    /// The answer, and when it was made (the clock read that timed it, so that marking the
    /// connection's head clock does not read the clock again), and the request's body, not
    /// read yet.
    Answered {
        response: Response<Full<Bytes>>,
        at: Instant,
        body: Incoming,
    },
    /// Boxed: it is moved into the future that serves it.
    Waits(Box<Waiting>),
}

/// A request that has to wait (for a body, PostgreSQL, Redis or a provider).
pub struct Waiting {
    started: Instant,
    id: RequestId,
    template: &'static str,
    span: Span,
    request: Request<Incoming>,
    work: Work,
    /// The request's trace, when tracing is on.
    trace: Option<Trace>,
}

impl Waiting {
    /// Whether serving it may end with its body unread: an order always reads its body
    /// first; other routes refuse some requests before they read it.
    pub fn may_leave_body_unread(&self) -> bool {
        matches!(self.work, Work::Route(_)) && !self.request.body().is_end_stream()
    }
}

/// What serves a waiting request.
enum Work {
    /// An order the per-IP limit and the sold-out mirror let through.
    Order(SoldOutChecked),
    /// Any other route, matched again from the request.
    Route(Face),
}

/// The first stage of every request, with nothing awaited: its id, its route, and for an
/// order the checks that refuse a flood. A refusal is answered here, so it never builds,
/// moves or boxes the futures that serve a request that waits.
/// Every answer carries the request's id (`X-Request-Id`), and everything logged while
/// serving it is inside the request's span. `admitted` is the deal of an order whose
/// checks the connection's front already made (see [`begin_front`]).
pub fn begin(
    state: &State,
    peer: SocketAddr,
    face: Face,
    request: Request<Incoming>,
    admitted: Option<SoldOutChecked>,
) -> Begun {
    let started = monotonic();
    let id = RequestId::of(
        request.headers(),
        state.settings.server.request_id_bytes_max,
    );
    let route = route_of(&request, face);
    let template = route.template();
    let span = request_span(&id, &route);
    let work = match route {
        Route::PlaceOrder(raw_id) => {
            let checked = match admitted {
                Some(deal_id) => Ok(deal_id),
                None => {
                    span.in_scope(|| public::check_order(state, peer, request.headers(), raw_id))
                }
            };
            match checked {
                Ok(deal_id) => Work::Order(deal_id),
                Err(problem) => {
                    let answered = Answered::new(Err(problem), started, &id, template);
                    let (response, at) = answered.complete(state, &span);
                    let elapsed = at.saturating_duration_since(started);
                    let status = response.status();
                    traced::refusal(state, request.headers(), &id, template, status, elapsed);
                    let body = request.into_body();
                    return Begun::Answered { response, at, body };
                }
            }
        }
        _ => Work::Route(face),
    };
    let trace = traced::begin(state, request.headers(), &span);
    Begun::Waits(Box::new(Waiting {
        started,
        id,
        template,
        span,
        request,
        work,
        trace,
    }))
}

/// What the first stage decided about an order request whose head the connection's front
/// parsed itself.
pub enum Early {
    /// Refused: its whole answer was appended to the front's output.
    Refused,
    /// An order the checks let through: hyper's service places it without checking again.
    Admitted(SoldOutChecked),
    /// Not an order on the public listener: hyper serves it.
    Other,
}

/// The first stage of a `POST` to `path` whose head the connection's front parsed: for an
/// order, the checks of [`begin`], and a refusal appended to `out` as the bytes hyper
/// would write for it (`date` is the `Date` header's value), counted, timed and logged as
/// [`begin`] does.
pub fn begin_front(
    state: &State,
    peer: SocketAddr,
    path: &str,
    headers: &impl Headers,
    date: &[u8],
    out: &mut Vec<u8>,
) -> Early {
    let started = monotonic();
    let route = route_of_path(&Method::POST, path, Face::Public);
    let Route::PlaceOrder(raw_id) = route else {
        return Early::Other;
    };
    let bytes_max = state.settings.server.request_id_bytes_max;
    let id = RequestId::of_value(headers.first(&request_id::HEADER), bytes_max);
    let span = request_span(&id, &route);
    let problem = match span.in_scope(|| public::check_order(state, peer, headers, raw_id)) {
        Ok(deal_id) => return Early::Admitted(deal_id),
        Err(problem) => problem,
    };
    let (status, slug) = (problem.status(), problem.slug());
    problem.write_http1(&id, date, out);
    let elapsed = elapsed_since(started);
    traced::refusal(state, headers, &id, route.template(), status, elapsed);
    span.record("outcome", slug);
    span.record("latency_ms", elapsed.as_secs_f64() * 1000.0);
    tracing::debug!(parent: &span, status = status.as_u16(), "answered");
    record(route.template(), status, elapsed);
    Early::Refused
}

/// Serves a request that waits, in time: a request still unanswered after
/// `server.request_timeout_ms` is answered 503.
pub async fn finish(
    state: &State,
    peer: SocketAddr,
    waiting: Box<Waiting>,
) -> Response<Full<Bytes>> {
    let Waiting {
        started,
        id,
        template,
        span,
        request,
        work,
        trace,
    } = *waiting;
    let timeout = Duration::from_millis(state.settings.server.request_timeout_ms);
    let method = request.method().clone();
    let serving = serve(state, peer, request, work).instrument(span.clone());
    let reply = match &trace {
        None => in_time(timeout, std::pin::pin!(serving)).await,
        Some(trace) => {
            let scoped = Tracer::within(trace.clone(), serving);
            in_time(timeout, std::pin::pin!(scoped)).await
        }
    };
    let reply = reply.unwrap_or_else(|_| Err(Problem::overloaded("the request took too long")));
    let (response, at) = Answered::new(reply, started, &id, template).complete(state, &span);
    if let Some(trace) = &trace {
        let elapsed = at.saturating_duration_since(started);
        traced::end(
            state,
            trace,
            &method,
            template,
            &id,
            response.status(),
            elapsed,
        );
    }
    response
}

async fn serve(
    state: &State,
    peer: SocketAddr,
    request: Request<Incoming>,
    work: Work,
) -> Result<Response<Full<Bytes>>, Problem> {
    // Every handler's future is boxed, as in `dispatch`: inlined, the largest of them (about
    // 11 KB for an order) would make this future and the one wrapping it twice that size,
    // copied whole when each is made.
    match work {
        Work::Order(deal_id) => Box::pin(public::place_admissible(state, request, deal_id)).await,
        Work::Route(face) => {
            // The clone shares the request's bytes: the route borrows the path, the
            // handler the request.
            let uri = request.uri().clone();
            let route = route_of_path(request.method(), uri.path(), face);
            dispatch(state, peer, route, request).await
        }
    }
}

fn route_of<B>(request: &Request<B>, face: Face) -> Route<'_> {
    route_of_path(request.method(), request.uri().path(), face)
}

/// The route, as far as this listener serves it.
fn route_of_path<'a>(method: &Method, path: &'a str, face: Face) -> Route<'a> {
    let route = Route::of(method, path);
    if route.served_on(face) {
        route
    } else {
        Route::Unknown
    }
}

/// A request's reply, with what its answer needs: its id, its route and when it began.
struct Answered<'a> {
    reply: Result<Response<Full<Bytes>>, Problem>,
    started: Instant,
    id: &'a RequestId,
    template: &'static str,
}

impl<'a> Answered<'a> {
    fn new(
        reply: Result<Response<Full<Bytes>>, Problem>,
        started: Instant,
        id: &'a RequestId,
        template: &'static str,
    ) -> Self {
        Self {
            reply,
            started,
            id,
            template,
        }
    }

    /// The answer: a problem rendered (carrying the request id), the request id added to
    /// any other answer, the connection closed when draining; counted, timed and logged. Also returns when it was timed.
    fn complete(self, state: &State, span: &Span) -> (Response<Full<Bytes>>, Instant) {
        let (mut response, outcome) = match self.reply {
            Ok(mut response) => {
                let id = self.id.header_value();
                response.headers_mut().insert(request_id::HEADER, id);
                (response, "ok")
            }
            Err(problem) => {
                let slug = problem.slug();
                (problem.into_response(self.id), slug)
            }
        };
        if state.draining.load(Ordering::Relaxed) {
            // Draining: each connection ends after this answer, so clients reconnect elsewhere.
            let close = HeaderValue::from_static("close");
            response.headers_mut().insert(CONNECTION, close);
        }
        let at = monotonic();
        let elapsed = at.saturating_duration_since(self.started);
        let status = response.status();
        span.record("outcome", outcome);
        span.record("latency_ms", elapsed.as_secs_f64() * 1000.0);
        tracing::debug!(parent: span, status = status.as_u16(), "answered");
        record(self.template, status, elapsed);
        (response, at)
    }
}

/// The span of one request: its id and route, the deal named in its path, and (recorded
/// later) the user, the outcome and the latency. Nothing is formatted when it is disabled.
fn request_span(id: &RequestId, route: &Route<'_>) -> Span {
    let span = tracing::info_span!(
        "request",
        id = %id,
        route = route.template(),
        deal = tracing::field::Empty,
        user = tracing::field::Empty,
        outcome = tracing::field::Empty,
        latency_ms = tracing::field::Empty,
        trace_id = tracing::field::Empty,
    );
    if !span.is_disabled()
        && let Some(deal) = route.deal_id().filter(|raw| DealId::parse(raw).is_ok())
    {
        span.record("deal", deal);
    }
    span
}

/// `work`'s output, or `Elapsed` after `timeout`. Refusals are answered on the first poll,
/// so the timer is created only for a request that has to wait.
async fn in_time<F: Future>(
    timeout: Duration,
    mut work: Pin<&mut F>,
) -> Result<F::Output, tokio::time::error::Elapsed> {
    let first = std::future::poll_fn(|cx| Poll::Ready(work.as_mut().poll(cx))).await;
    match first {
        Poll::Ready(output) => Ok(output),
        Poll::Pending => tokio::time::timeout(timeout, work).await,
    }
}

/// Counts the request and its duration in this thread's tally (see `telemetry::tally`).
fn record(template: &'static str, status: StatusCode, elapsed: Duration) {
    telemetry::tally::request(template, status.as_u16(), elapsed.as_secs_f64());
}

/// Handlers that wait on PostgreSQL, Redis or a body run boxed: a future holding any of
/// them inline would be tens of kilobytes, copied into place for every request. Orders are
/// checked in `begin` and reach this only when no such stage ran.
async fn dispatch(
    state: &State,
    peer: SocketAddr,
    route: Route<'_>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Problem> {
    match route {
        Route::Healthz => Ok(admin::healthz()),
        Route::Readyz => Ok(Box::pin(admin::readyz(state)).await),
        Route::Metrics => Ok(admin::metrics(state, request.headers())),
        Route::GetDeal(id) => Box::pin(public::get_deal(state, peer, &request, id)).await,
        Route::PlaceOrder(id) => {
            let deal_id = public::check_order(state, peer, request.headers(), id)?;
            Box::pin(public::place_admissible(state, request, deal_id)).await
        }
        Route::JoinQueue(id) => Box::pin(queue::join(state, peer, request, id)).await,
        Route::QueueStatus(id) => Box::pin(queue::line(state, peer, &request, id)).await,
        Route::PollTicket(id, ticket) => {
            Box::pin(queue::poll(state, peer, &request, id, ticket)).await
        }
        Route::GetOrder(id) => Box::pin(public::get_order(state, peer, &request, id)).await,
        Route::CancelOrder(id) => Box::pin(public::cancel_order(state, peer, &request, id)).await,
        Route::StartPayment(id) => {
            Box::pin(payments::start_payment(state, peer, request, id)).await
        }
        Route::Webhook(provider) => Box::pin(payments::webhook(state, request, provider)).await,
        Route::CreateDeal => Box::pin(admin::create_deal(state, request)).await,
        Route::AdjustStock(id) => Box::pin(admin::adjust_stock(state, request, id)).await,
        Route::Inventory(id) => Box::pin(admin::inventory(state, &request, id)).await,
        Route::PauseDeal(id) => Box::pin(ops::set_paused(state, &request, id, true)).await,
        Route::AdminDeal(id) => Box::pin(admin::deal(state, &request, id)).await,
        Route::DealReport(id) => Box::pin(admin::report(state, &request, id)).await,
        Route::SetAdmission(id) => Box::pin(admin::set_admission(state, request, id)).await,
        Route::IssueAccessCodes(id) => {
            Box::pin(admin::issue_access_codes(state, request, id)).await
        }
        Route::ResumeDeal(id) => Box::pin(ops::set_paused(state, &request, id, false)).await,
        Route::Rebalance(id) => Box::pin(ops::rebalance(state, request, id)).await,
        Route::Audit => Box::pin(ops::audit(state, &request)).await,
        Route::OperatorLog => Box::pin(operator_log::list(state, &request)).await,
        Route::OpenApi => Ok(ops::openapi()),
        Route::QueueChallenge(id) => Box::pin(queue::challenge(state, peer, &request, id)).await,
        Route::PassKeys => queue::keys(state),
        Route::RevokedPasses => Ok(revoked_feed::feed(state)),
        Route::RevokeQueue(id) => Box::pin(queue::revoke(state, request, id)).await,
        Route::WaitPage(id) => Box::pin(wait_page::page(state, &request, id)).await,
        Route::ReviewQueue => Box::pin(review::list(state, &request)).await,
        Route::ReviewFulfil(id) => Box::pin(review::fulfil(state, &request, id)).await,
        Route::ReviewRefund(id) => Box::pin(review::refund(state, &request, id)).await,
        Route::EventEndpoints => Box::pin(events::list(state, &request)).await,
        Route::CreateEventEndpoint => Box::pin(events::create(state, request)).await,
        Route::EventEndpoint(id) => Box::pin(events::one(state, request, id)).await,
        Route::RotateEventSecret(id) => Box::pin(events::rotate(state, request, id)).await,
        Route::ReplayEvents(id) => Box::pin(events::replay(state, request, id)).await,
        Route::Events => Box::pin(events::feed(state, &request)).await,
        Route::WrongMethod { allow, .. } => Err(Problem::method_not_allowed(allow)),
        Route::Unknown => Err(Problem::not_found("no such resource")),
    }
}
