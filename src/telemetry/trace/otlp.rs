//! OTLP over HTTP: finished spans encoded as an `ExportTraceServiceRequest` (protobuf,
//! opentelemetry-proto's `collector/trace/v1`) and posted to `<endpoint>/v1/traces`.
//!
//! The few messages a span needs are written by hand, field by field, rather than through
//! generated code: about a hundred lines instead of a protobuf code generator and its
//! build step. The test decodes them with the OpenTelemetry project's own definitions.

use std::time::Duration;

use tokio::sync::mpsc;

/// A span attribute's value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Text(String),
    /// A text known when the code was written (a system's or an operation's name): recorded
    /// without an allocation.
    Name(&'static str),
    Int(i64),
}

impl From<&str> for Value {
    fn from(text: &str) -> Self {
        Value::Text(text.to_owned())
    }
}

impl From<String> for Value {
    fn from(text: String) -> Self {
        Value::Text(text)
    }
}

impl From<i64> for Value {
    fn from(number: i64) -> Self {
        Value::Int(number)
    }
}

/// The role of a span (OTLP `SpanKind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Internal = 1,
    Server = 2,
    Client = 3,
}

/// A finished span, ready to export.
#[derive(Debug, Clone)]
pub struct Span {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub parent_span_id: Option<[u8; 8]>,
    pub trace_state: Option<String>,
    pub name: String,
    pub kind: Kind,
    pub start_unix_nanos: u64,
    pub end_unix_nanos: u64,
    pub attributes: Vec<(&'static str, Value)>,
    pub error: bool,
}

/// Spans posted in one request at most; more wait for the next.
const EXPORT_SPANS_MAX: usize = 512;
/// How long a span waits for others to share its export.
const EXPORT_INTERVAL: Duration = Duration::from_millis(500);
/// How long one export may take before it is given up (its spans are dropped).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// Posts what arrives on `spans` to `url`, a batch at a time, until every sender is gone.
/// A collector that fails or is slow loses those spans, never delays a request.
pub async fn export(url: String, mut spans: mpsc::Receiver<Vec<Span>>) {
    let client = match reqwest::Client::builder().timeout(EXPORT_TIMEOUT).build() {
        Ok(client) => client,
        Err(error) => {
            tracing::warn!(%error, "no HTTP client for OTLP export; traces are not exported");
            return;
        }
    };
    let mut batch: Vec<Span> = Vec::new();
    // When the oldest span waiting must be sent: a trickle of traces, each sooner than the
    // interval after the last, must not hold the batch back until it is full.
    let mut due = tokio::time::Instant::from_std(crate::clock::monotonic());
    loop {
        let next = match batch.is_empty() {
            true => spans.recv().await,
            false => tokio::time::timeout_at(due, spans.recv())
                .await
                .unwrap_or(Some(Vec::new())),
        };
        let Some(trace) = next else {
            post(&client, &url, &batch).await;
            return;
        };
        if batch.is_empty() {
            due = tokio::time::Instant::from_std(crate::clock::monotonic()) + EXPORT_INTERVAL;
        }
        let flush =
            trace.is_empty() || tokio::time::Instant::from_std(crate::clock::monotonic()) >= due;
        batch.extend(trace);
        if flush || batch.len() >= EXPORT_SPANS_MAX {
            post(&client, &url, &batch).await;
            batch.clear();
        }
    }
}

async fn post(client: &reqwest::Client, url: &str, spans: &[Span]) {
    if spans.is_empty() {
        return;
    }
    let sent = client
        .post(url)
        .header("content-type", "application/x-protobuf")
        .body(encode(spans))
        .send()
        .await;
    match sent {
        Ok(answer) if answer.status().is_success() => {}
        Ok(answer) => tracing::debug!(status = %answer.status(), "OTLP export refused"),
        Err(error) => tracing::debug!(%error, "OTLP export failed"),
    }
}

/// `ExportTraceServiceRequest { resource_spans: [{ resource: {service.name}, scope_spans:
/// [{ scope: {name}, spans }] }] }`.
pub fn encode(spans: &[Span]) -> Vec<u8> {
    let mut resource = Vec::new();
    message(
        &mut resource,
        1,
        &key_value("service.name", &"flashgate".into()),
    );
    let mut scope = Vec::new();
    text(&mut scope, 1, "flashgate");
    let mut scope_spans = Vec::new();
    message(&mut scope_spans, 1, &scope);
    for span in spans {
        message(&mut scope_spans, 2, &encode_span(span));
    }
    let mut resource_spans = Vec::new();
    message(&mut resource_spans, 1, &resource);
    message(&mut resource_spans, 2, &scope_spans);
    let mut request = Vec::new();
    message(&mut request, 1, &resource_spans);
    request
}

fn encode_span(span: &Span) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    bytes(&mut out, 1, &span.trace_id);
    bytes(&mut out, 2, &span.span_id);
    if let Some(state) = &span.trace_state {
        text(&mut out, 3, state);
    }
    if let Some(parent) = &span.parent_span_id {
        bytes(&mut out, 4, parent);
    }
    text(&mut out, 5, &span.name);
    varint_field(&mut out, 6, span.kind as u64);
    fixed64(&mut out, 7, span.start_unix_nanos);
    fixed64(&mut out, 8, span.end_unix_nanos);
    for (key, value) in &span.attributes {
        message(&mut out, 9, &key_value(key, value));
    }
    // Status { code = 3: 1 ok, 2 error }.
    let mut status = Vec::new();
    varint_field(&mut status, 3, if span.error { 2 } else { 1 });
    message(&mut out, 15, &status);
    out
}

/// `KeyValue { key = 1, value = 2: AnyValue { string_value = 1 | int_value = 3 } }`.
fn key_value(key: &str, value: &Value) -> Vec<u8> {
    let mut any = Vec::new();
    match value {
        Value::Text(value) => text(&mut any, 1, value),
        Value::Name(value) => text(&mut any, 1, value),
        Value::Int(value) => varint_field(&mut any, 3, *value as u64),
    }
    let mut out = Vec::new();
    text(&mut out, 1, key);
    message(&mut out, 2, &any);
    out
}

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn tag(out: &mut Vec<u8>, field: u64, wire_type: u64) {
    varint(out, field << 3 | wire_type);
}

fn varint_field(out: &mut Vec<u8>, field: u64, value: u64) {
    tag(out, field, 0);
    varint(out, value);
}

fn fixed64(out: &mut Vec<u8>, field: u64, value: u64) {
    tag(out, field, 1);
    out.extend_from_slice(&value.to_le_bytes());
}

fn bytes(out: &mut Vec<u8>, field: u64, value: &[u8]) {
    tag(out, field, 2);
    varint(out, value.len() as u64);
    out.extend_from_slice(value);
}

fn text(out: &mut Vec<u8>, field: u64, value: &str) {
    bytes(out, field, value.as_bytes());
}

fn message(out: &mut Vec<u8>, field: u64, encoded: &[u8]) {
    bytes(out, field, encoded);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_and_fields_follow_the_protobuf_wire_format() {
        let mut out = Vec::new();
        varint(&mut out, 300);
        assert_eq!(out, [0xac, 0x02]);
        let mut field = Vec::new();
        text(&mut field, 5, "ab");
        assert_eq!(field, [0x2a, 2, b'a', b'b']);
        let mut fixed = Vec::new();
        fixed64(&mut fixed, 7, 1);
        assert_eq!(fixed, [0x39, 1, 0, 0, 0, 0, 0, 0, 0]);
    }
}
