//! Proof-of-work challenges: a cost per ticket that works for API and mobile clients.
//!
//! A captcha needs a browser and is solved in advance by farms; a hash puzzle costs every
//! client the same CPU time, and a bot taking ten thousand places pays ten thousand times.
//! A deal with `pow_bits > 0` asks each join for a solution:
//!
//! 1. `GET /v1/deals/{id}/queue/challenge` hands out `base64url(json) "." base64url(mac)`,
//!    where the JSON binds the deal, the user, the issue time and the expiry (ms), the
//!    difficulty in bits and 16 random bytes, and `mac` is HMAC-SHA256 under a key derived
//!    from `pass_secret`. No state is kept: any instance sharing the secret verifies it, and
//!    every instance enforces the expiry signed in (the `expires_at` the client was told),
//!    whatever its own `pow_challenge_ttl_seconds` says.
//! 2. The client finds a `nonce` (decimal) such that SHA-256(`challenge ":" nonce`) starts
//!    with at least `bits` zero bits: 2^bits hashes on average.
//! 3. `POST /v1/deals/{id}/queue` carries `Flashgate-Pow: challenge ":" nonce`. Checking it
//!    is one HMAC and one SHA-256 (microseconds), then the challenge's random id is recorded
//!    in Redis with `SET NX PX` for the challenge's lifetime: a second use is refused. That
//!    seen-set is the only shared state, it is short-lived (entries expire with the
//!    challenge), and joining needs Redis anyway.
//!
//! The cost is per place, not per request: a user who already holds a ticket for the deal
//! joins again (the same ticket) without a solution.
//!
//! The difficulty is the deal's `pow_bits`, plus one bit per doubling of the people waiting
//! from `pow_crowd_step` on, at most `pow_bits_max`; a challenge carries the difficulty it
//! was issued with and may not be easier than the deal's own `pow_bits`.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

type HmacSha256 = Hmac<Sha256>;

/// Longest `Flashgate-Pow` header accepted.
pub const SOLUTION_BYTES_MAX: usize = 1024;

/// How far in the future an issue time may lie (clock skew between instances).
const SKEW_MS: i64 = 5_000;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Claims {
    /// Deal id.
    d: String,
    /// User id.
    u: String,
    /// Issued at, unix ms.
    t: i64,
    /// Expires at, unix ms: set by the issuer from its TTL, enforced as signed.
    x: i64,
    /// Leading zero bits asked.
    b: u32,
    /// Random id, the key of the seen-set.
    r: String,
}

/// Why a solution was refused; the `outcome` label of the challenge counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ChallengeError {
    #[error(
        "this deal asks for a proof of work: GET /v1/deals/{{id}}/queue/challenge, solve it and send Flashgate-Pow"
    )]
    Missing,
    #[error("the challenge is malformed or was not issued by this gateway")]
    Forged,
    #[error("the challenge was issued to another user")]
    OtherUser,
    #[error("the challenge was issued for another deal")]
    OtherDeal,
    #[error("the challenge has expired: fetch a new one")]
    Expired,
    #[error("the solution does not meet the difficulty asked")]
    TooEasy,
    #[error("the challenge was already used: fetch a new one")]
    Replayed,
}

impl ChallengeError {
    pub fn outcome(self) -> &'static str {
        match self {
            ChallengeError::Missing => "missing",
            ChallengeError::Forged => "forged",
            ChallengeError::OtherUser => "other_user",
            ChallengeError::OtherDeal => "other_deal",
            ChallengeError::Expired => "expired",
            ChallengeError::TooEasy => "too_easy",
            ChallengeError::Replayed => "replayed",
        }
    }
}

/// A challenge as handed out.
#[derive(Debug, Clone, Serialize)]
pub struct Challenge {
    pub challenge: String,
    pub difficulty_bits: u32,
    /// Unix ms after which a solution is refused.
    pub expires_at_ms: i64,
}

/// A solution that checked out, before the replay check: its random id and lifetime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Solved {
    pub id: String,
    pub ttl_ms: i64,
}

/// Issues and checks challenges with a key derived from the pass secret.
#[derive(Clone)]
pub struct Challenges {
    key: [u8; 32],
    ttl_ms: i64,
}

impl Challenges {
    pub fn new(secret: &str, ttl_seconds: u64) -> Self {
        let mut digest = Sha256::new();
        digest.update(b"flashgate pow challenge key\0");
        digest.update(secret.as_bytes());
        Self {
            key: digest.finalize().into(),
            ttl_ms: i64::try_from(ttl_seconds * 1000).unwrap_or(i64::MAX),
        }
    }

    fn mac(&self, claims: &[u8]) -> Vec<u8> {
        let mut mac = HmacSha256::new_from_slice(&self.key).expect("HMAC takes keys of any length");
        mac.update(claims);
        mac.finalize().into_bytes().to_vec()
    }

    /// A fresh challenge for `user` on `deal` at `bits`.
    pub fn issue(&self, deal: &str, user: &str, bits: u32, now_ms: i64) -> Challenge {
        let expires_at_ms = now_ms.saturating_add(self.ttl_ms);
        let claims = Claims {
            d: deal.to_owned(),
            u: user.to_owned(),
            t: now_ms,
            x: expires_at_ms,
            b: bits,
            r: hex::encode(rand::random::<[u8; 16]>()),
        };
        let json = serde_json::to_vec(&claims).expect("claims always serialize");
        let challenge = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(&json),
            URL_SAFE_NO_PAD.encode(self.mac(&json))
        );
        Challenge {
            challenge,
            difficulty_bits: bits,
            expires_at_ms,
        }
    }

    /// Checks a `challenge ":" nonce` solution for `user` on `deal`, where the deal asks at
    /// least `floor_bits`. Pure: the caller records the id to refuse replays.
    pub fn check(
        &self,
        solution: Option<&[u8]>,
        deal: &str,
        user: &str,
        floor_bits: u32,
        now_ms: i64,
    ) -> Result<Solved, ChallengeError> {
        let solution = solution.map(<[u8]>::trim_ascii).filter(|s| !s.is_empty());
        let solution = solution.ok_or(ChallengeError::Missing)?;
        if solution.len() > SOLUTION_BYTES_MAX {
            return Err(ChallengeError::Forged);
        }
        let text = std::str::from_utf8(solution).map_err(|_| ChallengeError::Forged)?;
        let (challenge, nonce) = text.rsplit_once(':').ok_or(ChallengeError::Forged)?;
        let (claims, mac) = challenge.split_once('.').ok_or(ChallengeError::Forged)?;
        let claims = URL_SAFE_NO_PAD
            .decode(claims)
            .map_err(|_| ChallengeError::Forged)?;
        let mac = URL_SAFE_NO_PAD
            .decode(mac)
            .map_err(|_| ChallengeError::Forged)?;
        let mut expected = HmacSha256::new_from_slice(&self.key).expect("any key length");
        expected.update(&claims);
        expected
            .verify_slice(&mac)
            .map_err(|_| ChallengeError::Forged)?;
        let claims: Claims = serde_json::from_slice(&claims).map_err(|_| ChallengeError::Forged)?;
        if claims.d != deal {
            return Err(ChallengeError::OtherDeal);
        }
        if claims.u != user {
            return Err(ChallengeError::OtherUser);
        }
        // The expiry the issuer signed and published, not this instance's TTL: instances
        // configured differently still agree on when a challenge stops working.
        if now_ms > claims.x || claims.t - now_ms > SKEW_MS {
            return Err(ChallengeError::Expired);
        }
        if claims.b < floor_bits || !nonce.bytes().all(|b| b.is_ascii_digit()) || nonce.is_empty() {
            return Err(ChallengeError::TooEasy);
        }
        if leading_zero_bits(&solution_hash(challenge, nonce)) < claims.b {
            return Err(ChallengeError::TooEasy);
        }
        Ok(Solved {
            id: claims.r,
            ttl_ms: claims.x - now_ms + SKEW_MS,
        })
    }
}

/// SHA-256 of `challenge ":" nonce`, the hash a solution must make small.
pub fn solution_hash(challenge: &str, nonce: &str) -> [u8; 32] {
    let mut digest = Sha256::new();
    digest.update(challenge.as_bytes());
    digest.update(b":");
    digest.update(nonce.as_bytes());
    digest.finalize().into()
}

pub fn leading_zero_bits(hash: &[u8]) -> u32 {
    let mut bits = 0;
    for byte in hash {
        if *byte == 0 {
            bits += 8;
        } else {
            return bits + byte.leading_zeros();
        }
    }
    bits
}

/// The difficulty asked of a deal's next joiner: `base` bits, plus one per doubling of the
/// crowd from `crowd_step` on, capped at `max` (never below `base`).
pub fn difficulty(base: u32, waiting: u64, crowd_step: u64, max: u32) -> u32 {
    if base == 0 {
        return 0;
    }
    let ratio = waiting / crowd_step.max(1);
    let extra = if ratio == 0 { 0 } else { ratio.ilog2() + 1 };
    (base + extra).min(max.max(base))
}

/// Finds a nonce for `challenge` at `bits` by counting up: what a client does (tests and
/// the load tester have their own solvers; this one documents the rule).
pub fn solve(challenge: &str, bits: u32) -> u64 {
    (0u64..)
        .find(|n| leading_zero_bits(&solution_hash(challenge, &n.to_string())) >= bits)
        .expect("a nonce exists for any difficulty up to 256 bits")
}

/// Every outcome of a proof-of-work check exists from the start, at zero, so an alert on
/// `increase()` sees the first one.
pub fn export_zeroes() {
    let failures = [
        ChallengeError::Missing,
        ChallengeError::Forged,
        ChallengeError::OtherUser,
        ChallengeError::OtherDeal,
        ChallengeError::Expired,
        ChallengeError::TooEasy,
        ChallengeError::Replayed,
    ];
    let outcomes = failures.map(ChallengeError::outcome);
    for outcome in outcomes.into_iter().chain(["solved"]) {
        metrics::counter!(crate::telemetry::WAITING_ROOM_CHALLENGES, "outcome" => outcome)
            .increment(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000_000;

    #[test]
    fn a_solved_challenge_checks_and_every_misuse_is_refused() {
        let c = Challenges::new("a-pass-secret-of-some-length", 60);
        let issued = c.issue("d1", "alice", 8, NOW);
        let nonce = solve(&issued.challenge, 8);
        let good = format!("{}:{nonce}", issued.challenge);
        let check = |s: &str, deal: &str, user: &str, floor: u32, now: i64| {
            c.check(Some(s.as_bytes()), deal, user, floor, now)
        };
        assert!(check(&good, "d1", "alice", 8, NOW + 1000).is_ok());
        assert_eq!(
            check(&good, "d2", "alice", 8, NOW),
            Err(ChallengeError::OtherDeal)
        );
        assert_eq!(
            check(&good, "d1", "bob", 8, NOW),
            Err(ChallengeError::OtherUser)
        );
        assert_eq!(
            check(&good, "d1", "alice", 8, NOW + 61_000),
            Err(ChallengeError::Expired)
        );
        assert_eq!(
            check(&good, "d1", "alice", 9, NOW),
            Err(ChallengeError::TooEasy)
        );
        let other = Challenges::new("another-secret-entirely", 60);
        assert_eq!(
            other.check(Some(good.as_bytes()), "d1", "alice", 8, NOW),
            Err(ChallengeError::Forged)
        );
        assert_eq!(
            c.check(None, "d1", "alice", 8, NOW),
            Err(ChallengeError::Missing)
        );
        // A nonce that does not reach the difficulty.
        let bad = (0u64..)
            .find(|n| leading_zero_bits(&solution_hash(&issued.challenge, &n.to_string())) < 8)
            .unwrap();
        let weak = format!("{}:{bad}", issued.challenge);
        assert_eq!(
            check(&weak, "d1", "alice", 8, NOW),
            Err(ChallengeError::TooEasy)
        );
    }

    #[test]
    fn every_instance_enforces_the_expiry_the_challenge_published_whatever_its_own_ttl() {
        let secret = "a-pass-secret-of-some-length";
        let issuer = Challenges::new(secret, 60);
        let issued = issuer.issue("d1", "alice", 4, NOW);
        assert_eq!(issued.expires_at_ms, NOW + 60_000);
        let solution = format!("{}:{}", issued.challenge, solve(&issued.challenge, 4));
        for ttl_seconds in [1, 60, 3600] {
            let verifier = Challenges::new(secret, ttl_seconds);
            let at = |now: i64| verifier.check(Some(solution.as_bytes()), "d1", "alice", 4, now);
            let solved = at(issued.expires_at_ms).expect("good until its published expiry");
            assert_eq!(
                solved.ttl_ms, SKEW_MS,
                "remembered until it expires (and skew)"
            );
            assert_eq!(
                at(issued.expires_at_ms + 1),
                Err(ChallengeError::Expired),
                "a verifier with a {ttl_seconds} s TTL accepted it past its expiry"
            );
        }
    }

    #[test]
    fn difficulty_grows_one_bit_per_doubling_of_the_crowd() {
        assert_eq!(difficulty(0, 1_000_000, 1000, 28), 0);
        assert_eq!(difficulty(12, 999, 1000, 28), 12);
        assert_eq!(difficulty(12, 1000, 1000, 28), 13);
        assert_eq!(difficulty(12, 2000, 1000, 28), 14);
        assert_eq!(difficulty(12, 4000, 1000, 28), 15);
        assert_eq!(difficulty(12, u64::MAX, 1000, 28), 28);
        assert_eq!(leading_zero_bits(&[0, 0x10, 0]), 11);
    }
}
