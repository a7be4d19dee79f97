//! Reading bounded request bodies and writing JSON responses.

use std::time::Duration;

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE, HeaderValue, VARY};
use http::{Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::problem::Problem;
use crate::config::ServerSettings;

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
/// otherwise (worded in `problem`).
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
        Problem::invalid_json(&error, well_formed)
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
