//! User tokens: HS256 JWTs whose `sub` is the user id, whose `exp` and `nbf` are enforced,
//! and whose `iss` and `aud` must name this deployment: a service that shares the secret
//! but signs tokens for another purpose (another issuer or audience) cannot make users.
//!
//! Verification is an HMAC over a few hundred bytes, with no Redis or PostgreSQL round
//! trip, so it can run before anything expensive.

use std::borrow::Cow;
use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

use super::oidc::{ClaimSet, Identity, OidcVerifier};
pub use super::token_error::TokenError;
use crate::clock::Clock;
use crate::domain::UserId;

/// The `iss` and `aud` that `config/default.toml` requires (checked by a unit test), used
/// by [`mint_token`].
pub const DEFAULT_ISSUER: &str = "flashgate";
pub const DEFAULT_AUDIENCE: &str = "flashgate";

#[derive(Debug, Serialize, Deserialize)]
struct Claims {
    sub: String,
    exp: i64,
    iss: String,
    aud: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    iat: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    nbf: Option<i64>,
    /// The token's other claims, which a waiting room's invitation may read.
    #[serde(flatten)]
    other: serde_json::Map<String, serde_json::Value>,
}

/// Who signs user tokens and for whom; both must match for a token to be accepted.
#[derive(Debug, Clone, Copy)]
pub struct Audience<'a> {
    pub issuer: &'a str,
    pub audience: &'a str,
}

impl<'a> Audience<'a> {
    /// The issuer and audience the settings ask user tokens to name.
    pub fn of(settings: &'a super::AuthSettings) -> Self {
        Self {
            issuer: &settings.jwt_issuer,
            audience: &settings.jwt_audience,
        }
    }
}

impl Audience<'static> {
    /// The issuer and audience of the default configuration.
    pub const DEFAULT: Self = Self {
        issuer: DEFAULT_ISSUER,
        audience: DEFAULT_AUDIENCE,
    };
}

pub struct TokenVerifier {
    key: DecodingKey,
    validation: Validation,
    user_id_bytes_max: usize,
    /// `exp` and `nbf` are checked on the application's clock, with this much leeway.
    leeway_seconds: i64,
    clock: Clock,
}

impl TokenVerifier {
    pub fn new(
        secret: &str,
        expected: Audience<'_>,
        leeway_seconds: u64,
        user_id_bytes_max: usize,
        clock: Clock,
    ) -> Self {
        let mut validation = Validation::new(Algorithm::HS256);
        // The times are checked against `clock` after the signature, not the library's.
        validation.validate_exp = false;
        validation.validate_nbf = false;
        validation.set_issuer(&[expected.issuer]);
        validation.set_audience(&[expected.audience]);
        validation.set_required_spec_claims(&["exp", "sub", "iss", "aud"]);
        Self {
            key: DecodingKey::from_secret(secret.as_bytes())
                .expect("validated: secret is not empty"),
            validation,
            user_id_bytes_max,
            leeway_seconds: i64::try_from(leeway_seconds).unwrap_or(i64::MAX),
            clock,
        }
    }

    /// Verifies the value of an `Authorization` header.
    pub fn verify(&self, authorization: Option<&[u8]>) -> Result<UserId, TokenError> {
        self.verify_token(bearer_token(authorization)?)
    }

    /// Verifies a bearer token.
    pub fn verify_token(&self, token: &[u8]) -> Result<UserId, TokenError> {
        self.verify_claims(token).map(|(user, _)| user)
    }

    /// Verifies a bearer token; its user and its claims besides the registered ones.
    pub fn verify_claims(&self, token: &[u8]) -> Result<(UserId, ClaimSet), TokenError> {
        let claims = jsonwebtoken::decode::<Claims>(token, &self.key, &self.validation)
            .map_err(|_| TokenError::Invalid)?
            .claims;
        let now = self.clock.now().timestamp();
        if claims.exp < now.saturating_sub(self.leeway_seconds) {
            return Err(TokenError::Expired);
        }
        if claims
            .nbf
            .is_some_and(|nbf| nbf > now.saturating_add(self.leeway_seconds))
        {
            return Err(TokenError::Invalid);
        }
        let user =
            UserId::parse(&claims.sub, self.user_id_bytes_max).map_err(|_| TokenError::Invalid)?;
        Ok((user, ClaimSet::new(claims.other)))
    }
}

/// Both kinds of user token: HS256 with the shared secret, and, when `[auth.oidc]` names
/// a provider, the provider's tokens. A token signed HS256 is checked only against the
/// secret, any other only against the provider's keys, so neither can pass for the other.
pub struct Tokens {
    shared: TokenVerifier,
    provider: Option<Arc<OidcVerifier>>,
}

impl Tokens {
    pub fn new(shared: TokenVerifier, provider: Option<Arc<OidcVerifier>>) -> Self {
        Self { shared, provider }
    }

    /// The provider's verifier, when one is configured.
    pub fn provider(&self) -> Option<&Arc<OidcVerifier>> {
        self.provider.as_ref()
    }

    /// Verifies the value of an `Authorization` header, waiting for the provider's keys
    /// only when the token names a key not held yet.
    pub async fn verify(&self, authorization: Option<&[u8]>) -> Result<Identity, TokenError> {
        let token = bearer_token(authorization)?;
        match self.provider_header(token)? {
            Some((provider, header)) => provider.verify(token, &header).await,
            None => self.shared_identity(token),
        }
    }

    /// Verifies with what is in memory only (for checks made before the body is read).
    pub fn verify_held(&self, authorization: Option<&[u8]>) -> Result<Identity, TokenError> {
        let token = bearer_token(authorization)?;
        match self.provider_header(token)? {
            Some((provider, header)) => provider.verify_held(token, &header),
            None => self.shared_identity(token),
        }
    }

    /// The provider and the token's header, when the provider is the one to check it; a
    /// token over `auth.oidc.token_bytes_max` is refused before its header is decoded.
    fn provider_header(&self, token: &[u8]) -> Result<Option<(&OidcVerifier, Header)>, TokenError> {
        let Some(provider) = self.provider.as_deref() else {
            return Ok(None);
        };
        if token.len() > provider.token_bytes_max() {
            return Err(TokenError::Invalid);
        }
        Ok(match jsonwebtoken::decode_header(token) {
            Ok(header) if header.alg != Algorithm::HS256 => Some((provider, header)),
            _ => None,
        })
    }

    fn shared_identity(&self, token: &[u8]) -> Result<Identity, TokenError> {
        self.shared
            .verify_claims(token)
            .map(|(user, claims)| Identity {
                user,
                admin: false,
                claims,
            })
    }
}

/// Whom a bearer token names, NOT verified, handed to `read`: good only for deciding to
/// refuse someone who would be refused whoever they are, never for letting anyone in. It
/// spares a refusal the signature check and the second reading of the claims that
/// `verify` makes, and a token of usual size is decoded on the stack.
pub fn with_claimed_subject<R>(
    authorization: Option<&[u8]>,
    read: impl FnOnce(&str) -> R,
) -> Option<R> {
    #[derive(Deserialize)]
    struct Subject<'a> {
        #[serde(borrow)]
        sub: Cow<'a, str>,
    }
    let token = bearer(authorization)?;
    let mut parts = token.split(|&byte| byte == b'.');
    let (_header, payload) = (parts.next()?, parts.next()?);
    let mut on_stack = [0; CLAIMS_ON_STACK_BYTES];
    let on_heap;
    let claims = match URL_SAFE_NO_PAD.decode_slice(payload, &mut on_stack) {
        Ok(len) => &on_stack[..len],
        Err(base64::DecodeSliceError::OutputSliceTooSmall) => {
            on_heap = URL_SAFE_NO_PAD.decode(payload).ok()?;
            &on_heap[..]
        }
        Err(base64::DecodeSliceError::DecodeError(_)) => return None,
    };
    let subject: Subject<'_> = serde_json::from_slice(claims).ok()?;
    Some(read(&subject.sub))
}

/// Decoded claims up to this size are read without an allocation; larger ones still are.
const CLAIMS_ON_STACK_BYTES: usize = 512;

/// The token of an `Authorization: Bearer <token>` header.
pub fn bearer(authorization: Option<&[u8]>) -> Option<&[u8]> {
    let value = authorization?;
    let scheme_len = b"Bearer ".len();
    if value.len() <= scheme_len || !value[..scheme_len].eq_ignore_ascii_case(b"Bearer ") {
        return None;
    }
    Some(value[scheme_len..].trim_ascii())
}

/// The token of an `Authorization` header, or why there is none: no header, or one whose
/// scheme is not `Bearer`, which a client can only fix by being told so.
pub fn bearer_token(authorization: Option<&[u8]>) -> Result<&[u8], TokenError> {
    let value = authorization.ok_or(TokenError::Missing)?;
    bearer(Some(value)).ok_or_else(|| {
        let scheme = value.split(|b| *b == b' ').next().unwrap_or_default();
        if scheme.eq_ignore_ascii_case(b"Bearer") {
            TokenError::Missing
        } else {
            TokenError::WrongScheme
        }
    })
}

/// Mints a token for `user_id` valid for `ttl_seconds` (negative: already expired), for
/// the default issuer and audience.
pub fn mint_token(secret: &str, user_id: &str, ttl_seconds: i64) -> String {
    mint_token_for(secret, Audience::DEFAULT, user_id, ttl_seconds)
}

/// Mints a token for `user_id` as `expected` issuer and audience.
pub fn mint_token_for(
    secret: &str,
    expected: Audience<'_>,
    user_id: &str,
    ttl_seconds: i64,
) -> String {
    issue(
        secret,
        expected,
        user_id,
        ttl_seconds,
        Clock::system().now(),
    )
}

/// As [`mint_token`], issued at `at`: for a gateway running on a clock of its own (a test's
/// manual clock), which a token issued on the system's would not suit.
pub fn mint_token_at(secret: &str, user_id: &str, ttl_seconds: i64, at: DateTime<Utc>) -> String {
    issue(secret, Audience::DEFAULT, user_id, ttl_seconds, at)
}

/// Mints a token for `user_id` valid for an hour that carries `other` claims besides the
/// registered ones (a waiting room's invitation reads them).
pub fn mint_token_with_claims(
    secret: &str,
    user_id: &str,
    other: serde_json::Map<String, serde_json::Value>,
) -> String {
    let now = Clock::system().now().timestamp();
    sign(
        secret,
        &Claims {
            sub: user_id.to_owned(),
            exp: now + 3600,
            iss: DEFAULT_ISSUER.to_owned(),
            aud: DEFAULT_AUDIENCE.to_owned(),
            iat: Some(now),
            nbf: Some(now),
            other,
        },
    )
}

fn issue(
    secret: &str,
    expected: Audience<'_>,
    user_id: &str,
    ttl_seconds: i64,
    at: DateTime<Utc>,
) -> String {
    let now = at.timestamp();
    sign(
        secret,
        &Claims {
            sub: user_id.to_owned(),
            exp: now + ttl_seconds,
            iss: expected.issuer.to_owned(),
            aud: expected.audience.to_owned(),
            iat: Some(now),
            nbf: Some(now),
            other: serde_json::Map::new(),
        },
    )
}

fn sign(secret: &str, claims: &Claims) -> String {
    let key = EncodingKey::from_secret(secret.as_bytes()).expect("a non-empty secret");
    jsonwebtoken::encode(&Header::new(Algorithm::HS256), claims, &key)
        .expect("HS256 signing cannot fail")
}

/// Compares two secrets in time that depends on neither their contents nor their
/// lengths: both are hashed to 32 bytes first, and the digests compared with `subtle`.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    use sha2::{Digest, Sha256};
    use subtle::ConstantTimeEq;
    Sha256::digest(a).ct_eq(&Sha256::digest(b)).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "test-secret";

    fn verifier() -> TokenVerifier {
        TokenVerifier::new(SECRET, Audience::DEFAULT, 0, 128, Clock::system())
    }

    fn claims(iss: &str, aud: &str, nbf_in_seconds: i64) -> Claims {
        let now = Clock::system().now().timestamp();
        Claims {
            sub: "alice".into(),
            exp: now + 600,
            iss: iss.into(),
            aud: aud.into(),
            iat: None,
            nbf: Some(now + nbf_in_seconds),
            other: serde_json::Map::new(),
        }
    }

    #[test]
    fn the_other_claims_are_read_with_the_user() {
        let mut with_tier = claims(DEFAULT_ISSUER, DEFAULT_AUDIENCE, -1);
        with_tier.other.insert("tier".into(), "gold".into());
        let verifier = TokenVerifier::new(SECRET, Audience::DEFAULT, 0, 64, Clock::system());
        let (user, other) = verifier
            .verify_claims(sign(SECRET, &with_tier).as_bytes())
            .expect("a valid token");
        assert_eq!(user.as_str(), "alice");
        assert_eq!(other.get("tier"), Some(&serde_json::Value::from("gold")));
        assert!(!other.contains_key("sub"));
    }

    #[test]
    fn refuses_other_issuers_audiences_and_early_tokens() {
        let accepted = sign(SECRET, &claims(DEFAULT_ISSUER, DEFAULT_AUDIENCE, -1));
        assert!(verifier().verify(Some(&header(&accepted))).is_ok());
        for token in [
            sign(SECRET, &claims("billing", DEFAULT_AUDIENCE, 0)),
            sign(SECRET, &claims(DEFAULT_ISSUER, "billing", 0)),
            sign(SECRET, &claims(DEFAULT_ISSUER, DEFAULT_AUDIENCE, 120)),
        ] {
            assert_eq!(
                verifier().verify(Some(&header(&token))),
                Err(TokenError::Invalid)
            );
        }
        let custom = Audience {
            issuer: "shop",
            audience: "sale",
        };
        let token = mint_token_for(SECRET, custom, "bob", 60);
        assert!(verifier().verify(Some(&header(&token))).is_err());
        let verifier = TokenVerifier::new(SECRET, custom, 0, 128, Clock::system());
        assert_eq!(
            verifier.verify(Some(&header(&token))).unwrap().as_str(),
            "bob"
        );
    }

    fn header(token: &str) -> Vec<u8> {
        format!("Bearer {token}").into_bytes()
    }

    #[test]
    fn accepts_a_fresh_token() {
        let token = mint_token(SECRET, "alice", 60);
        assert_eq!(
            verifier().verify(Some(&header(&token))).unwrap().as_str(),
            "alice"
        );
    }

    #[test]
    fn refuses_expired_forged_and_missing_tokens() {
        let expired = mint_token(SECRET, "alice", -5);
        assert_eq!(
            verifier().verify(Some(&header(&expired))),
            Err(TokenError::Expired)
        );
        let forged = mint_token("other-secret", "alice", 60);
        assert_eq!(
            verifier().verify(Some(&header(&forged))),
            Err(TokenError::Invalid)
        );
        assert_eq!(
            verifier().verify(Some(b"Bearer garbage")),
            Err(TokenError::Invalid)
        );
        assert_eq!(verifier().verify(None), Err(TokenError::Missing));
        assert_eq!(
            verifier().verify(Some(b"Basic abc")),
            Err(TokenError::WrongScheme)
        );
        assert_eq!(
            verifier().verify(Some(b"abc")),
            Err(TokenError::WrongScheme)
        );
        assert_eq!(
            verifier().verify(Some(b"Bearer ")),
            Err(TokenError::Missing)
        );
    }

    #[test]
    fn a_token_expires_on_the_application_s_clock_after_the_leeway() {
        let clock = crate::clock::ManualClock::starting_now();
        let verifier = TokenVerifier::new(SECRET, Audience::DEFAULT, 5, 128, clock.clock());
        let token = mint_token(SECRET, "alice", 60);
        clock.advance(std::time::Duration::from_secs(64));
        assert!(verifier.verify(Some(&header(&token))).is_ok());
        clock.advance(std::time::Duration::from_secs(3));
        assert_eq!(
            verifier.verify(Some(&header(&token))),
            Err(TokenError::Expired)
        );
    }

    #[test]
    fn constant_time_compare() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
        assert!(!constant_time_eq(b"", b"a"));
        assert!(constant_time_eq(b"", b""));
    }

    #[test]
    fn the_claimed_subject_is_read_whether_or_not_the_token_is_valid() {
        let claimed = |value: &[u8]| with_claimed_subject(Some(value), str::to_owned);
        let valid = mint_token(SECRET, "alice", 600);
        let forged = mint_token("another-secret", "mallory", 600);
        assert_eq!(claimed(&header(&valid)).as_deref(), Some("alice"));
        assert_eq!(claimed(&header(&forged)).as_deref(), Some("mallory"));
        assert!(verifier().verify(Some(&header(&forged))).is_err());
        let long = "l".repeat(2 * CLAIMS_ON_STACK_BYTES);
        let large = mint_token(SECRET, &long, 600);
        assert_eq!(claimed(&header(&large)), Some(long));
        for garbage in ["Bearer x", "Bearer a.%%%.c", "Basic abc", ""] {
            assert_eq!(claimed(garbage.as_bytes()), None);
        }
        assert_eq!(with_claimed_subject(None, str::to_owned), None);
    }
}
