//! Passes: what a buyer earns by reaching the front of a deal's line.
//!
//! The payload is a small JSON object binding the deal, the user, the expiry (unix seconds)
//! and the pass id (the ticket it was earned with). Two signatures exist, both verified in
//! memory with no Redis or PostgreSQL round trip:
//!
//! - Ed25519 (the default): a JWS compact serialization, `base64url(header) "."
//!   base64url(payload) "." base64url(signature)` with header `{"alg":"EdDSA","kid":...}`.
//!   The public keys are published (`GET /.well-known/flashgate-keys.json`, a JWK set), so a
//!   CDN worker or another service verifies passes without being able to mint them. Several
//!   keys verify at once, so a key is rotated in with overlap.
//! - HMAC-SHA256: `base64url(payload) "." base64url(HMAC(secret, payload))`, compared in
//!   constant time; only holders of the secret can verify.
//!
//! The pass id lets the order path free the pass's active slot and lets a revocation name it.

use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::settings::{WaitingRoomSettings, derived_seed};

type HmacSha256 = Hmac<Sha256>;

/// Longest pass accepted; anything longer is refused before decoding.
pub const PASS_BYTES_MAX: usize = 1024;

/// Longest key id in a header; ours are 11 characters.
const KID_BYTES_MAX: usize = 64;

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

/// The JWS header of an Ed25519 pass.
#[derive(Debug, Serialize, Deserialize)]
struct Header {
    alg: String,
    kid: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    typ: Option<String>,
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
    #[error("the pass was revoked: its session on the line has ended")]
    Revoked,
}

impl PassError {
    pub fn reason(self) -> &'static str {
        match self {
            PassError::Missing => "missing",
            PassError::Forged => "forged",
            PassError::Expired => "expired",
            PassError::OtherUser => "other_user",
            PassError::OtherDeal => "other_deal",
            PassError::Revoked => "revoked",
        }
    }
}

/// A pass that verified: its id, to free its slot once it placed an order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedPass {
    pub pass_id: String,
}

/// One Ed25519 key: its id (published with it) and both halves.
struct KeyPair {
    kid: String,
    signing: SigningKey,
    verifying: VerifyingKey,
}

/// The published id of a public key: its SHA-256, first 8 bytes, base64url.
pub fn key_id(verifying: &VerifyingKey) -> String {
    URL_SAFE_NO_PAD.encode(&Sha256::digest(verifying.as_bytes())[..8])
}

/// Mints and verifies passes.
#[derive(Clone)]
pub struct Passes {
    secret: Vec<u8>,
    /// Mint Ed25519 passes (else HMAC).
    ed25519: bool,
    keys: Arc<[KeyPair]>,
}

impl Passes {
    /// HMAC passes with `secret` and one Ed25519 key derived from it (tests and tools).
    pub fn new(secret: &str) -> Self {
        Self::with_seeds(secret, false, &[derived_seed(secret)])
    }

    /// Validated settings: the secret is not empty and the seeds parse.
    pub fn from_settings(settings: &WaitingRoomSettings) -> Self {
        assert!(
            !settings.pass_secret.is_empty(),
            "validated: the pass secret is not empty"
        );
        let seeds = settings
            .signing_seeds()
            .expect("validated: the signing keys parse");
        let ed25519 = settings.pass_format == "ed25519";
        Self::with_seeds(&settings.pass_secret, ed25519, &seeds)
    }

    /// Passes keyed by `secret` and signed by the first of `seeds`; `ed25519` mints Ed25519.
    fn with_seeds(secret: &str, ed25519: bool, seeds: &[[u8; 32]]) -> Self {
        assert!(!seeds.is_empty(), "at least one signing key");
        let keys: Vec<KeyPair> = seeds
            .iter()
            .map(|seed| {
                let signing = SigningKey::from_bytes(seed);
                let verifying = signing.verifying_key();
                KeyPair {
                    kid: key_id(&verifying),
                    signing,
                    verifying,
                }
            })
            .collect();
        Self {
            secret: secret.as_bytes().to_vec(),
            ed25519,
            keys: keys.into(),
        }
    }

    fn mac(&self) -> HmacSha256 {
        HmacSha256::new_from_slice(&self.secret).expect("HMAC takes keys of any length")
    }

    /// The published key set (RFC 7517 JWKs of RFC 8037 Ed25519 keys).
    pub fn key_set(&self) -> serde_json::Value {
        let keys: Vec<serde_json::Value> = self
            .keys
            .iter()
            .map(|k| {
                serde_json::json!({
                    "kty": "OKP", "crv": "Ed25519", "alg": "EdDSA", "use": "sig",
                    "kid": k.kid, "x": URL_SAFE_NO_PAD.encode(k.verifying.as_bytes()),
                })
            })
            .collect();
        serde_json::json!({ "keys": keys })
    }

    /// A pass for `user` on `deal`, valid until `expires_unix` (seconds), in the configured
    /// format.
    pub fn mint(&self, deal: &str, user: &str, expires_unix: i64, pass_id: &str) -> String {
        match self.ed25519 {
            true => self.mint_ed25519(deal, user, expires_unix, pass_id),
            false => self.mint_hmac(deal, user, expires_unix, pass_id),
        }
    }

    fn payload(deal: &str, user: &str, expires_unix: i64, pass_id: &str) -> Vec<u8> {
        let payload = Payload {
            d: deal.to_owned(),
            u: user.to_owned(),
            e: expires_unix,
            p: pass_id.to_owned(),
        };
        serde_json::to_vec(&payload).expect("a payload always serializes")
    }

    /// An HMAC-SHA256 pass, whatever the configured format.
    pub fn mint_hmac(&self, deal: &str, user: &str, expires_unix: i64, pass_id: &str) -> String {
        seal(
            self.mac(),
            &Self::payload(deal, user, expires_unix, pass_id),
        )
    }

    /// An Ed25519 pass signed with the first key, whatever the configured format.
    pub fn mint_ed25519(&self, deal: &str, user: &str, exp_unix: i64, pass_id: &str) -> String {
        let key = &self.keys[0];
        let header = Header {
            alg: "EdDSA".into(),
            kid: key.kid.clone(),
            typ: Some("flashgate-pass".into()),
        };
        let header = serde_json::to_vec(&header).expect("a header always serializes");
        let json = Self::payload(deal, user, exp_unix, pass_id);
        let signed = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header),
            URL_SAFE_NO_PAD.encode(&json)
        );
        let signature = key.signing.sign(signed.as_bytes());
        format!("{signed}.{}", URL_SAFE_NO_PAD.encode(signature.to_bytes()))
    }

    /// Checks the signature first (so nothing of an unsigned payload is believed beyond the
    /// key id that picks the key), then the deal, the user and the expiry against `now_unix`.
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
        let parts: Vec<&[u8]> = pass.split(|b| *b == b'.').collect();
        let payload = match parts[..] {
            [payload, signature] => self.verify_hmac(payload, signature)?,
            [header, payload, signature] => {
                self.verify_ed25519(pass, header, payload, signature)?
            }
            _ => return Err(PassError::Forged),
        };
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

    /// The payload bytes if the HMAC matches.
    fn verify_hmac(&self, payload: &[u8], signature: &[u8]) -> Result<Vec<u8>, PassError> {
        unseal(self.mac(), payload, signature).ok_or(PassError::Forged)
    }

    /// The payload bytes if the header names one of our keys and its signature matches.
    fn verify_ed25519(
        &self,
        pass: &[u8],
        header: &[u8],
        payload: &[u8],
        signature: &[u8],
    ) -> Result<Vec<u8>, PassError> {
        let parsed: Header =
            serde_json::from_slice(&decode(header)?).map_err(|_| PassError::Forged)?;
        if parsed.alg != "EdDSA" || parsed.kid.len() > KID_BYTES_MAX {
            return Err(PassError::Forged);
        }
        let key = self
            .keys
            .iter()
            .find(|k| k.kid == parsed.kid)
            .ok_or(PassError::Forged)?;
        let signature =
            Signature::from_slice(&decode(signature)?).map_err(|_| PassError::Forged)?;
        let signed = &pass[..header.len() + 1 + payload.len()];
        key.verifying
            .verify_strict(signed, &signature)
            .map_err(|_| PassError::Forged)?;
        decode(payload)
    }
}

fn decode(part: &[u8]) -> Result<Vec<u8>, PassError> {
    URL_SAFE_NO_PAD.decode(part).map_err(|_| PassError::Forged)
}

/// The payload of a sealed token's two parts (base64url `payload` and `signature`), when
/// `signature` is its HMAC under `mac`.
pub(super) fn unseal(mut mac: HmacSha256, payload: &[u8], signature: &[u8]) -> Option<Vec<u8>> {
    let payload = URL_SAFE_NO_PAD.decode(payload).ok()?;
    let signature = URL_SAFE_NO_PAD.decode(signature).ok()?;
    mac.update(&payload);
    mac.verify_slice(&signature).ok()?;
    Some(payload)
}

/// `json` and its HMAC under `mac`, each base64url without padding, joined by a dot: the
/// form of an HMAC pass and of a ticket's signed position.
pub(super) fn seal(mut mac: HmacSha256, json: &[u8]) -> String {
    mac.update(json);
    let signature = mac.finalize().into_bytes();
    format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(json),
        URL_SAFE_NO_PAD.encode(signature)
    )
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
        for junk in ["", "abc", "a.b.c", "a.b.c.d", "!!.??", &"x".repeat(2000)] {
            assert!(check(junk, "d1", "alice").is_err(), "{junk:?}");
        }
    }

    #[test]
    fn ed25519_passes_verify_with_any_listed_key_and_refuse_tampering() {
        let p = passes();
        let pass = p.mint_ed25519("d1", "alice", NOW + 60, "t1");
        assert_eq!(pass.split('.').count(), 3);
        assert!(p.verify(Some(pass.as_bytes()), "d1", "alice", NOW).is_ok());
        assert_eq!(
            p.verify(Some(pass.as_bytes()), "d1", "bob", NOW),
            Err(PassError::OtherUser)
        );
        let other = Passes::new("another-secret-entirely");
        assert_eq!(
            other.verify(Some(pass.as_bytes()), "d1", "alice", NOW),
            Err(PassError::Forged)
        );
        let mut bytes = pass.into_bytes();
        let last = bytes.len() - 2;
        bytes[last] = if bytes[last] == b'A' { b'B' } else { b'A' };
        assert_eq!(
            p.verify(Some(&bytes), "d1", "alice", NOW),
            Err(PassError::Forged)
        );
    }
}
