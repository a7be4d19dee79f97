//! Builds the whole gateway from `Settings`: pools, Redis, admission, background tasks and
//! the HTTP server. The only module that knows every other one.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::admission::Admission;
use crate::config::{Settings, millis};
use crate::http::{self, State};
use crate::ops;
use crate::orders::sweeper;
use crate::payments::http_provider::HttpProvider;
use crate::payments::{Payments, workers};
use crate::redis_link::RedisHandle;
use crate::store::{self, Pools, StoreError};
use crate::telemetry;

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("cannot listen on {0}: {1}")]
    Bind(SocketAddr, std::io::Error),
    #[error("payment provider client: {0}")]
    Provider(#[from] reqwest::Error),
}

/// A built, bound, not yet running gateway.
pub struct Application {
    listener: TcpListener,
    local_addr: SocketAddr,
    state: Arc<State>,
    shutdown: CancellationToken,
}

impl Application {
    /// Connects, migrates (when configured) and binds. Redis being down is not an error.
    pub async fn build(settings: Settings) -> Result<Self, AppError> {
        telemetry::prometheus();
        let settings = Arc::new(settings);
        if settings.database.migrate_on_start {
            store::migrate(&settings.database).await?;
        }
        let pools = Pools::new(&settings.database)?;
        let redis = RedisHandle::new(
            &settings.redis.url,
            &settings.redis.key_prefix,
            millis(settings.redis.command_timeout_ms),
        );
        redis.connect().await;
        let admission = Admission::new(&settings, redis.clone());
        let listen = settings.server.listen;
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|e| AppError::Bind(listen, e))?;
        let local_addr = listener
            .local_addr()
            .map_err(|e| AppError::Bind(listen, e))?;
        let payments = build_payments(&settings)?;
        let state = State::new(settings, pools, redis, admission, payments);
        Ok(Self {
            listener,
            local_addr,
            state,
            shutdown: CancellationToken::new(),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Cancel it to shut the gateway down gracefully.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// The pool for administrative work done before serving (the demo sale, say).
    pub fn admin_pool(&self) -> PgPool {
        self.state.pools.admin.clone()
    }

    /// Serves until the shutdown token is cancelled, then drains and stops every task.
    pub async fn run(self) -> Result<(), AppError> {
        // Background work keeps running while requests drain: a request finishing during
        // the drain may still need the sold-out mirror, and the sweeper stops last.
        let background = CancellationToken::new();
        let tasks = TaskTracker::new();
        spawn_background(&tasks, &self.state, &background);
        http::serve(self.listener, self.state, self.shutdown.clone()).await;
        background.cancel();
        tasks.close();
        tasks.wait().await;
        tracing::info!("stopped");
        Ok(())
    }
}

/// The payment provider client, when payments are enabled.
pub fn build_payments(settings: &Settings) -> Result<Option<Payments>, AppError> {
    if !settings.payments.enabled {
        return Ok(None);
    }
    let provider = HttpProvider::new(&settings.payments)?;
    Ok(Some(Payments::new(
        Arc::new(provider),
        settings.payments.clone(),
    )))
}

fn spawn_background(tasks: &TaskTracker, state: &Arc<State>, shutdown: &CancellationToken) {
    let settings = &state.settings;
    let background = state.pools.background.clone();
    tasks.spawn(state.redis.clone().keep_connected(
        millis(settings.redis.reconnect_interval_ms),
        shutdown.clone(),
    ));
    tasks.spawn(state.admission.sold_out().clone().keep_fresh(
        background.clone(),
        millis(settings.soldout.refresh_interval_ms),
        shutdown.clone(),
    ));
    let sold_out = state.admission.sold_out().clone();
    tasks.spawn(sweeper::run(
        background,
        millis(settings.sweeper.interval_ms),
        settings.sweeper.batch_max,
        shutdown.clone(),
        move |deals| {
            let sold_out = sold_out.clone();
            async move {
                for deal in deals {
                    sold_out.clear(&deal).await;
                }
            }
        },
    ));
    tasks.spawn(state.pools.primary.clone().keep_primary(
        state.pools.all(),
        millis(settings.database.primary_check_interval_ms),
        shutdown.clone(),
    ));
    tasks.spawn(sample_metrics(state.clone(), shutdown.clone()));
    tasks.spawn(forget_idle_limits(state.clone(), shutdown.clone()));
    tasks.spawn(
        state
            .admission
            .global_limits()
            .clone()
            .keep_counted(shutdown.clone()),
    );
    tasks.spawn(crate::waiting_room::advancer::run(
        state.admission.waiting_room().clone(),
        state.pools.background.clone(),
        shutdown.clone(),
    ));
    spawn_ops(tasks, state, shutdown);
    spawn_payments(tasks, state, shutdown);
}

/// The outbox worker, the provider check before unpaid orders expire, and the reconciler.
fn spawn_payments(tasks: &TaskTracker, state: &Arc<State>, shutdown: &CancellationToken) {
    let Some(payments) = state.payments.clone() else {
        return;
    };
    let settings = &state.settings;
    let pool = state.pools.background.clone();
    let clear = {
        let sold_out = state.admission.sold_out().clone();
        move |deals: Vec<String>| {
            let sold_out = sold_out.clone();
            async move {
                for deal in deals {
                    sold_out.clear(&deal).await;
                }
            }
        }
    };
    let (p, db) = (payments.clone(), pool.clone());
    tasks.spawn(workers::every(
        millis(settings.payments.outbox_interval_ms),
        shutdown.clone(),
        move || {
            let (p, db) = (p.clone(), db.clone());
            async move { p.drain_outbox(&db).await.map(|(_, deals)| deals) }
        },
        clear.clone(),
    ));
    let (p, db) = (payments.clone(), pool.clone());
    tasks.spawn(workers::every(
        millis(settings.sweeper.interval_ms),
        shutdown.clone(),
        move || {
            let (p, db) = (p.clone(), db.clone());
            async move { p.check_overdue(&db).await }
        },
        clear.clone(),
    ));
    let (p, db) = (payments, pool);
    tasks.spawn(workers::every(
        millis(settings.payments.reconcile_interval_ms),
        shutdown.clone(),
        move || {
            let (p, db) = (p.clone(), db.clone());
            async move { p.reconcile(&db).await.map(|_| Vec::new()) }
        },
        clear,
    ));
}

/// The invariant audit, and the listener that drops deals changed elsewhere from the cache.
fn spawn_ops(tasks: &TaskTracker, state: &Arc<State>, shutdown: &CancellationToken) {
    let settings = &state.settings;
    tasks.spawn(ops::audit::keep_auditing(
        state.pools.background.clone(),
        state.redis.clone(),
        ops::audit::Options::from_settings(settings),
        millis(settings.ops.audit_interval_ms),
        shutdown.clone(),
    ));
    let listening = state.clone();
    tasks.spawn(ops::changes::follow(
        {
            let direct = settings.database.direct_url.clone();
            let primary = state.pools.primary.clone();
            move || {
                if direct.is_empty() {
                    primary.url()
                } else {
                    direct.clone()
                }
            }
        },
        shutdown.clone(),
        move |change| match change {
            ops::changes::Change::Deal(id) => listening.admission.deals().evict(id),
            ops::changes::Change::Unknown => listening.admission.deals().clear(),
        },
    ));
}

/// Publishes pool occupancy and per-deal inventory gauges.
async fn sample_metrics(state: Arc<State>, shutdown: CancellationToken) {
    let interval = millis(state.settings.deals.metrics_interval_ms);
    loop {
        state.pools.record_metrics();
        if let Err(error) = record_inventory(&state.pools.background).await {
            tracing::debug!(%error, "inventory gauges not refreshed");
        }
        if state.payments.is_some()
            && let Err(error) = record_payment_backlog(&state.pools.background).await
        {
            tracing::debug!(%error, "payment gauges not refreshed");
        }
        if sleep_or_shutdown(interval, &shutdown).await {
            return;
        }
    }
}

/// Deals still on sale, or ended within the last day, get inventory gauges.
async fn record_inventory(pool: &PgPool) -> Result<(), StoreError> {
    let rows: Vec<(String, i64, i64, i64)> = sqlx::query_as(
        "SELECT b.deal_id, sum(b.available)::bigint, sum(b.reserved)::bigint, sum(b.sold)::bigint
           FROM inventory_buckets b JOIN deals d ON d.id = b.deal_id
          WHERE d.ends_at IS NULL OR d.ends_at > now() - interval '1 day'
          GROUP BY b.deal_id",
    )
    .fetch_all(pool)
    .await?;
    for (deal, available, reserved, sold) in rows {
        for (state, units) in [
            ("available", available),
            ("reserved", reserved),
            ("sold", sold),
        ] {
            metrics::gauge!(telemetry::INVENTORY_UNITS, "deal" => deal.clone(), "state" => state)
                .set(units as f64);
        }
    }
    Ok(())
}

/// Refunds waiting for the provider and side effects waiting in the outbox.
async fn record_payment_backlog(pool: &PgPool) -> Result<(), StoreError> {
    let refunds = crate::payments::refunds::pending(pool).await?;
    let outbox = crate::payments::outbox::backlog(pool).await?;
    metrics::gauge!(telemetry::REFUNDS_PENDING).set(refunds as f64);
    metrics::gauge!(telemetry::OUTBOX_BACKLOG).set(outbox as f64);
    Ok(())
}

async fn forget_idle_limits(state: Arc<State>, shutdown: CancellationToken) {
    let interval = millis(state.settings.limits.retain_interval_ms);
    while !sleep_or_shutdown(interval, &shutdown).await {
        state.admission.limits().forget_idle();
        state.admission.global_limits().forget_idle();
    }
}

/// Sleeps `interval`; true when shutdown came first.
async fn sleep_or_shutdown(interval: Duration, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        () = shutdown.cancelled() => true,
        () = tokio::time::sleep(interval) => false,
    }
}
