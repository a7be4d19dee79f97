//! The connection's front: answers a flood's refusals from prepared bytes before hyper
//! takes the connection.
//!
//! A flood after a sell-out is order requests refused from memory. Through hyper each one
//! builds a request, a header map and a body channel, and its answer a response and a
//! header map, to send bytes that differ from the previous answer's only by the date and
//! the request id. The front reads a new connection's requests into a buffer of its own,
//! parses their heads (`httparse`, as hyper does) and answers each refusal by appending its
//! prepared answer (`Problem::write_http1`); the body, whole in the buffer, is skipped.
//!
//! The first request the front does not answer itself hands the connection to hyper for
//! good, after every answer the front made is written, with the bytes the front read and
//! did not answer given to hyper first: answers stay in order, and hyper frames everything
//! the front does not. Handed over: any other route or method, an order the checks let
//! through (hyper places it without checking again), a head or body not whole in the
//! buffer, anything but plain HTTP/1.1 framed by `Content-Length` (chunked, `Expect`,
//! `Connection`, `Upgrade`), a body over `server.body_bytes_max`, a head over
//! `server.header_bytes_max` (read up to `head_read_bytes_max`, so that one carried over by
//! its `Authorization` header is answered 401, not 431), a head hyper would refuse, and
//! every request once the gateway drains.

use std::cell::Cell;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;

use super::State;
use super::connection::{Drain, HeadClock, HeadTimer};
use super::guard::Headers;
use super::router::{self, Early};
use super::stream::SharedStream;
use crate::admission::SoldOutChecked;
use http::HeaderName;

/// Most headers a head the front answers may have; a head with more goes to hyper.
const HEADERS_MAX: usize = 32;

/// How the front left the connection.
pub enum Handoff {
    /// Ended: the client closed it, kept it waiting past the header read timeout, or the
    /// drain closed it.
    Closed,
    /// hyper serves the rest: `read` first, then the socket. `admitted` is the deal of the
    /// first request in `read` when the front's checks let that order through.
    Hyper {
        read: Bytes,
        admitted: Option<SoldOutChecked>,
    },
}

/// Answers the refusals at the start of a public connection until it meets a request it
/// hands to hyper, or the connection ends.
pub async fn serve(
    state: &State,
    peer: SocketAddr,
    stream: &SharedStream,
    drain: &Drain,
    heads: &HeadClock,
    head_timeout: Duration,
) -> Handoff {
    let (mut abort, mut closing) = (drain.abort.cancelled(), drain.closing.cancelled());
    let mut head_due = HeadTimer::new(head_timeout);
    let (mut read, mut out) = (Vec::new(), Vec::new());
    loop {
        let next = answer_read(state, peer, &mut read, &mut out);
        if !out.is_empty() {
            tokio::select! {
                biased;
                () = &mut abort => return Handoff::Closed,
                written = stream.write_all(&out) => if written.is_err() {
                    return Handoff::Closed;
                },
            }
            out.clear();
            heads.answered();
        }
        if let Next::Hyper(admitted) = next {
            return hand_over(read, admitted);
        }
        tokio::select! {
            biased;
            () = &mut abort => return Handoff::Closed,
            () = &mut closing => {
                // Bytes already here are a request sent before the gateway stopped: hyper
                // answers it, as `connection::drive` lets it.
                if read.is_empty() && !stream.has_unread_bytes() {
                    return Handoff::Closed;
                }
                return hand_over(read, None);
            }
            () = &mut head_due => match heads.next_due(head_timeout) {
                Some(due) => head_due.reset(due),
                None => {
                    tracing::debug!("no request head within the header read timeout");
                    return Handoff::Closed;
                }
            },
            more = stream.read_more(&mut read) => if !matches!(more, Ok(n) if n > 0) {
                return Handoff::Closed;
            },
        }
    }
}

fn hand_over(read: Vec<u8>, admitted: Option<SoldOutChecked>) -> Handoff {
    Handoff::Hyper {
        read: Bytes::from(read),
        admitted,
    }
}

/// What follows the requests the front answered.
#[derive(Debug)]
enum Next {
    /// The rest of a head: read more.
    More,
    /// A request for hyper (with its deal when it is an order the checks let through).
    Hyper(Option<SoldOutChecked>),
}

/// Answers every whole refusal at the start of `read` into `out` and removes it from `read`.
fn answer_read(state: &State, peer: SocketAddr, read: &mut Vec<u8>, out: &mut Vec<u8>) -> Next {
    let mut start = 0;
    let next = loop {
        match answer_one(state, peer, &read[start..], out) {
            One::Answered(length) => start += length,
            One::Stop(next) => break next,
        }
    };
    read.drain(..start);
    next
}

enum One {
    /// A refusal was answered; its request took this many bytes.
    Answered(usize),
    Stop(Next),
}

/// Answers the request at the start of `bytes` if it is a refusal the front answers.
fn answer_one(state: &State, peer: SocketAddr, bytes: &[u8], out: &mut Vec<u8>) -> One {
    if bytes.is_empty() {
        return One::Stop(Next::More);
    }
    let server = &state.settings.server;
    let mut slots = [httparse::EMPTY_HEADER; HEADERS_MAX];
    let mut request = httparse::Request::new(&mut slots);
    let head_length = match request.parse(bytes) {
        // A head over `header_bytes_max` is hyper's to refuse (`router::check_head`).
        Ok(httparse::Status::Complete(length)) if length <= server.header_bytes_max => length,
        Ok(httparse::Status::Partial) if bytes.len() <= server.head_read_bytes_max() => {
            return One::Stop(Next::More);
        }
        _ => return One::Stop(Next::Hyper(None)),
    };
    let plain = request.version == Some(1)
        && request.method == Some("POST")
        && !state.draining.load(Ordering::Relaxed);
    let path = request.path.filter(|path| plain && path.starts_with('/'));
    let length = plain_body_length(request.headers).filter(|&l| l <= server.body_bytes_max);
    let whole = length
        .and_then(|length| head_length.checked_add(length))
        .filter(|&whole| whole <= bytes.len());
    let (Some(path), Some(whole)) = (path, whole) else {
        return One::Stop(Next::Hyper(None));
    };
    let path = path.split_once('?').map_or(path, |(path, _query)| path);
    let head = Head(request.headers);
    match router::begin_front(
        state,
        peer,
        path,
        &head,
        &http_date(state.clock.now().into()),
        out,
    ) {
        Early::Refused => One::Answered(whole),
        Early::Admitted(deal_id) => One::Stop(Next::Hyper(Some(deal_id))),
        Early::Other => One::Stop(Next::Hyper(None)),
    }
}

/// The body's length when the head frames it plainly: one `Content-Length` or none, and
/// none of the headers that change how the connection goes on (hyper handles those).
fn plain_body_length(headers: &[httparse::Header<'_>]) -> Option<usize> {
    const HYPERS: [&str; 4] = ["transfer-encoding", "connection", "expect", "upgrade"];
    let mut length = None;
    for header in headers {
        if header.name.eq_ignore_ascii_case("content-length") {
            if length.is_some() {
                return None;
            }
            length = Some(decimal(header.value)?);
        } else if HYPERS
            .iter()
            .any(|name| header.name.eq_ignore_ascii_case(name))
        {
            return None;
        }
    }
    Some(length.unwrap_or(0))
}

/// A `Content-Length` value: digits only, as hyper reads it, without overflow.
fn decimal(value: &[u8]) -> Option<usize> {
    if value.is_empty() || value.len() > 19 {
        return None;
    }
    value.iter().try_fold(0usize, |total, &digit| {
        digit
            .is_ascii_digit()
            .then(|| total * 10 + usize::from(digit - b'0'))
    })
}

/// A head parsed by the front, read by the same checks as hyper's requests.
struct Head<'h>(&'h [httparse::Header<'h>]);

impl Headers for Head<'_> {
    fn first(&self, name: &HeaderName) -> Option<&[u8]> {
        let name = name.as_str();
        let found = self
            .0
            .iter()
            .find(|header| header.name.eq_ignore_ascii_case(name));
        found.map(|header| header.value)
    }

    fn every<'a>(&'a self, name: &'a HeaderName) -> impl DoubleEndedIterator<Item = &'a [u8]> + 'a {
        self.0
            .iter()
            .filter(move |header| header.name.eq_ignore_ascii_case(name.as_str()))
            .map(|header| header.value)
    }
}

/// Length of an IMF-fixdate (`Fri, 04 Dec 2026 18:30:00 GMT`).
const DATE_BYTES: usize = 29;

thread_local! {
    /// This thread's `Date` value and the second it names: formatted once a second, as
    /// hyper does.
    static DATE: Cell<(u64, [u8; DATE_BYTES])> = const { Cell::new((0, [0; DATE_BYTES])) };
}

/// The `Date` header's value at `now`.
fn http_date(now: SystemTime) -> [u8; DATE_BYTES] {
    let second = now
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    DATE.with(|date| {
        let (cached, text) = date.get();
        if cached == second {
            return text;
        }
        let mut fresh = [b' '; DATE_BYTES];
        let formatted = httpdate::fmt_http_date(now);
        let length = formatted.len().min(DATE_BYTES);
        fresh[..length].copy_from_slice(&formatted.as_bytes()[..length]);
        date.set((second, fresh));
        fresh
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header<'b>(name: &'b str, value: &'b [u8]) -> httparse::Header<'b> {
        httparse::Header { name, value }
    }

    #[test]
    fn only_plain_lengths_frame_a_body_the_front_skips() {
        assert_eq!(plain_body_length(&[]), Some(0));
        assert_eq!(
            plain_body_length(&[header("Content-Length", b"14")]),
            Some(14)
        );
        let twice = [
            header("content-length", b"1"),
            header("content-length", b"1"),
        ];
        assert_eq!(plain_body_length(&twice), None);
        for value in [&b""[..], b"+1", b"1 ", b"0x1", b"99999999999999999999"] {
            assert_eq!(plain_body_length(&[header("content-length", value)]), None);
        }
        for name in ["Transfer-Encoding", "Connection", "Expect", "Upgrade"] {
            assert_eq!(plain_body_length(&[header(name, b"x")]), None, "{name}");
        }
    }

    #[test]
    fn the_date_is_an_imf_fixdate() {
        let date = http_date(crate::clock::Clock::system().now().into());
        let text = std::str::from_utf8(&date).expect("ASCII");
        assert!(httpdate::parse_http_date(text).is_ok(), "{text}");
    }
}
