//! A problem written as an answer: a hyper response, or the bytes the connection's front
//! sends. A flood gets the same refusal over and over, so everything but the request id is
//! prepared once per thread and copied.

use std::cell::RefCell;

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderName, HeaderValue, RETRY_AFTER};
use http::{HeaderMap, Response};
use http_body_util::Full;

use super::{Problem, TYPE_BASE};
use crate::admission::limits::Limited;
use crate::http::http1;
use crate::http::request_id::{self, RequestId};

/// Room for a whole problem body, so rendering it does not grow the buffer.
const BODY_BYTES_TYPICAL: usize = 256;

impl Problem {
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
    /// hyper writes for [`Problem::into_response`] (see [`http1`]): the connection's front
    /// answers a refusal without hyper. `date` is the `Date` header's value.
    pub fn write_http1(self, id: &RequestId, date: &[u8], out: &mut Vec<u8>) {
        LAST_ANSWER.with_borrow_mut(|last| {
            let prepared = match last {
                Some(prepared) if prepared.problem == self => prepared,
                _ => last.insert(Prepared::new(self)),
            };
            prepared.write_http1(id, date, out);
        });
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
            http1_head: http1::head(problem.status, &headers, &request_id::HEADER),
            headers,
            problem,
        }
    }

    fn write_http1(&self, id: &RequestId, date: &[u8], out: &mut Vec<u8>) {
        let id_text = id.as_str().as_bytes();
        let body = [&self.body_head[..], id_text, BODY_TAIL];
        http1::write(&self.http1_head, id_text, date, &body, out);
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

#[cfg(test)]
mod tests {
    use super::*;

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
