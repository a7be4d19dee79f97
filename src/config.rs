//! Settings: one typed tree, loaded in layers.
//!
//! Each module declares its own section (fields with their units, its limits and their
//! check) in a `settings.rs` beside its code; this module assembles the sections into one
//! tree, checks the relationships between them and names a bad setting as it was given.
//!
//! `config/default.toml` is compiled in and carries every default, so there is exactly one
//! place a default lives. A `--config` file and environment variables override it. Every
//! limit is validated at start-up; a bad configuration stops the process before it binds.
//! [`env`] holds the environment's names for the settings; [`explain`] tells where each
//! effective value came from (`flashgate config`).

use std::path::Path;
use std::time::Duration;

use figment::Figment;
use figment::providers::{Format, Serialized, Toml};
use serde::Deserialize;

use crate::admission::{AdmissionSettings, AuthSettings, LimitSettings, SoldOutSettings};
use crate::deals::DealSettings;
use crate::events::EventSettings;
use crate::http::{HandlerSettings, ServerSettings};
use crate::ops::OpsSettings;
use crate::ops::audit;
use crate::ops::cli::CliSettings;
use crate::orders::lanes::LaneSettings;
use crate::orders::{OrderSettings, SweeperSettings};
use crate::payments::PaymentSettings;
use crate::redis_link::RedisSettings;
use crate::settings::require;
use crate::store::DatabaseSettings;
use crate::telemetry::TelemetrySettings;
use crate::waiting_room::WaitingRoomSettings;

pub mod env;
pub mod explain;
mod sources;
mod urls;

use explain::Effective;
pub use sources::Sources;

/// The defaults, shipped inside the binary.
pub const DEFAULT_TOML: &str = include_str!("../config/default.toml");

/// A configuration that cannot be used; the message names the setting as it was given
/// (environment variable, or key and file) and what is wrong with it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// Every section, each of the type its module declares.
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
    pub events: EventSettings,
    /// Where each value came from, so later messages name the setting as it was given.
    #[serde(skip)]
    pub sources: Sources,
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

    /// Checks every section's limits, then the relationships between sections.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_sections().map_err(ConfigError::Invalid)
    }

    /// Each section by its own module's check, then the limits across sections.
    fn validate_sections(&self) -> Result<(), String> {
        self.server.validate()?;
        self.database.validate()?;
        self.redis.validate()?;
        self.auth.validate()?;
        self.limits.validate()?;
        self.orders.validate()?;
        self.deals.validate()?;
        self.payments.validate()?;
        self.waiting_room.validate()?;
        self.sweeper.validate()?;
        self.soldout.validate()?;
        self.ops.validate()?;
        self.telemetry.validate()?;
        self.events.validate()?;
        self.validate_across()
    }

    /// The limits one section sets for another.
    fn validate_across(&self) -> Result<(), String> {
        let request_timeout_ms = self.server.request_timeout_ms;
        require(
            self.database.acquire_timeout_ms < request_timeout_ms,
            "database.acquire_timeout_ms must be below server.request_timeout_ms",
        )?;
        let cores = crate::settings::cores();
        require(
            self.orders.lanes < self.database.request_pool_size(cores) as usize,
            "orders.lanes must be below database.request_pool_max, so reads still get connections",
        )?;
        let p = &self.payments;
        require(
            p.request_timeout_ms * u64::from(p.retries_max + 1) < request_timeout_ms,
            "payments.request_timeout_ms × (retries_max + 1) must fit in server.request_timeout_ms",
        )
    }

    /// The order engine's batching, its lanes chosen with the request pool they draw on.
    pub fn lanes(&self) -> LaneSettings {
        let cores = crate::settings::cores();
        let pool = self.database.request_pool_size(cores);
        let lanes = self.orders.lanes_for(cores, pool);
        self.orders.lanes(lanes, self.database.transaction_pooler)
    }

    /// The sections admission is built from.
    pub fn admission(&self) -> AdmissionSettings<'_> {
        AdmissionSettings {
            trusted_proxies: &self.server.trusted_proxies,
            auth: &self.auth,
            limits: &self.limits,
            soldout: &self.soldout,
            deals: &self.deals,
            waiting_room: &self.waiting_room,
        }
    }

    /// The sections the HTTP handlers read.
    pub fn handlers(&self) -> HandlerSettings {
        HandlerSettings {
            server: self.server.clone(),
            auth: self.auth.clone(),
            orders: self.orders.clone(),
            waiting_room: self.waiting_room.clone(),
            audit: self.audit(),
            telemetry: self.telemetry.clone(),
            events: self.events.clone(),
        }
    }

    /// What the operator commands reach.
    pub fn cli(&self) -> CliSettings {
        CliSettings {
            database: self.database.clone(),
            redis: self.redis.clone(),
            waiting_room: self.waiting_room.clone(),
            audit: self.audit(),
            events: self.events.clone(),
        }
    }

    /// How the invariant audit runs: its own section, and the sold-out flags' refresh.
    pub fn audit(&self) -> audit::Options {
        let flag_refresh = Duration::from_millis(self.soldout.refresh_interval_ms);
        audit::Options::from_settings(&self.ops, flag_refresh)
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
    fn the_default_configuration_names_the_default_issuer_and_audience() {
        let settings = Settings::defaults();
        assert_eq!(
            settings.auth.jwt_issuer,
            crate::admission::token::DEFAULT_ISSUER
        );
        assert_eq!(
            settings.auth.jwt_audience,
            crate::admission::token::DEFAULT_AUDIENCE
        );
    }

    #[test]
    fn rejects_bad_limits() {
        let mut settings = Settings::defaults();
        settings.soldout.refresh_interval_ms = 5000;
        assert!(settings.validate().is_err());
    }

    #[test]
    fn settings_left_to_zero_follow_the_cores() {
        let settings = Settings::defaults();
        let (server, database, orders) = (&settings.server, &settings.database, &settings.orders);
        let chosen = |cores| {
            let pool = database.request_pool_size(cores);
            (
                server.runtime_threads(cores, true),
                pool,
                orders.lanes_for(cores, pool),
            )
        };
        assert_eq!(chosen(1), (1, 16, 4));
        assert_eq!(chosen(2), (1, 16, 4));
        assert_eq!(chosen(4), (3, 32, 8));
        assert_eq!(chosen(64), (63, 64, 16));
        assert_eq!(server.runtime_threads(2, false), 2, "every core when alone");
    }

    #[test]
    fn settings_given_win_over_the_cores() {
        let mut settings = Settings::defaults();
        settings.server.worker_threads = 2;
        settings.database.request_pool_max = 3;
        settings.orders.lanes = 2;
        assert_eq!(settings.server.runtime_threads(8, true), 2);
        assert_eq!(settings.database.request_pool_size(8), 3);
        assert_eq!(settings.orders.lanes_for(8, 3), 2);
        settings.orders.lanes = 0;
        assert_eq!(
            settings.orders.lanes_for(8, 3),
            2,
            "chosen lanes stay below the pool"
        );
    }

    #[test]
    fn worker_threads_are_bounded() {
        let mut settings = Settings::defaults();
        settings.server.worker_threads = 1;
        settings.validate().unwrap();
        settings.server.worker_threads = crate::http::WORKER_THREADS_MAX + 1;
        let error = settings.validate().unwrap_err().to_string();
        assert!(error.contains("server.worker_threads"), "{error}");
    }
}
