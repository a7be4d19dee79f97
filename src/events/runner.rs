//! Runs the event machinery on one instance at a time: the instance holding the events'
//! advisory lock (on a connection of its own) positions events, delivers them, and expires
//! old ones; the others ask again every `events.leader_retry_ms`. Everything here uses the
//! events' own pool, so a dead receiver costs the sale nothing.
//!
//! Idle costs nothing that grows with the events kept: the sequencer reads the index on the
//! events' writers only past the snapshot it last finished, and backs off to `events.poll_interval_max_ms`; an endpoint with
//! nothing to send sleeps until the sequencer positions something (or, at the latest,
//! `events.maintenance_interval_ms`, to see a replay); backlogs are counted up to
//! `endpoints::PENDING_COUNTED_MAX`.

use std::collections::{HashMap, HashSet};
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use sqlx::{Connection, PgConnection, PgPool};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::endpoints::Endpoint;
use super::pace::{self, Pace};
use super::{EventError, EventSettings, delivery, endpoints, feed, sequencer, target};
use crate::clock::{Clock, elapsed_since, monotonic};
use crate::telemetry;
use crate::telemetry::trace::Tracer;

/// The advisory lock key held by the instance that runs the events.
const LEADER_KEY: i64 = 0x666c_6173_6865_7632;

/// Retention deletes this many events per statement, so one pass holds no long lock.
const EXPIRE_BATCH: i64 = 10_000;

/// What the tasks share.
#[derive(Clone)]
struct Context {
    pool: PgPool,
    client: reqwest::Client,
    /// Each delivery attempt is a span of its own; `None` with tracing off.
    tracer: Option<Tracer>,
    clock: Clock,
    settings: EventSettings,
    wake: Arc<Notify>,
    /// The feed's rate, for giving way to a sale.
    pace: Arc<Pace>,
}

/// Runs until `shutdown`: takes the lead when free, and keeps it while its connection lives.
pub async fn run(
    pool: PgPool,
    tracer: Option<Tracer>,
    clock: Clock,
    leader_url: String,
    settings: EventSettings,
    shutdown: CancellationToken,
) {
    let client = match client(&settings) {
        Ok(client) => client,
        Err(error) => {
            tracing::error!(%error, "event delivery client cannot be built; events are not pushed");
            return;
        }
    };
    let retry = Duration::from_millis(settings.leader_retry_ms);
    let context = Context {
        pool,
        client,
        tracer,
        clock,
        settings,
        wake: Arc::new(Notify::new()),
        pace: Arc::new(Pace::default()),
    };
    while !shutdown.is_cancelled() {
        match lead(&leader_url).await {
            Ok(Some(connection)) => {
                tracing::info!("this instance runs the event sequencer and deliveries");
                serve(&context, connection, &shutdown).await;
            }
            Ok(None) => {}
            Err(error) => tracing::debug!(%error, "events leader lock not reachable"),
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(retry) => {}
        }
    }
}

/// The delivery client: its own timeout, no redirects, and the resolver that refuses inward
/// addresses at delivery time.
fn client(settings: &EventSettings) -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .timeout(Duration::from_millis(settings.request_timeout_ms))
        .connect_timeout(Duration::from_millis(settings.request_timeout_ms))
        .redirect(reqwest::redirect::Policy::none())
        .dns_resolver(target::resolver(settings.allow_private_targets))
        .user_agent("flashgate-events")
        .build()
}

/// A connection holding the leader lock, or `None` when another instance holds it.
async fn lead(url: &str) -> Result<Option<PgConnection>, sqlx::Error> {
    let mut connection = PgConnection::connect(url).await?;
    let held: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
        .bind(LEADER_KEY)
        .fetch_one(&mut connection)
        .await?;
    Ok(held.then_some(connection))
}

/// The sequencer, the endpoints and the retention, while `connection` lives.
async fn serve(context: &Context, mut connection: PgConnection, shutdown: &CancellationToken) {
    let stop = shutdown.child_token();
    let sequencing = tokio::spawn(sequence(context.clone(), stop.clone()));
    let mut workers: HashMap<Uuid, JoinHandle<()>> = HashMap::new();
    let check = Duration::from_millis(context.settings.leader_retry_ms);
    let maintain = Duration::from_millis(context.settings.maintenance_interval_ms);
    let mut last_maintenance: Option<std::time::Instant> = None;
    loop {
        supervise(context, &mut workers, &stop).await;
        if last_maintenance.is_none_or(|at| elapsed_since(at) >= maintain) {
            maintenance(context).await;
            last_maintenance = Some(monotonic());
        }
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(check) => {}
        }
        if let Err(error) = sqlx::query("SELECT 1").execute(&mut connection).await {
            tracing::warn!(%error, "events leader connection lost; handing over");
            break;
        }
    }
    stop.cancel();
    let _ = sequencing.await;
    for (_, worker) in workers {
        let _ = worker.await;
    }
}

/// Positions events as they commit, waking the endpoints after each round that found some.
async fn sequence(context: Context, stop: CancellationToken) {
    let (min, max) = (
        Duration::from_millis(context.settings.poll_interval_min_ms),
        Duration::from_millis(context.settings.poll_interval_max_ms),
    );
    let mut pause = min;
    loop {
        let round = sequencer::round(&context.pool, context.settings.sequencer_batch_max).await;
        let now = context.clock.instant();
        context.pace.record(*round.as_ref().unwrap_or(&0), now);
        metrics::gauge!(telemetry::EVENTS_FEED_RATE).set(context.pace.per_second(now));
        match round {
            Ok(0) => pause = (pause * 2).min(max),
            Ok(_) => {
                context.wake.notify_waiters();
                pause = min;
            }
            Err(error) => {
                tracing::warn!(%error, "event sequencer round failed");
                pause = max;
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(pause) => {}
        }
    }
}

/// One task per enabled, active endpoint; finished tasks are forgotten.
async fn supervise(
    context: &Context,
    workers: &mut HashMap<Uuid, JoinHandle<()>>,
    stop: &CancellationToken,
) {
    workers.retain(|_, worker| !worker.is_finished());
    let list = match endpoints::list(&context.pool).await {
        Ok(list) => list,
        Err(error) => {
            tracing::debug!(%error, "event endpoints not read");
            return;
        }
    };
    for endpoint in list {
        if endpoint.enabled && endpoint.state == "active" && !workers.contains_key(&endpoint.id) {
            let task = serve_endpoint(context.clone(), endpoint.id, stop.clone());
            workers.insert(endpoint.id, tokio::spawn(task));
        }
    }
}

/// Delivers to one endpoint until it is disabled, deleted or failing, or `stop`.
async fn serve_endpoint(context: Context, id: Uuid, stop: CancellationToken) {
    let settings = &context.settings;
    let (initial, max) = (
        Duration::from_millis(settings.retry_initial_ms),
        Duration::from_millis(settings.retry_max_ms),
    );
    let idle = Duration::from_millis(settings.maintenance_interval_ms);
    let mut accepted = HashSet::new();
    let mut attempt = 0;
    loop {
        let mut woken = pin!(context.wake.notified());
        woken.as_mut().enable();
        let endpoint = match endpoints::get(&context.pool, id).await {
            Ok(endpoint) if endpoint.enabled && endpoint.state == "active" => endpoint,
            Ok(_) | Err(EventError::NotFound) => return,
            Err(error) => {
                tracing::debug!(%error, "event endpoint not read");
                if sleep_or_stop(max.min(Duration::from_secs(5)), &stop).await {
                    return;
                }
                continue;
            }
        };
        let batch = next_batch(&context, &endpoint).await;
        if batch.is_empty() {
            tokio::select! {
                () = stop.cancelled() => return,
                () = woken => {}
                () = tokio::time::sleep(idle) => {}
            }
            continue;
        }
        if let Some(wait) = give_way(&context, &batch) {
            tokio::select! {
                () = stop.cancelled() => return,
                () = context.clock.sleep(wait) => {}
            }
            continue;
        }
        let Some(failure) = deliver(&context, &endpoint, &batch, &mut accepted).await else {
            attempt = 0;
            continue;
        };
        if failed(&context, id, &failure).await {
            return;
        }
        let wait = delivery::backoff(attempt, initial, max, failure.retry_after);
        attempt = attempt.saturating_add(1);
        // The schedule is a rule, so it waits on the application's clock.
        tokio::select! {
            () = stop.cancelled() => return,
            () = context.clock.sleep(wait) => {}
        }
    }
}

/// How long to hold `batch` back while a sale fills the feed (see [`pace`]); the wait is
/// on the application's clock, since it is a rule.
fn give_way(context: &Context, batch: &[feed::Event]) -> Option<Duration> {
    let oldest = batch.first()?.occurred_at;
    let settings = &context.settings;
    let recheck = Duration::from_millis(settings.poll_interval_max_ms);
    pace::hold(
        &context.pace,
        settings.yield_rule(),
        &context.clock,
        oldest,
        recheck,
    )
}

/// The endpoint's next events after what it accepted (none when the feed cannot be read).
async fn next_batch(context: &Context, endpoint: &Endpoint) -> Vec<feed::Event> {
    let types = endpoint.event_types.as_deref();
    let limit = context.settings.delivery_batch_max;
    match feed::after(&context.pool, endpoint.delivered_position, limit, types).await {
        Ok(batch) => batch,
        Err(error) => {
            tracing::debug!(%error, "event feed not read");
            Vec::new()
        }
    }
}

/// One round to the endpoint (unless its URL is now refused), recording how far it
/// accepted; the round's first failure, if any.
async fn deliver(
    context: &Context,
    endpoint: &Endpoint,
    batch: &[feed::Event],
    accepted: &mut HashSet<i64>,
) -> Option<delivery::Failure> {
    let settings = &context.settings;
    if let Err(error) = target::parse(&endpoint.url, usize::MAX, settings.allow_private_targets) {
        let error = error.to_string();
        return Some(delivery::Failure {
            error,
            retry_after: None,
        });
    }
    let concurrency = settings.concurrency_per_endpoint;
    let (client, clock) = (&context.client, &context.clock);
    let tracer = context.tracer.as_ref();
    let outcome = delivery::round(
        client,
        tracer,
        clock,
        endpoint,
        batch,
        accepted,
        concurrency,
    )
    .await;
    if let Some(to) = outcome.accepted_to {
        let from = endpoint.delivered_position;
        let moved = endpoints::advance(&context.pool, endpoint.id, from, to).await;
        if !matches!(moved, Ok(true)) {
            // A replay moved the endpoint meanwhile: what was accepted is sent again.
            accepted.clear();
        }
    }
    outcome.failure
}

/// Records a failed attempt; true when the endpoint is now failing (or gone).
async fn failed(context: &Context, id: Uuid, failure: &delivery::Failure) -> bool {
    let limit = context.settings.failing_after_seconds;
    let now = context.clock.now();
    match endpoints::record_failure(&context.pool, id, &failure.error, limit, now).await {
        Ok(state) if state == "active" => false,
        Ok(state) => {
            tracing::warn!(endpoint = %id, error = %failure.error, state, "event endpoint failing; deliveries stopped until a replay");
            true
        }
        Err(error) => {
            tracing::debug!(%error, "event endpoint failure not recorded");
            false
        }
    }
}

/// Deletes events past retention and refreshes the gauges.
async fn maintenance(context: &Context) {
    if let Err(error) = feed::expire(
        &context.pool,
        context.settings.retention_hours,
        EXPIRE_BATCH,
    )
    .await
    {
        tracing::debug!(%error, "old events not deleted");
    }
    match feed::oldest_seconds(&context.pool).await {
        Ok(age) => metrics::gauge!(telemetry::EVENTS_OLDEST_KEPT).set(age),
        Err(error) => tracing::debug!(%error, "oldest event not read"),
    }
    let Ok(list) = endpoints::list(&context.pool).await else {
        return;
    };
    for endpoint in list {
        let label = endpoint.id.to_string();
        let failing = f64::from(u8::from(endpoint.state == "failing"));
        metrics::gauge!(telemetry::EVENT_ENDPOINT_FAILING, "endpoint" => label.clone())
            .set(failing);
        if let Ok(view) = endpoints::view(&context.pool, endpoint).await {
            metrics::gauge!(telemetry::EVENT_ENDPOINT_PENDING, "endpoint" => label.clone())
                .set(view.pending as f64);
            metrics::gauge!(telemetry::EVENT_ENDPOINT_OLDEST_PENDING, "endpoint" => label)
                .set(view.oldest_pending_seconds);
        }
    }
}

/// Sleeps `wait`; true when stopped first.
async fn sleep_or_stop(wait: Duration, stop: &CancellationToken) -> bool {
    tokio::select! {
        () = stop.cancelled() => true,
        () = tokio::time::sleep(wait) => false,
    }
}
