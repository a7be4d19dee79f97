//! Position tokens: a ticket's place in its line, signed, so that its holder can follow the
//! line on the public state alone, and prove to any instance, without a Redis read, which
//! ticket it holds and where.
//!
//! A buyer far back needs nothing personal from the origin until the line's
//! `admitted_through` comes near; the token tells the client where it stands, and the
//! signature keeps it honest wherever it is shown or checked: a client that edits its
//! position gets a token that no longer verifies. The gateway accepts the token back in the
//! `Flashgate-Position` header: a returning buyer re-joins with it instead of a new proof
//! of work, and a poll from far outside the check-in window is answered from it and the
//! line state in memory. The token is
//! `base64url(payload) "." base64url(HMAC-SHA256(key, payload))`, the payload a small JSON
//! object binding the deal, the holder (a digest of the user id, so a token shown
//! elsewhere names nobody), the ticket, the position and whether that position is final (a
//! random-order line reorders the tickets taken before it opens, so a position read before
//! the shuffle is provisional), and whether it is a place in the priority group's line,
//! which counts its places apart (absent for the general group). The key is derived from `pass_secret`, apart from the
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
    /// The holder: `holder(user)`.
    u: String,
    /// Ticket id.
    t: String,
    /// 1-based position in the line.
    p: u64,
    /// Whether the position is final (false before a random-order line's shuffle).
    f: bool,
    /// A place in the priority group's line.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    g: bool,
}

/// A verified position token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    /// The ticket the token was signed for.
    pub ticket: String,
    pub position: u64,
    pub is_final: bool,
    /// The place is in the priority group's line.
    pub priority: bool,
}

/// Why a position token was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PositionError {
    #[error("the position token is malformed or its signature does not match")]
    Forged,
    #[error("the position token is for another ticket, deal or user")]
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

    /// The token of `user`'s place in the line of `deal`.
    pub fn sign(&self, deal: &str, user: &str, place: &Position) -> String {
        let payload = Payload {
            d: deal.to_owned(),
            u: holder(user),
            t: place.ticket.clone(),
            p: place.position,
            f: place.is_final,
            g: place.priority,
        };
        let json = serde_json::to_vec(&payload).expect("a payload of strings and numbers");
        super::pass::seal(self.mac(), &json)
    }

    /// The ticket and position `token` signs for `user` in the line of `deal`; checked in
    /// memory, so a forged or borrowed token costs nothing downstream.
    pub fn verify(&self, token: &[u8], deal: &str, user: &str) -> Result<Position, PositionError> {
        if token.len() > POSITION_TOKEN_BYTES_MAX {
            return Err(PositionError::Forged);
        }
        let text = std::str::from_utf8(token).map_err(|_| PositionError::Forged)?;
        let (body, signature) = text.split_once('.').ok_or(PositionError::Forged)?;
        let json = super::pass::unseal(self.mac(), body.as_bytes(), signature.as_bytes())
            .ok_or(PositionError::Forged)?;
        let payload: Payload = serde_json::from_slice(&json).map_err(|_| PositionError::Forged)?;
        if payload.d != deal || payload.u != holder(user) {
            return Err(PositionError::OtherTicket);
        }
        Ok(Position {
            ticket: payload.t,
            position: payload.p,
            is_final: payload.f,
            priority: payload.g,
        })
    }
}

/// The holder as a token names it: 64 bits of SHA-256 of the user id, enough to tell users
/// apart within one line, without writing the id itself into a token.
fn holder(user: &str) -> String {
    let digest = Sha256::digest(user.as_bytes());
    hex::encode(&digest[..8])
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;

    fn place(position: u64, priority: bool) -> Position {
        Position {
            ticket: "ab12".into(),
            position,
            is_final: true,
            priority,
        }
    }

    #[test]
    fn a_signed_position_verifies_for_its_ticket_only() {
        let positions = Positions::new("a pass secret of some length");
        let token = positions.sign("deal-1", "alice", &place(42, false));
        let verified = positions.verify(token.as_bytes(), "deal-1", "alice");
        assert_eq!(verified, Ok(place(42, false)));
        let priority = positions.sign("deal-1", "alice", &place(3, true));
        let verified = positions.verify(priority.as_bytes(), "deal-1", "alice");
        assert_eq!(verified, Ok(place(3, true)));
        let other_user = positions.verify(token.as_bytes(), "deal-1", "bob");
        assert_eq!(other_user, Err(PositionError::OtherTicket));
        let other_deal = positions.verify(token.as_bytes(), "deal-2", "alice");
        assert_eq!(other_deal, Err(PositionError::OtherTicket));
        let other_key = Positions::new("another secret of some length");
        let forged = other_key.verify(token.as_bytes(), "deal-1", "alice");
        assert_eq!(forged, Err(PositionError::Forged));
    }

    #[test]
    fn a_client_cannot_move_itself_forward() {
        let positions = Positions::new("a pass secret of some length");
        let token = positions.sign("deal-1", "alice", &place(42, false));
        let (_, signature) = token.split_once('.').expect("two parts");
        let moved = Payload {
            d: "deal-1".into(),
            u: holder("alice"),
            t: "ab12".into(),
            p: 1,
            f: true,
            g: false,
        };
        let promoted = Payload {
            g: true,
            p: 42,
            ..moved.clone()
        };
        for edited in [moved, promoted] {
            let edited = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&edited).expect("json"));
            let edited = format!("{edited}.{signature}");
            let refused = positions.verify(edited.as_bytes(), "deal-1", "alice");
            assert_eq!(refused, Err(PositionError::Forged));
        }
        let garbage = positions.verify(b"not a token", "deal-1", "alice");
        assert_eq!(garbage, Err(PositionError::Forged));
    }
}
