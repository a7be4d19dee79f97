//! Reading the provider: its discovery document (for `jwks_uri`) and its JWKS, each
//! bounded in time and size, and how long the provider says the keys may be kept
//! (`Cache-Control: max-age`).

use std::time::Duration;

use serde::Deserialize;

use super::keys::KeySet;
use super::settings::{OidcSettings, check_url};

/// A fetched key set and how long the provider allows it to be kept, if it says.
pub struct Fetched {
    pub keys: KeySet,
    pub max_age: Option<Duration>,
}

/// Fetches the JWKS, finding its URL through discovery unless `jwks_url` names it.
pub struct Fetcher {
    client: reqwest::Client,
    settings: OidcSettings,
}

impl Fetcher {
    pub fn new(settings: &OidcSettings) -> Result<Self, String> {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_millis(settings.fetch_timeout_ms))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|error| format!("auth.oidc: cannot build an HTTP client: {error}"))?;
        Ok(Self {
            client,
            settings: settings.clone(),
        })
    }

    /// The setting a failed fetch is blamed on in a start-up error.
    pub fn setting(&self) -> &'static str {
        if self.settings.jwks_url.is_empty() {
            "auth.oidc.issuer"
        } else {
            "auth.oidc.jwks_url"
        }
    }

    /// The JWKS, or why it could not be had.
    pub async fn fetch(&self) -> Result<Fetched, String> {
        let url = if self.settings.jwks_url.is_empty() {
            self.discover().await?
        } else {
            self.settings.jwks_url.clone()
        };
        let (body, max_age) = self.get(&url).await?;
        let keys = KeySet::parse(&body).map_err(|why| format!("{url}: {why}"))?;
        Ok(Fetched { keys, max_age })
    }

    /// `jwks_uri` of the issuer's discovery document, which must name the same issuer.
    async fn discover(&self) -> Result<String, String> {
        #[derive(Deserialize)]
        struct Discovery {
            issuer: String,
            jwks_uri: String,
        }
        let issuer = self.settings.issuer.trim_end_matches('/');
        let url = format!("{issuer}/.well-known/openid-configuration");
        let (body, _) = self.get(&url).await?;
        let found: Discovery = serde_json::from_slice(&body)
            .map_err(|error| format!("{url}: not a discovery document: {error}"))?;
        if found.issuer.trim_end_matches('/') != issuer {
            return Err(format!("{url} names another issuer: {}", found.issuer));
        }
        check_url(&found.jwks_uri).map_err(|why| format!("{url}: jwks_uri {why}"))?;
        Ok(found.jwks_uri)
    }

    async fn get(&self, url: &str) -> Result<(Vec<u8>, Option<Duration>), String> {
        let mut response = self
            .client
            .get(url)
            .send()
            .await
            .map_err(|error| format!("{url}: {error}"))?;
        if !response.status().is_success() {
            return Err(format!("{url} answered {}", response.status()));
        }
        let max_age = max_age(response.headers());
        let limit = self.settings.document_bytes_max;
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|error| format!("{url}: {error}"))?
        {
            if body.len() + chunk.len() > limit {
                return Err(format!(
                    "{url}: larger than auth.oidc.document_bytes_max ({limit})"
                ));
            }
            body.extend_from_slice(&chunk);
        }
        Ok((body, max_age))
    }
}

/// `max-age` of a `Cache-Control` header; `no-store` and `no-cache` count as zero.
fn max_age(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let value = headers.get(reqwest::header::CACHE_CONTROL)?.to_str().ok()?;
    let mut found = None;
    for directive in value.split(',').map(str::trim) {
        let lower = directive.to_ascii_lowercase();
        if lower == "no-store" || lower == "no-cache" {
            return Some(Duration::ZERO);
        }
        if let Some(seconds) = lower.strip_prefix("max-age=") {
            found = seconds
                .trim_matches('"')
                .parse()
                .ok()
                .map(Duration::from_secs);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::{CACHE_CONTROL, HeaderMap, HeaderValue};

    fn with(value: &'static str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(CACHE_CONTROL, HeaderValue::from_static(value));
        headers
    }

    #[test]
    fn reads_max_age() {
        assert_eq!(
            max_age(&with("public, max-age=300")),
            Some(Duration::from_secs(300))
        );
        assert_eq!(max_age(&with("no-store")), Some(Duration::ZERO));
        assert_eq!(max_age(&with("public")), None);
        assert_eq!(max_age(&HeaderMap::new()), None);
    }
}
