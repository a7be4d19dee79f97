//! Builds the whole gateway from `Settings`: pools, Redis, admission, background tasks and
//! the HTTP server. The only module that knows every other one.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::admission::Admission;
use crate::admission::oidc::OidcVerifier;
use crate::admission::soldout::RefreshPace;
use crate::clock::Clock;
use crate::config::Settings;
use crate::deals::DealSettings;
use crate::http::{self, State};
use crate::inventory::{self, StockChange, StockEvents};
use crate::ops;
use crate::orders::sweeper;
use crate::payments::http_provider::HttpProvider;
use crate::payments::{Payments, workers};
use crate::redis_link::RedisHandle;
use crate::store::{self, Pools, StoreError, Writes};
use crate::telemetry;

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Connect(#[from] store::ConnectError),
    #[error(transparent)]
    Migrate(#[from] store::MigrateError),
    #[error(
        "cannot listen on {addr} for the {} (set by {}): {source}",
        listener.name(),
        listener.setting()
    )]
    Bind {
        listener: Listener,
        addr: SocketAddr,
        source: std::io::Error,
    },
    /// The identity provider's keys could not be read; the message names the setting.
    #[error("{0}")]
    Identity(String),
    #[error("payment provider client: {0}")]
    Provider(#[from] crate::payments::http_provider::ClientError),
}

/// The two listeners, for naming the one that cannot be bound.
#[derive(Clone, Copy, Debug)]
pub enum Listener {
    Public,
    Ops,
}

impl Listener {
    fn name(self) -> &'static str {
        match self {
            Self::Public => "public listener",
            Self::Ops => "operations listener",
        }
    }

    /// The setting with its environment variables, as the operator may have set it.
    fn setting(self) -> &'static str {
        match self {
            Self::Public => "server.listen / FLASHGATE__SERVER__LISTEN or FLASHGATE_LISTEN",
            Self::Ops => {
                "server.ops_listen / FLASHGATE__SERVER__OPS_LISTEN or FLASHGATE_OPS_LISTEN"
            }
        }
    }
}

/// A built, bound, not yet running gateway.
pub struct Application {
    listeners: http::Listeners,
    local_addr: SocketAddr,
    ops_addr: SocketAddr,
    settings: Settings,
    state: Arc<State>,
    shutdown: CancellationToken,
}

impl Application {
    /// Binds, then connects and migrates (when configured). Redis being down is not an
    /// error. Both ports are taken first, so a port in use is said before anything is dialled.
    pub async fn build(settings: Settings) -> Result<Self, AppError> {
        Self::build_on(settings, Clock::system()).await
    }

    /// As `build`, with every time-dependent rule on `clock` (a test's manual clock).
    pub async fn build_on(settings: Settings, clock: Clock) -> Result<Self, AppError> {
        let (public, local_addr) = bind(Listener::Public, settings.server.listen).await?;
        let (ops, ops_addr) = bind(Listener::Ops, settings.server.ops_listen).await?;
        telemetry::prometheus();
        record_capacity(&settings);
        crate::waiting_room::challenge::export_zeroes();
        crate::waiting_room::busy::export_zeroes();
        crate::payments::export_zeroes();
        crate::events::export_zeroes();
        if settings.database.migrate_on_start {
            let applied = store::migrate(&settings.database).await?;
            for migration in &applied {
                tracing::info!(
                    version = migration.version,
                    description = %migration.description,
                    "migration applied"
                );
            }
        }
        let pools = Pools::new(&settings.database)?;
        let redis = RedisHandle::from_settings(&settings.redis);
        redis.connect().await;
        let provider = identity_provider(&settings, &clock).await?;
        let admission =
            Admission::new(settings.admission(), redis.clone(), clock.clone(), provider);
        // Counted once before serving, so that users' budgets are split by a real count of
        // the instances from the first request.
        admission.global_limits().heartbeat().await;
        let payments = build_payments(&settings, &clock)?;
        let stock_events = subscribe_stock_events(&admission, &pools);
        let state = State::new(
            settings.handlers(),
            settings.lanes(),
            pools,
            redis,
            admission,
            payments,
            stock_events,
        );
        Ok(Self {
            listeners: http::Listeners { public, ops },
            local_addr,
            ops_addr,
            settings,
            state,
            shutdown: CancellationToken::new(),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Where `/metrics` and the admin API are served.
    pub fn ops_addr(&self) -> SocketAddr {
        self.ops_addr
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
        spawn_background(&tasks, &self.state, &self.settings, &background);
        let tasks_stop = Duration::from_millis(self.settings.server.tasks_stop_ms);
        http::serve(self.listeners, self.state, self.shutdown.clone()).await;
        background.cancel();
        tasks.close();
        if tokio::time::timeout(tasks_stop, tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                still_running = tasks.len(),
                ?tasks_stop,
                "background tasks did not stop in time; exiting without them"
            );
        }
        tracing::info!("stopped");
        Ok(())
    }
}

/// The OpenID Connect provider's verifier with its keys read, when `[auth.oidc]` names one.
async fn identity_provider(
    settings: &Settings,
    clock: &Clock,
) -> Result<Option<Arc<OidcVerifier>>, AppError> {
    let auth = &settings.auth;
    if !auth.oidc.enabled() {
        return Ok(None);
    }
    let clock = clock.clone();
    OidcVerifier::start(
        &auth.oidc,
        auth.jwt_leeway_seconds,
        auth.user_id_bytes_max,
        clock,
    )
    .await
    .map(Some)
    .map_err(AppError::Identity)
}

/// What this instance runs with, for operators and the load scripts: the figures chosen from
/// the cores when the settings leave them to 0.
fn record_capacity(settings: &Settings) {
    let workers = tokio::runtime::Handle::current().metrics().num_workers();
    let pool = settings
        .database
        .request_pool_size(crate::settings::cores());
    let lanes = settings.lanes().lanes;
    for (of, value) in [
        ("runtime_workers", workers as f64),
        ("request_pool_connections", f64::from(pool)),
        ("lanes", lanes as f64),
    ] {
        metrics::gauge!(telemetry::CAPACITY, "of" => of).set(value);
    }
}

async fn bind(listener: Listener, addr: SocketAddr) -> Result<(TcpListener, SocketAddr), AppError> {
    let failed = |source| AppError::Bind {
        listener,
        addr,
        source,
    };
    let bound = TcpListener::bind(addr).await.map_err(failed)?;
    let local = bound.local_addr().map_err(failed)?;
    Ok((bound, local))
}

/// The payment provider client, when payments are enabled.
pub fn build_payments(settings: &Settings, clock: &Clock) -> Result<Option<Payments>, AppError> {
    if !settings.payments.enabled {
        return Ok(None);
    }
    let provider = HttpProvider::new(&settings.payments, clock.clone())?;
    Ok(Some(Payments::new(
        Arc::new(provider),
        settings.payments.clone(),
        Writes::new(&settings.database),
        clock.clone(),
    )))
}

/// The one handler of stock changes: the sold-out mirror follows them, and the waiting room
/// (which reads stock through the mirror and inventory totals) sees them from there.
fn subscribe_stock_events(admission: &Admission, pools: &Pools) -> StockEvents {
    let events = StockEvents::default();
    let sold_out = admission.sold_out().clone();
    let pool = pools.background.clone();
    events.subscribe(move |change| {
        let (sold_out, pool) = (sold_out.clone(), pool.clone());
        async move {
            match change {
                StockChange::Freed(deal) => sold_out.clear(&deal).await,
                StockChange::RanOut(deal) => sold_out.mark(&pool, &deal).await,
            }
        }
    });
    events
}

fn spawn_background(
    tasks: &TaskTracker,
    state: &Arc<State>,
    settings: &Settings,
    shutdown: &CancellationToken,
) {
    let background = state.pools.background.clone();
    if let Some(provider) = state.admission.provider() {
        tasks.spawn(provider.clone().keep_fresh(shutdown.clone()));
    }
    tasks.spawn(state.redis.clone().keep_connected(
        Duration::from_millis(settings.redis.reconnect_interval_ms),
        shutdown.clone(),
    ));
    tasks.spawn(state.redis.clone().keep_probed(
        Duration::from_millis(settings.redis.health_check_interval_ms),
        shutdown.clone(),
    ));
    let pace = RefreshPace {
        interval: Duration::from_millis(settings.soldout.refresh_interval_ms),
        heard_gap: Duration::from_millis(settings.soldout.heard_refresh_gap_ms),
        reconnect: Duration::from_millis(settings.redis.reconnect_interval_ms),
    };
    tasks.spawn(state.admission.sold_out().clone().keep_fresh(
        background.clone(),
        pace,
        shutdown.clone(),
    ));
    tasks.spawn(sweeper::run(
        background,
        Duration::from_millis(settings.sweeper.interval_ms),
        settings.sweeper.batch_max,
        Duration::from_secs(u64::from(settings.payments.expiry_grace_seconds)),
        shutdown.clone(),
        state.sale.stock_events().freed_reporter(),
    ));
    tasks.spawn(state.pools.primary.clone().keep_primary(
        state.pools.all(),
        Duration::from_millis(settings.database.primary_check_interval_ms),
        shutdown.clone(),
    ));
    tasks.spawn(sample_metrics(
        state.clone(),
        settings.deals.clone(),
        shutdown.clone(),
    ));
    tasks.spawn(forget_idle_limits(
        state.clone(),
        Duration::from_millis(settings.limits.retain_interval_ms),
        shutdown.clone(),
    ));
    let global_limits = state.admission.global_limits();
    tasks.spawn(global_limits.clone().keep_counted(shutdown.clone()));
    tasks.spawn(
        global_limits
            .clone()
            .keep_returning_lapsed(shutdown.clone()),
    );
    tasks.spawn(crate::waiting_room::advancer::run(
        state.admission.waiting_room().clone(),
        state.pools.background.clone(),
        shutdown.clone(),
    ));
    tasks.spawn(crate::waiting_room::report::keep_paid_counted(
        state.pools.background.clone(),
        Duration::from_millis(settings.waiting_room.paid_sample_interval_ms),
        settings.deals.metrics_retain_seconds,
        shutdown.clone(),
    ));
    tasks.spawn(crate::waiting_room::health::run(
        state.admission.waiting_room().clone(),
        shutdown.clone(),
    ));
    tasks.spawn(crate::waiting_room::revocation::follow(
        state.admission.waiting_room().clone(),
        shutdown.clone(),
    ));
    spawn_ops(tasks, state, settings, shutdown);
    spawn_payments(tasks, state, settings, shutdown);
    if settings.events.enabled {
        tasks.spawn(crate::events::runner::run(
            state.pools.events.clone(),
            state.tracer.clone(),
            state.clock.clone(),
            store::direct_url(&settings.database).to_owned(),
            settings.events.clone(),
            shutdown.clone(),
        ));
    }
}

/// The outbox worker, the provider check before unpaid orders expire, and the reconciler.
fn spawn_payments(
    tasks: &TaskTracker,
    state: &Arc<State>,
    settings: &Settings,
    shutdown: &CancellationToken,
) {
    let Some(payments) = state.sale.payments().cloned() else {
        return;
    };
    let pool = state.pools.background.clone();
    let clear = state.sale.stock_events().freed_reporter();
    let (p, db) = (payments.clone(), pool.clone());
    tasks.spawn(workers::every(
        Duration::from_millis(settings.payments.outbox_interval_ms),
        shutdown.clone(),
        move || {
            let (p, db) = (p.clone(), db.clone());
            async move { p.drain_outbox(&db).await.map(|(_, deals)| deals) }
        },
        clear.clone(),
    ));
    let (p, db) = (payments.clone(), pool.clone());
    tasks.spawn(workers::every(
        Duration::from_millis(settings.sweeper.interval_ms),
        shutdown.clone(),
        move || {
            let (p, db) = (p.clone(), db.clone());
            async move { p.check_overdue(&db).await }
        },
        clear.clone(),
    ));
    let (p, db) = (payments, pool);
    tasks.spawn(workers::every(
        Duration::from_millis(settings.payments.reconcile_interval_ms),
        shutdown.clone(),
        move || {
            let (p, db) = (p.clone(), db.clone());
            async move { p.reconcile(&db).await.map(|_| Vec::new()) }
        },
        clear,
    ));
}

/// The invariant audit, and the listener that drops deals changed elsewhere from the cache.
fn spawn_ops(
    tasks: &TaskTracker,
    state: &Arc<State>,
    settings: &Settings,
    shutdown: &CancellationToken,
) {
    tasks.spawn(ops::audit::keep_auditing(
        state.pools.background.clone(),
        state.redis.clone(),
        settings.audit(),
        Duration::from_millis(settings.ops.audit_interval_ms),
        shutdown.clone(),
    ));
    let listening = state.clone();
    tasks.spawn(crate::deals::changes::follow(
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
            crate::deals::changes::Change::Deal(id) => listening.admission.deals().evict(id),
            crate::deals::changes::Change::Unknown => listening.admission.deals().clear(),
        },
    ));
}

/// Publishes pool occupancy and per-deal inventory gauges.
async fn sample_metrics(state: Arc<State>, deals: DealSettings, shutdown: CancellationToken) {
    let interval = Duration::from_millis(deals.metrics_interval_ms);
    let mut known = HashSet::new();
    loop {
        state.pools.record_metrics();
        let retain_seconds = deals.metrics_retain_seconds;
        if let Err(error) = record_inventory(&state.pools.background, retain_seconds).await {
            tracing::debug!(%error, "inventory gauges not refreshed");
        }
        let retiring = retire_deal_series(&state.pools.background, retain_seconds, &mut known);
        if let Err(error) = retiring.await {
            tracing::debug!(%error, "series of ended deals not retired");
        }
        if state.sale.payments().is_some()
            && let Err(error) = record_payment_backlog(&state.pools.background).await
        {
            tracing::debug!(%error, "payment gauges not refreshed");
        }
        if sleep_or_shutdown(interval, &shutdown).await {
            return;
        }
    }
}

/// Deals still on sale, or ended within `deals.metrics_retain_seconds`, get inventory
/// gauges.
async fn record_inventory(pool: &PgPool, retain_seconds: u64) -> Result<(), StoreError> {
    let deals: Vec<String> = sqlx::query_scalar(
        "SELECT id FROM deals
          WHERE ends_at IS NULL OR ends_at > now() - make_interval(secs => $1)",
    )
    .bind(retain_seconds as f64)
    .fetch_all(pool)
    .await?;
    for (deal, totals) in inventory::totals(pool, &deals).await? {
        for (state, units) in [
            ("available", totals.available),
            ("reserved", totals.reserved),
            ("sold", totals.sold),
        ] {
            metrics::gauge!(telemetry::INVENTORY_UNITS, "deal" => deal.clone(), "state" => state)
                .set(units as f64);
        }
    }
    Ok(())
}

/// Drops the series of deals that ended more than `retain_seconds` ago, and of deals in
/// `known` (the deals with series this instance found in its database last time) that are
/// gone. Only deals of this instance's own database are retired: several gateways in one
/// process share the metrics.
async fn retire_deal_series(
    pool: &PgPool,
    retain_seconds: u64,
    known: &mut HashSet<String>,
) -> Result<(), StoreError> {
    let metrics = telemetry::prometheus();
    let with_series: Vec<String> = metrics.deals().into_iter().collect();
    let rows: Vec<(String, bool)> = sqlx::query_as(
        "SELECT id, ends_at IS NOT NULL AND ends_at <= now() - make_interval(secs => $2)
           FROM deals WHERE id = ANY($1)",
    )
    .bind(&with_series)
    .bind(retain_seconds as f64)
    .fetch_all(pool)
    .await?;
    let existing: HashSet<String> = rows.iter().map(|(id, _)| id.clone()).collect();
    let retired = rows
        .into_iter()
        .filter_map(|(id, ended)| ended.then_some(id))
        .chain(known.iter().filter(|id| !existing.contains(*id)).cloned())
        .collect();
    metrics.retire_deals(&retired);
    *known = existing;
    Ok(())
}

/// Refunds waiting for the provider and side effects waiting in the outbox.
async fn record_payment_backlog(pool: &PgPool) -> Result<(), StoreError> {
    let refunds = crate::payments::refunds::pending(pool).await?;
    let outbox = crate::payments::outbox::backlog(pool).await?;
    metrics::gauge!(telemetry::REFUNDS_PENDING).set(refunds as f64);
    let failed = crate::payments::refunds::failed_count(pool).await?;
    metrics::gauge!(telemetry::REFUNDS_GIVEN_UP).set(failed as f64);
    metrics::gauge!(telemetry::OUTBOX_BACKLOG).set(outbox as f64);
    let refund_age = crate::payments::refunds::pending_oldest_seconds(pool).await?;
    metrics::gauge!(telemetry::REFUNDS_PENDING_OLDEST).set(refund_age);
    let outbox_age = crate::payments::outbox::oldest_seconds(pool).await?;
    metrics::gauge!(telemetry::OUTBOX_OLDEST).set(outbox_age);
    let (in_review, oldest) = crate::payments::review::backlog(pool).await?;
    metrics::gauge!(telemetry::MANUAL_REVIEW_ORDERS).set(in_review as f64);
    metrics::gauge!(telemetry::MANUAL_REVIEW_OLDEST).set(oldest);
    Ok(())
}

/// Drops idle limiter keys. A pass visits every key (tens of milliseconds for hundreds of
/// thousands of users), so it runs on a blocking thread: on a request thread it would stall
/// every request queued behind it.
async fn forget_idle_limits(state: Arc<State>, interval: Duration, shutdown: CancellationToken) {
    while !sleep_or_shutdown(interval, &shutdown).await {
        let state = state.clone();
        let swept = tokio::task::spawn_blocking(move || {
            state.admission.limits().forget_idle();
            state.admission.global_limits().forget_idle();
        })
        .await;
        if let Err(error) = swept {
            tracing::error!(%error, "forgetting idle rate-limit keys failed");
        }
    }
}

/// Sleeps `interval`; true when shutdown came first.
async fn sleep_or_shutdown(interval: Duration, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        () = shutdown.cancelled() => true,
        () = tokio::time::sleep(interval) => false,
    }
}
