//! What every load-tester command needs to act as the gateway's operator and its users:
//! the operations listener, the admin token, and the secret user tokens are signed with.

use clap::Args;

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

    /// A user token for `user`, valid for `ttl_seconds`.
    pub fn token(&self, user: &str, ttl_seconds: i64) -> String {
        flashgate::auth::mint_token(&self.jwt_secret, user, ttl_seconds)
    }
}
