//! Several PostgreSQL hosts, one primary: writes always go to the host not in recovery.
//!
//! `database.url` may list hosts as libpq does (`postgres://u@h1:5432,h2:5433/db`), for a
//! primary and its standbys managed by a failover tool (pg_auto_failover). The pools dial
//! the host last seen as primary; `keep_primary` checks it every
//! `primary_check_interval_ms` and, when it is gone or in recovery, asks every host and
//! points the pools at the one that accepts writes. Connections opened before such a
//! change are closed rather than reused (a demoted primary still answers, read-only), and
//! a fresh connection that finds itself on a standby is refused (`target_session_attrs =
//! read-write`), so a request meets a 503 during a failover, never a wrong host.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, Connection, PgPool, Row};
use tokio_util::sync::CancellationToken;

use crate::clock::{elapsed_since, monotonic};

/// How long one probe of one host may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The single-host URLs of a libpq-style URL with a host list (one URL stays as it is).
pub fn split_hosts(url: &str) -> Vec<String> {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return vec![url.to_owned()];
    };
    let rest = &url[scheme_end..];
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let (userinfo, hosts) = match authority.rfind('@') {
        Some(at) => authority.split_at(at + 1),
        None => ("", authority),
    };
    hosts
        .split(',')
        .filter(|host| !host.is_empty())
        .map(|host| format!("{}{userinfo}{host}{tail}", &url[..scheme_end]))
        .collect()
}

/// The hosts, which of them is primary, and when that last changed.
pub struct Primary {
    urls: Vec<String>,
    options: Vec<PgConnectOptions>,
    current: AtomicUsize,
    /// Milliseconds after `epoch` of the last change of primary (0: none yet).
    changed_ms: AtomicU64,
    /// On tokio's clock ([`monotonic`]), so that tests can pause and advance it.
    epoch: Instant,
}

impl Primary {
    pub fn new(urls: Vec<String>, options: Vec<PgConnectOptions>) -> Arc<Self> {
        assert_eq!(urls.len(), options.len(), "one set of options per host");
        assert!(!urls.is_empty(), "at least one host");
        Arc::new(Self {
            urls,
            options,
            current: AtomicUsize::new(0),
            changed_ms: AtomicU64::new(0),
            epoch: monotonic(),
        })
    }

    pub fn several(&self) -> bool {
        self.urls.len() > 1
    }

    /// Options of the host currently believed primary.
    pub fn options(&self) -> PgConnectOptions {
        self.options[self.current.load(Ordering::Acquire)].clone()
    }

    /// URL of the host currently believed primary (for LISTEN).
    pub fn url(&self) -> String {
        self.urls[self.current.load(Ordering::Acquire)].clone()
    }

    /// True for a connection opened before the last change of primary: close it.
    pub fn is_stale(&self, age: Duration) -> bool {
        let changed = self.changed_ms.load(Ordering::Acquire);
        changed > 0
            && elapsed_since(self.epoch).saturating_sub(Duration::from_millis(changed)) < age
    }

    /// Checks the believed primary; when it fails, finds the host that accepts writes and
    /// points `pools` at it. Only runs with several hosts.
    pub async fn keep_primary(
        self: Arc<Self>,
        pools: Vec<PgPool>,
        interval: Duration,
        shutdown: CancellationToken,
    ) {
        if !self.several() {
            return;
        }
        loop {
            let current = self.current.load(Ordering::Acquire);
            if probe(&self.options[current]).await != Some(true) {
                self.find(&pools, current).await;
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(interval) => {}
            }
        }
    }

    async fn find(&self, pools: &[PgPool], current: usize) {
        for (index, options) in self.options.iter().enumerate() {
            if probe(options).await != Some(true) {
                continue;
            }
            if index != current {
                self.current.store(index, Ordering::Release);
                let now_ms =
                    u64::try_from(elapsed_since(self.epoch).as_millis()).unwrap_or(u64::MAX);
                self.changed_ms.store(now_ms.max(1), Ordering::Release);
                for pool in pools {
                    pool.set_connect_options(options.clone());
                }
                tracing::warn!(primary = %host_of(&self.urls[index]), "PostgreSQL primary changed");
            }
            return;
        }
        tracing::debug!("no PostgreSQL host accepts writes yet");
    }
}

/// `Some(true)` when the host answers and is not in recovery, `Some(false)` for a standby,
/// `None` when it cannot be reached.
async fn probe(options: &PgConnectOptions) -> Option<bool> {
    let check = async {
        let mut connection = options.connect().await.ok()?;
        let primary = accepts_writes(&mut connection).await.ok();
        let _ = connection.close().await;
        primary
    };
    tokio::time::timeout(PROBE_TIMEOUT, check)
        .await
        .ok()
        .flatten()
}

/// Whether this connection reached a primary. Asked as one simple query: behind a
/// transaction pooler, outside a transaction, a prepared statement and its execution may
/// reach different servers.
pub async fn accepts_writes(connection: &mut PgConnection) -> Result<bool, sqlx::Error> {
    let row = sqlx::raw_sql("SELECT pg_is_in_recovery()")
        .fetch_one(&mut *connection)
        .await?;
    let in_recovery: bool = row.try_get(0)?;
    Ok(!in_recovery)
}

/// `host:port` of a URL, for the log (never the credentials).
fn host_of(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, rest)| rest);
    rest.split(['/', '?']).next().unwrap_or(rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_a_host_list_into_urls() {
        assert_eq!(
            split_hosts("postgres://u:p@a:1,b:2/db?sslmode=disable"),
            [
                "postgres://u:p@a:1/db?sslmode=disable",
                "postgres://u:p@b:2/db?sslmode=disable"
            ]
        );
        assert_eq!(
            split_hosts("postgres://a:1,b:2"),
            ["postgres://a:1", "postgres://b:2"]
        );
        assert_eq!(split_hosts("postgres://u@h/db"), ["postgres://u@h/db"]);
    }

    #[tokio::test(start_paused = true)]
    async fn only_connections_older_than_a_change_are_stale() {
        let primary = Primary::new(
            vec!["postgres://a".into(), "postgres://b".into()],
            vec![PgConnectOptions::new(), PgConnectOptions::new()],
        );
        assert!(
            !primary.is_stale(Duration::from_secs(3600)),
            "no change yet"
        );
        tokio::time::advance(Duration::from_millis(20)).await;
        // The primary changed 10 ms after the epoch, 10 ms ago.
        primary.changed_ms.store(10, Ordering::Release);
        assert!(primary.is_stale(Duration::from_secs(3600)));
        assert!(primary.is_stale(Duration::from_millis(11)));
        assert!(!primary.is_stale(Duration::from_millis(10)));
        assert!(!primary.is_stale(Duration::from_millis(1)));
        assert_eq!(host_of("postgres://u:secret@h:5/db"), "h:5");
    }
}
