//! `[auth.oidc]`: where an OpenID Connect provider publishes its keys, what its tokens
//! must say, and how often flashgate may ask it again. Declared beside the verifier that
//! reads it.

use std::net::IpAddr;

use serde::Deserialize;

use crate::settings::require;

/// The provider whose tokens name users and operators. Off while both `issuer` and
/// `jwks_url` are empty.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OidcSettings {
    /// The provider's issuer URL: every token's `iss` must equal it, and, without
    /// `jwks_url`, its keys are found through `<issuer>/.well-known/openid-configuration`.
    pub issuer: String,
    /// The JWKS URL, when the provider's discovery document is not to be used; with no
    /// `issuer`, `iss` is then not checked.
    pub jwks_url: String,
    /// The `aud` every provider token must carry.
    pub audience: String,
    /// The claim that names the user (and the operator in the operator log).
    pub user_claim: String,
    /// The claim that makes a token an operator's; empty: provider tokens never open /admin.
    pub admin_claim: String,
    /// The value `admin_claim` must hold: equal to it, or an element of an array, or a word
    /// of a space-separated list (as `scope` is).
    pub admin_value: String,
    /// A token whose `kid` is not held triggers at most one JWKS fetch per this interval,
    /// whatever the number of such tokens.
    pub refetch_min_interval_ms: u64,
    /// The background refresh honours the provider's `Cache-Control: max-age`, but never
    /// refreshes more often than this.
    pub refresh_min_seconds: u64,
    /// ... nor less often than this (also the interval when the provider says nothing).
    pub refresh_max_seconds: u64,
    /// A JWKS or discovery fetch that takes longer fails (and the held keys stay).
    pub fetch_timeout_ms: u64,
    /// Largest discovery document or JWKS read, in bytes.
    pub document_bytes_max: usize,
    /// Largest provider token verified, in bytes; larger ones are refused unread.
    pub token_bytes_max: usize,
    /// Verified tokens remembered until their `exp`, so a buyer's repeated requests verify
    /// once; at the cap the oldest half of a shard is dropped.
    pub cache_entries_max: usize,
    /// Start even when the provider cannot be reached: tokens are then answered 503 with
    /// `Retry-After` until its keys arrive.
    pub start_without_keys: bool,
}

impl OidcSettings {
    /// True when a provider is configured.
    pub fn enabled(&self) -> bool {
        !self.issuer.is_empty() || !self.jwks_url.is_empty()
    }

    /// Checks the section; the message names the key.
    pub fn validate(&self) -> Result<(), String> {
        if !self.enabled() {
            return Ok(());
        }
        for (name, url) in [("issuer", &self.issuer), ("jwks_url", &self.jwks_url)] {
            if !url.is_empty() {
                check_url(url).map_err(|why| format!("auth.oidc.{name} {why}"))?;
            }
        }
        require(
            !self.audience.is_empty() && !self.user_claim.is_empty(),
            "auth.oidc.audience and auth.oidc.user_claim must not be empty",
        )?;
        require(
            self.admin_claim.is_empty() == self.admin_value.is_empty(),
            "auth.oidc.admin_claim and auth.oidc.admin_value are set together",
        )?;
        require(
            self.refetch_min_interval_ms > 0 && self.fetch_timeout_ms > 0,
            "auth.oidc.refetch_min_interval_ms and fetch_timeout_ms must be > 0",
        )?;
        require(
            0 < self.refresh_min_seconds && self.refresh_min_seconds <= self.refresh_max_seconds,
            "auth.oidc.refresh_min_seconds must be > 0 and at most refresh_max_seconds",
        )?;
        require(
            self.document_bytes_max > 0 && self.token_bytes_max > 0 && self.cache_entries_max > 0,
            "auth.oidc.document_bytes_max, token_bytes_max and cache_entries_max must be > 0",
        )
    }
}

/// An `https://` URL, or `http://` to a loopback host (tests, the demo): keys fetched in
/// the clear from anywhere else could be anyone's.
pub fn check_url(raw: &str) -> Result<(), String> {
    let url = reqwest::Url::parse(raw).map_err(|error| format!("is not a URL: {error}"))?;
    match url.scheme() {
        "https" => Ok(()),
        "http" if is_loopback(&url) => Ok(()),
        "http" => Err("may use http:// only on a loopback address; use https://".into()),
        other => Err(format!("must be an https:// URL, not {other}://")),
    }
}

fn is_loopback(url: &reqwest::Url) -> bool {
    url.host_str().is_some_and(|host| {
        host.eq_ignore_ascii_case("localhost")
            || host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    })
}

#[cfg(test)]
mod tests {
    use super::check_url;

    #[test]
    fn plain_http_only_on_loopback() {
        for ok in [
            "https://id.example.com/realms/shop",
            "http://127.0.0.1:8080",
            "http://localhost/jwks",
            "http://[::1]:9000/",
        ] {
            assert!(check_url(ok).is_ok(), "{ok}");
        }
        for refused in [
            "http://id.example.com",
            "http://10.0.0.1/jwks",
            "ftp://x",
            "nonsense",
        ] {
            assert!(check_url(refused).is_err(), "{refused}");
        }
    }
}
