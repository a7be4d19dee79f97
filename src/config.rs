//! Settings: one typed tree, loaded in layers.
//!
//! `config/default.toml` is compiled in and carries every default, so there is exactly one
//! place a default lives. A `--config` file and environment variables override it. Every
//! limit is validated at start-up; a bad configuration stops the process before it binds.
//! [`env`] holds the environment's names for the settings; [`explain`] tells where each
//! effective value came from (`flashgate config`).

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use figment::Figment;
use figment::providers::{Format, Serialized, Toml};
use ipnet::IpNet;
use serde::Deserialize;

pub mod env;
pub mod explain;
mod sources;
mod urls;

use explain::Effective;
pub use sources::Sources;
pub use urls::redact_url;

/// The defaults, shipped inside the binary.
pub const DEFAULT_TOML: &str = include_str!("../config/default.toml");

/// Most runtime worker threads `server.worker_threads` may ask for.
const WORKER_THREADS_MAX: usize = 1024;

/// A configuration that cannot be used; the message names the setting as it was given
/// (environment variable, or key and file) and what is wrong with it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
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
    /// Where each value came from, so later messages name the setting as it was given.
    #[serde(skip)]
    pub sources: Sources,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSettings {
    pub listen: SocketAddr,
    /// The operations listener: `/metrics`, `/admin/*`, health. Keep it off the internet.
    pub ops_listen: SocketAddr,
    /// Runtime worker threads; 0 means one per core.
    pub worker_threads: usize,
    pub header_bytes_max: usize,
    pub body_bytes_max: usize,
    pub header_read_timeout_ms: u64,
    pub request_timeout_ms: u64,
    pub connections_max: usize,
    pub shutdown_grace_seconds: u64,
    /// After the signal, how long `/readyz` fails while requests are still served, so load
    /// balancers stop sending traffic before the listener closes.
    pub drain_delay_ms: u64,
    /// After the connections are drained, how long background tasks (sweeper, outbox,
    /// advancer) get to stop; a task still busy then is dropped mid-flight, which is safe
    /// because each of its transactions rolls back, and the process exits anyway.
    pub tasks_stop_ms: u64,
    /// Open connections one client address may hold; more are closed at once.
    pub connections_per_client_max: usize,
    /// A request body not fully received within this is answered 408.
    pub body_read_timeout_ms: u64,
    pub trusted_proxies: Vec<IpNet>,
    pub client_ip_header: String,
    pub public_cache_max_age_seconds: u32,
    /// Longest `X-Request-Id` a caller may send; a longer or unsafe one is replaced by a
    /// generated id.
    pub request_id_bytes_max: usize,
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
    /// `url` leads to a pooler handing out a server connection per transaction (PgBouncer
    /// in transaction mode): every checkout runs in a transaction of its own.
    pub transaction_pooler: bool,
    /// Direct connection for what a transaction pooler cannot carry (migrations, LISTEN);
    /// empty means `url`.
    pub direct_url: String,
    /// With several hosts in `url`, how often the gateway checks it still talks to the primary.
    pub primary_check_interval_ms: u64,
    /// During a failover, at most one warning (with the count of failed requests) this often.
    pub failover_log_interval_ms: u64,
}

#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSettings {
    pub url: String,
    pub key_prefix: String,
    pub command_timeout_ms: u64,
    /// Command timeouts drop the shared connection only when Redis has answered nothing for
    /// this long, so a slow moment (or a CPU-starved gateway) is a few failed calls, not
    /// every call failing until the next reconnect.
    pub unresponsive_after_ms: u64,
    pub reconnect_interval_ms: u64,
    /// While Redis stays unreachable, the log repeats its warning at most this often.
    pub outage_log_interval_ms: u64,
    /// How often a probe command decides whether Redis is up (`/readyz`,
    /// `flashgate_redis_up`): a connection may exist while every command fails.
    pub health_check_interval_ms: u64,
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
    pub global: GlobalLimitSettings,
}

/// The per-user and per-deal limits shared by every instance through Redis.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GlobalLimitSettings {
    /// Off: each instance enforces the limits alone, so N instances allow N times the rate.
    pub enabled: bool,
    /// Most order requests an instance takes from a deal's shared budget per Redis round
    /// trip (never more than the deal's burst); slices grow to it with local demand.
    pub deal_slice: u32,
    /// A slice is spent for at most this long; what it leaves goes back to the budget.
    pub slice_ttl_ms: u64,
    /// How often each instance announces itself in Redis.
    pub heartbeat_interval_ms: u64,
    /// An instance not heard from for this long no longer counts.
    pub instance_ttl_ms: u64,
    /// Instances assumed until Redis has told how many run; while Redis is down each
    /// instance allows this share (1/N) of the per-user and per-deal budgets.
    pub instances_assumed: u32,
    /// Most per-user checks answered by one Redis script call.
    pub user_batch_max: u32,
    /// Most per-user checks waiting for Redis; past it the local share decides.
    pub user_queue_max: u32,
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
    /// Batches of one deal in flight at once on this instance, each with its own share of
    /// the buckets.
    pub lanes: usize,
    /// Most orders placed in one batch (one statement, one transaction).
    pub batch_max: usize,
    /// Batches of a deal placed the careful way after one met an existing key or buyer.
    pub careful_after_recheck: u32,
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
    /// How long after a deal ends (or at once when it is deleted) its `deal`-labelled
    /// series stay on `/metrics`; after that they are dropped, so the label does not grow
    /// with every deal ever sold.
    pub metrics_retain_seconds: u64,
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
    /// Most payment attempts one order may have, its first included; one more is answered
    /// 409 `payment-attempts-exhausted`.
    pub attempts_per_order_max: u32,
    /// After `expires_at`, how long an order with a payment still open at the provider is
    /// held while the provider is asked about it; at `expires_at` plus this the reservation
    /// is released whatever the provider says, and later money follows the late-payment
    /// policy. Shown in every order as `hold_ends_at`.
    pub expiry_grace_seconds: u32,
    /// A refund the provider refuses is retried with backoff (2, 4, … up to 60 s apart) this
    /// many times in all, then marked FAILED and surfaced (`flashgate_refunds_failed`,
    /// `flashgate reconcile`) for a person to finish.
    pub refund_tries_max: u32,
    /// PEM file of the certificate authorities trusted for an `https` `base_url`, instead of
    /// the system's; empty to use the system's.
    pub ca_file: String,
    /// Provider calls failing or timing out one after another (each after its retries) that
    /// open the circuit breaker.
    pub breaker_failures_max: u32,
    /// How long an open breaker refuses provider calls before letting one probe through.
    pub breaker_open_ms: u64,
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
    /// `text` for people at a terminal, `json` (one object per line) for log collectors.
    pub log_format: LogFormat,
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
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
    /// While no line has anyone waiting or a pass outstanding, the advancer sleeps; each
    /// instance checks this often whether a join elsewhere woke it (one Redis command).
    pub idle_check_ms: u64,
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
    /// A stock snapshot older than this admits nobody (the advancer could not re-read it).
    pub stock_age_max_ms: u64,
    /// How often each instance reads the revocation stream: the most a revoked pass keeps
    /// working on another instance.
    pub revocation_poll_ms: u64,
    /// Revocations kept in the Redis stream (approximately), for instances catching up.
    pub revocations_max: u64,
    /// `ed25519` (anyone holding the published key set can verify) or `hmac` (only holders
    /// of `pass_secret` can). Both are always accepted; this picks what is minted.
    pub pass_format: String,
    /// Ed25519 signing keys as base64url 32-byte seeds (FLASHGATE__WAITING_ROOM__PASS_SIGNING_KEYS):
    /// the first signs, all are published and verify, so a key is rotated in by listing it
    /// second, then first once cached key sets hold it (`keys_max_age_seconds`), then
    /// dropping the old one after `pass_ttl_seconds`. Empty: one key derived from
    /// `pass_secret`.
    pub pass_signing_keys: Vec<String>,
    /// How long a CDN may cache the published key set.
    pub keys_max_age_seconds: u64,
    /// A proof-of-work challenge this instance issues must be solved and used within this;
    /// the expiry is signed in, so every instance enforces the issuer's.
    pub pow_challenge_ttl_seconds: u64,
    /// The hardest challenge ever asked, however large the crowd.
    pub pow_bits_max: u32,
    /// The crowd size from which each doubling of the people waiting adds one bit.
    pub pow_crowd_step: u64,
    /// The waiting page's title and optional stylesheet: the shop's branding.
    pub page_title: String,
    pub page_stylesheet_url: String,
    /// How long a CDN may cache the waiting page.
    pub page_max_age_seconds: u64,
}

impl std::fmt::Debug for WaitingRoomSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WaitingRoomSettings")
            .field("pass_secret", &"<redacted>")
            .field("advance_interval_ms", &self.advance_interval_ms)
            .field("lease_ttl_ms", &self.lease_ttl_ms)
            .field("idle_check_ms", &self.idle_check_ms)
            .finish_non_exhaustive()
    }
}

impl Settings {
    /// Defaults, then `config_file` if given, then the environment; validated.
    pub fn load(config_file: Option<&Path>) -> Result<Self, ConfigError> {
        Self::layered(config_file).map(|(settings, _)| settings)
    }

    /// Loads as [`Settings::load`] does, and tells every setting's effective value and
    /// where it came from (`flashgate config`), secrets redacted.
    pub fn explain(config_file: Option<&Path>) -> Result<Vec<Effective>, ConfigError> {
        let (settings, figment) = Self::layered(config_file)?;
        let root: figment::value::Value = figment
            .extract()
            .map_err(|error| settings.sources.describe(error))?;
        let mut values = std::collections::BTreeMap::new();
        explain::flatten("", &root, &mut values);
        Ok(values
            .iter()
            .map(|(key, value)| Effective {
                key: key.clone(),
                shown: explain::shown(key, value),
                origin: settings.sources.origin(key),
            })
            .collect())
    }

    /// The validated settings and the figment they were read from.
    fn layered(config_file: Option<&Path>) -> Result<(Self, Figment), ConfigError> {
        let defaults = explain::defaults();
        let env = env::read(env_vars(), &defaults)?;
        let mut sources = Sources::new(config_file, &env);
        let mut figment = Figment::from(Toml::string(DEFAULT_TOML));
        if let Some(path) = config_file {
            check_config_file(path)?;
            sources.note_file_keys(&Figment::from(Toml::file(path)), defaults.into_keys());
            figment = figment.merge(Toml::file(path));
        }
        for setting in env {
            figment = figment.merge(Serialized::default(&setting.key, setting.value));
        }
        for key in ["server.listen", "server.ops_listen"] {
            figment = sources.resolve_listen(figment, key)?;
        }
        let mut settings: Settings = figment.extract().map_err(|error| sources.describe(error))?;
        urls::check_database(&settings.database, &sources)?;
        settings.validate()?;
        settings.sources = sources;
        Ok((settings, figment))
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
        )?;
        self.validate_waiting_room_edge()
    }

    fn validate_waiting_room_edge(&self) -> Result<(), ConfigError> {
        let w = &self.waiting_room;
        check(
            w.stock_age_max_ms >= 2 * w.stock_refresh_ms && w.stock_age_max_ms <= 600_000,
            "waiting_room.stock_age_max_ms must be 2 × stock_refresh_ms..=600000",
        )?;
        check(
            (10..=60_000).contains(&w.idle_check_ms),
            "waiting_room.idle_check_ms must be 10..=60000",
        )?;
        check(
            (1..=1000).contains(&w.revocation_poll_ms),
            "waiting_room.revocation_poll_ms must be 1..=1000",
        )?;
        check(
            (1000..=10_000_000).contains(&w.revocations_max),
            "waiting_room.revocations_max must be 1000..=10000000",
        )?;
        check(
            matches!(w.pass_format.as_str(), "ed25519" | "hmac"),
            "waiting_room.pass_format must be ed25519 or hmac",
        )?;
        check(
            w.signing_seeds().is_ok(),
            "waiting_room.pass_signing_keys must be base64url 32-byte seeds",
        )?;
        check(
            (10..=600).contains(&w.pow_challenge_ttl_seconds),
            "waiting_room.pow_challenge_ttl_seconds must be 10..=600",
        )?;
        check(
            (1..=32).contains(&w.pow_bits_max),
            "waiting_room.pow_bits_max must be 1..=32",
        )?;
        check(
            w.pow_crowd_step >= 1,
            "waiting_room.pow_crowd_step must be at least 1",
        )?;
        check(
            w.page_title.len() <= 200 && w.page_stylesheet_url.len() <= 2000,
            "waiting_room.page_title must be at most 200 bytes, page_stylesheet_url 2000",
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
            (16..=128).contains(&s.request_id_bytes_max),
            "server.request_id_bytes_max must be 16..=128",
        )?;
        check(
            s.header_read_timeout_ms > 0,
            "server.header_read_timeout_ms must be > 0",
        )?;
        check(
            s.request_timeout_ms > 0,
            "server.request_timeout_ms must be > 0",
        )?;
        check(
            s.worker_threads <= WORKER_THREADS_MAX,
            "server.worker_threads must be at most 1024 (0: one per core)",
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
            d.primary_check_interval_ms > 0,
            "database.primary_check_interval_ms must be > 0",
        )?;
        check(
            d.failover_log_interval_ms >= 1000,
            "database.failover_log_interval_ms must be at least 1000",
        )?;
        check(
            self.redis.command_timeout_ms > 0,
            "redis.command_timeout_ms must be > 0",
        )?;
        check(
            self.redis.unresponsive_after_ms >= self.redis.command_timeout_ms,
            "redis.unresponsive_after_ms must be at least redis.command_timeout_ms",
        )?;
        check(
            self.redis.reconnect_interval_ms > 0,
            "redis.reconnect_interval_ms must be > 0",
        )?;
        check(
            (50..=1000).contains(&self.redis.health_check_interval_ms),
            "redis.health_check_interval_ms must be between 50 and 1000",
        )?;
        check(
            self.redis.outage_log_interval_ms >= 1000,
            "redis.outage_log_interval_ms must be at least 1000",
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
        let g = &self.limits.global;
        check(
            g.deal_slice > 0
                && g.slice_ttl_ms > 0
                && g.heartbeat_interval_ms > 0
                && g.instances_assumed > 0,
            "limits.global deal_slice, slice_ttl_ms, heartbeat_interval_ms and instances_assumed must be > 0",
        )?;
        check(
            g.instance_ttl_ms > 2 * g.heartbeat_interval_ms,
            "limits.global.instance_ttl_ms must exceed twice heartbeat_interval_ms",
        )?;
        check(
            (1..=1024).contains(&g.user_batch_max) && g.user_queue_max >= g.user_batch_max,
            "limits.global.user_batch_max must be 1..=1024 and user_queue_max at least as large",
        )?;
        let o = &self.orders;
        check(
            (1..=1_000_000).contains(&o.quantity_max),
            "orders.quantity_max must be 1..=1000000",
        )?;
        check(
            (1..=1024).contains(&o.batch_max),
            "orders.batch_max must be 1..=1024",
        )?;
        check((1..=64).contains(&o.lanes), "orders.lanes must be 1..=64")?;
        check(
            o.lanes < self.database.request_pool_max as usize,
            "orders.lanes must be below database.request_pool_max, so reads still get connections",
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
        )?;
        check(
            (1..=100).contains(&p.attempts_per_order_max),
            "payments.attempts_per_order_max must be 1..=100",
        )?;
        check(
            p.expiry_grace_seconds <= 300,
            "payments.expiry_grace_seconds must be at most 300",
        )?;
        check(
            (1..=100).contains(&p.refund_tries_max),
            "payments.refund_tries_max must be 1..=100",
        )?;
        check(
            p.base_url.starts_with("http://") || p.base_url.starts_with("https://"),
            "payments.base_url must start with http:// or https://",
        )?;
        check(
            p.breaker_failures_max > 0 && p.breaker_open_ms > 0,
            "payments.breaker_failures_max and payments.breaker_open_ms must be > 0",
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

    /// Outside `demo`, every secret must be set to a value of its own, at least
    /// [`SECRET_BYTES_MIN`] long: the shipped defaults are public. The payment provider's
    /// API key and webhook secret count only when payments are enabled. The error gives one
    /// line per offending setting, naming it as it was given and how to set it.
    pub fn check_secrets(&self) -> Result<(), ConfigError> {
        let problems: Vec<String> = self
            .secrets()
            .iter()
            .filter_map(|secret| secret.problem(&self.sources))
            .map(|problem| format!("  {problem}"))
            .collect();
        if problems.is_empty() {
            return Ok(());
        }
        Err(ConfigError::Invalid(format!(
            "`serve` needs secrets of its own of at least {SECRET_BYTES_MIN} bytes \
             (e.g. the output of `openssl rand -hex 32`); only `flashgate demo` runs with \
             the development defaults:\n{}",
            problems.join("\n")
        )))
    }

    /// The secret settings still at their public development default, for the warning
    /// `demo` prints.
    pub fn default_secrets(&self) -> Vec<&'static str> {
        self.secrets()
            .iter()
            .filter(|secret| secret.value == secret.default)
            .map(|secret| secret.key)
            .collect()
    }

    fn secrets(&self) -> Vec<Secret<'_>> {
        let defaults = Self::defaults();
        let known = |key, value, default: &str| Secret {
            key,
            value,
            default: default.to_owned(),
        };
        let mut secrets = vec![
            known(
                "auth.jwt_secret",
                &self.auth.jwt_secret,
                &defaults.auth.jwt_secret,
            ),
            known(
                "auth.admin_token",
                &self.auth.admin_token,
                &defaults.auth.admin_token,
            ),
            known(
                "waiting_room.pass_secret",
                &self.waiting_room.pass_secret,
                &defaults.waiting_room.pass_secret,
            ),
        ];
        if self.payments.enabled {
            secrets.push(known(
                "payments.webhook_secret",
                &self.payments.webhook_secret,
                &defaults.payments.webhook_secret,
            ));
            secrets.push(known(
                "payments.api_key",
                &self.payments.api_key,
                &defaults.payments.api_key,
            ));
        }
        secrets
    }
}

/// Shortest secret `serve` accepts, in bytes (256 bits).
pub const SECRET_BYTES_MIN: usize = 32;

/// One secret setting, for [`Settings::check_secrets`].
struct Secret<'a> {
    key: &'static str,
    value: &'a str,
    /// Owned: the defaults are parsed afresh for each check.
    default: String,
}

impl Secret<'_> {
    /// What is wrong with the secret, naming it as it was given (the variable the operator
    /// used, or the file), and how to set it; `None` when nothing is.
    fn problem(&self, sources: &Sources) -> Option<String> {
        let problem = if self.value == self.default {
            "is left at its public development default".to_owned()
        } else if self.value.len() < SECRET_BYTES_MIN {
            format!("is {} bytes long", self.value.len())
        } else {
            return None;
        };
        let key = self.key;
        Some(match sources.origin(key) {
            explain::Origin::Env(var) => format!("{key}, set by {var}, {problem}"),
            explain::Origin::File(path) => {
                format!("{key}, set in {}, {problem}", path.display())
            }
            explain::Origin::Default => {
                format!("{key} {problem}: {}", sources.how_to_set(key))
            }
        })
    }
}

/// The process's environment; a name or value that is not UTF-8 is read lossily, so it
/// is still checked (and refused when it is an unknown flashgate name).
fn env_vars() -> impl Iterator<Item = (String, String)> {
    std::env::vars_os().map(|(name, value)| {
        (
            name.to_string_lossy().into_owned(),
            value.to_string_lossy().into_owned(),
        )
    })
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

impl WaitingRoomSettings {
    /// The Ed25519 seeds of the settings (the first signs), or one derived from `pass_secret`.
    pub fn signing_seeds(&self) -> Result<Vec<[u8; 32]>, String> {
        if self.pass_signing_keys.is_empty() {
            use sha2::Digest;
            let mut digest = sha2::Sha256::new();
            digest.update(b"flashgate pass ed25519 seed\0");
            digest.update(self.pass_secret.as_bytes());
            return Ok(vec![digest.finalize().into()]);
        }
        use base64::Engine;
        self.pass_signing_keys
            .iter()
            .map(|seed| {
                let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
                    .decode(seed.trim())
                    .map_err(|e| e.to_string())?;
                <[u8; 32]>::try_from(bytes.as_slice()).map_err(|_| "not 32 bytes".to_owned())
            })
            .collect()
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

/// `--config` must name a readable file; a directory or a missing path is said as such.
fn check_config_file(path: &Path) -> Result<(), ConfigError> {
    let problem = match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => "is a directory, not a file".to_owned(),
        Ok(meta) if meta.is_file() => return Ok(()),
        Ok(_) => "is not a regular file".to_owned(),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => "does not exist".to_owned(),
        Err(error) => format!("cannot be read: {error}"),
    };
    Err(ConfigError::Invalid(format!(
        "--config {} {problem}",
        path.display()
    )))
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
    fn serve_refuses_default_and_short_secrets() {
        let mut settings = Settings::defaults();
        let error = settings.check_secrets().unwrap_err().to_string();
        assert!(error.contains("auth.jwt_secret") && error.contains("FLASHGATE_JWT_SECRET"));
        settings.auth.jwt_secret = "j".repeat(32);
        settings.auth.admin_token = "a".repeat(32);
        settings.waiting_room.pass_secret = "p".repeat(31);
        let error = settings.check_secrets().unwrap_err().to_string();
        assert!(
            error.contains("waiting_room.pass_secret is 31 bytes long"),
            "{error}"
        );
        settings.waiting_room.pass_secret = "p".repeat(32);
        settings.check_secrets().unwrap();
        settings.payments.enabled = true;
        let error = settings.check_secrets().unwrap_err().to_string();
        assert!(
            error.contains("FLASHGATE__PAYMENTS__WEBHOOK_SECRET"),
            "{error}"
        );
        settings.payments.webhook_secret = "w".repeat(32);
        let error = settings.check_secrets().unwrap_err().to_string();
        assert!(error.contains("payments.api_key"), "{error}");
        settings.payments.api_key = "k".repeat(32);
        settings.check_secrets().unwrap();
    }

    #[test]
    fn names_every_secret_at_its_default() {
        let mut settings = Settings::defaults();
        assert_eq!(
            settings.default_secrets(),
            [
                "auth.jwt_secret",
                "auth.admin_token",
                "waiting_room.pass_secret"
            ]
        );
        settings.auth.admin_token = "a".repeat(32);
        let error = settings.check_secrets().unwrap_err().to_string();
        assert!(
            error.contains("auth.jwt_secret is left")
                && error.contains("waiting_room.pass_secret is left")
                && !error.contains("auth.admin_token"),
            "{error}"
        );
        // A line of its own for each secret, after the one saying what is asked.
        let lines: Vec<&str> = error.lines().collect();
        assert_eq!(lines.len(), 3, "{error}");
        assert!(lines[1].trim_start().starts_with("auth.jwt_secret is left"));
        assert!(
            lines[2]
                .trim_start()
                .starts_with("waiting_room.pass_secret is left")
        );
    }

    #[test]
    fn rejects_bad_limits() {
        let mut settings = Settings::defaults();
        settings.soldout.refresh_interval_ms = 5000;
        assert!(settings.validate().is_err());
    }

    #[test]
    fn worker_threads_are_bounded() {
        let mut settings = Settings::defaults();
        settings.server.worker_threads = 1;
        settings.validate().unwrap();
        settings.server.worker_threads = WORKER_THREADS_MAX + 1;
        let error = settings.validate().unwrap_err().to_string();
        assert!(error.contains("server.worker_threads"), "{error}");
    }
}
