//! What every load-tester command needs to act as the gateway's operator and its users:
//! the operations listener, the admin token, and how its users' tokens are signed.

use clap::Args;

use crate::provider::{TokenKind, rs256_token};

/// How a command reaches the gateway's operations listener and mints its users' tokens;
/// flattened into each command's arguments.
#[derive(Args, Debug, Clone)]
pub struct Operator {
    /// The gateway's operations listener (admin API and /metrics); must be a loopback address.
    #[arg(long, default_value = "http://127.0.0.1:8081")]
    pub ops_url: String,
    #[arg(
        long,
        env = "FLASHGATE_ADMIN_TOKEN",
        default_value = "flashgate-dev-admin-token"
    )]
    pub admin_token: String,
    #[arg(
        long,
        env = "FLASHGATE_JWT_SECRET",
        default_value = "flashgate-dev-secret-change-me"
    )]
    pub jwt_secret: String,
    /// The users' tokens in `sale` and `flood`: HS256 with `--jwt-secret`, or RS256 provider tokens signed with
    /// the load tester's own key (serve its JWKS with `flashgate-loadtest provider`).
    #[arg(long, value_enum, default_value_t = TokenKind::Hs256)]
    pub token_kind: TokenKind,
    /// The `iss` of RS256 tokens (the gateway's `auth.oidc.issuer`, if it checks one).
    #[arg(long, default_value = "http://127.0.0.1:8097")]
    pub token_issuer: String,
    /// The `aud` of RS256 tokens (the gateway's `auth.oidc.audience`).
    #[arg(long, default_value = "flashgate")]
    pub token_audience: String,
}

impl Operator {
    /// A `POST` of the admin API at `path` (from `/admin/…`), authorised.
    pub fn post(&self, http: &reqwest::Client, path: &str) -> reqwest::RequestBuilder {
        http.post(format!("{}{path}", self.ops_url))
            .bearer_auth(&self.admin_token)
    }

    /// Creates the deal `body` describes through the admin API; its answer must be 201.
    pub async fn create_deal(
        &self,
        http: &reqwest::Client,
        body: &serde_json::Value,
    ) -> Result<(), String> {
        let response = self
            .post(http, "/admin/deals")
            .json(body)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status();
        if status != reqwest::StatusCode::CREATED {
            let text = response.text().await.unwrap_or_default();
            return Err(format!("creating the deal answered {status}: {text}"));
        }
        Ok(())
    }

    /// An HS256 user token for `user`, valid for `ttl_seconds` (the crowd and chaos runs).
    pub fn token(&self, user: &str, ttl_seconds: i64) -> String {
        flashgate::auth::mint_token(&self.jwt_secret, user, ttl_seconds)
    }

    /// A user token for `user` of `--token-kind` (sale and flood), valid for `ttl_seconds`.
    pub fn user_token(&self, user: &str, ttl_seconds: i64) -> Result<String, String> {
        match self.token_kind {
            TokenKind::Hs256 => Ok(self.token(user, ttl_seconds)),
            TokenKind::Rs256 => {
                rs256_token(&self.token_issuer, &self.token_audience, user, ttl_seconds)
            }
        }
    }

    /// Tokens for users `{prefix}0` to `{prefix}{count - 1}`, valid for an hour, minted on
    /// every core (an RS256 signature costs a few hundred microseconds), in user order.
    pub fn tokens(&self, prefix: &str, count: usize) -> Result<Vec<String>, String> {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let chunk = count.div_ceil(threads).max(1);
        std::thread::scope(|scope| {
            let parts: Vec<_> = (0..count)
                .step_by(chunk)
                .map(|start| {
                    scope.spawn(move || {
                        (start..(start + chunk).min(count))
                            .map(|u| self.user_token(&format!("{prefix}{u}"), 3600))
                            .collect::<Result<Vec<_>, _>>()
                    })
                })
                .collect();
            let mut all = Vec::with_capacity(count);
            for part in parts {
                all.extend(part.join().map_err(|_| "a minting thread failed")??);
            }
            eprintln!("{count} tokens signed");
            Ok(all)
        })
    }
}
