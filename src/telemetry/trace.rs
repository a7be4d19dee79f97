//! Traces: a request's spans (the request, the admission decision, its batch and the
//! PostgreSQL statement, Redis commands, provider calls) and webhook deliveries, exported over OTLP/HTTP to a
//! collector, so an operator can follow one buyer's request from the edge to the commit.
//!
//! Off unless `telemetry.otlp_endpoint` (or `OTEL_EXPORTER_OTLP_ENDPOINT`) names a
//! collector. When on, a request joins the caller's trace (`traceparent`) or starts one, and
//! its spans are kept in memory until it is answered; then it is exported if the caller
//! sampled it, if it drew one of `telemetry.trace_ratio` (head sampling), if it was
//! answered 5xx, or if it took longer than `telemetry.trace_slow_ms` (the tail decision,
//! which is why nothing is sent before the end). Everything else is dropped unsent.
//! Refusals answered before a request waits are decided at once: a sampled one is exported
//! as a single span, the rest cost one random draw.
//!
//! Spans are recorded by the code that does the work through [`span`], which finds the
//! request's trace in a task-local: with tracing off, or outside a request, it is a lookup
//! that finds nothing. The batch, run by a lane task for many requests, records its spans
//! into each traced request's trace through the handle its job carries ([`current`]).
//! Work outside any request (a webhook delivery attempt) is a one-span trace of its own,
//! kept by the same rules ([`Tracer::alone`]).

mod context;
pub mod otlp;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

pub use context::{Parent, to_hex};
pub use otlp::{Kind, Value};

use super::TelemetrySettings;
use crate::clock::{Clock, monotonic};

/// Finished traces waiting for the exporter; past this they are dropped (and counted)
/// rather than held: a collector that cannot keep up must not grow the gateway's memory.
const EXPORT_QUEUE_TRACES_MAX: usize = 4096;

tokio::task_local! {
    static CURRENT: Trace;
}

/// Starts and ends request traces; cheap to clone.
#[derive(Clone)]
pub struct Tracer(Arc<TracerInner>);

struct TracerInner {
    ratio: f64,
    slow: Duration,
    clock: Clock,
    exports: mpsc::Sender<Vec<otlp::Span>>,
}

impl Tracer {
    /// The tracer the settings ask for, with its exporter task started; `None` when no
    /// collector is configured (tracing off). Call within the runtime.
    pub fn start(settings: &TelemetrySettings, clock: Clock) -> Option<Tracer> {
        let endpoint = settings.otlp_endpoint.trim().trim_end_matches('/');
        if endpoint.is_empty() {
            return None;
        }
        let (exports, queue) = mpsc::channel(EXPORT_QUEUE_TRACES_MAX);
        tokio::spawn(otlp::export(format!("{endpoint}/v1/traces"), queue));
        Some(Tracer(Arc::new(TracerInner {
            ratio: settings.trace_ratio,
            slow: Duration::from_millis(settings.trace_slow_ms),
            clock,
            exports,
        })))
    }

    /// Whether a request is sampled at its head: the caller's decision when it sent a
    /// `traceparent`, else a draw at `trace_ratio`.
    fn head_sampled(&self, parent: Option<&Parent>) -> bool {
        match parent {
            Some(parent) => parent.sampled,
            None => self.0.ratio > 0.0 && unit_draw() < self.0.ratio,
        }
    }

    /// A request's head decision, made once: its caller's place (a valid `traceparent`) and
    /// whether it is sampled.
    pub fn head(&self, traceparent: Option<&[u8]>) -> Head {
        let parent = traceparent.and_then(Parent::parse);
        let sampled = self.head_sampled(parent.as_ref());
        Head { parent, sampled }
    }

    /// A new trace for a request begun at `started` (monotonic), as `head` decided. It
    /// reads no clock: the wall time is read once the trace is kept.
    pub fn begin(&self, head: Head, tracestate: Option<&[u8]>, started: Instant) -> Trace {
        let Head { parent, sampled } = head;
        let trace_state = tracestate
            .filter(|_| parent.is_some())
            .and_then(|state| std::str::from_utf8(state).ok())
            .map(str::to_owned);
        Trace(Arc::new(TraceInner {
            trace_id: parent.as_ref().map_or_else(trace_id, |p| p.trace_id),
            root: next_id().to_be_bytes(),
            caller: parent.map(|p| p.span_id),
            trace_state,
            head_sampled: sampled,
            started,
            spans: Mutex::new(Vec::new()),
        }))
    }

    /// Ends `trace`, answered `status` after `elapsed`; exports it when it was sampled,
    /// failed (5xx) or was slow, with the request span `request` makes (only then).
    pub fn end(
        &self,
        trace: &Trace,
        status: u16,
        elapsed: Duration,
        request: impl FnOnce() -> RequestSpan,
    ) {
        let failed = status >= 500;
        if !(trace.0.head_sampled || failed || elapsed >= self.0.slow) {
            return;
        }
        let ended = unix_nanos(&self.0.clock);
        let began = ended.saturating_sub(nanos(elapsed));
        let recorded =
            std::mem::take(&mut *trace.0.spans.lock().unwrap_or_else(|p| p.into_inner()));
        let mut spans: Vec<otlp::Span> = recorded
            .into_iter()
            .map(|r| trace.exported(r, began))
            .collect();
        let request = request();
        let mut attributes = request.attributes;
        attributes.push(("http.response.status_code", Value::Int(i64::from(status))));
        spans.push(otlp::Span {
            trace_id: trace.0.trace_id,
            span_id: trace.0.root,
            parent_span_id: trace.0.caller,
            trace_state: trace.0.trace_state.clone(),
            name: request.name,
            kind: Kind::Server,
            start_unix_nanos: began,
            end_unix_nanos: ended,
            attributes,
            error: failed,
        });
        if self.0.exports.try_send(spans).is_err() {
            tracing::debug!("trace dropped: the OTLP export queue is full");
            return;
        }
        let seconds = elapsed.as_secs_f64();
        super::openmetrics::record_exemplar(request.route, seconds, trace.id(), ended as f64 / 1e9);
    }

    /// Runs `work` with `trace` as the request's trace, so [`span`] records into it.
    pub async fn within<F: Future>(trace: Trace, work: F) -> F::Output {
        CURRENT.scope(trace, work).await
    }
}

/// A span that is a trace of its own, outside any request: a webhook delivery attempt.
pub struct Alone {
    pub name: &'static str,
    pub kind: Kind,
    pub attributes: Vec<(&'static str, Value)>,
    pub failed: bool,
}

impl Tracer {
    /// Exports `span`, begun at `started` (monotonic) and ending now, as a one-span trace
    /// when a draw at `trace_ratio` samples it, it failed, or it took longer than
    /// `trace_slow_ms`: the request's rules, for work no caller's `traceparent` reaches.
    pub fn alone(&self, span: Alone, started: Instant) {
        let elapsed = monotonic().saturating_duration_since(started);
        if !(span.failed || elapsed >= self.0.slow || self.head_sampled(None)) {
            return;
        }
        let end_unix_nanos = unix_nanos(&self.0.clock);
        let exported = otlp::Span {
            trace_id: trace_id(),
            span_id: next_id().to_be_bytes(),
            parent_span_id: None,
            trace_state: None,
            name: span.name.to_owned(),
            kind: span.kind,
            start_unix_nanos: end_unix_nanos.saturating_sub(nanos(elapsed)),
            end_unix_nanos,
            attributes: span.attributes,
            error: span.failed,
        };
        if self.0.exports.try_send(vec![exported]).is_err() {
            tracing::debug!("trace dropped: the OTLP export queue is full");
        }
    }
}

/// What a request's head decided: the caller's span, if it named one, and whether the
/// trace is sampled (kept whatever its end).
pub struct Head {
    parent: Option<Parent>,
    pub sampled: bool,
}

/// The request's own span, as the router ends it.
pub struct RequestSpan {
    /// `METHOD /route/template`.
    pub name: String,
    /// The route template, whose latency bucket takes the trace as its exemplar.
    pub route: &'static str,
    pub attributes: Vec<(&'static str, Value)>,
}

/// One request's trace: its ids and the spans recorded so far; cheap to clone.
#[derive(Clone)]
pub struct Trace(Arc<TraceInner>);

struct TraceInner {
    trace_id: [u8; 16],
    /// The request span's id: every other span's parent, or its ancestor.
    root: [u8; 8],
    /// The caller's span, the request span's parent.
    caller: Option<[u8; 8]>,
    trace_state: Option<String>,
    head_sampled: bool,
    /// When the request began on the monotonic clock: the spans' times are offsets from it,
    /// made wall-clock times only when the trace is exported.
    started: Instant,
    /// Kept as recorded, cheap to make: only a trace that is exported is converted.
    spans: Mutex<Vec<Finished>>,
}

impl Trace {
    /// The trace id in hex, for the logs.
    pub fn id(&self) -> String {
        to_hex(&self.0.trace_id)
    }

    /// The request span's id, parent of the spans recorded under it.
    pub fn root(&self) -> [u8; 8] {
        self.0.root
    }

    /// Records a finished span under `parent`; returns its id, the parent of spans below it.
    pub fn record(&self, mut finished: Finished) -> [u8; 8] {
        let span_id = next_id().to_be_bytes();
        finished.id = span_id;
        self.0
            .spans
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(finished);
        span_id
    }

    /// A recorded span as exported: wall-clock times (the request began at `began`, Unix
    /// nanoseconds), the trace's id.
    fn exported(&self, finished: Finished, began: u64) -> otlp::Span {
        let at = |moment: Instant| began + nanos(moment.saturating_duration_since(self.0.started));
        otlp::Span {
            trace_id: self.0.trace_id,
            span_id: finished.id,
            parent_span_id: Some(finished.parent),
            trace_state: None,
            name: finished.name.to_owned(),
            kind: finished.kind,
            start_unix_nanos: at(finished.start),
            end_unix_nanos: at(finished.end),
            attributes: finished.attributes,
            error: finished.error,
        }
    }
}

/// A span that ended, for [`Trace::record`].
pub struct Finished {
    /// Its span id, given by [`Trace::record`] (leave it zero).
    pub id: [u8; 8],
    pub name: &'static str,
    pub kind: Kind,
    pub parent: [u8; 8],
    pub start: Instant,
    pub end: Instant,
    pub attributes: Vec<(&'static str, Value)>,
    pub error: bool,
}

/// The trace of the request this task serves, if it is traced.
pub fn current() -> Option<Trace> {
    CURRENT.try_with(Trace::clone).ok()
}

/// A span from now until the guard drops, in the current request's trace; does nothing
/// (and allocates nothing) outside a traced request.
pub fn span(name: &'static str, kind: Kind) -> SpanGuard {
    SpanGuard {
        live: current().map(|trace| Live {
            parent: trace.root(),
            trace,
            name,
            kind,
            start: monotonic(),
            attributes: Vec::new(),
            error: false,
        }),
    }
}

/// An open span; recorded when dropped.
pub struct SpanGuard {
    live: Option<Live>,
}

struct Live {
    trace: Trace,
    parent: [u8; 8],
    name: &'static str,
    kind: Kind,
    start: Instant,
    attributes: Vec<(&'static str, Value)>,
    error: bool,
}

impl SpanGuard {
    /// Adds an attribute; `value` is made only when the span is recorded.
    pub fn attribute<V: Into<Value>>(&mut self, key: &'static str, value: impl FnOnce() -> V) {
        if let Some(live) = &mut self.live {
            live.attributes.push((key, value().into()));
        }
    }

    /// Marks the span failed.
    pub fn failed(&mut self) {
        if let Some(live) = &mut self.live {
            live.error = true;
        }
    }
}

impl Drop for SpanGuard {
    fn drop(&mut self) {
        if let Some(live) = self.live.take() {
            live.trace.record(Finished {
                id: [0; 8],
                name: live.name,
                kind: live.kind,
                parent: live.parent,
                start: live.start,
                end: monotonic(),
                attributes: live.attributes,
                error: live.error,
            });
        }
    }
}

thread_local! {
    /// This thread's id generator (SplitMix64), seeded once from the system's randomness:
    /// ids and sampling draws cost a few arithmetic operations, not a CSPRNG block each.
    static IDS: std::cell::Cell<u64> = std::cell::Cell::new(rand::random());
}

/// A fresh 64-bit id (never zero, which W3C reserves for "none").
fn next_id() -> u64 {
    IDS.with(|state| {
        loop {
            let seed = state.get().wrapping_add(0x9e37_79b9_7f4a_7c15);
            state.set(seed);
            let mut z = seed;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            let id = z ^ (z >> 31);
            if id != 0 {
                return id;
            }
        }
    })
}

/// A new 128-bit trace id.
fn trace_id() -> [u8; 16] {
    let mut id = [0; 16];
    id[..8].copy_from_slice(&next_id().to_be_bytes());
    id[8..].copy_from_slice(&next_id().to_be_bytes());
    id
}

/// A uniform draw in [0, 1) for head sampling.
fn unit_draw() -> f64 {
    (next_id() >> 11) as f64 / (1u64 << 53) as f64
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

fn unix_nanos(clock: &Clock) -> u64 {
    clock
        .now()
        .timestamp_nanos_opt()
        .and_then(|n| u64::try_from(n).ok())
        .unwrap_or(0)
}
