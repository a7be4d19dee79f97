//! Settings: one typed tree, loaded in layers.
//!
//! `config/default.toml` is compiled in and carries every default, so there is exactly one
//! place a default lives. A `--config` file and environment variables override it. Every
//! limit is validated at start-up; a bad configuration stops the process before it binds.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use figment::Figment;
use figment::providers::{Env, Format, Toml};
use ipnet::IpNet;
use serde::Deserialize;

/// The defaults, shipped inside the binary.
pub const DEFAULT_TOML: &str = include_str!("../config/default.toml");

/// Environment variables with fixed names, and the key each one sets.
const NAMED_ENV: [(&str, &str); 6] = [
    ("DATABASE_URL", "database.url"),
    ("REDIS_URL", "redis.url"),
    ("FLASHGATE_LISTEN", "server.listen"),
    ("FLASHGATE_OPS_LISTEN", "server.ops_listen"),
    ("FLASHGATE_ADMIN_TOKEN", "auth.admin_token"),
    ("FLASHGATE_JWT_SECRET", "auth.jwt_secret"),
];

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration could not be read: {0}")]
    Load(#[from] Box<figment::Error>),
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub server: ServerSettings,
    pub database: DatabaseSettings,
    pub redis: RedisSettings,
    pub auth: AuthSettings,
    pub limits: LimitSettings,
    pub orders: OrderSettings,
    pub sweeper: SweeperSettings,
    pub soldout: SoldOutSettings,
    pub deals: DealSettings,
    pub telemetry: TelemetrySettings,
    pub ops: OpsSettings,
    pub payments: PaymentSettings,
    pub waiting_room: WaitingRoomSettings,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSettings {
    pub listen: SocketAddr,
    /// The operations listener: `/metrics`, `/admin/*`, health. Keep it off the internet.
    pub ops_listen: SocketAddr,
    pub header_bytes_max: usize,
    pub body_bytes_max: usize,
    pub header_read_timeout_ms: u64,
    pub request_timeout_ms: u64,
    pub connections_max: usize,
    pub shutdown_grace_seconds: u64,
    /// After the signal, how long `/readyz` fails while requests are still served, so load
    /// balancers stop sending traffic before the listener closes.
    pub drain_delay_ms: u64,
    /// Open connections one client address may hold; more are closed at once.
    pub connections_per_client_max: usize,
    /// A request body not fully received within this is answered 408.
    pub body_read_timeout_ms: u64,
    pub trusted_proxies: Vec<IpNet>,
    pub client_ip_header: String,
    pub public_cache_max_age_seconds: u32,
}

#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseSettings {
    pub url: String,
    pub request_pool_max: u32,
    pub background_pool_max: u32,
    pub admin_pool_max: u32,
    pub webhook_pool_max: u32,
    pub acquire_timeout_ms: u64,
    pub admin_acquire_timeout_ms: u64,
    pub statement_timeout_ms: u64,
    pub migrate_on_start: bool,
}

#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSettings {
    pub url: String,
    pub key_prefix: String,
    pub command_timeout_ms: u64,
    pub reconnect_interval_ms: u64,
}

#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthSettings {
    pub jwt_secret: String,
    pub jwt_leeway_seconds: u64,
    /// The `iss` every user token must carry.
    pub jwt_issuer: String,
    /// The `aud` every user token must carry.
    pub jwt_audience: String,
    pub admin_token: String,
    pub user_id_bytes_max: usize,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitSettings {
    pub retain_interval_ms: u64,
    pub per_ip: RateSettings,
    pub per_user: RateSettings,
    pub per_deal: RateSettings,
}

/// A token bucket: `rate_per_second` sustained, `burst` at once.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateSettings {
    pub rate_per_second: u32,
    pub burst: u32,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrderSettings {
    pub quantity_max: u32,
    pub idempotency_key_bytes_max: usize,
    pub retries_max: u32,
    pub grouping: bool,
    pub group_window_us: u64,
    pub group_size_max: usize,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweeperSettings {
    pub interval_ms: u64,
    pub batch_max: u32,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SoldOutSettings {
    pub refresh_interval_ms: u64,
    pub holders_max: usize,
    pub holders_refresh_ms: u64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DealSettings {
    pub cache_ttl_ms: u64,
    pub cache_entries_max: usize,
    /// Most deal ids kept in memory to answer unknown ids without PostgreSQL; with more
    /// deals than this, each unknown id is looked up (and its absence cached) on its own.
    pub catalogue_ids_max: usize,
    pub metrics_interval_ms: u64,
}

/// The payment provider and the workers that settle payments.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PaymentSettings {
    pub enabled: bool,
    pub provider: String,
    pub base_url: String,
    pub api_key: String,
    pub webhook_secret: String,
    pub webhook_tolerance_seconds: u32,
    pub connect_timeout_ms: u64,
    pub request_timeout_ms: u64,
    pub retries_max: u32,
    pub retry_backoff_ms: u64,
    pub session_seconds_min: u32,
    pub check_backoff_max_seconds: u32,
    pub outbox_interval_ms: u64,
    pub outbox_batch_max: u32,
    pub outbox_lease_seconds: u32,
    pub reconcile_interval_ms: u64,
    pub reconcile_after_seconds: u32,
    pub reconcile_batch_max: u32,
}

impl std::fmt::Debug for PaymentSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PaymentSettings")
            .field("enabled", &self.enabled)
            .field("provider", &self.provider)
            .field("base_url", &self.base_url)
            .field("api_key", &"<redacted>")
            .field("webhook_secret", &"<redacted>")
            .finish_non_exhaustive()
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetrySettings {
    pub log_filter: String,
}

/// The invariant audit every instance runs in the background.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpsSettings {
    /// How often the audit runs; its findings become `flashgate_invariant_violations`.
    pub audit_interval_ms: u64,
    /// A pending order this long past its expiry counts as overdue (the sweeper is behind).
    pub overdue_after_seconds: u64,
}

/// The queue in front of deals that have a waiting room (the per-deal rates are on the deal).
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaitingRoomSettings {
    /// HMAC-SHA256 key of the passes (FLASHGATE__WAITING_ROOM__PASS_SECRET); every instance
    /// must share it, since a pass minted by one is checked by another.
    pub pass_secret: String,
    /// How often the instance holding the lease moves each line.
    pub advance_interval_ms: u64,
    /// The advancing instance's Redis lease; if it dies, another takes over within this.
    pub lease_ttl_ms: u64,
    /// A waiting ticket not polled for this long is skipped when its turn comes.
    pub abandon_after_seconds: u64,
    /// Outstanding passes are capped at this multiple of the units available or reserved.
    pub stock_multiple: f64,
    /// How often the advancer re-reads each deal's stock from PostgreSQL.
    pub stock_refresh_ms: u64,
    /// Admission saved up while the line was empty or capped, in milliseconds of rate.
    pub burst_ms: u64,
    /// Most tickets one step of one line looks at (admitted or skipped).
    pub step_tickets_max: u32,
    /// Longest `refresh_after_seconds` a poller is told; keep it well below the abandon grace.
    pub refresh_after_seconds_max: u64,
    /// Most tickets shuffled in one line when a random-order sale opens.
    pub shuffle_tickets_max: u32,
    /// A line's Redis keys expire this long after its last ticket was taken.
    pub keys_ttl_seconds: u64,
}

impl std::fmt::Debug for WaitingRoomSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WaitingRoomSettings")
            .field("pass_secret", &"<redacted>")
            .field("advance_interval_ms", &self.advance_interval_ms)
            .field("lease_ttl_ms", &self.lease_ttl_ms)
            .finish_non_exhaustive()
    }
}

impl Settings {
    /// Defaults, then `config_file` if given, then the environment; validated.
    pub fn load(config_file: Option<&Path>) -> Result<Self, ConfigError> {
        let mut figment = Figment::from(Toml::string(DEFAULT_TOML));
        if let Some(path) = config_file {
            if !path.is_file() {
                return Err(ConfigError::Invalid(format!(
                    "config file {} does not exist",
                    path.display()
                )));
            }
            figment = figment.merge(Toml::file(path));
        }
        figment = figment.merge(Env::prefixed("FLASHGATE__").split("__"));
        for (var, key) in NAMED_ENV {
            if let Ok(value) = std::env::var(var) {
                figment = figment.merge((key, value));
            }
        }
        let settings: Settings = figment.extract().map_err(Box::new)?;
        settings.validate()?;
        Ok(settings)
    }

    /// Only the compiled-in defaults; for tests and tools that build settings in code.
    pub fn defaults() -> Self {
        let settings: Settings = Figment::from(Toml::string(DEFAULT_TOML))
            .extract()
            .expect("config/default.toml is valid");
        settings
    }

    /// Checks every limit and the relationships between them.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_server()?;
        self.validate_stores()?;
        self.validate_admission()?;
        self.validate_payments()?;
        self.validate_waiting_room()?;
        self.validate_tasks()
    }

    fn validate_waiting_room(&self) -> Result<(), ConfigError> {
        let w = &self.waiting_room;
        check(
            w.pass_secret.len() >= 16,
            "waiting_room.pass_secret must be at least 16 bytes",
        )?;
        check(
            (1..=1000).contains(&w.advance_interval_ms),
            "waiting_room.advance_interval_ms must be 1..=1000",
        )?;
        check(
            w.lease_ttl_ms >= 3 * w.advance_interval_ms && w.lease_ttl_ms <= 60_000,
            "waiting_room.lease_ttl_ms must be 3 × advance_interval_ms..=60000",
        )?;
        check(
            w.abandon_after_seconds >= 2 * w.refresh_after_seconds_max.max(1),
            "waiting_room.abandon_after_seconds must be at least twice refresh_after_seconds_max",
        )?;
        check(
            w.stock_multiple.is_finite() && w.stock_multiple >= 1.0,
            "waiting_room.stock_multiple must be at least 1",
        )?;
        check(
            (1..=10_000).contains(&w.stock_refresh_ms),
            "waiting_room.stock_refresh_ms must be 1..=10000",
        )?;
        check(
            w.burst_ms >= w.advance_interval_ms,
            "waiting_room.burst_ms must be at least advance_interval_ms",
        )?;
        check(
            (1..=100_000).contains(&w.step_tickets_max),
            "waiting_room.step_tickets_max must be 1..=100000",
        )?;
        check(
            (1..=1_000_000).contains(&w.shuffle_tickets_max),
            "waiting_room.shuffle_tickets_max must be 1..=1000000",
        )?;
        check(
            w.keys_ttl_seconds >= 3600,
            "waiting_room.keys_ttl_seconds must be at least 3600",
        )
    }

    fn validate_server(&self) -> Result<(), ConfigError> {
        let s = &self.server;
        check(
            s.header_bytes_max >= 8192,
            "server.header_bytes_max must be at least 8192",
        )?;
        check(
            s.body_bytes_max >= 64,
            "server.body_bytes_max must be at least 64",
        )?;
        check(
            s.header_read_timeout_ms > 0,
            "server.header_read_timeout_ms must be > 0",
        )?;
        check(
            s.request_timeout_ms > 0,
            "server.request_timeout_ms must be > 0",
        )?;
        check(s.connections_max > 0, "server.connections_max must be > 0")?;
        check(
            s.connections_per_client_max > 0,
            "server.connections_per_client_max must be > 0",
        )?;
        check(
            s.drain_delay_ms < s.shutdown_grace_seconds.saturating_mul(1000),
            "server.drain_delay_ms must be shorter than server.shutdown_grace_seconds",
        )?;
        check(
            s.body_read_timeout_ms > 0 && s.body_read_timeout_ms < s.request_timeout_ms,
            "server.body_read_timeout_ms must be > 0 and below server.request_timeout_ms",
        )?;
        check(
            http::HeaderName::from_bytes(s.client_ip_header.as_bytes()).is_ok(),
            "server.client_ip_header must be a header name",
        )
    }

    fn validate_stores(&self) -> Result<(), ConfigError> {
        let d = &self.database;
        check(
            d.request_pool_max > 0,
            "database.request_pool_max must be > 0",
        )?;
        check(
            d.background_pool_max > 0,
            "database.background_pool_max must be > 0",
        )?;
        check(d.admin_pool_max > 0, "database.admin_pool_max must be > 0")?;
        check(
            d.webhook_pool_max > 0,
            "database.webhook_pool_max must be > 0",
        )?;
        check(
            d.acquire_timeout_ms > 0,
            "database.acquire_timeout_ms must be > 0",
        )?;
        check(
            d.acquire_timeout_ms < self.server.request_timeout_ms,
            "database.acquire_timeout_ms must be below server.request_timeout_ms",
        )?;
        check(
            d.admin_acquire_timeout_ms >= d.acquire_timeout_ms,
            "database.admin_acquire_timeout_ms must be at least database.acquire_timeout_ms",
        )?;
        check(
            d.statement_timeout_ms > 0,
            "database.statement_timeout_ms must be > 0",
        )?;
        check(
            self.redis.command_timeout_ms > 0,
            "redis.command_timeout_ms must be > 0",
        )?;
        check(
            self.redis.reconnect_interval_ms > 0,
            "redis.reconnect_interval_ms must be > 0",
        )
    }

    fn validate_admission(&self) -> Result<(), ConfigError> {
        check(
            !self.auth.jwt_secret.is_empty(),
            "auth.jwt_secret must not be empty",
        )?;
        check(
            !self.auth.jwt_issuer.is_empty() && !self.auth.jwt_audience.is_empty(),
            "auth.jwt_issuer and auth.jwt_audience must not be empty",
        )?;
        check(
            self.auth.admin_token.len() >= 16,
            "auth.admin_token must be at least 16 bytes",
        )?;
        check(
            self.auth.user_id_bytes_max > 0,
            "auth.user_id_bytes_max must be > 0",
        )?;
        for (name, rate) in [
            ("per_ip", self.limits.per_ip),
            ("per_user", self.limits.per_user),
            ("per_deal", self.limits.per_deal),
        ] {
            check(
                rate.rate_per_second > 0 && rate.burst > 0,
                &format!("limits.{name} rate_per_second and burst must be > 0"),
            )?;
        }
        check(
            self.limits.retain_interval_ms > 0,
            "limits.retain_interval_ms must be > 0",
        )?;
        let o = &self.orders;
        check(
            (1..=1_000_000).contains(&o.quantity_max),
            "orders.quantity_max must be 1..=1000000",
        )?;
        check(
            (1..=1024).contains(&o.group_size_max),
            "orders.group_size_max must be 1..=1024",
        )?;
        check(
            (1..=100_000).contains(&o.group_window_us),
            "orders.group_window_us must be 1..=100000",
        )?;
        check(
            (1..=255).contains(&o.idempotency_key_bytes_max),
            "orders.idempotency_key_bytes_max must be 1..=255",
        )?;
        check(
            self.deals.cache_ttl_ms > 0,
            "deals.cache_ttl_ms must be > 0",
        )?;
        check(
            self.deals.cache_entries_max > 0 && self.deals.catalogue_ids_max > 0,
            "deals.cache_entries_max and deals.catalogue_ids_max must be > 0",
        )
    }

    fn validate_payments(&self) -> Result<(), ConfigError> {
        let p = &self.payments;
        check(
            !p.provider.is_empty()
                && p.provider
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_'),
            "payments.provider must be a short name of letters, digits and _",
        )?;
        check(
            !p.webhook_secret.is_empty(),
            "payments.webhook_secret must not be empty",
        )?;
        check(
            p.webhook_tolerance_seconds > 0,
            "payments.webhook_tolerance_seconds must be > 0",
        )?;
        check(
            p.connect_timeout_ms > 0 && p.request_timeout_ms > 0,
            "payments timeouts must be > 0",
        )?;
        check(
            p.request_timeout_ms * u64::from(p.retries_max + 1) < self.server.request_timeout_ms,
            "payments.request_timeout_ms × (retries_max + 1) must fit in server.request_timeout_ms",
        )?;
        check(
            (1..=86_400).contains(&p.session_seconds_min),
            "payments.session_seconds_min must be 1..=86400",
        )?;
        check(
            p.check_backoff_max_seconds > 0,
            "payments.check_backoff_max_seconds must be > 0",
        )?;
        check(
            p.outbox_interval_ms > 0 && p.outbox_batch_max > 0,
            "payments outbox interval and batch must be > 0",
        )?;
        check(
            p.outbox_lease_seconds > 0,
            "payments.outbox_lease_seconds must be > 0",
        )?;
        check(
            p.reconcile_interval_ms > 0 && p.reconcile_batch_max > 0,
            "payments reconcile interval and batch must be > 0",
        )
    }

    fn validate_tasks(&self) -> Result<(), ConfigError> {
        check(
            self.sweeper.interval_ms > 0,
            "sweeper.interval_ms must be > 0",
        )?;
        check(self.sweeper.batch_max > 0, "sweeper.batch_max must be > 0")?;
        check(
            (1..=1000).contains(&self.soldout.refresh_interval_ms),
            "soldout.refresh_interval_ms must be 1..=1000 so a cleared flag spreads within a second",
        )?;
        check(
            self.soldout.holders_refresh_ms > 0,
            "soldout.holders_refresh_ms must be > 0",
        )?;
        check(
            self.deals.metrics_interval_ms > 0,
            "deals.metrics_interval_ms must be > 0",
        )?;
        check(
            self.ops.audit_interval_ms >= 1000,
            "ops.audit_interval_ms must be at least 1000",
        )?;
        check(
            self.ops.overdue_after_seconds > 0,
            "ops.overdue_after_seconds must be > 0",
        )
    }

    pub fn uses_default_secrets(&self) -> bool {
        let defaults = Self::defaults();
        self.auth.jwt_secret == defaults.auth.jwt_secret
            || self.auth.admin_token == defaults.auth.admin_token
            || self.waiting_room.pass_secret == defaults.waiting_room.pass_secret
    }
}

fn check(ok: bool, message: &str) -> Result<(), ConfigError> {
    if ok {
        Ok(())
    } else {
        Err(ConfigError::Invalid(message.to_owned()))
    }
}

pub fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

impl AuthSettings {
    /// The issuer and audience user tokens must name.
    pub fn audience(&self) -> crate::admission::token::Audience<'_> {
        crate::admission::token::Audience {
            issuer: &self.jwt_issuer,
            audience: &self.jwt_audience,
        }
    }
}

/// Secrets never reach logs.
impl std::fmt::Debug for DatabaseSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatabaseSettings")
            .field("url", &redact_url(&self.url))
            .field("request_pool_max", &self.request_pool_max)
            .field("background_pool_max", &self.background_pool_max)
            .field("acquire_timeout_ms", &self.acquire_timeout_ms)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for RedisSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSettings")
            .field("url", &redact_url(&self.url))
            .field("key_prefix", &self.key_prefix)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for AuthSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthSettings")
            .field("jwt_secret", &"<redacted>")
            .field("admin_token", &"<redacted>")
            .field("jwt_leeway_seconds", &self.jwt_leeway_seconds)
            .finish_non_exhaustive()
    }
}

/// Drops the password from a connection URL.
fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            format!("{}://<redacted>{}", &url[..scheme_end], &url[at..])
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_parse_and_validate() {
        let settings = Settings::defaults();
        settings.validate().unwrap();
        assert_eq!(settings.orders.idempotency_key_bytes_max, 255);
    }

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact_url("postgres://u:secret@h:5432/db"),
            "postgres://<redacted>@h:5432/db"
        );
        assert_eq!(redact_url("redis://127.0.0.1"), "redis://127.0.0.1");
    }

    #[test]
    fn rejects_bad_limits() {
        let mut settings = Settings::defaults();
        settings.soldout.refresh_interval_ms = 5000;
        assert!(settings.validate().is_err());
    }
}
