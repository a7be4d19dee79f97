//! Group reservation: concurrent orders for one deal share one short transaction.
//!
//! A durable purchase costs a commit, and a commit costs an fsync; under a stampede that,
//! not the row locks, is the ceiling. When more than one order for the same deal is in
//! flight on this instance, new ones wait up to `orders.group_window_us` (and at most
//! `orders.group_size_max` of them) and are then reserved together: one multi-row insert
//! of the orders, the users' counters and every non-empty bucket locked once (users first,
//! then buckets ascending, as everywhere), each request decided in arrival order exactly
//! as if it had run alone, one multi-row insert of the reservation lines, one commit.
//! Requests that lose (over their limit, not enough units) have their order rows deleted
//! before the commit, so one failure never fails the others. With a single order in
//! flight the ordinary one-order transaction runs, so low load pays no waiting.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dashmap::DashMap;
use sqlx::{PgConnection, PgPool};
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use super::{ORDER_COLUMNS, Order, OrderError, Placed, fingerprint, replay};
use crate::admission::Admitted;
use crate::deals::Deal;
use crate::domain::IdempotencyKey;
use crate::inventory::Line;
use crate::payments::attempts;
use crate::store::StoreError;
use crate::telemetry;

/// How orders are grouped.
#[derive(Debug, Clone, Copy)]
pub struct GroupSettings {
    pub enabled: bool,
    pub window: Duration,
    pub size_max: usize,
    pub retries_max: u32,
}

/// One order waiting for its group.
struct Job {
    admitted: Admitted,
    key: IdempotencyKey,
    reply: oneshot::Sender<Result<Placed, OrderError>>,
}

/// A deal's queue on this instance.
struct DealQueue {
    in_flight: AtomicUsize,
    jobs: mpsc::Sender<Job>,
}

/// Routes orders to the single path or to their deal's group.
pub struct Grouper {
    settings: GroupSettings,
    pool: PgPool,
    payment_provider: Option<String>,
    queues: DashMap<String, Arc<DealQueue>>,
}

/// Decrements the in-flight count when the order is answered, however that happens.
struct InFlight(Arc<DealQueue>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Grouper {
    pub fn new(settings: GroupSettings, pool: PgPool, payment_provider: Option<String>) -> Self {
        assert!(settings.size_max >= 1);
        Self {
            settings,
            pool,
            payment_provider,
            queues: DashMap::new(),
        }
    }

    /// Places an admitted order, alone or in a group.
    pub async fn place(
        &self,
        admitted: Admitted,
        key: IdempotencyKey,
    ) -> Result<Placed, OrderError> {
        let queue = self.settings.enabled.then(|| self.queue(&admitted.deal.id));
        let busy = queue
            .as_ref()
            .is_some_and(|q| q.in_flight.fetch_add(1, Ordering::AcqRel) > 0);
        let _in_flight = queue.clone().map(InFlight);
        match queue {
            Some(queue) if busy => Self::join_group(&queue, admitted, key).await,
            _ => {
                let provider = self.payment_provider.as_deref();
                let retries = self.settings.retries_max;
                super::place(&self.pool, &admitted, &key, retries, provider).await
            }
        }
    }

    /// Hands the order to its deal's group task and waits for the answer.
    async fn join_group(
        queue: &DealQueue,
        admitted: Admitted,
        key: IdempotencyKey,
    ) -> Result<Placed, OrderError> {
        let (reply, answer) = oneshot::channel();
        if queue
            .jobs
            .send(Job {
                admitted,
                key,
                reply,
            })
            .await
            .is_err()
        {
            return Err(OrderError::Store(StoreError::PoolExhausted));
        }
        answer
            .await
            .unwrap_or(Err(OrderError::Store(StoreError::PoolExhausted)))
    }

    fn queue(&self, deal_id: &str) -> Arc<DealQueue> {
        if let Some(queue) = self.queues.get(deal_id) {
            return queue.clone();
        }
        self.queues
            .entry(deal_id.to_owned())
            .or_insert_with(|| {
                let (jobs, receiver) = mpsc::channel(self.settings.size_max * 4);
                tokio::spawn(run_groups(
                    receiver,
                    self.settings,
                    self.pool.clone(),
                    self.payment_provider.clone(),
                ));
                Arc::new(DealQueue {
                    in_flight: AtomicUsize::new(0),
                    jobs,
                })
            })
            .clone()
    }
}

/// Collects a group (up to the window or the size limit), reserves it, answers, repeats.
async fn run_groups(
    mut receiver: mpsc::Receiver<Job>,
    settings: GroupSettings,
    pool: PgPool,
    provider: Option<String>,
) {
    while let Some(first) = receiver.recv().await {
        let mut group = vec![first];
        let deadline = tokio::time::Instant::now() + settings.window;
        while group.len() < settings.size_max {
            match tokio::time::timeout_at(deadline, receiver.recv()).await {
                Ok(Some(job)) => group.push(job),
                _ => break,
            }
        }
        // A request whose caller gave up (the HTTP timeout dropped it) reserves nothing.
        group.retain(|job| !job.reply.is_closed());
        if group.is_empty() {
            continue;
        }
        let results = run_isolated(&pool, &group, settings.retries_max, provider.clone()).await;
        metrics::counter!(telemetry::RESERVATION_GROUPS).increment(1);
        metrics::counter!(telemetry::GROUPED_ORDERS).increment(group.len() as u64);
        for (job, result) in group.into_iter().zip(results) {
            let _ = job.reply.send(super::record(result));
        }
    }
}

/// Runs the group as its own task, so a broken invariant (a panic) fails this group with
/// 503 instead of ending the deal's queue.
async fn run_isolated(
    pool: &PgPool,
    group: &[Job],
    retries_max: u32,
    provider: Option<String>,
) -> Vec<Result<Placed, OrderError>> {
    let requests: Vec<Request> = group
        .iter()
        .map(|job| Request::of(&job.admitted, &job.key))
        .collect();
    let deal = group[0].admitted.deal.clone();
    let pool = pool.clone();
    let size = requests.len();
    let run = tokio::spawn(async move {
        place_group_retrying(&pool, &deal, &requests, retries_max, provider.as_deref()).await
    });
    run.await.unwrap_or_else(|panic| {
        tracing::error!(%panic, "group reservation broke an invariant");
        (0..size)
            .map(|_| Err(OrderError::Store(StoreError::PoolExhausted)))
            .collect()
    })
}

async fn place_group_retrying(
    pool: &PgPool,
    deal: &Deal,
    requests: &[Request],
    retries_max: u32,
    provider: Option<&str>,
) -> Vec<Result<Placed, OrderError>> {
    let mut attempt = 0;
    loop {
        match place_group(pool, deal, requests, provider).await {
            Err(StoreError::Retryable(_)) if attempt < retries_max => attempt += 1,
            Ok(results) => return results,
            Err(error) => {
                tracing::warn!(%error, size = requests.len(), "group reservation failed");
                return requests
                    .iter()
                    .map(|_| Err(OrderError::Store(StoreError::PoolExhausted)))
                    .collect();
            }
        }
    }
}

/// One request of a group, as the group transaction needs it.
#[derive(Debug, Clone)]
pub struct Request {
    pub user_id: String,
    pub key: String,
    pub quantity: i32,
    pub fingerprint: Vec<u8>,
}

impl Request {
    fn of(admitted: &Admitted, key: &IdempotencyKey) -> Self {
        Self {
            user_id: admitted.user.as_str().to_owned(),
            key: key.as_str().to_owned(),
            quantity: admitted.quantity.as_i32(),
            fingerprint: fingerprint(&admitted.deal.id, admitted.quantity.get()),
        }
    }
}

/// Reserves `requests` (all for `deal`, in arrival order) in one transaction; one result
/// per request, in order.
pub async fn place_group(
    pool: &PgPool,
    deal: &Deal,
    requests: &[Request],
    payment_provider: Option<&str>,
) -> Result<Vec<Result<Placed, OrderError>>, StoreError> {
    assert!(!requests.is_empty());
    let mut tx = pool.begin().await?;
    let inserted = insert_orders(&mut tx, deal, requests).await?;
    let (decisions, emptied_a_bucket) = decide(&mut tx, deal, requests, &inserted).await?;
    apply(&mut tx, deal, &inserted, &decisions, payment_provider).await?;
    tx.commit().await?;
    answer(pool, deal, requests, inserted, &decisions, emptied_a_bucket).await
}

/// Inserts every request's order; a key used before (or twice in the group, or a closed
/// sale window) inserts nothing for that request. Index in `requests` → order.
async fn insert_orders(
    tx: &mut PgConnection,
    deal: &Deal,
    requests: &[Request],
) -> Result<BTreeMap<usize, Order>, StoreError> {
    let ids: Vec<Uuid> = requests.iter().map(|_| Uuid::now_v7()).collect();
    let sql = format!(
        "INSERT INTO orders (id, user_id, deal_id, idempotency_key, request_fingerprint, status,
                             quantity, unit_price_minor, amount_minor, currency, expires_at)
         SELECT j.id, j.user_id, d.id, j.key, j.fp, 'PENDING_PAYMENT', j.q, d.unit_price_minor,
                d.unit_price_minor * j.q, d.currency, now() + make_interval(secs => d.reservation_ttl_seconds)
           FROM unnest($2::uuid[], $3::text[], $4::text[], $5::bytea[], $6::int[]) WITH ORDINALITY
                AS j(id, user_id, key, fp, q, n)
           JOIN deals d ON d.id = $1
          WHERE NOT d.paused
            AND (d.starts_at IS NULL OR d.starts_at <= now())
            AND (d.ends_at IS NULL OR now() < d.ends_at)
          ORDER BY j.n
         ON CONFLICT (user_id, idempotency_key) DO NOTHING
         RETURNING {ORDER_COLUMNS}"
    );
    let orders: Vec<Order> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(&deal.id)
        .bind(&ids)
        .bind(
            requests
                .iter()
                .map(|r| r.user_id.clone())
                .collect::<Vec<_>>(),
        )
        .bind(requests.iter().map(|r| r.key.clone()).collect::<Vec<_>>())
        .bind(
            requests
                .iter()
                .map(|r| r.fingerprint.clone())
                .collect::<Vec<_>>(),
        )
        .bind(requests.iter().map(|r| r.quantity).collect::<Vec<_>>())
        .fetch_all(&mut *tx)
        .await?;
    let index: HashMap<Uuid, usize> = ids.iter().enumerate().map(|(i, id)| (*id, i)).collect();
    Ok(orders
        .into_iter()
        .filter_map(|order| Some((*index.get(&order.id)?, order)))
        .collect())
}

/// What one inserted request gets.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Decision {
    Reserve(Vec<Line>),
    PerUserLimit,
    SoldOut { available: i64 },
}

/// Decides every inserted request in arrival order against the locked counters and buckets.
async fn decide(
    tx: &mut PgConnection,
    deal: &Deal,
    requests: &[Request],
    inserted: &BTreeMap<usize, Order>,
) -> Result<(BTreeMap<usize, Decision>, bool), StoreError> {
    let users: Vec<String> = inserted
        .keys()
        .map(|&i| requests[i].user_id.clone())
        .collect();
    // Every user gets a counter row first, so each one is locked here, in user order,
    // before any bucket: a first purchase follows the same lock order as the rest.
    sqlx::query(
        "INSERT INTO user_deal_units (deal_id, user_id, units, limit_units)
         SELECT $1, u, 0, $3 FROM (SELECT DISTINCT u FROM unnest($2::text[]) AS t(u) ORDER BY u) users
         ON CONFLICT (deal_id, user_id) DO NOTHING",
    )
    .bind(&deal.id)
    .bind(&users)
    .bind(deal.per_user_limit)
    .execute(&mut *tx)
    .await?;
    let mut units: HashMap<String, i32> = sqlx::query_as::<_, (String, i32)>(
        "SELECT user_id, units FROM user_deal_units WHERE deal_id = $1 AND user_id = ANY($2)
          ORDER BY user_id FOR NO KEY UPDATE",
    )
    .bind(&deal.id)
    .bind(&users)
    .fetch_all(&mut *tx)
    .await?
    .into_iter()
    .collect();
    let mut buckets: Vec<(i32, i64)> = sqlx::query_as(
        "SELECT bucket, available FROM inventory_buckets
          WHERE deal_id = $1 AND available > 0 ORDER BY bucket FOR NO KEY UPDATE",
    )
    .bind(&deal.id)
    .fetch_all(&mut *tx)
    .await?;
    let mut decisions = BTreeMap::new();
    for &i in inserted.keys() {
        let request = &requests[i];
        let held = units.entry(request.user_id.clone()).or_insert(0);
        let decision = if *held + request.quantity > deal.per_user_limit {
            Decision::PerUserLimit
        } else {
            match take(&mut buckets, request.quantity) {
                Some(lines) => {
                    *held += request.quantity;
                    Decision::Reserve(lines)
                }
                None => Decision::SoldOut {
                    available: buckets.iter().map(|(_, a)| a).sum(),
                },
            }
        };
        decisions.insert(i, decision);
    }
    let emptied_a_bucket = buckets.iter().any(|(_, available)| *available == 0);
    Ok((decisions, emptied_a_bucket))
}

/// Takes `quantity` from `buckets` (fullest first), or nothing if they cannot cover it.
fn take(buckets: &mut [(i32, i64)], quantity: i32) -> Option<Vec<Line>> {
    let lines = crate::inventory::allocate(buckets, quantity)?;
    for line in &lines {
        let bucket = buckets
            .iter_mut()
            .find(|(b, _)| *b == line.bucket)
            .expect("allocated from these buckets");
        bucket.1 -= i64::from(line.quantity);
        assert!(bucket.1 >= 0);
    }
    Some(lines)
}

/// Writes the decisions: losers' orders deleted, winners' units moved, lines inserted.
async fn apply(
    tx: &mut PgConnection,
    deal: &Deal,
    inserted: &BTreeMap<usize, Order>,
    decisions: &BTreeMap<usize, Decision>,
    payment_provider: Option<&str>,
) -> Result<(), StoreError> {
    let losers: Vec<Uuid> = decisions
        .iter()
        .filter(|(_, d)| !matches!(d, Decision::Reserve(_)))
        .map(|(i, _)| inserted[i].id)
        .collect();
    if !losers.is_empty() {
        sqlx::query("DELETE FROM orders WHERE id = ANY($1)")
            .bind(&losers)
            .execute(&mut *tx)
            .await?;
    }
    let winners: Vec<usize> = decisions
        .iter()
        .filter(|(_, d)| matches!(d, Decision::Reserve(_)))
        .map(|(i, _)| *i)
        .collect();
    let mut per_bucket: BTreeMap<i32, i64> = BTreeMap::new();
    let mut per_user: BTreeMap<&str, i32> = BTreeMap::new();
    let mut lines = LineRows::default();
    for &i in &winners {
        let order = &inserted[&i];
        let Decision::Reserve(taken) = &decisions[&i] else {
            continue;
        };
        assert_eq!(
            taken.iter().map(|l| l.quantity).sum::<i32>(),
            order.quantity
        );
        for line in taken {
            *per_bucket.entry(line.bucket).or_default() += i64::from(line.quantity);
            lines.push(order.id, line);
        }
        *per_user.entry(order.user_id.as_str()).or_default() += order.quantity;
    }
    lines.insert(tx, &deal.id).await?;
    update_buckets(tx, &deal.id, &per_bucket).await?;
    update_users(tx, deal, &per_user).await?;
    if let Some(provider) = payment_provider {
        let orders: Vec<Uuid> = winners.iter().map(|i| inserted[i].id).collect();
        attempts::insert_initial_many(tx, &orders, provider, &deal.capture_method).await?;
    }
    Ok(())
}

/// Every reservation line of a group, written with one statement.
#[derive(Default)]
struct LineRows {
    orders: Vec<Uuid>,
    buckets: Vec<i32>,
    units: Vec<i32>,
}

impl LineRows {
    fn push(&mut self, order_id: Uuid, line: &Line) {
        self.orders.push(order_id);
        self.buckets.push(line.bucket);
        self.units.push(line.quantity);
    }

    async fn insert(&self, tx: &mut PgConnection, deal_id: &str) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO reservation_lines (order_id, deal_id, bucket, quantity)
             SELECT o, $1, b, q FROM unnest($2::uuid[], $3::int[], $4::int[]) AS t(o, b, q)",
        )
        .bind(deal_id)
        .bind(&self.orders)
        .bind(&self.buckets)
        .bind(&self.units)
        .execute(tx)
        .await?;
        Ok(())
    }
}

async fn update_buckets(
    tx: &mut PgConnection,
    deal_id: &str,
    per_bucket: &BTreeMap<i32, i64>,
) -> Result<(), StoreError> {
    let (ids, units): (Vec<i32>, Vec<i64>) = per_bucket.iter().map(|(b, q)| (*b, *q)).unzip();
    let updated = sqlx::query(
        "UPDATE inventory_buckets b SET available = b.available - t.q, reserved = b.reserved + t.q
           FROM unnest($2::int[], $3::bigint[]) AS t(bucket, q)
          WHERE b.deal_id = $1 AND b.bucket = t.bucket AND b.available >= t.q",
    )
    .bind(deal_id)
    .bind(&ids)
    .bind(&units)
    .execute(tx)
    .await?;
    assert_eq!(
        updated.rows_affected() as usize,
        ids.len(),
        "the buckets are locked by this transaction"
    );
    Ok(())
}

async fn update_users(
    tx: &mut PgConnection,
    deal: &Deal,
    per_user: &BTreeMap<&str, i32>,
) -> Result<(), StoreError> {
    let (users, units): (Vec<&str>, Vec<i32>) = per_user.iter().map(|(u, q)| (*u, *q)).unzip();
    let updated = sqlx::query(
        "UPDATE user_deal_units u SET units = u.units + t.q, limit_units = $4
           FROM unnest($2::text[], $3::int[]) AS t(user_id, q)
          WHERE u.deal_id = $1 AND u.user_id = t.user_id AND u.units + t.q <= $4",
    )
    .bind(&deal.id)
    .bind(&users)
    .bind(&units)
    .bind(deal.per_user_limit)
    .execute(tx)
    .await?;
    assert_eq!(
        updated.rows_affected() as usize,
        users.len(),
        "the counters are locked by this transaction"
    );
    Ok(())
}

/// One answer per request: winners their order, losers their reason, and requests that
/// inserted nothing the stored order for their key (or the sale-window refusal).
async fn answer(
    pool: &PgPool,
    deal: &Deal,
    requests: &[Request],
    mut inserted: BTreeMap<usize, Order>,
    decisions: &BTreeMap<usize, Decision>,
    emptied_a_bucket: bool,
) -> Result<Vec<Result<Placed, OrderError>>, StoreError> {
    let mut results = Vec::with_capacity(requests.len());
    for (i, request) in requests.iter().enumerate() {
        let result = match decisions.get(&i) {
            Some(Decision::Reserve(_)) => {
                let order = inserted.remove(&i).expect("a winner inserted its order");
                Ok(Placed {
                    order,
                    replayed: false,
                    emptied_a_bucket,
                })
            }
            Some(decision) => Err(refusal(deal, decision)),
            None => match lost_to_same_key(requests, decisions, i) {
                Some(SameKey::LostEarlier(decision)) => Err(refusal(deal, decision)),
                Some(SameKey::RetryAlone) => Err(OrderError::Store(StoreError::PoolExhausted)),
                None => replay(pool, &request.user_id, &request.key, &request.fingerprint).await,
            },
        };
        results.push(result);
    }
    Ok(results)
}

fn refusal(deal: &Deal, decision: &Decision) -> OrderError {
    match decision {
        Decision::SoldOut { available } => OrderError::SoldOut {
            available: *available,
        },
        Decision::PerUserLimit | Decision::Reserve(_) => OrderError::PerUserLimit {
            limit: deal.per_user_limit,
        },
    }
}

/// A request that inserted nothing because an earlier request of the same group used the
/// same key and lost. With the same body it would have lost the same way alone; with
/// another body its own answer is unknown here, so it is asked to retry (503), when it
/// will run alone.
enum SameKey<'a> {
    LostEarlier(&'a Decision),
    RetryAlone,
}

fn lost_to_same_key<'a>(
    requests: &[Request],
    decisions: &'a BTreeMap<usize, Decision>,
    i: usize,
) -> Option<SameKey<'a>> {
    let request = &requests[i];
    let earlier = (0..i)
        .find(|&j| requests[j].user_id == request.user_id && requests[j].key == request.key)?;
    let decision = decisions
        .get(&earlier)
        .filter(|decision| !matches!(decision, Decision::Reserve(_)))?;
    if requests[earlier].fingerprint == request.fingerprint {
        Some(SameKey::LostEarlier(decision))
    } else {
        Some(SameKey::RetryAlone)
    }
}
