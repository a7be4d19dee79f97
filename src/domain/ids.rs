//! Identifiers and quantities, each valid by construction.

use std::fmt;

/// Why a value from the network was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidInput(pub String);

/// A deal id: 1–64 characters of `[A-Za-z0-9._-]`, safe in URLs, metric labels and Redis keys.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DealId(String);

impl DealId {
    pub const BYTES_MAX: usize = 64;

    pub fn parse(raw: &str) -> Result<Self, InvalidInput> {
        let valid = !raw.is_empty()
            && raw.len() <= Self::BYTES_MAX
            && raw
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if valid {
            Ok(Self(raw.to_owned()))
        } else {
            Err(InvalidInput(format!(
                "deal id must be 1-{} characters of A-Z a-z 0-9 . _ -",
                Self::BYTES_MAX
            )))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for DealId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The authenticated user, taken from a verified token's `sub`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UserId(String);

impl UserId {
    pub fn parse(raw: &str, bytes_max: usize) -> Result<Self, InvalidInput> {
        if raw.is_empty() || raw.len() > bytes_max || raw.chars().any(char::is_control) {
            return Err(InvalidInput(format!(
                "user id must be 1-{bytes_max} bytes without control characters"
            )));
        }
        Ok(Self(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A client-chosen key that makes a retried request safe: visible ASCII, 1–255 bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    pub fn parse(raw: &[u8], bytes_max: usize) -> Result<Self, InvalidInput> {
        let valid = !raw.is_empty()
            && raw.len() <= bytes_max
            && raw.iter().all(|b| (0x20..0x7f).contains(b));
        match std::str::from_utf8(raw) {
            Ok(text) if valid => Ok(Self(text.to_owned())),
            _ => Err(InvalidInput(format!(
                "Idempotency-Key must be 1-{bytes_max} printable ASCII characters"
            ))),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Units in one order: at least 1, at most the configured `orders.quantity_max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Quantity(u32);

impl Quantity {
    /// The smallest order, valid under every `quantity_max`.
    pub const ONE: Quantity = Quantity(1);

    pub fn new(raw: i64, quantity_max: u32) -> Result<Self, InvalidInput> {
        match u32::try_from(raw) {
            Ok(units) if units >= 1 && units <= quantity_max => Ok(Self(units)),
            _ => Err(InvalidInput(format!(
                "quantity must be an integer from 1 to {quantity_max}"
            ))),
        }
    }

    pub fn get(self) -> u32 {
        self.0
    }

    pub fn as_i32(self) -> i32 {
        // Bounded by `quantity_max`, which validation keeps far below i32::MAX.
        i32::try_from(self.0).unwrap_or(i32::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deal_ids() {
        assert!(DealId::parse("concert-2026_a.b").is_ok());
        for bad in ["", "a b", "a/b", "ä", &"x".repeat(65)] {
            assert!(DealId::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn idempotency_keys() {
        assert!(IdempotencyKey::parse(b"k-1", 255).is_ok());
        assert!(IdempotencyKey::parse(&[b'k'; 255], 255).is_ok());
        assert!(IdempotencyKey::parse(&[b'k'; 256], 255).is_err());
        assert!(IdempotencyKey::parse(b"", 255).is_err());
        assert!(IdempotencyKey::parse(b"a\nb", 255).is_err());
    }

    #[test]
    fn quantities() {
        assert_eq!(Quantity::new(3, 100).unwrap().get(), 3);
        for bad in [0, -1, 101, i64::MAX, i64::MIN] {
            assert!(Quantity::new(bad, 100).is_err(), "{bad}");
        }
    }

    #[test]
    fn user_ids() {
        assert!(UserId::parse("alice", 128).is_ok());
        assert!(UserId::parse("", 128).is_err());
        assert!(UserId::parse(&"u".repeat(129), 128).is_err());
    }
}
