//! Deal changes announced to every instance.
//!
//! Each instance caches deal settings for `deals.cache_ttl_ms`, so a change made elsewhere
//! (another instance's admin API, the CLI) reaches it within that TTL at the latest. A
//! change that matters at once, such as pausing a sale, is also announced with
//! `pg_notify` in the transaction that makes it: PostgreSQL delivers the notification at
//! commit, and each instance's listener drops the deal from its cache. The TTL remains the
//! bound when a notification is lost (for instance while the listener reconnects; after a
//! reconnect the whole cache is dropped).

use std::time::Duration;

use sqlx::PgConnection;
use sqlx::postgres::{PgListener, PgPoolOptions};
use tokio_util::sync::CancellationToken;

use crate::store::StoreError;

/// The PostgreSQL channel deal ids are announced on.
pub const CHANNEL: &str = "flashgate_deal_changed";

/// How long the listener waits before trying again after PostgreSQL refused it, and how
/// long one connection attempt may take: the listener is back within about this much of
/// PostgreSQL coming back.
const RETRY_INTERVAL: Duration = Duration::from_secs(1);

/// Announces, when `tx` commits, that `deal_id` changed.
pub async fn announce(tx: &mut PgConnection, deal_id: &str) -> Result<(), StoreError> {
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(CHANNEL)
        .bind(deal_id)
        .execute(tx)
        .await?;
    Ok(())
}

/// What a listener tells its owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change<'a> {
    /// This deal changed.
    Deal(&'a str),
    /// Notifications may have been missed: forget every deal.
    Unknown,
}

/// Listens on its own connection to `database_url()` (asked again on every reconnect, so
/// it can follow a new primary) until `shutdown`, calling `on_change`
/// for every announcement. Connection failures are retried every second; each new
/// connection starts with [`Change::Unknown`].
pub async fn follow(
    database_url: impl Fn() -> String + Send,
    shutdown: CancellationToken,
    on_change: impl Fn(Change<'_>) + Send,
) {
    loop {
        let url = database_url();
        let listened = tokio::select! {
            () = shutdown.cancelled() => return,
            listened = listen(&url, &shutdown, &on_change) => listened,
        };
        if let Err(error) = listened {
            tracing::warn!(%error, "deal change listener lost PostgreSQL; retrying");
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(RETRY_INTERVAL) => {}
        }
    }
}

async fn listen(
    database_url: &str,
    shutdown: &CancellationToken,
    on_change: &impl Fn(Change<'_>),
) -> Result<(), sqlx::Error> {
    // The listener reconnects through a pool of one. Its connection attempts are bounded by
    // the retry interval: left at the pool's default, they back off for up to 6 s between
    // tries, and a listener would stay deaf that long after PostgreSQL came back.
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .max_lifetime(None)
        .idle_timeout(None)
        .acquire_timeout(RETRY_INTERVAL)
        .connect_lazy(database_url)?;
    let mut listener = PgListener::connect_with(&pool).await?;
    listener.listen(CHANNEL).await?;
    on_change(Change::Unknown);
    while !shutdown.is_cancelled() {
        match listener.try_recv().await? {
            Some(notification) => on_change(Change::Deal(notification.payload())),
            // The connection dropped and was re-established: anything may have been missed.
            None => on_change(Change::Unknown),
        }
    }
    Ok(())
}
