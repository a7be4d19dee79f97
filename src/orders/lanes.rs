//! Lanes: batches of one deal in flight side by side, group-commit style.
//!
//! A durable purchase costs a commit; under a stampede, paying for one commit per order
//! (and one round trip per statement) is the ceiling. Each deal gets up to
//! `orders.lanes` lane tasks on this instance, all taking work from the deal's one queue.
//! When no batch of the deal is in flight, an idle lane takes the next order at once, with
//! every order queued behind it (at most `orders.batch_max`), and places them as one batch.
//! While batches are in flight, new orders queue: another lane starts beside them only
//! once a full share of a batch is waiting (`batch_max / lanes` orders), otherwise the
//! orders wait for the first lane to finish and go together. Most of a batch's cost in
//! PostgreSQL is paid once per batch (statements, locks, the commit), so a lane started for
//! every waiting order would split the work into many small batches and spend the cores on
//! that fixed cost. Nothing ever waits on a timer: at low load a batch is one order, at high
//! load batches grow by themselves and more lanes run. Each lane draws first from its own
//! share of the buckets, so the lanes of an instance do not queue on each other's rows.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicUsize, Ordering};
use std::time::Instant;

use dashmap::DashMap;
use sqlx::PgPool;
use tokio::sync::{Mutex, Notify, mpsc, oneshot};
use uuid::Uuid;

use super::batch::{self, BatchOptions, PlacementHook, Request};
use super::{Order, OrderError, Placed};
use crate::admission::Admitted;
use crate::deals::Deal;
use crate::domain::{IdempotencyKey, UserId};
use crate::inventory::{self, StockEvents};
use crate::store::StoreError;
use crate::telemetry;
use crate::telemetry::trace::{self, Finished, Kind, Trace};

/// How orders are batched.
#[derive(Debug, Clone, Copy)]
pub struct LaneSettings {
    /// Batches of one deal in flight at once on this instance.
    pub lanes: usize,
    /// Most orders in one batch.
    pub batch_max: usize,
    /// A batch that hit a deadlock or serialization failure runs again this many times.
    pub retries_max: u32,
    /// Behind a transaction-pooling PgBouncer every checkout is one transaction that commits
    /// only when the connection goes back to the pool, after the answers would be sent: the
    /// batch then commits its own transaction before anyone is answered.
    pub commit_before_answer: bool,
    /// After a batch met an existing key or buyer and was decided again, this many of the
    /// deal's next batches check every key and buyer from the start.
    pub careful_after_recheck: u32,
}

/// One order waiting for its batch.
struct Job {
    deal: Arc<Deal>,
    request: Request,
    reply: oneshot::Sender<Result<Placed, OrderError>>,
    /// The request's trace, which the batch records its spans into.
    trace: Option<Trace>,
}

/// What the lanes of one deal share.
struct DealQueue {
    receiver: Mutex<mpsc::Receiver<Job>>,
    /// Batches of this deal in flight on this instance.
    in_flight: AtomicUsize,
    /// Woken whenever one of those batches ends.
    ended: Notify,
    /// Batches still to place the careful way since the last one that was decided again.
    careful_left: AtomicU32,
}

impl DealQueue {
    fn new(receiver: mpsc::Receiver<Job>) -> Self {
        Self {
            receiver: Mutex::new(receiver),
            in_flight: AtomicUsize::new(0),
            ended: Notify::new(),
            careful_left: AtomicU32::new(0),
        }
    }

    fn end_batch(&self) {
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.ended.notify_waiters();
    }

    /// Whether the next batch goes the careful way; counts it if so. A batch inserts new
    /// keys and buyers plainly and decides again when one exists, which costs a failed
    /// attempt: after one, the next batches skip the attempt, so that a storm of replays
    /// pays for at most one failed attempt in `careful_after_recheck + 1` batches.
    fn take_careful(&self) -> bool {
        self.careful_left
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| {
                left.checked_sub(1)
            })
            .is_ok()
    }

    fn rechecked(&self, careful_batches: u32) {
        self.careful_left.store(careful_batches, Ordering::Release);
    }
}

/// What every lane task needs; holds no queue, so dropping the engine ends the lanes.
#[derive(Clone)]
struct Context {
    settings: LaneSettings,
    pool: PgPool,
    hook: Option<Arc<dyn PlacementHook>>,
    events: StockEvents,
    busy: Arc<AtomicI64>,
}

/// Places and cancels orders; the only way orders are placed.
pub struct Engine {
    context: Context,
    queues: DashMap<String, mpsc::Sender<Job>>,
}

impl Engine {
    pub fn new(
        settings: LaneSettings,
        pool: PgPool,
        hook: Option<Arc<dyn PlacementHook>>,
        events: StockEvents,
    ) -> Self {
        assert!(settings.lanes >= 1 && settings.batch_max >= 1);
        Self {
            context: Context {
                settings,
                pool,
                hook,
                events,
                busy: Arc::new(AtomicI64::new(0)),
            },
            queues: DashMap::new(),
        }
    }

    /// Places an admitted order in the next batch of its deal.
    pub async fn place(
        &self,
        admitted: Admitted,
        key: IdempotencyKey,
    ) -> Result<Placed, OrderError> {
        let request = Request::of(&admitted, &key);
        let queue = self.queue(&admitted.deal);
        let (reply, answer) = oneshot::channel();
        let job = Job {
            deal: admitted.deal,
            request,
            reply,
            trace: trace::current(),
        };
        if queue.send(job).await.is_err() {
            return Err(batch::unexpected("the deal's lanes stopped"));
        }
        answer
            .await
            .unwrap_or_else(|_| Err(batch::unexpected("the batch ended without an answer")))
    }

    /// Cancels the user's pending order; the sale reports its units free.
    pub async fn cancel(&self, user: &UserId, order_id: Uuid) -> Result<Order, OrderError> {
        super::cancel(&self.context.pool, user, order_id).await
    }

    fn queue(&self, deal: &Deal) -> mpsc::Sender<Job> {
        if let Some(queue) = self.queues.get(&deal.id) {
            return queue.clone();
        }
        self.queues
            .entry(deal.id.clone())
            .or_insert_with(|| {
                let settings = self.context.settings;
                let (jobs, receiver) = mpsc::channel(settings.batch_max * settings.lanes * 4);
                let queue = Arc::new(DealQueue::new(receiver));
                let lanes = settings.lanes.min(deal.bucket_count.max(1) as usize);
                for lane in 0..lanes {
                    let context = self.context.clone();
                    tokio::spawn(run_lane(lane, lanes, queue.clone(), context));
                }
                jobs
            })
            .clone()
    }
}

/// The batch's spans in a traced request's trace: the batch (its size and lane) and,
/// below it, its PostgreSQL statement.
fn record_spans(
    trace: &Trace,
    lane: usize,
    size: usize,
    began: Instant,
    placed: Instant,
    failed: bool,
) {
    let batch = trace.record(Finished {
        id: [0; 8],
        name: "reservation batch",
        kind: Kind::Internal,
        parent: trace.root(),
        start: began,
        end: placed,
        attributes: vec![
            ("flashgate.batch.size", trace::Value::Int(size as i64)),
            ("flashgate.batch.lane", trace::Value::Int(lane as i64)),
        ],
        error: failed,
    });
    trace.record(Finished {
        id: [0; 8],
        name: "postgresql orders_place_batch",
        kind: Kind::Client,
        parent: batch,
        start: began,
        end: placed,
        attributes: vec![
            ("db.system.name", trace::Value::Name("postgresql")),
            (
                "db.operation.name",
                trace::Value::Name("orders_place_batch"),
            ),
        ],
        error: failed,
    });
}

/// One lane: takes everything queued (up to the limit), places it, answers, repeats.
async fn run_lane(lane: usize, lanes: usize, queue: Arc<DealQueue>, context: Context) {
    let batch_max = context.settings.batch_max;
    // A full share of a batch: enough waiting orders to start a lane beside the others.
    let beside_min = (batch_max / lanes).max(1);
    while let Some(mut jobs) = next_batch(&queue, batch_max, beside_min).await {
        // A request whose caller gave up (the HTTP timeout dropped it) reserves nothing.
        jobs.retain(|job| !job.reply.is_closed());
        if !jobs.is_empty() {
            let busy = context.busy.fetch_add(1, Ordering::AcqRel) + 1;
            metrics::gauge!(telemetry::LANES_BUSY).set(busy as f64);
            run_batch(&context, lane, lanes, &queue, jobs).await;
            let busy = context.busy.fetch_sub(1, Ordering::AcqRel) - 1;
            metrics::gauge!(telemetry::LANES_BUSY).set(busy as f64);
        }
        queue.end_batch();
    }
}

/// Waits for one order and takes every order queued behind it; while other batches of the
/// deal are in flight, keeps taking arrivals until `beside_min` orders are in hand or one
/// of those batches ends. Counts the batch as in flight before letting the next lane look.
async fn next_batch(queue: &DealQueue, batch_max: usize, beside_min: usize) -> Option<Vec<Job>> {
    let mut receiver = queue.receiver.lock().await;
    let first = receiver.recv().await?;
    let mut jobs = vec![first];
    loop {
        while jobs.len() < batch_max {
            match receiver.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        let ended = queue.ended.notified();
        tokio::pin!(ended);
        // Registered before looking, so an end between the look and the wait is not missed.
        ended.as_mut().enable();
        if jobs.len() >= beside_min.min(batch_max) || queue.in_flight.load(Ordering::Acquire) == 0 {
            break;
        }
        tokio::select! {
            job = receiver.recv() => match job {
                Some(job) => jobs.push(job),
                None => break,
            },
            () = &mut ended => {}
        }
    }
    queue.in_flight.fetch_add(1, Ordering::AcqRel);
    Some(jobs)
}

async fn run_batch(
    context: &Context,
    lane: usize,
    lanes: usize,
    queue: &DealQueue,
    jobs: Vec<Job>,
) {
    // The newest copy of the deal in the batch knows the current bucket count.
    let deal = jobs
        .iter()
        .map(|job| job.deal.clone())
        .max_by_key(|deal| deal.bucket_count)
        .expect("a batch has at least one order");
    let options = BatchOptions {
        share: inventory::share(lane, lanes, deal.bucket_count),
        hook: context.hook.clone(),
        commit_before_answer: context.settings.commit_before_answer,
        careful: queue.take_careful(),
    };
    let requests: Vec<Request> = jobs.iter().map(|job| job.request.clone()).collect();
    let size = requests.len();
    record_size(size);
    let (pool, retries_max) = (context.pool.clone(), context.settings.retries_max);
    let placing = deal.clone();
    let began = crate::clock::monotonic();
    // Its own task, so a broken invariant (a panic) fails this batch, not the lane.
    let outcome = tokio::spawn(async move {
        place_retrying(&pool, &placing, &requests, &options, retries_max).await
    })
    .await;
    let placed = crate::clock::monotonic();
    let broke = !matches!(outcome, Ok(Ok(_)));
    for trace in jobs.iter().filter_map(|job| job.trace.as_ref()) {
        record_spans(trace, lane, size, began, placed, broke);
    }
    let (results, ran_out) = match outcome {
        Ok(Ok(batch)) => {
            if batch.rechecked {
                queue.rechecked(context.settings.careful_after_recheck);
            }
            (batch.results, batch.ran_out)
        }
        Ok(Err(error)) => {
            // A failover is logged, counted, as its requests are answered.
            if !matches!(error, StoreError::Unavailable(_)) {
                tracing::warn!(%error, size, "reservation batch failed");
            }
            (failed(size, &|| OrderError::Store(error.clone())), false)
        }
        Err(panic) => {
            tracing::error!(%panic, size, "reservation batch broke an invariant");
            let error = || batch::unexpected("the reservation batch broke an invariant");
            (failed(size, &error), false)
        }
    };
    let sold_out = results
        .iter()
        .any(|r| matches!(r, Err(OrderError::SoldOut { available: 0 })));
    if ran_out || sold_out {
        context.events.ran_out(&deal.id).await;
    }
    for (job, result) in jobs.into_iter().zip(results) {
        let _ = job.reply.send(super::record(result));
    }
}

fn failed(size: usize, error: &dyn Fn() -> OrderError) -> Vec<Result<Placed, OrderError>> {
    (0..size).map(|_| Err(error())).collect()
}

async fn place_retrying(
    pool: &PgPool,
    deal: &Deal,
    requests: &[Request],
    options: &BatchOptions,
    retries_max: u32,
) -> Result<batch::Batch, StoreError> {
    let mut attempt = 0;
    loop {
        match batch::place_batch(pool, deal, requests, options).await {
            Err(StoreError::Retryable(error)) if attempt < retries_max => {
                tracing::debug!(%error, attempt, "reservation batch retried");
                metrics::counter!(telemetry::DB_RETRIES, "operation" => "reservation").increment(1);
                attempt += 1;
            }
            outcome => return outcome,
        }
    }
}

fn record_size(size: usize) {
    metrics::histogram!(telemetry::RESERVATION_BATCH_SIZE).record(size as f64);
    metrics::counter!(telemetry::RESERVATION_GROUPS).increment(1);
    if size > 1 {
        metrics::counter!(telemetry::GROUPED_ORDERS).increment(size as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recheck_sends_exactly_the_next_batches_the_careful_way() {
        let (_jobs, receiver) = mpsc::channel(1);
        let queue = DealQueue::new(receiver);
        assert!(
            !queue.take_careful(),
            "plain until a batch is decided again"
        );

        queue.rechecked(3);
        let next: Vec<bool> = (0..5).map(|_| queue.take_careful()).collect();

        assert_eq!(next, [true, true, true, false, false]);
        queue.rechecked(0);
        assert!(!queue.take_careful(), "0 turns the backoff off");
    }
}
