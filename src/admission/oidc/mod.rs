//! User and operator tokens from an OpenID Connect provider: verified against the keys of
//! the provider's JWKS, held in memory and refreshed in the background, so a request
//! never waits on the provider unless its token names a key flashgate has not seen (and
//! then at most one fetch per `refetch_min_interval_ms` is made, whatever the flood).
//!
//! A key is chosen by the token's `kid` and verifies with its own algorithm only, so
//! `alg: none`, an HMAC made with a public key and a `kid` lent to another algorithm are
//! refused. A token is read once (`jws`), and verified tokens are remembered until their
//! `exp` (`cache`).

mod cache;
mod fetch;
mod jws;
mod keys;
mod settings;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use serde_json::{Map, Value};
use std::time::Instant;
use tokio_util::sync::CancellationToken;

use super::token_error::TokenError;
use crate::clock::{Clock, elapsed_since, monotonic};
use crate::domain::UserId;
use crate::telemetry;

pub use crate::domain::ClaimSet;
pub use cache::Identity;
pub use jws::Compact;
pub use settings::OidcSettings;

use cache::TokenCache;
use fetch::{Fetched, Fetcher};
use keys::KeySet;

/// A failed fetch is logged at most once per this interval; the metric counts every one.
const FAILURE_LOG_INTERVAL: Duration = Duration::from_secs(60);

pub struct OidcVerifier {
    settings: OidcSettings,
    keys: ArcSwap<KeySet>,
    /// False until a JWKS has been read (only when started with `start_without_keys`).
    loaded: AtomicBool,
    fetcher: Fetcher,
    /// When the last fetch on behalf of an unknown `kid` began; the lock makes it single-flight.
    refetched_at: tokio::sync::Mutex<Option<Instant>>,
    /// When a failed fetch was last logged.
    failure_logged_at: std::sync::Mutex<Option<Instant>>,
    cache: TokenCache,
    user_id_bytes_max: usize,
    /// `exp` and `nbf` are checked on the application's clock, with this much leeway.
    leeway_seconds: i64,
    clock: Clock,
}

impl OidcVerifier {
    /// Reads the provider's keys. Without them start-up fails naming the setting, unless
    /// `start_without_keys` lets the gateway start and answer 503 until they arrive.
    pub async fn start(
        settings: &OidcSettings,
        leeway_seconds: u64,
        user_id_bytes_max: usize,
        clock: Clock,
    ) -> Result<Arc<Self>, String> {
        let fetcher = Fetcher::new(settings)?;
        let first = fetcher.fetch().await;
        let verifier = Arc::new(Self {
            settings: settings.clone(),
            keys: ArcSwap::from_pointee(KeySet::default()),
            loaded: AtomicBool::new(false),
            refetched_at: tokio::sync::Mutex::new(None),
            failure_logged_at: std::sync::Mutex::new(None),
            cache: TokenCache::new(settings.cache_entries_max),
            user_id_bytes_max,
            leeway_seconds: i64::try_from(leeway_seconds).unwrap_or(i64::MAX),
            clock,
            fetcher,
        });
        match first {
            Ok(fetched) => {
                verifier.install(fetched.keys);
            }
            Err(why) if settings.start_without_keys => {
                verifier.failed(&why);
            }
            Err(why) => {
                return Err(format!(
                    "{}: cannot read the provider's keys ({why}); set auth.oidc.start_without_keys to start without them",
                    verifier.fetcher.setting()
                ));
            }
        }
        Ok(verifier)
    }

    /// What an edge needs to check this provider's tokens itself, published in the pass
    /// key document (`provider`): where its keys are and what a token must say.
    pub fn published(&self) -> Value {
        serde_json::json!({
            "issuer": self.settings.issuer,
            "jwks_url": self.settings.jwks_url,
            "audience": self.settings.audience,
            "user_claim": self.settings.user_claim,
            "user_id_bytes_max": self.user_id_bytes_max,
            "token_bytes_max": self.settings.token_bytes_max,
        })
    }

    /// Largest token worth decoding (`auth.oidc.token_bytes_max`).
    pub fn token_bytes_max(&self) -> usize {
        self.settings.token_bytes_max
    }

    /// Seconds a client is told to wait while no keys are held.
    pub fn retry_after_seconds(&self) -> u64 {
        self.settings.refetch_min_interval_ms.div_ceil(1000).max(1)
    }

    /// Verifies a provider token with the keys held, fetching the JWKS again (at most once
    /// per `refetch_min_interval_ms`) when its `kid` is unknown.
    pub async fn verify(&self, token: &[u8], jws: &Compact<'_>) -> Result<Identity, TokenError> {
        let digest = cache::digest(token);
        let now = self.clock.now().timestamp();
        if let Some(identity) = self.cache.get(&digest, now) {
            return Ok(identity);
        }
        let kid = jws.kid.as_deref().ok_or(TokenError::Invalid)?;
        let mut keys = self.keys.load_full();
        if keys.get(kid).is_none() {
            keys = self.refetch_for(kid).await;
        }
        let Some(key) = keys.get(kid) else {
            return Err(self.no_key());
        };
        let (identity, expires_at) = self.check(jws, key, now)?;
        self.cache.insert(digest, identity.clone(), expires_at, now);
        Ok(identity)
    }

    /// Verifies with the keys held only, never waiting on the provider: for checks made
    /// before a request's body is read.
    pub fn verify_held(&self, token: &[u8], jws: &Compact<'_>) -> Result<Identity, TokenError> {
        let digest = cache::digest(token);
        let now = self.clock.now().timestamp();
        if let Some(identity) = self.cache.get(&digest, now) {
            return Ok(identity);
        }
        let kid = jws.kid.as_deref().ok_or(TokenError::Invalid)?;
        let keys = self.keys.load();
        let key = keys.get(kid).ok_or_else(|| self.no_key())?;
        self.check(jws, key, now).map(|(identity, _)| identity)
    }

    /// Unknown key: refused, or 503 while no keys have ever been read.
    fn no_key(&self) -> TokenError {
        if self.loaded.load(Ordering::Acquire) {
            TokenError::Invalid
        } else {
            TokenError::KeysUnavailable {
                retry_after_seconds: self.retry_after_seconds(),
            }
        }
    }

    /// The signature with the key's own algorithm, then the claims: `aud`, `iss` (when
    /// an issuer is set), `exp` and `nbf` against `now` (Unix seconds on the application's
    /// clock), and the user.
    fn check(
        &self,
        jws: &Compact<'_>,
        key: &keys::Key,
        now: i64,
    ) -> Result<(Identity, i64), TokenError> {
        if jws.algorithm != key.algorithm || !jws.signed_by(&key.verifying) {
            return Err(TokenError::Invalid);
        }
        let claims = jws.claims().ok_or(TokenError::Invalid)?;
        let audience = &self.settings.audience;
        let issuer = &self.settings.issuer;
        let for_us = claims
            .get("aud")
            .is_some_and(|aud| holds_exactly(aud, audience));
        let from_issuer =
            issuer.is_empty() || claims.get("iss").and_then(Value::as_str) == Some(issuer);
        if !(for_us && from_issuer) {
            return Err(TokenError::Invalid);
        }
        let expires_at = self.check_times(&claims, now)?;
        let user = claims
            .get(&self.settings.user_claim)
            .and_then(Value::as_str)
            .and_then(|raw| UserId::parse(raw, self.user_id_bytes_max).ok())
            .ok_or(TokenError::Invalid)?;
        let admin = !self.settings.admin_claim.is_empty()
            && claims
                .get(&self.settings.admin_claim)
                .is_some_and(|held| holds(held, &self.settings.admin_value));
        let claims = ClaimSet::new(claims);
        Ok((
            Identity {
                user,
                admin,
                claims,
            },
            expires_at,
        ))
    }

    /// `exp` (required) and `nbf` (when present) with the leeway; the token's `exp`.
    fn check_times(&self, claims: &Map<String, Value>, now: i64) -> Result<i64, TokenError> {
        let expires_at = claims
            .get("exp")
            .and_then(Value::as_i64)
            .ok_or(TokenError::Invalid)?;
        if expires_at < now.saturating_sub(self.leeway_seconds) {
            return Err(TokenError::Expired);
        }
        let not_before = match claims.get("nbf") {
            None => None,
            Some(nbf) => Some(nbf.as_i64().ok_or(TokenError::Invalid)?),
        };
        if not_before.is_some_and(|nbf| nbf > now.saturating_add(self.leeway_seconds)) {
            return Err(TokenError::Invalid);
        }
        Ok(expires_at)
    }

    /// The keys after a fetch made for `kid`, unless another request's fetch already
    /// brought it or one was made less than `refetch_min_interval_ms` ago.
    async fn refetch_for(&self, kid: &str) -> Arc<KeySet> {
        let mut refetched_at = self.refetched_at.lock().await;
        let held = self.keys.load_full();
        if held.get(kid).is_some() {
            return held;
        }
        let interval = Duration::from_millis(self.settings.refetch_min_interval_ms);
        let now = self.clock.instant();
        if refetched_at.is_some_and(|at| now.saturating_duration_since(at) < interval) {
            return held;
        }
        *refetched_at = Some(now);
        let _ = self.refresh().await;
        self.keys.load_full()
    }

    /// Fetches the JWKS and installs it; the interval until the next background refresh.
    pub async fn refresh(&self) -> Duration {
        let bounds = (
            Duration::from_secs(self.settings.refresh_min_seconds),
            Duration::from_secs(self.settings.refresh_max_seconds),
        );
        match self.fetcher.fetch().await {
            Ok(Fetched { keys, max_age }) => {
                self.install(keys);
                max_age.unwrap_or(bounds.1).clamp(bounds.0, bounds.1)
            }
            Err(why) => {
                self.failed(&why);
                bounds.0
            }
        }
    }

    /// The new key set replaces the old one; if it removed a key, every remembered
    /// verdict goes, so tokens that key signed are refused from now on.
    fn install(&self, keys: KeySet) {
        metrics::counter!(telemetry::OIDC_JWKS_FETCHES, "outcome" => "ok").increment(1);
        metrics::gauge!(telemetry::OIDC_KEYS).set(keys.len() as f64);
        if keys.is_empty() {
            tracing::warn!("the provider's JWKS holds no key flashgate can use");
        }
        let previous = self.keys.swap(Arc::new(keys));
        if previous.loses_keys_in(&self.keys.load()) {
            self.cache.clear();
        }
        self.loaded.store(true, Ordering::Release);
    }

    /// A failed fetch: counted always, logged at most once a minute; the keys held stay.
    fn failed(&self, why: &str) {
        metrics::counter!(telemetry::OIDC_JWKS_FETCHES, "outcome" => "error").increment(1);
        let mut logged_at = self
            .failure_logged_at
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if logged_at.is_none_or(|at| elapsed_since(at) >= FAILURE_LOG_INTERVAL) {
            *logged_at = Some(monotonic());
            tracing::warn!(
                why,
                keys_held = self.keys.load().len(),
                "cannot read the provider's keys; the keys held stay in use"
            );
        }
    }

    /// Refreshes the keys in the background until shutdown, as often as the provider's
    /// `Cache-Control` asks within `refresh_min_seconds..=refresh_max_seconds` (and every
    /// `refetch_min_interval_ms` while no keys have been read).
    pub async fn keep_fresh(self: Arc<Self>, shutdown: CancellationToken) {
        let mut wait = Duration::from_secs(self.settings.refresh_max_seconds);
        loop {
            if !self.loaded.load(Ordering::Acquire) {
                wait = wait.min(Duration::from_millis(self.settings.refetch_min_interval_ms));
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
            wait = self.refresh().await;
        }
    }
}

/// `aud` names `wanted`: equal to it, or an array holding it.
fn holds_exactly(aud: &Value, wanted: &str) -> bool {
    match aud {
        Value::String(text) => text == wanted,
        Value::Array(items) => items.iter().any(|item| item.as_str() == Some(wanted)),
        _ => false,
    }
}

/// A claim holds the operators' value: equal to it, an array containing it, or a
/// space-separated list (as `scope` is) naming it.
fn holds(claim: &Value, wanted: &str) -> bool {
    match claim {
        Value::String(text) => text == wanted || text.split(' ').any(|word| word == wanted),
        Value::Array(items) => items.iter().any(|item| item.as_str() == Some(wanted)),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::{holds, holds_exactly};
    use serde_json::json;

    #[test]
    fn the_audience_is_the_claim_or_one_of_its_elements_never_a_word_of_it() {
        assert!(holds_exactly(&json!("flashgate"), "flashgate"));
        assert!(holds_exactly(&json!(["shop", "flashgate"]), "flashgate"));
        assert!(!holds_exactly(&json!("shop flashgate"), "flashgate"));
        assert!(!holds_exactly(&json!(["shop"]), "flashgate"));
        assert!(!holds_exactly(&json!({"flashgate": 1}), "flashgate"));
    }

    #[test]
    fn the_admin_claim_may_be_a_string_an_array_or_a_scope() {
        assert!(holds(&json!("flashgate-admin"), "flashgate-admin"));
        assert!(holds(&json!(["a", "flashgate-admin"]), "flashgate-admin"));
        assert!(holds(&json!("read flashgate-admin"), "flashgate-admin"));
        assert!(!holds(&json!("flashgate-administrator"), "flashgate-admin"));
        assert!(!holds(&json!(["a"]), "flashgate-admin"));
        assert!(!holds(&json!({"flashgate-admin": true}), "flashgate-admin"));
    }
}
