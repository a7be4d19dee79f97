//! The crowd itself: real tickets taken through the gateway, then waiting clients as timers.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::{Mutex, Semaphore, mpsc};

use super::CrowdConfig;
use super::impatient::PollCounts;
use super::order::order_with_pass;
use super::probes::{self, Counts, Stop};

/// One waiting client.
pub struct Client {
    pub ticket: String,
    pub user: u32,
    /// From the signed position token; for a random line's pre-queue, the issue number until
    /// the shuffle is published and recomputed from its seed.
    pub position: u64,
    pub abandoned: bool,
    /// Polls its ticket from the moment it joined, ignoring the check-in window
    /// (`impatient`); it never reads the public line state.
    pub ignores_window: bool,
}

pub fn user_id(user: u32) -> String {
    format!("crowd-{user}")
}

/// What a ticket poll or an order came back with.
enum Outcome {
    Waiting(f64),
    Admitted,
    Expired,
    Failed,
}

/// What the measurement window saw, and what the fairness check needs.
pub struct Measured {
    pub seconds: f64,
    pub modelled_public_polls: f64,
    pub edge: HashMap<String, u64>,
    pub personal_polls: u64,
    /// The polls of the clients ignoring the window answered from memory.
    pub far_polls: u64,
    /// Their polls answered as check-ins (from Redis).
    pub impatient_check_ins: u64,
    /// Their polls due but not sent at the window's end (the load tester's own lag).
    pub impatient_backlog: u64,
    pub origin: Counts,
    pub redis_calls: u64,
    pub redis_client_commands: u64,
    pub redis_by_command: Vec<(String, u64)>,
    /// Redis's own CPU (user and system) over the window.
    pub redis_cpu_seconds: f64,
    pub max_active_seen: u64,
    /// Clients that were handed a pass, by client index, with how many passes they saw.
    pub passes: HashMap<usize, u32>,
    /// Clients that read `expired` though they checked in.
    pub expired_checked_in: u64,
    pub orders_created: u64,
    pub clients: Vec<Client>,
}

impl Measured {
    pub fn report(&self) -> Value {
        let per_s = |n: f64| n / self.seconds;
        let edge_total: u64 = self.edge.values().sum();
        let hits = self.edge.get("HIT").copied().unwrap_or(0)
            + self.edge.get("UPDATING").copied().unwrap_or(0)
            + self.edge.get("STALE").copied().unwrap_or(0);
        json!({
            "seconds": self.seconds,
            "crowd_public_polls_per_second_modelled": per_s(self.modelled_public_polls),
            "edge_public_requests_per_second": per_s(edge_total as f64),
            "edge_cache_status": self.edge,
            "edge_hit_ratio": hits as f64 / (edge_total.max(1)) as f64,
            "origin_public_per_second": per_s(self.origin.public as f64),
            "origin_personal_per_second": per_s(self.origin.personal as f64),
            "origin_orders_per_second": per_s(self.origin.orders as f64),
            "client_personal_polls_per_second": per_s(self.personal_polls as f64),
            "ticket_polls_from_memory_per_second": per_s(self.far_polls as f64),
            "impatient_backlog_at_window_end": self.impatient_backlog,
            "ticket_polls_checked_in_per_second":
                per_s((self.personal_polls + self.impatient_check_ins) as f64),
            "redis_cpu_seconds": self.redis_cpu_seconds,
            "redis_cpu_percent": 100.0 * per_s(self.redis_cpu_seconds),
            "redis_commands_per_second": per_s(self.redis_calls as f64),
            "redis_client_commands_per_second": per_s(self.redis_client_commands as f64),
            "redis_top_commands": self.redis_by_command.iter().take(8)
                .map(|(c, n)| json!({"command": c, "per_second": per_s(*n as f64)})).collect::<Vec<_>>(),
            "max_active_seen": self.max_active_seen,
            "passes_collected": self.passes.len(),
            "orders_created": self.orders_created,
            "checked_in_then_expired": self.expired_checked_in,
        })
    }
}

/// The public line state as the crowd last read it through the edge.
#[derive(Default)]
struct Line {
    admitted_through: AtomicU64,
    window: AtomicU64,
    seed: Mutex<Option<(String, u64)>>,
}

/// The crowd after the line filled.
pub struct Crowd {
    http: reqwest::Client,
    config: CrowdConfig,
    deal_id: String,
    clients: Vec<Client>,
    /// The answers the clients ignoring the window got.
    impatient: Arc<PollCounts>,
}

impl Crowd {
    pub fn new(
        http: reqwest::Client,
        config: CrowdConfig,
        deal_id: String,
        clients: Vec<Client>,
        impatient: Arc<PollCounts>,
    ) -> Self {
        Self {
            http,
            config,
            deal_id,
            clients,
            impatient,
        }
    }

    /// Runs the crowd from now until the measurement window after `opens_at` ends.
    pub async fn run(mut self, opens_at: Instant) -> Result<Measured, String> {
        let line = Arc::new(Line::default());
        let edge_counts = Arc::new(std::sync::Mutex::new(HashMap::<String, u64>::new()));
        let followers = self.clients.iter().filter(|c| !c.ignores_window).count();
        let waiting = Arc::new(AtomicU64::new(followers as u64));
        let stop = Stop::default();
        let edge = tokio::spawn(edge_sampler(
            self.http.clone(),
            self.config.clone(),
            format!("{}/v1/deals/{}/queue", self.config.edge_url, self.deal_id),
            line.clone(),
            edge_counts.clone(),
            waiting.clone(),
            stop.clone(),
        ));
        let active = tokio::spawn(probes::watch_passes_active(
            self.http.clone(),
            self.config.operator.ops_url.clone(),
            self.deal_id.clone(),
            stop.clone(),
        ));
        let window_start = opens_at + Duration::from_secs(self.config.warmup_seconds);
        let window_end = window_start + Duration::from_secs(self.config.measure_seconds);
        let mut state = Schedule::new(self.clients.len());
        let (tx, mut rx) = mpsc::unbounded_channel::<(usize, Outcome)>();
        let permits = Arc::new(Semaphore::new(self.config.poll_concurrency.max(1)));
        let mut window: Option<Snapshot> = None;
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        let mut last = Instant::now();
        loop {
            tick.tick().await;
            let now = Instant::now();
            let dt = now.duration_since(last).as_secs_f64();
            last = now;
            if window.is_none() && now >= window_start {
                window = Some(Snapshot::take(&self, &edge_counts, &state).await?);
            }
            if now >= window_end {
                break;
            }
            self.reorder_if_shuffled(&line, &mut state).await;
            state.enter_window(&self.clients, &line, &self.config, now);
            while let Ok((i, outcome)) = rx.try_recv() {
                state.settle(i, outcome, now);
            }
            waiting.store((followers - state.done) as u64, Ordering::Relaxed);
            for i in state.due(now) {
                let permit = permits
                    .clone()
                    .acquire_owned()
                    .await
                    .map_err(|e| e.to_string())?;
                let poll = self.poll_task(i, tx.clone());
                tokio::spawn(async move {
                    poll.await;
                    drop(permit);
                });
                state.personal_polls += 1;
            }
            let modelled =
                waiting.load(Ordering::Relaxed) as f64 * dt / self.config.public_poll_seconds;
            if window.is_some() {
                state.modelled_public += modelled;
            }
        }
        let start = window.ok_or("the window never started")?;
        let end = Snapshot::take(&self, &edge_counts, &state).await?;
        stop.stop();
        let _ = edge.await;
        let max_active_seen = active.await.unwrap_or(u64::MAX);
        Ok(start.measured(end, state, max_active_seen, self.clients))
    }

    /// A random line's shuffle, once published: every pre-queue client's position is
    /// recomputed from the seed, as anyone can (see `flashgate::waiting_room::shuffle`).
    async fn reorder_if_shuffled(&mut self, line: &Line, state: &mut Schedule) {
        if state.reordered {
            return;
        }
        let Some((seed, size)) = line.seed.lock().await.clone() else {
            return;
        };
        let positions = flashgate::waiting_room::shuffle::positions(&seed, size);
        for client in &mut self.clients {
            if client.position <= size {
                client.position = positions[client.position as usize - 1];
            }
        }
        // The schedule refers to clients by index: only pre-open states exist yet, and a
        // random line admits nobody before its shuffle, so the order is rebuilt from scratch.
        self.clients.sort_unstable_by_key(|c| c.position);
        *state = Schedule::new(self.clients.len());
        state.reordered = true;
    }

    /// Polls client `i`'s ticket through the edge and, once admitted, orders with the pass.
    fn poll_task(
        &self,
        i: usize,
        tx: mpsc::UnboundedSender<(usize, Outcome)>,
    ) -> impl std::future::Future<Output = ()> + use<> {
        let client = &self.clients[i];
        let http = self.http.clone();
        let base = format!("{}/v1/deals/{}", self.config.edge_url, self.deal_id);
        let ticket = client.ticket.clone();
        let token = self.config.operator.token(&user_id(client.user), 3600);
        async move {
            let outcome = poll_and_order(&http, &base, &ticket, &token).await;
            let _ = tx.send((i, outcome));
        }
    }
}

async fn poll_and_order(http: &reqwest::Client, base: &str, ticket: &str, token: &str) -> Outcome {
    let Ok(response) = http
        .get(format!("{base}/queue/{ticket}"))
        .bearer_auth(token)
        .send()
        .await
    else {
        return Outcome::Failed;
    };
    let Ok(body) = response.json::<Value>().await else {
        return Outcome::Failed;
    };
    match (body["state"].as_str(), body["pass"].as_str()) {
        (Some("admitted"), Some(pass)) => {
            order_with_pass(http, base, ticket, token, pass).await;
            Outcome::Admitted
        }
        (Some("expired"), _) => Outcome::Expired,
        (Some(_), _) => Outcome::Waiting(body["refresh_after_seconds"].as_f64().unwrap_or(1.0)),
        _ => Outcome::Failed,
    }
}

/// The real public requests through the edge: the crowd's public polls, sampled at up to
/// `edge_rate_max` per second over 32 workers. Every answer updates the crowd's view.
async fn edge_sampler(
    http: reqwest::Client,
    config: CrowdConfig,
    url: String,
    line: Arc<Line>,
    counts: Arc<std::sync::Mutex<HashMap<String, u64>>>,
    waiting: Arc<AtomicU64>,
    stop: Stop,
) {
    const WORKERS: u32 = 32;
    let mut workers = Vec::new();
    for _ in 0..WORKERS {
        let (http, url, line, counts, waiting, stop) = (
            http.clone(),
            url.clone(),
            line.clone(),
            counts.clone(),
            waiting.clone(),
            stop.clone(),
        );
        let (poll_s, cap) = (config.public_poll_seconds, config.edge_rate_max);
        workers.push(tokio::spawn(async move {
            while !stop.is_stopped() {
                let rate =
                    (waiting.load(Ordering::Relaxed) as f64 / poll_s).clamp(1.0, f64::from(cap));
                let pause = Duration::from_secs_f64(f64::from(WORKERS) / rate);
                let sent = Instant::now();
                if let Ok(response) = http.get(&url).send().await {
                    let status = response
                        .headers()
                        .get("x-cache-status")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("NONE")
                        .to_owned();
                    if let Ok(body) = response.json::<Value>().await {
                        read_line(&line, &body).await;
                    }
                    *counts.lock().expect("counts").entry(status).or_default() += 1;
                }
                tokio::time::sleep(pause.saturating_sub(sent.elapsed())).await;
            }
        }));
    }
    for worker in workers {
        let _ = worker.await;
    }
}

async fn read_line(line: &Line, body: &Value) {
    let through = body["admitted_through"].as_u64().unwrap_or(0);
    line.admitted_through.fetch_max(through, Ordering::Relaxed);
    line.window.store(
        body["checkin_window_tickets"].as_u64().unwrap_or(0),
        Ordering::Relaxed,
    );
    if let (Some(seed), Some(size)) = (body["seed"].as_str(), body["prequeue_size"].as_u64()) {
        let mut held = line.seed.lock().await;
        if held.is_none() {
            *held = Some((seed.to_owned(), size));
        }
    }
}

/// The clients' timers: who is near the front, and when each polls next.
struct Schedule {
    /// Clients before this index have entered the check-in window.
    frontier: usize,
    heap: BinaryHeap<Reverse<(Instant, usize)>>,
    done: usize,
    passes: HashMap<usize, u32>,
    expired_checked_in: u64,
    personal_polls: u64,
    modelled_public: f64,
    reordered: bool,
}

impl Schedule {
    fn new(_clients: usize) -> Self {
        Self {
            frontier: 0,
            heap: BinaryHeap::new(),
            done: 0,
            passes: HashMap::new(),
            expired_checked_in: 0,
            personal_polls: 0,
            modelled_public: 0.0,
            reordered: false,
        }
    }

    /// Clients whose signed position the line has come within the window of check in at
    /// their own timer's next tick (a uniform phase of the public poll interval); those
    /// who abandoned never do. A random line's pre-queue waits for its shuffle.
    fn enter_window(
        &mut self,
        clients: &[Client],
        line: &Line,
        config: &CrowdConfig,
        now: Instant,
    ) {
        let random_unsettled = config.queue_order == "random" && !self.reordered;
        let reach =
            line.admitted_through.load(Ordering::Relaxed) + line.window.load(Ordering::Relaxed);
        while self.frontier < clients.len() && clients[self.frontier].position <= reach {
            let client = &clients[self.frontier];
            if random_unsettled && client.position as usize <= clients.len() {
                break;
            }
            if client.ignores_window {
                // Polls on its own timer already (`impatient`).
            } else if client.abandoned {
                self.done += 1;
            } else {
                let phase =
                    Duration::from_secs_f64(rand::random::<f64>() * config.public_poll_seconds);
                self.heap.push(Reverse((now + phase, self.frontier)));
            }
            self.frontier += 1;
        }
    }

    fn settle(&mut self, i: usize, outcome: Outcome, now: Instant) {
        match outcome {
            Outcome::Waiting(refresh) => {
                let next = now + Duration::from_secs_f64(refresh.clamp(0.2, 30.0));
                self.heap.push(Reverse((next, i)));
            }
            Outcome::Failed => self.heap.push(Reverse((now + Duration::from_secs(1), i))),
            Outcome::Admitted => {
                *self.passes.entry(i).or_default() += 1;
                self.done += 1;
            }
            Outcome::Expired => {
                self.expired_checked_in += 1;
                self.done += 1;
            }
        }
    }

    fn due(&mut self, now: Instant) -> Vec<usize> {
        let mut due = Vec::new();
        while let Some(Reverse((at, i))) = self.heap.peek().copied() {
            if at > now {
                break;
            }
            self.heap.pop();
            due.push(i);
        }
        due
    }
}

/// Counters at one edge of the measurement window.
struct Snapshot {
    at: Instant,
    edge: HashMap<String, u64>,
    origin: Counts,
    redis: probes::RedisCounts,
    personal_polls: u64,
    far_polls: u64,
    impatient_check_ins: u64,
    impatient_backlog: u64,
}

impl Snapshot {
    async fn take(
        crowd: &Crowd,
        edge: &std::sync::Mutex<HashMap<String, u64>>,
        state: &Schedule,
    ) -> Result<Self, String> {
        let origin = probes::origin_counts(&crowd.http, &crowd.config.operator.ops_url).await?;
        let redis = probes::redis_counts(&crowd.config.redis_url).await?;
        Ok(Self {
            at: Instant::now(),
            edge: edge.lock().expect("counts").clone(),
            origin,
            redis,
            personal_polls: state.personal_polls,
            far_polls: crowd.impatient.memory.load(Ordering::Relaxed),
            impatient_check_ins: crowd.impatient.redis.load(Ordering::Relaxed),
            impatient_backlog: crowd.impatient.backlog.load(Ordering::Relaxed),
        })
    }

    fn measured(
        self,
        end: Snapshot,
        state: Schedule,
        max_active_seen: u64,
        clients: Vec<Client>,
    ) -> Measured {
        let mut edge = end.edge.clone();
        for (status, n) in &self.edge {
            if let Some(total) = edge.get_mut(status) {
                *total -= n;
            }
        }
        let (redis_calls, redis_by_command) = end.redis.calls_since(&self.redis);
        Measured {
            seconds: end.at.duration_since(self.at).as_secs_f64(),
            modelled_public_polls: state.modelled_public,
            edge,
            personal_polls: end.personal_polls - self.personal_polls,
            far_polls: end.far_polls - self.far_polls,
            impatient_check_ins: end.impatient_check_ins - self.impatient_check_ins,
            impatient_backlog: end.impatient_backlog,
            origin: end.origin.since(&self.origin),
            redis_calls,
            redis_client_commands: end.redis.client_commands - self.redis.client_commands,
            redis_by_command,
            redis_cpu_seconds: end.redis.cpu_seconds - self.redis.cpu_seconds,
            max_active_seen,
            passes: state.passes,
            expired_checked_in: state.expired_checked_in,
            orders_created: end.origin.orders_created,
            clients,
        }
    }
}
