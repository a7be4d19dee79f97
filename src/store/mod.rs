//! PostgreSQL plumbing shared by every domain module: the two pools, migrations, and the
//! classification of database errors into what callers can act on.
//!
//! Separate pools keep sale traffic from starving the work that keeps the system correct:
//! user requests share `request`; the sweeper, the sold-out mirror and the metrics sampler
//! use `background`; operators get `admin`, usable in the middle of a sale storm.
//!
//! Behind PgBouncer in transaction mode (`transaction_pooler`) every checkout is one
//! transaction, see `pooler`; migrations and LISTEN then use `direct_url`. A single write
//! issued straight on a pool goes through [`Writes`], so that it is committed before its
//! caller answers.

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgPool};

use crate::telemetry;

mod connect;
pub mod failover;
mod migrations;
mod pooler;
pub mod primary;
pub mod rows;
mod settings;
mod writes;

pub use connect::{AppliedMigration, ConnectError, UrlSetting};
pub use migrations::migrator;
pub use settings::DatabaseSettings;
pub use writes::{WriteConnection, Writes};

use std::sync::Arc;

use primary::Primary;

/// SQL errors as the callers see them. Cheap to clone (the error is shared), so that every
/// request of a failed batch gets the batch's own error, not a rewording of it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// No connection was free within the acquire timeout: shed load, do not queue.
    #[error("database pool exhausted")]
    PoolExhausted,
    /// A deadlock or serialization failure; the transaction may simply be retried.
    #[error("transient conflict: {0}")]
    Retryable(Arc<sqlx::Error>),
    /// The primary is read-only, shutting down or unreachable: a failover (see [`failover`]).
    #[error("PostgreSQL unavailable: {0}")]
    Unavailable(Arc<sqlx::Error>),
    /// A value the database cannot store (a NUL in a text or JSON string): bad input that
    /// got past validation, refused as such rather than blamed on the database.
    #[error("a value holds a character the database cannot store")]
    Unstorable(Arc<sqlx::Error>),
    #[error("database error: {0}")]
    Unexpected(Arc<sqlx::Error>),
}

impl From<sqlx::Error> for StoreError {
    fn from(error: sqlx::Error) -> Self {
        match &error {
            sqlx::Error::PoolTimedOut => {
                metrics::counter!(telemetry::DB_POOL_TIMEOUTS).increment(1);
                Self::PoolExhausted
            }
            sqlx::Error::Database(db)
                if matches!(db.code().as_deref(), Some("40P01" | "40001")) =>
            {
                Self::Retryable(Arc::new(error))
            }
            // untranslatable_character, character_not_in_repertoire
            sqlx::Error::Database(db)
                if matches!(db.code().as_deref(), Some("22P05" | "22021")) =>
            {
                Self::Unstorable(Arc::new(error))
            }
            _ if failover::is_failover(&error) => Self::Unavailable(Arc::new(error)),
            _ => Self::Unexpected(Arc::new(error)),
        }
    }
}

/// Connection options shared by every pool and the migration connection.
fn connect_options(
    settings: &DatabaseSettings,
    url: &str,
) -> Result<PgConnectOptions, sqlx::Error> {
    let options = url
        .parse::<PgConnectOptions>()?
        .application_name("flashgate")
        .disable_statement_logging();
    if settings.transaction_pooler {
        // The pooler drops startup options; the timeout is set per transaction instead.
        return Ok(pooler::options(options));
    }
    Ok(options.options([(
        "statement_timeout",
        settings.statement_timeout_ms.to_string(),
    )]))
}

/// The connection options of each host of `url`; a URL sqlx cannot use is reported
/// naming `setting`.
fn host_options(
    settings: &DatabaseSettings,
    setting: UrlSetting,
    url: &str,
) -> Result<Vec<(String, PgConnectOptions)>, ConnectError> {
    primary::split_hosts(url)
        .into_iter()
        .map(|host_url| {
            let options = connect_options(settings, &host_url)
                .map_err(|error| ConnectError::new(setting, url, connect::cause(&error)))?;
            Ok((host_url, options))
        })
        .collect()
}

/// Whether every host `database.url` names is this machine (loopback or a Unix socket): the
/// gateway then shares its cores with PostgreSQL (or its pooler), and leaves one of them to it.
pub fn database_on_this_machine(settings: &DatabaseSettings) -> bool {
    primary::split_hosts(&settings.url).iter().all(|url| {
        url.parse::<PgConnectOptions>()
            .is_ok_and(|options| is_this_machine(options.get_host()))
    })
}

fn is_this_machine(host: &str) -> bool {
    host.starts_with('/')
        || host.eq_ignore_ascii_case("localhost")
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Where migrations and LISTEN connect: past a transaction pooler when one is configured.
pub fn direct_url(settings: &DatabaseSettings) -> &str {
    if settings.direct_url.is_empty() {
        &settings.url
    } else {
        &settings.direct_url
    }
}

#[derive(Clone)]
pub struct Pools {
    /// Serves user requests; exhausted means 503.
    pub request: PgPool,
    /// Background tasks; never used by sale traffic.
    pub background: PgPool,
    /// The admin API and CLI; waits longer for a connection rather than failing fast.
    pub admin: PgPool,
    /// Payment webhooks: confirming money must not queue behind a sale storm.
    pub webhook: PgPool,
    /// The event sequencer and deliveries: a dead receiver holds these, never the sale's.
    pub events: PgPool,
    /// Which of the configured hosts is primary.
    pub primary: Arc<Primary>,
}

/// One pool's options, with the hooks that keep it on the primary and, behind a
/// transaction pooler, make each checkout one transaction.
fn pool_options(
    settings: &DatabaseSettings,
    primary: &Arc<Primary>,
    max: u32,
    acquire_timeout_ms: u64,
) -> PgPoolOptions {
    let pooled = settings.transaction_pooler;
    let timeout_ms = settings.statement_timeout_ms;
    let several = primary.several();
    let (on_acquire, on_release) = (primary.clone(), primary.clone());
    PgPoolOptions::new()
        .max_connections(max)
        .min_connections(0)
        .acquire_timeout(Duration::from_millis(acquire_timeout_ms))
        .test_before_acquire(false)
        .after_connect(move |conn, _| {
            Box::pin(async move {
                // target_session_attrs=read-write: a standby is never written to.
                if several && !primary::accepts_writes(conn).await? {
                    return Err(sqlx::Error::Protocol(
                        "connected to a standby while looking for the primary".into(),
                    ));
                }
                if pooled {
                    pooler::begin(conn, timeout_ms).await?;
                }
                Ok(())
            })
        })
        .before_acquire(move |conn, meta| {
            let stale = on_acquire.is_stale(meta.age);
            Box::pin(async move {
                if stale {
                    return Ok(false);
                }
                if pooled {
                    pooler::begin(conn, timeout_ms).await?;
                }
                Ok(true)
            })
        })
        .after_release(move |conn, meta| {
            let stale = on_release.is_stale(meta.age);
            Box::pin(async move {
                if pooled {
                    pooler::commit(conn).await?;
                }
                Ok(!stale)
            })
        })
}

impl Pools {
    /// Lazily connecting pools: nothing is dialled until first use.
    pub fn new(settings: &DatabaseSettings) -> Result<Self, ConnectError> {
        let (urls, options) = host_options(settings, UrlSetting::Url, &settings.url)?
            .into_iter()
            .unzip();
        let primary = Primary::new(urls, options);
        failover::set_log_interval(Duration::from_millis(settings.failover_log_interval_ms));
        let pool = |max: u32, acquire_timeout_ms: u64| {
            pool_options(settings, &primary, max, acquire_timeout_ms)
                .connect_lazy_with(primary.options())
        };
        Ok(Self {
            request: pool(
                settings.request_pool_size(crate::settings::cores()),
                settings.acquire_timeout_ms,
            ),
            background: pool(settings.background_pool_max, settings.acquire_timeout_ms),
            admin: pool(settings.admin_pool_max, settings.admin_acquire_timeout_ms),
            webhook: pool(settings.webhook_pool_max, settings.admin_acquire_timeout_ms),
            events: pool(settings.events_pool_max, settings.admin_acquire_timeout_ms),
            primary,
        })
    }

    /// As [`Pools::new`], after one connection proved PostgreSQL reachable: for commands
    /// that need the database at once and should say why it is not there.
    pub async fn connect(settings: &DatabaseSettings) -> Result<Self, ConnectError> {
        let hosts = host_options(settings, UrlSetting::Url, &settings.url)?;
        connect::probe(settings, &hosts).await?;
        Self::new(settings)
    }

    /// Every pool, for following the primary.
    pub fn all(&self) -> Vec<PgPool> {
        vec![
            self.request.clone(),
            self.background.clone(),
            self.admin.clone(),
            self.webhook.clone(),
            self.events.clone(),
        ]
    }

    /// Publishes pool occupancy; called by the metrics sampler.
    pub fn record_metrics(&self) {
        let pools = [
            ("request", &self.request),
            ("background", &self.background),
            ("admin", &self.admin),
            ("webhook", &self.webhook),
            ("events", &self.events),
        ];
        for (name, pool) in pools {
            let size = pool.size() as f64;
            let idle = pool.num_idle() as f64;
            metrics::gauge!(telemetry::DB_POOL_CONNECTIONS, "pool" => name, "state" => "idle")
                .set(idle);
            metrics::gauge!(telemetry::DB_POOL_CONNECTIONS, "pool" => name, "state" => "in_use")
                .set(size - idle);
        }
    }
}

/// How long start-up waits for PostgreSQL to accept the migration connection.
const MIGRATION_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why migrations did not run.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error("applying migrations: {0}")]
    Apply(#[from] sqlx::migrate::MigrateError),
}

/// Applies pending migrations on a dedicated connection and returns the ones applied.
/// sqlx holds a PostgreSQL advisory lock while migrating, so instances that start
/// together apply each migration once.
pub async fn migrate(settings: &DatabaseSettings) -> Result<Vec<AppliedMigration>, MigrateError> {
    let direct = DatabaseSettings {
        transaction_pooler: false,
        ..settings.clone()
    };
    let setting = if settings.direct_url.is_empty() {
        UrlSetting::Url
    } else {
        UrlSetting::DirectUrl
    };
    let url = direct_url(settings);
    let hosts = host_options(&direct, setting, url)?;
    let mut connection =
        connect::connect_primary(setting, url, &hosts, MIGRATION_CONNECT_TIMEOUT).await?;
    Ok(connect::run_migrations(&mut connection).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_and_sockets_are_this_machine_and_other_hosts_are_not() {
        let mut settings = crate::config::Settings::defaults().database;
        for (url, here) in [
            ("postgres://u@127.0.0.1:5432/db", true),
            ("postgres://u@localhost/db", true),
            ("postgres://u@[::1]:5432/db", true),
            ("postgres://u@127.0.0.1:5432,localhost:5433/db", true),
            ("postgres://u@db.internal:5432/db", false),
            ("postgres://u@10.0.0.7:5432/db", false),
            ("postgres://u@127.0.0.1:5432,10.0.0.7:5432/db", false),
        ] {
            settings.url = url.to_owned();
            assert_eq!(database_on_this_machine(&settings), here, "{url}");
        }
    }
}
