//! Where requests meet traces (`telemetry::trace`): a waiting request's trace begun from
//! its `traceparent`, a refusal traced when sampled, and the request span each ends with.

use std::time::{Duration, Instant};

use http::header::HeaderName;
use http::{Method, StatusCode};
use tracing::Span;

use super::State;
use super::guard::Headers;
use super::request_id::RequestId;
use crate::telemetry::trace::{RequestSpan, Trace, Value};

/// The W3C Trace Context headers a traced request joins its caller's trace with.
const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// The trace of a request that waits, begun at `started`, when tracing is on; its id goes
/// into the request's log span.
pub fn begin(
    state: &State,
    headers: &impl Headers,
    span: &Span,
    started: Instant,
) -> Option<Trace> {
    let tracer = state.tracer.as_ref()?;
    let head = tracer.head(headers.first(&TRACEPARENT));
    let trace = tracer.begin(head, headers.first(&TRACESTATE), started);
    if !span.is_disabled() {
        span.record("trace_id", trace.id());
    }
    Some(trace)
}

/// Ends a waiting request's trace with its answer.
pub fn end(
    state: &State,
    trace: &Trace,
    method: &Method,
    template: &'static str,
    id: &RequestId,
    status: StatusCode,
    elapsed: Duration,
) {
    if let Some(tracer) = &state.tracer {
        tracer.end(trace, status.as_u16(), elapsed, || {
            request_span(method, template, id)
        });
    }
}

/// A refusal answered `elapsed` after it began at `started`, before its request waited:
/// traced as one span when the caller or the ratio sampled it (5xx refusals too);
/// otherwise it costs a random draw at most.
pub fn refusal(
    state: &State,
    headers: &impl Headers,
    id: &RequestId,
    template: &'static str,
    status: StatusCode,
    started: Instant,
    elapsed: Duration,
) {
    let Some(tracer) = &state.tracer else {
        return;
    };
    let head = tracer.head(headers.first(&TRACEPARENT));
    if !head.sampled && !status.is_server_error() {
        return;
    }
    // The head's one draw decides: drawing again would trace refusals at the ratio squared.
    let trace = tracer.begin(head, headers.first(&TRACESTATE), started);
    // The refusals decided before a request waits are all answers to orders.
    tracer.end(&trace, status.as_u16(), elapsed, || {
        request_span(&Method::POST, template, id)
    });
}

/// The request span of a trace: its route, method and id.
fn request_span(method: &Method, template: &'static str, id: &RequestId) -> RequestSpan {
    RequestSpan {
        name: format!("{method} {template}"),
        route: template,
        attributes: vec![
            ("http.request.method", Value::from(method.as_str())),
            ("http.route", Value::from(template)),
            ("flashgate.request_id", Value::from(id.as_str())),
        ],
    }
}
