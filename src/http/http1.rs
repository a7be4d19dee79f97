//! The HTTP/1.1 writer of the connection's front: an answer as the bytes hyper writes for
//! it on a keep-alive connection, for the front to append without going through hyper.
//!
//! An answer the front sends is made once (`head`) and copied for every request, with the
//! parts that differ between requests (the request id, the date) written in (`write`).
//! It must stay byte for byte what hyper writes: a client cannot tell which of the two
//! answered it.

use http::{HeaderMap, HeaderName, StatusCode};

/// The status line and the headers of `headers` in their order, `last` last and without
/// its value (hyper writes names in lower case, as the map holds them).
pub fn head(status: StatusCode, headers: &HeaderMap, last: &HeaderName) -> Vec<u8> {
    let mut head = Vec::with_capacity(256);
    head.extend_from_slice(b"HTTP/1.1 ");
    head.extend_from_slice(status.as_str().as_bytes());
    head.push(b' ');
    head.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    head.extend_from_slice(b"\r\n");
    for (name, value) in headers {
        if name == last {
            continue;
        }
        head.extend_from_slice(name.as_str().as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(last.as_str().as_bytes());
    head.extend_from_slice(b": ");
    head
}

/// Appends a whole answer to `out`: `head` (from [`head`]) ended by `last_value`, then
/// `content-length` and `date` as hyper adds them, and the body, the concatenation of
/// `body`.
pub fn write(head: &[u8], last_value: &[u8], date: &[u8], body: &[&[u8]], out: &mut Vec<u8>) {
    let length = body.iter().map(|part| part.len()).sum();
    let mut digits = [0; 20];
    let length_text = format_length(length, &mut digits);
    for part in [
        head,
        last_value,
        b"\r\ncontent-length: ",
        length_text,
        b"\r\ndate: ",
        date,
        b"\r\n\r\n",
    ] {
        out.extend_from_slice(part);
    }
    for part in body {
        out.extend_from_slice(part);
    }
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

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    #[test]
    fn an_answer_is_its_head_its_length_its_date_and_its_body() {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("text/plain"));
        let last = HeaderName::from_static("x-request-id");
        headers.insert(last.clone(), HeaderValue::from_static(""));
        let head = head(StatusCode::NOT_FOUND, &headers, &last);
        let mut out = Vec::new();
        write(
            &head,
            b"id-1",
            b"Sun, 06 Dec 2026 10:00:00 GMT",
            &[b"no ", b"such"],
            &mut out,
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 404 Not Found\r\ncontent-type: text/plain\r\nx-request-id: id-1\r\n\
             content-length: 7\r\ndate: Sun, 06 Dec 2026 10:00:00 GMT\r\n\r\nno such"
        );
    }
}
