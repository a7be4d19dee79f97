//! Reading bounded request bodies, discarding the bodies of refused requests, and writing
//! JSON responses.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE, HeaderValue, VARY};
use http::{Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Body, Incoming};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::time::Sleep;

use super::ServerSettings;
use super::problem::Problem;

/// The whole body, refused with 413 past `bytes_max` (before reading it when the client
/// declared its length), and with 408 when it has not arrived within `timeout`.
pub async fn read(
    body: Incoming,
    headers: &http::HeaderMap,
    bytes_max: usize,
    timeout: Duration,
) -> Result<Bytes, Problem> {
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|length| length > bytes_max as u64) {
        return Err(Problem::payload_too_large(bytes_max));
    }
    let collected = tokio::time::timeout(timeout, Limited::new(body, bytes_max).collect())
        .await
        .map_err(|_| Problem::request_timeout("the request body did not arrive in time"))?;
    match collected {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error)
            if error
                .downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Err(Problem::payload_too_large(bytes_max))
        }
        Err(_) => Err(Problem::invalid("the request body could not be read")),
    }
}

/// The body of a request refused before it was read, read to its end and thrown away.
///
/// hyper keeps a keep-alive connection after an answer only when the request's body was
/// read to its end; a body nobody reads it drains itself, but only as far as its buffer
/// goes, and closes the connection when the body continues past it. A read boundary falls
/// inside some body sooner or later, and every request a client had pipelined behind it
/// went unanswered. So a refusal reads what is left of its body first: usually one chunk,
/// already received with the head.
pub struct Unread {
    body: Incoming,
    /// Bytes that may still be thrown away; a longer body is not waited for.
    bytes_left: usize,
    timeout: Duration,
    /// Armed the first time the body is not all there: a body received with its head,
    /// the common case, costs no timer.
    deadline: Option<Pin<Box<Sleep>>>,
}

impl Unread {
    /// What is left of `body`, to be read to its end within `timeout` if it is at most
    /// `bytes_max` long; `None` when nothing is left.
    pub fn of(body: Incoming, bytes_max: usize, timeout: Duration) -> Option<Self> {
        (!body.is_end_stream()).then_some(Self {
            body,
            bytes_left: bytes_max,
            timeout,
            deadline: None,
        })
    }

    /// Reads and throws away what has arrived. Ready with `true` once the body has been
    /// read to its end; with `false` when it cannot be (longer than allowed, not arrived in
    /// time, broken off): the connection cannot carry another request, and its answer
    /// should say so.
    pub fn poll_discard(&mut self, cx: &mut Context<'_>) -> Poll<bool> {
        // A declared length is known before any of the body is read.
        if self.body.size_hint().lower() > self.bytes_left as u64 {
            return Poll::Ready(false);
        }
        loop {
            match Pin::new(&mut self.body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    let length = frame.data_ref().map_or(0, Bytes::len);
                    let Some(left) = self.bytes_left.checked_sub(length) else {
                        return Poll::Ready(false);
                    };
                    self.bytes_left = left;
                    // Known at the last byte of a declared length, without waiting for
                    // hyper to say the body ended.
                    if self.body.is_end_stream() {
                        return Poll::Ready(true);
                    }
                }
                Poll::Ready(None) => return Poll::Ready(true),
                Poll::Ready(Some(Err(_))) => return Poll::Ready(false),
                Poll::Pending => return self.poll_deadline(cx).map(|()| false),
            }
        }
    }

    /// True once the body had to be waited for.
    pub fn waited(&self) -> bool {
        self.deadline.is_some()
    }

    fn poll_deadline(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let timeout = self.timeout;
        self.deadline
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)))
            .as_mut()
            .poll(cx)
    }
}

/// The request's head and its whole body, bounded as `read` is.
pub async fn split(
    request: http::Request<Incoming>,
    server: &ServerSettings,
) -> Result<(http::request::Parts, Bytes), Problem> {
    let (parts, incoming) = request.into_parts();
    let timeout = Duration::from_millis(server.body_read_timeout_ms);
    let bytes = read(incoming, &parts.headers, server.body_bytes_max, timeout).await?;
    Ok((parts, bytes))
}

/// Parses a JSON object body into `T`, answering 400 with the field and the reason
/// otherwise (worded by `invalid_json`).
/// Only objects are accepted: serde would also read a struct from an array. JSON is UTF-8
/// (RFC 8259), and serde skips the bytes of fields it ignores without looking at them, so
/// the whole body is checked first: invalid bytes anywhere make the body invalid.
pub fn json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Problem> {
    if std::str::from_utf8(bytes).is_err() {
        return Err(Problem::invalid("the body is not valid UTF-8"));
    }
    if bytes.trim_ascii_start().first() != Some(&b'{') {
        return Err(Problem::invalid("the body must be a JSON object"));
    }
    let mut reader = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut reader).map_err(|error| {
        let well_formed = serde_json::from_slice::<serde::de::IgnoredAny>(bytes).is_ok();
        invalid_json(&error, well_formed)
    })?;
    reader
        .end()
        .map_err(|_| Problem::invalid("the body is not valid JSON: more follows the object"))?;
    Ok(value)
}

/// Cache policy of a successful response.
#[derive(Debug, Clone, Copy)]
pub enum Caching {
    /// Anyone's answer, safe for a CDN for this many seconds.
    Public(u32),
    /// Personal or a write: never cached.
    Private,
}

pub fn respond<T: Serialize>(
    status: StatusCode,
    value: &T,
    caching: Caching,
) -> Response<Full<Bytes>> {
    let json = serde_json::to_vec(value).unwrap_or_default();
    let mut response = Response::new(Full::new(Bytes::from(json)));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    let cache = match caching {
        Caching::Public(seconds) => HeaderValue::from_str(&format!("public, max-age={seconds}"))
            .unwrap_or(HeaderValue::from_static("no-store")),
        Caching::Private => HeaderValue::from_static("private, no-store"),
    };
    headers.insert(CACHE_CONTROL, cache);
    if let Caching::Private = caching {
        // A personal answer depends on who asks: no shared cache may give it to another.
        headers.insert(VARY, HeaderValue::from_static("authorization"));
    }
    response
}

pub fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
        .headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// A JSON body that does not fit its request: the field and the reason in the words of
/// the API (`quantity must be an integer (got string "2")`), never serde's or Rust's
/// type names. `well_formed` tells whether the body is JSON at all: a value of the wrong
/// kind for a field of fixed values is reported by serde_json as a syntax error.
fn invalid_json(
    error: &serde_path_to_error::Error<serde_json::Error>,
    well_formed: bool,
) -> Problem {
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
        invalid_json(&error, well_formed).detail()
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
}
