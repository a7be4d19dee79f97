//! Clients that ignore the check-in window: each polls its own ticket from the moment it
//! joins, at the `refresh_after_seconds` every answer gives, showing the ticket's latest
//! `position_token` in `Flashgate-Position` as docs/openapi.yaml asks, until it is admitted
//! (then it orders with its pass) or its ticket expired. That is what a client written from
//! the API reference alone does when it never reads the public line state.
//!
//! The answers are counted by how the gateway gave them: from memory (`checked_in` false,
//! a poll from far outside the window) or as a check-in (the ticket read from Redis).
//!
//! A real crowd's timers fire on their own machines; here they share one process and at
//! most `poll_concurrency` polls in flight. When more polls are due than that sends, the
//! due ones go front of the line first (a late answer from far back is the same answer,
//! a late check-in is a skipped ticket), and the rest wait: `backlog` says how many.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinHandle;

use super::order::order_with_pass;
use super::probes::Stop;

/// A client that just took its ticket.
pub struct Arrival {
    pub ticket: String,
    /// The user's bearer token.
    pub token: String,
    pub position_token: String,
    /// From the signed position token.
    pub position: u64,
    /// The join answer's `refresh_after_seconds`.
    pub refresh_seconds: f64,
}

/// The answers the impatient clients got, by kind; read at both edges of the window.
#[derive(Debug, Default)]
pub struct PollCounts {
    /// Answered from memory: `checked_in` false.
    pub memory: AtomicU64,
    /// Check-ins: `checked_in` true (the ticket was read from Redis).
    pub redis: AtomicU64,
    pub failed: AtomicU64,
    pub passes: AtomicU64,
    pub expired: AtomicU64,
    /// Polls due but not sent yet, as of the last tick.
    pub backlog: AtomicU64,
}

impl PollCounts {
    /// The totals since the first join.
    pub fn report(&self) -> Value {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        serde_json::json!({
            "polls_from_memory": n(&self.memory),
            "check_ins": n(&self.redis),
            "failed": n(&self.failed),
            "passes": n(&self.passes),
            "expired": n(&self.expired),
            "backlog_at_the_end": n(&self.backlog),
        })
    }
}

/// What one poll came back with.
enum Answer {
    Waiting {
        refresh: f64,
        position_token: String,
    },
    Done,
    Failed,
}

/// The impatient crowd, running from before the first join until stopped.
pub struct Impatient {
    pub arrivals: mpsc::UnboundedSender<Arrival>,
    pub counts: Arc<PollCounts>,
    stop: Stop,
    task: JoinHandle<()>,
}

impl Impatient {
    /// Starts the clients' timers; each polls through `base` (`{edge}/v1/deals/{id}`) with
    /// at most `concurrency` polls in flight.
    pub fn start(http: reqwest::Client, base: String, concurrency: usize) -> Self {
        let (arrivals, rx) = mpsc::unbounded_channel();
        let counts = Arc::new(PollCounts::default());
        let stop = Stop::default();
        let task = tokio::spawn(run(
            http,
            Arc::new(base),
            rx,
            counts.clone(),
            stop.clone(),
            concurrency,
        ));
        Self {
            arrivals,
            counts,
            stop,
            task,
        }
    }

    /// Stops every client's timer and waits for the loop to end.
    pub async fn stop(self) {
        self.stop.stop();
        drop(self.arrivals);
        let _ = self.task.await;
    }
}

/// The clients' timers: a heap of (when, client) and the polls they fire.
async fn run(
    http: reqwest::Client,
    base: Arc<String>,
    mut arrivals: mpsc::UnboundedReceiver<Arrival>,
    counts: Arc<PollCounts>,
    stop: Stop,
    concurrency: usize,
) {
    let mut clients: Vec<Arrival> = Vec::new();
    let mut heap = BinaryHeap::<Reverse<(Instant, usize)>>::new();
    // Due polls, front of the line first.
    let mut due = BinaryHeap::<Reverse<(u64, usize)>>::new();
    let (tx, mut answers) = mpsc::unbounded_channel::<(usize, Answer)>();
    let permits = Arc::new(Semaphore::new(concurrency.max(1)));
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    while !stop.is_stopped() {
        tick.tick().await;
        let now = Instant::now();
        while let Ok(arrival) = arrivals.try_recv() {
            heap.push(Reverse((
                now + after(arrival.refresh_seconds),
                clients.len(),
            )));
            clients.push(arrival);
        }
        while let Ok((i, answer)) = answers.try_recv() {
            match answer {
                Answer::Waiting {
                    refresh,
                    position_token,
                } => {
                    clients[i].position_token = position_token;
                    heap.push(Reverse((now + after(refresh), i)));
                }
                Answer::Failed => heap.push(Reverse((now + Duration::from_secs(1), i))),
                Answer::Done => {}
            }
        }
        while let Some(Reverse((at, i))) = heap.peek().copied() {
            if at > now {
                break;
            }
            heap.pop();
            due.push(Reverse((clients[i].position, i)));
        }
        while let Some(Reverse((_, i))) = due.peek().copied() {
            let Ok(permit) = permits.clone().try_acquire_owned() else {
                break;
            };
            due.pop();
            let client = &clients[i];
            let poll = poll(
                http.clone(),
                base.clone(),
                client.ticket.clone(),
                client.token.clone(),
                client.position_token.clone(),
                counts.clone(),
            );
            let tx = tx.clone();
            tokio::spawn(async move {
                let _ = tx.send((i, poll.await));
                drop(permit);
            });
        }
        counts.backlog.store(due.len() as u64, Ordering::Relaxed);
    }
}

/// The wait a client is told, within what a browser's timer would do with it.
fn after(refresh_seconds: f64) -> Duration {
    Duration::from_secs_f64(refresh_seconds.clamp(0.2, 3600.0))
}

/// One poll of the ticket, showing its position token; an admitted client orders at once.
async fn poll(
    http: reqwest::Client,
    base: Arc<String>,
    ticket: String,
    token: String,
    position_token: String,
    counts: Arc<PollCounts>,
) -> Answer {
    let sent = http
        .get(format!("{base}/queue/{ticket}"))
        .bearer_auth(&token)
        .header("Flashgate-Position", &position_token)
        .send()
        .await;
    let body = match sent {
        Ok(response) if response.status().is_success() => response.json::<Value>().await.ok(),
        _ => None,
    };
    let Some(body) = body else {
        counts.failed.fetch_add(1, Ordering::Relaxed);
        return Answer::Failed;
    };
    let source = match body["checked_in"].as_bool() {
        Some(false) => &counts.memory,
        _ => &counts.redis,
    };
    source.fetch_add(1, Ordering::Relaxed);
    match (body["state"].as_str(), body["pass"].as_str()) {
        (Some("admitted"), Some(pass)) => {
            order_with_pass(&http, &base, &ticket, &token, pass).await;
            counts.passes.fetch_add(1, Ordering::Relaxed);
            Answer::Done
        }
        (Some("expired"), _) => {
            counts.expired.fetch_add(1, Ordering::Relaxed);
            Answer::Done
        }
        (Some(_), _) => Answer::Waiting {
            refresh: body["refresh_after_seconds"].as_f64().unwrap_or(1.0),
            position_token: body["position_token"]
                .as_str()
                .map_or(position_token, str::to_owned),
        },
        _ => {
            counts.failed.fetch_add(1, Ordering::Relaxed);
            Answer::Failed
        }
    }
}
