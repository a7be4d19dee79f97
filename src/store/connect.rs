//! Reaching PostgreSQL, and saying why not. A first connection that fails names the
//! setting it came from, where it points (never the password) and PostgreSQL's or the
//! network's own reason, so an operator sees "connection refused" or "database does not
//! exist" at once rather than a pool timeout seconds later.

use std::collections::HashSet;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, Connection, Executor};

use super::DatabaseSettings;
use super::primary;
use crate::settings::redact_url;

/// The setting a URL came from, with its environment variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UrlSetting {
    Url,
    DirectUrl,
}

impl std::fmt::Display for UrlSetting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Url => "database.url / DATABASE_URL",
            Self::DirectUrl => "database.direct_url / DATABASE_DIRECT_URL",
        })
    }
}

/// PostgreSQL could not be reached, or refused the connection.
#[derive(Debug, thiserror::Error)]
#[error("cannot connect to PostgreSQL at {url} (set by {setting}): {cause}{hint}")]
pub struct ConnectError {
    pub setting: UrlSetting,
    /// The URL without its password.
    pub url: String,
    pub cause: String,
    /// What to do about the two causes a new user meets first, empty for the others.
    hint: String,
}

impl ConnectError {
    pub(super) fn new(setting: UrlSetting, url: &str, cause: String) -> Self {
        Self {
            setting,
            hint: hint(url, &cause),
            url: redact_url(url),
            cause,
        }
    }
}

/// How to get past a refused connection (nothing listens: the service is down or the port
/// is wrong) or a database that does not exist yet; empty for every other cause.
fn hint(url: &str, cause: &str) -> String {
    if cause.contains("Connection refused") {
        return "; is PostgreSQL running there? On a development machine \
                `scripts/services.sh` installs and starts it (and Redis) on 127.0.0.1:5432"
            .to_owned();
    }
    if !cause.contains("SQLSTATE 3D000") {
        return String::new();
    }
    let Ok(options) = url.parse::<PgConnectOptions>() else {
        return String::new();
    };
    let name = options.get_database().unwrap_or("flashgate");
    format!(
        "; create it first: createdb -h {} -p {} -U {} {name} \
         (the gateway applies its migrations at start; `flashgate migrate` applies them alone)",
        options.get_host(),
        options.get_port(),
        options.get_username(),
    )
}

/// The reason in PostgreSQL's or the system's words, without sqlx's wrapping (a server
/// error's source line, say).
pub fn cause(error: &sqlx::Error) -> String {
    match error {
        sqlx::Error::Database(db) => match db.code() {
            Some(code) => format!("{} (SQLSTATE {code})", db.message()),
            None => db.message().to_owned(),
        },
        sqlx::Error::Io(io) => io.to_string(),
        sqlx::Error::Tls(tls) => format!("TLS: {tls}"),
        sqlx::Error::Configuration(config) => format!("the URL is not usable: {config}"),
        other => other.to_string(),
    }
}

/// Opens one connection to the host of `url` (one of its hosts, for a host list) that
/// accepts writes, trying each within `timeout`.
pub(super) async fn connect_primary(
    setting: UrlSetting,
    url: &str,
    hosts: &[(String, PgConnectOptions)],
    timeout: Duration,
) -> Result<PgConnection, ConnectError> {
    let mut failures = Vec::new();
    for (host_url, options) in hosts {
        let failure = match tokio::time::timeout(timeout, options.connect()).await {
            Ok(Ok(mut connection)) => match primary::accepts_writes(&mut connection).await {
                Ok(true) => return Ok(connection),
                Ok(false) => "a standby (in recovery), not the primary".to_owned(),
                Err(error) => cause(&error),
            },
            Ok(Err(error)) => cause(&error),
            Err(_) => format!("no answer within {} s", timeout.as_secs_f64()),
        };
        failures.push(if hosts.len() > 1 {
            format!("{}: {failure}", redact_url(host_url))
        } else {
            failure
        });
    }
    Err(ConnectError::new(setting, url, failures.join("; ")))
}

/// One connection, closed again: proves the URL works before a command relies on lazily
/// connecting pools, whose own failure would only be a timeout.
pub(super) async fn probe(
    settings: &DatabaseSettings,
    hosts: &[(String, PgConnectOptions)],
) -> Result<(), ConnectError> {
    let timeout = Duration::from_millis(settings.admin_acquire_timeout_ms);
    let connection = connect_primary(UrlSetting::Url, &settings.url, hosts, timeout).await?;
    let _ = connection.close().await;
    Ok(())
}

/// A migration that was pending and is now applied.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AppliedMigration {
    pub version: i64,
    pub description: String,
}

/// Runs the pending migrations on `connection`; returns the ones it applied. The
/// connection only reports warnings and worse: sqlx creates its bookkeeping table with
/// `IF NOT EXISTS`, whose notice on every start says nothing.
pub(super) async fn run_migrations(
    connection: &mut PgConnection,
) -> Result<Vec<AppliedMigration>, sqlx::migrate::MigrateError> {
    connection
        .execute("SET client_min_messages = warning")
        .await?;
    let before = applied_versions(connection).await?;
    let migrator = super::migrations::migrator();
    migrator.run(&mut *connection).await?;
    Ok(migrator
        .iter()
        .filter(|m| !m.migration_type.is_down_migration() && !before.contains(&m.version))
        .map(|m| AppliedMigration {
            version: m.version,
            description: m.description.to_string(),
        })
        .collect())
}

async fn applied_versions(connection: &mut PgConnection) -> Result<HashSet<i64>, sqlx::Error> {
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
        .fetch_one(&mut *connection)
        .await?;
    if !exists {
        return Ok(HashSet::new());
    }
    let versions: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
            .fetch_all(&mut *connection)
            .await?;
    Ok(versions.into_iter().collect())
}
