//! Request ids: one per request, so a client's report, the problem body it got and every
//! log line the gateway wrote for it can be matched.
//!
//! A caller (a proxy, a CDN, a client) may send its own id in `X-Request-Id`; it is kept
//! when it is short and made of characters that are safe in a header, a URN and a log
//! line. Otherwise the gateway makes one: a random prefix drawn once per process, so that
//! instances do not collide, and a counter, so that making one costs no system call. Each
//! thread takes the counter's values a block at a time: one shared counter written by
//! every core would move its cache line between them on every request.

use std::cell::Cell;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};

use http::HeaderMap;
use http::header::{HeaderName, HeaderValue};

/// The header that carries the id in both directions.
pub const HEADER: HeaderName = HeaderName::from_static("x-request-id");

/// Longest id kept inline; `server.request_id_bytes_max` is checked against it at start-up.
pub const BYTES_CAPACITY: usize = 128;

/// A request id: ASCII letters, digits and `-_.:`, at most [`BYTES_CAPACITY`] bytes.
#[derive(Clone, Copy)]
pub struct RequestId {
    bytes: [u8; BYTES_CAPACITY],
    len: u8,
}

/// Per-process prefix of generated ids: 32 random bits as 8 hex digits.
static PREFIX: LazyLock<u32> = LazyLock::new(rand::random);
/// The start of the next block of counter values no thread has taken yet.
static COUNTER: AtomicU64 = AtomicU64::new(0);
/// Counter values a thread takes at once.
const BLOCK: u64 = 1024;

thread_local! {
    /// This thread's next counter value and the end of its block (empty at first).
    static NEXT: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

/// The next counter value: unique in the process, increasing within a thread.
fn next_count() -> u64 {
    NEXT.with(|next| {
        let (mut count, mut end) = next.get();
        if count == end {
            count = COUNTER.fetch_add(BLOCK, Ordering::Relaxed);
            end = count + BLOCK;
        }
        next.set((count + 1, end));
        count
    })
}

impl RequestId {
    /// The caller's id when it is valid and at most `bytes_max` long, else a new one.
    pub fn of(headers: &HeaderMap, bytes_max: usize) -> Self {
        Self::of_value(
            headers.get(&HEADER).map(|value| value.as_bytes()),
            bytes_max,
        )
    }

    /// The caller's id from the raw value of its header, when valid, else a new one.
    pub fn of_value(raw: Option<&[u8]>, bytes_max: usize) -> Self {
        raw.and_then(|raw| Self::parse(raw, bytes_max))
            .unwrap_or_else(Self::generate)
    }

    /// A caller's id, if it is one the gateway can repeat safely.
    pub fn parse(raw: &[u8], bytes_max: usize) -> Option<Self> {
        let safe = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':');
        let fits = !raw.is_empty() && raw.len() <= bytes_max.min(BYTES_CAPACITY);
        if !fits || !raw.iter().all(safe) {
            return None;
        }
        let mut bytes = [0; BYTES_CAPACITY];
        bytes[..raw.len()].copy_from_slice(raw);
        Some(Self {
            bytes,
            len: raw.len() as u8,
        })
    }

    /// A new id: the process prefix and the next counter value, `8 hex - 12 hex`.
    pub fn generate() -> Self {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let count = next_count();
        let mut bytes = [0; BYTES_CAPACITY];
        let prefix = u64::from(*PREFIX);
        for i in 0..8 {
            bytes[i] = HEX[((prefix >> (28 - 4 * i)) & 0xf) as usize];
        }
        bytes[8] = b'-';
        for i in 0..12 {
            bytes[9 + i] = HEX[((count >> (44 - 4 * i)) & 0xf) as usize];
        }
        Self { bytes, len: 21 }
    }

    pub fn as_str(&self) -> &str {
        // Only ASCII is ever stored.
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or_default()
    }

    /// The id as a response header value.
    pub fn header_value(&self) -> HeaderValue {
        HeaderValue::from_str(self.as_str()).unwrap_or(HeaderValue::from_static("invalid"))
    }
}

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Debug for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_safe_incoming_id_is_kept() {
        let id = RequestId::parse(b"edge-7f3a:42.x_y", 64).unwrap();
        assert_eq!(id.as_str(), "edge-7f3a:42.x_y");
    }

    #[test]
    fn unsafe_empty_or_long_ids_are_refused() {
        for raw in [
            &b""[..],
            b"a b",
            b"a\"b",
            b"a/b",
            b"<script>",
            "é".as_bytes(),
        ] {
            assert!(RequestId::parse(raw, 64).is_none(), "{raw:?}");
        }
        assert!(RequestId::parse(&[b'a'; 65], 64).is_none());
        assert!(RequestId::parse(&[b'a'; 64], 64).is_some());
        assert!(RequestId::parse(&[b'a'; BYTES_CAPACITY + 1], usize::MAX).is_none());
    }

    #[test]
    fn generated_ids_are_distinct_and_valid() {
        let (a, b) = (RequestId::generate(), RequestId::generate());
        assert_ne!(a.as_str(), b.as_str());
        assert_eq!(a.as_str().len(), 21);
        assert!(RequestId::parse(a.as_str().as_bytes(), 64).is_some());
        let mut headers = HeaderMap::new();
        headers.insert(HEADER, HeaderValue::from_static("bad id"));
        assert_ne!(RequestId::of(&headers, 64).as_str(), "bad id");
    }
}
