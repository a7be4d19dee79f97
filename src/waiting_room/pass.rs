//! Passes: what a buyer earns by reaching the front of a deal's line.
//!
//! A pass is `base64url(payload) "." base64url(HMAC-SHA256(secret, payload))`, where the
//! payload is a small JSON object binding the deal, the user, the expiry (unix seconds) and
//! the pass id (the ticket it was earned with). Any instance sharing the secret verifies it
//! in memory, with no Redis or PostgreSQL round trip; the signature is compared in constant
//! time (`verify_slice`). The pass id lets the order path free the pass's active slot.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Longest pass accepted; anything longer is refused before decoding.
pub const PASS_BYTES_MAX: usize = 1024;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Payload {
    /// Deal id.
    d: String,
    /// User id.
    u: String,
    /// Expiry, unix seconds.
    e: i64,
    /// Pass id: the ticket that earned it.
    p: String,
}

/// Why a pass was refused; the label of `flashgate_waiting_room_pass_rejections_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PassError {
    #[error("a Flashgate-Pass header is required: join the waiting room first")]
    Missing,
    #[error("the pass is malformed or its signature does not match")]
    Forged,
    #[error("the pass has expired: join the waiting room again")]
    Expired,
    #[error("the pass was issued to another user")]
    OtherUser,
    #[error("the pass was issued for another deal")]
    OtherDeal,
}

impl PassError {
    pub fn reason(self) -> &'static str {
        match self {
            PassError::Missing => "missing",
            PassError::Forged => "forged",
            PassError::Expired => "expired",
            PassError::OtherUser => "other_user",
            PassError::OtherDeal => "other_deal",
        }
    }
}

/// A pass that verified: its id, to free its slot once it placed an order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedPass {
    pub pass_id: String,
}

/// Mints and verifies passes with one secret.
#[derive(Clone)]
pub struct Passes {
    secret: Vec<u8>,
}

impl Passes {
    pub fn new(secret: &str) -> Self {
        assert!(
            !secret.is_empty(),
            "validated: the pass secret is not empty"
        );
        Self {
            secret: secret.as_bytes().to_vec(),
        }
    }

    fn mac(&self) -> HmacSha256 {
        HmacSha256::new_from_slice(&self.secret).expect("HMAC takes keys of any length")
    }

    /// A pass for `user` on `deal`, valid until `expires_unix` (seconds).
    pub fn mint(&self, deal: &str, user: &str, expires_unix: i64, pass_id: &str) -> String {
        let payload = Payload {
            d: deal.to_owned(),
            u: user.to_owned(),
            e: expires_unix,
            p: pass_id.to_owned(),
        };
        let json = serde_json::to_vec(&payload).expect("a payload always serializes");
        let mut mac = self.mac();
        mac.update(&json);
        let signature = mac.finalize().into_bytes();
        format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(&json),
            URL_SAFE_NO_PAD.encode(signature)
        )
    }

    /// Checks the signature first (so nothing of an unsigned payload is believed), then the
    /// deal, the user and the expiry against `now_unix`.
    pub fn verify(
        &self,
        pass: Option<&[u8]>,
        deal: &str,
        user: &str,
        now_unix: i64,
    ) -> Result<VerifiedPass, PassError> {
        let pass = pass.map(<[u8]>::trim_ascii).filter(|p| !p.is_empty());
        let pass = pass.ok_or(PassError::Missing)?;
        if pass.len() > PASS_BYTES_MAX {
            return Err(PassError::Forged);
        }
        let mut parts = pass.split(|b| *b == b'.');
        let (Some(payload), Some(signature), None) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(PassError::Forged);
        };
        let payload = URL_SAFE_NO_PAD
            .decode(payload)
            .map_err(|_| PassError::Forged)?;
        let signature = URL_SAFE_NO_PAD
            .decode(signature)
            .map_err(|_| PassError::Forged)?;
        let mut mac = self.mac();
        mac.update(&payload);
        mac.verify_slice(&signature)
            .map_err(|_| PassError::Forged)?;
        let payload: Payload = serde_json::from_slice(&payload).map_err(|_| PassError::Forged)?;
        if payload.d != deal {
            return Err(PassError::OtherDeal);
        }
        if payload.u != user {
            return Err(PassError::OtherUser);
        }
        if payload.e <= now_unix {
            return Err(PassError::Expired);
        }
        Ok(VerifiedPass { pass_id: payload.p })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000;

    fn passes() -> Passes {
        Passes::new("a-pass-secret-of-some-length")
    }

    #[test]
    fn a_fresh_pass_verifies() {
        let pass = passes().mint("d1", "alice", NOW + 60, "t1");
        let verified = passes().verify(Some(pass.as_bytes()), "d1", "alice", NOW);
        assert_eq!(
            verified,
            Ok(VerifiedPass {
                pass_id: "t1".into()
            })
        );
    }

    #[test]
    fn refuses_missing_forged_expired_and_misbound_passes() {
        let p = passes();
        let check =
            |pass: &str, deal: &str, user: &str| p.verify(Some(pass.as_bytes()), deal, user, NOW);
        assert_eq!(p.verify(None, "d1", "alice", NOW), Err(PassError::Missing));
        assert_eq!(
            p.verify(Some(b"  "), "d1", "alice", NOW),
            Err(PassError::Missing)
        );
        let good = p.mint("d1", "alice", NOW + 60, "t1");
        assert_eq!(check(&good, "d2", "alice"), Err(PassError::OtherDeal));
        assert_eq!(check(&good, "d1", "bob"), Err(PassError::OtherUser));
        let expired = p.mint("d1", "alice", NOW, "t1");
        assert_eq!(check(&expired, "d1", "alice"), Err(PassError::Expired));
        let other_key = Passes::new("another-secret-entirely").mint("d1", "alice", NOW + 60, "t");
        assert_eq!(check(&other_key, "d1", "alice"), Err(PassError::Forged));
        // A payload changed after signing (bob's name in alice's pass).
        let (_, signature) = good.split_once('.').unwrap();
        let swapped = format!(
            "{}.{signature}",
            URL_SAFE_NO_PAD.encode(br#"{"d":"d1","u":"bob","e":1900000000,"p":"t1"}"#)
        );
        assert_eq!(check(&swapped, "d1", "bob"), Err(PassError::Forged));
        for junk in ["", "abc", "a.b.c", "!!.??", &"x".repeat(2000)] {
            assert!(check(junk, "d1", "alice").is_err(), "{junk:?}");
        }
    }
}
