//! Webhook signatures in the `t=<unix seconds>,v1=<hex HMAC-SHA256("<t>.<body>")>` form.
//!
//! The signature covers the timestamp, so a captured request cannot be replayed after the
//! tolerance window; the comparison is constant-time, so the secret cannot be guessed
//! byte by byte.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use super::provider::WebhookError;

type HmacSha256 = Hmac<Sha256>;

/// The header value for `body` signed with `secret` at `t`.
pub fn sign(secret: &[u8], t: i64, body: &[u8]) -> String {
    format!(
        "t={t},v1={}",
        hex::encode(keyed(secret, t, body).finalize().into_bytes())
    )
}

/// The MAC state over `"<t>.<body>"`.
fn keyed(secret: &[u8], t: i64, body: &[u8]) -> HmacSha256 {
    let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(t.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

/// Accepts `header` if one of its `v1` signatures matches and `t` is within
/// `tolerance_seconds` of `now_unix`.
pub fn verify(
    secret: &[u8],
    header: Option<&[u8]>,
    body: &[u8],
    now_unix: i64,
    tolerance_seconds: i64,
) -> Result<(), WebhookError> {
    let header = header
        .and_then(|h| std::str::from_utf8(h).ok())
        .ok_or(WebhookError::BadSignature)?;
    let mut timestamp = None;
    let mut signatures = Vec::new();
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", value)) => timestamp = value.parse::<i64>().ok(),
            Some(("v1", value)) => signatures.extend(hex::decode(value).ok()),
            _ => {}
        }
    }
    let t = timestamp.ok_or(WebhookError::BadSignature)?;
    let matches = signatures
        .iter()
        .any(|candidate| keyed(secret, t, body).verify_slice(candidate).is_ok());
    if !matches {
        return Err(WebhookError::BadSignature);
    }
    if (now_unix - t).abs() > tolerance_seconds {
        return Err(WebhookError::Stale);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"whsec";

    #[test]
    fn round_trip() {
        let header = sign(SECRET, 1_000, b"{}");
        assert_eq!(
            verify(SECRET, Some(header.as_bytes()), b"{}", 1_010, 300),
            Ok(())
        );
    }

    #[test]
    fn refuses_tampering_wrong_secret_and_staleness() {
        let header = sign(SECRET, 1_000, b"{\"a\":1}");
        let h = Some(header.as_bytes());
        assert_eq!(
            verify(SECRET, h, b"{\"a\":2}", 1_000, 300),
            Err(WebhookError::BadSignature)
        );
        assert_eq!(
            verify(b"other", h, b"{\"a\":1}", 1_000, 300),
            Err(WebhookError::BadSignature)
        );
        assert_eq!(
            verify(SECRET, h, b"{\"a\":1}", 1_301, 300),
            Err(WebhookError::Stale)
        );
        assert_eq!(
            verify(SECRET, None, b"{}", 1_000, 300),
            Err(WebhookError::BadSignature)
        );
        assert_eq!(
            verify(SECRET, Some(b"t=1000"), b"{}", 1_000, 300),
            Err(WebhookError::BadSignature)
        );
        assert_eq!(
            verify(SECRET, Some(b"v1=zz,t=x"), b"{}", 1_000, 300),
            Err(WebhookError::BadSignature)
        );
    }

    #[test]
    fn a_later_timestamp_in_the_header_does_not_help_a_forger() {
        let genuine = sign(SECRET, 1_000, b"{}");
        let forged = genuine.replace("t=1000", "t=2000");
        assert_eq!(
            verify(SECRET, Some(forged.as_bytes()), b"{}", 2_000, 300),
            Err(WebhookError::BadSignature)
        );
    }
}
