//! W3C Trace Context: the `traceparent` a caller sends, parsed strictly, so a request
//! joins the caller's trace instead of starting one of its own.
//!
//! `traceparent` is `version "-" trace-id "-" parent-id "-" flags` in lowercase hex
//! (`00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01`). A header that does not
//! parse, or names the all-zero trace or span id, is ignored and the request starts a new
//! trace, as the recommendation says. `tracestate` is carried along unread.

/// The caller's place in a trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parent {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    /// The caller sampled this trace (flag bit 0).
    pub sampled: bool,
}

/// Version 00's length: 2 + 1 + 32 + 1 + 16 + 1 + 2.
const TRACEPARENT_BYTES: usize = 55;

impl Parent {
    /// The parent a `traceparent` value names, if it is valid.
    pub fn parse(value: &[u8]) -> Option<Parent> {
        let value = value.trim_ascii();
        // A later version may append fields after its own; version 00 has exactly four.
        let version = hex::<1>(value.get(..2)?)?[0];
        let well_sized = match version {
            0 => value.len() == TRACEPARENT_BYTES,
            0xff => false,
            _ => value.len() == TRACEPARENT_BYTES || value.get(TRACEPARENT_BYTES) == Some(&b'-'),
        };
        if !well_sized || [2, 35, 52].iter().any(|at| value.get(*at) != Some(&b'-')) {
            return None;
        }
        let trace_id = hex::<16>(&value[3..35])?;
        let span_id = hex::<8>(&value[36..52])?;
        let flags = hex::<1>(&value[53..55])?[0];
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(Parent {
            trace_id,
            span_id,
            sampled: flags & 1 == 1,
        })
    }
}

/// `N` bytes from `2N` lowercase hex digits.
fn hex<const N: usize>(text: &[u8]) -> Option<[u8; N]> {
    if text.len() != 2 * N {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0; N];
    for (i, pair) in text.chunks_exact(2).enumerate() {
        out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

/// Lowercase hex of `bytes`, as trace and span ids are written in logs.
pub fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        text.push(DIGITS[usize::from(byte >> 4)] as char);
        text.push(DIGITS[usize::from(byte & 15)] as char);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_valid_traceparent_parses_and_an_invalid_one_is_ignored() {
        let parent =
            Parent::parse(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        assert_eq!(to_hex(&parent.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(to_hex(&parent.span_id), "00f067aa0ba902b7");
        assert!(parent.sampled);
        let unsampled = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
        assert!(!Parent::parse(unsampled).unwrap().sampled);
        let later = b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra";
        assert!(Parent::parse(later).is_some());
        for bad in [
            &b""[..],
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            b"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
        ] {
            assert_eq!(Parent::parse(bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }
}
