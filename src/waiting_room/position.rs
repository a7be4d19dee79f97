//! Position tokens: a ticket's place in its line, signed, so that its holder can follow the
//! line on the public state alone.
//!
//! A buyer far back needs nothing personal from the origin until the line's
//! `admitted_through` comes near; the token tells the client where it stands, and the
//! signature keeps it honest wherever it is shown or checked: a client that edits its
//! position gets a token that no longer verifies. The token is
//! `base64url(payload) "." base64url(HMAC-SHA256(key, payload))`, the payload a small JSON
//! object binding the deal, the ticket, the position and whether that position is final (a
//! random-order line reorders the tickets taken before it opens, so a position read before
//! the shuffle is provisional). The key is derived from `pass_secret`, apart from the
//! passes' own.

use hmac::{Hmac, KeyInit};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

type HmacSha256 = Hmac<Sha256>;

/// Longest token accepted; anything longer is refused before decoding.
pub const POSITION_TOKEN_BYTES_MAX: usize = 512;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Payload {
    /// Deal id.
    d: String,
    /// Ticket id.
    t: String,
    /// 1-based position in the line.
    p: u64,
    /// Whether the position is final (false before a random-order line's shuffle).
    f: bool,
}

/// A verified position token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    pub position: u64,
    pub is_final: bool,
}

/// Why a position token was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PositionError {
    #[error("the position token is malformed or its signature does not match")]
    Forged,
    #[error("the position token is for another ticket or deal")]
    OtherTicket,
}

/// Signs and checks position tokens; cheap to clone.
#[derive(Clone)]
pub struct Positions {
    key: [u8; 32],
}

impl Positions {
    /// Tokens keyed by `pass_secret`, separated from the passes' HMAC key by a label.
    pub fn new(pass_secret: &str) -> Self {
        let mut digest = Sha256::new();
        digest.update(b"flashgate position token\0");
        digest.update(pass_secret.as_bytes());
        Self {
            key: digest.finalize().into(),
        }
    }

    fn mac(&self) -> HmacSha256 {
        HmacSha256::new_from_slice(&self.key).expect("HMAC takes keys of any length")
    }

    /// The token of `ticket` at `position` in the line of `deal`.
    pub fn sign(&self, deal: &str, ticket: &str, position: u64, is_final: bool) -> String {
        let payload = Payload {
            d: deal.to_owned(),
            t: ticket.to_owned(),
            p: position,
            f: is_final,
        };
        let json = serde_json::to_vec(&payload).expect("a payload of strings and numbers");
        super::pass::seal(self.mac(), &json)
    }

    /// The position `token` signs for `ticket` of `deal`.
    pub fn verify(
        &self,
        token: &[u8],
        deal: &str,
        ticket: &str,
    ) -> Result<Position, PositionError> {
        if token.len() > POSITION_TOKEN_BYTES_MAX {
            return Err(PositionError::Forged);
        }
        let text = std::str::from_utf8(token).map_err(|_| PositionError::Forged)?;
        let (body, signature) = text.split_once('.').ok_or(PositionError::Forged)?;
        let json = super::pass::unseal(self.mac(), body.as_bytes(), signature.as_bytes())
            .ok_or(PositionError::Forged)?;
        let payload: Payload = serde_json::from_slice(&json).map_err(|_| PositionError::Forged)?;
        if payload.d != deal || payload.t != ticket {
            return Err(PositionError::OtherTicket);
        }
        Ok(Position {
            position: payload.p,
            is_final: payload.f,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;

    #[test]
    fn a_signed_position_verifies_for_its_ticket_only() {
        let positions = Positions::new("a pass secret of some length");
        let token = positions.sign("deal-1", "ab12", 42, true);
        let verified = positions.verify(token.as_bytes(), "deal-1", "ab12");
        assert_eq!(
            verified,
            Ok(Position {
                position: 42,
                is_final: true
            })
        );
        let other = positions.verify(token.as_bytes(), "deal-1", "cd34");
        assert_eq!(other, Err(PositionError::OtherTicket));
        let other_key = Positions::new("another secret of some length");
        let forged = other_key.verify(token.as_bytes(), "deal-1", "ab12");
        assert_eq!(forged, Err(PositionError::Forged));
    }

    #[test]
    fn a_client_cannot_move_itself_forward() {
        let positions = Positions::new("a pass secret of some length");
        let token = positions.sign("deal-1", "ab12", 42, true);
        let (_, signature) = token.split_once('.').expect("two parts");
        let moved = Payload {
            d: "deal-1".into(),
            t: "ab12".into(),
            p: 1,
            f: true,
        };
        let moved = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&moved).expect("json"));
        let edited = format!("{moved}.{signature}");
        let refused = positions.verify(edited.as_bytes(), "deal-1", "ab12");
        assert_eq!(refused, Err(PositionError::Forged));
        let garbage = positions.verify(b"not a token", "deal-1", "ab12");
        assert_eq!(garbage, Err(PositionError::Forged));
    }
}
