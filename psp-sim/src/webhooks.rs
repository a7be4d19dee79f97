//! Webhook delivery: every event is recorded, then sent asynchronously, signed, and retried
//! with backoff, with the faults from `/control/faults` applied on the way.
//!
//! Two tasks: the scheduler applies drop, duplicate, delay and reorder faults and hands
//! copies to the sender in order; the sender makes each copy's first attempt in that order
//! and leaves retries to their own tasks, so one failing copy never holds up the rest.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use hmac::{Hmac, KeyInit, Mac};
use serde_json::{Value, json};
use sha2::Sha256;
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::faults::Faults;
use super::lock;

/// The header carrying `t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`.
pub const SIGNATURE_HEADER: &str = "Flashgate-Signature";
/// Waits before the second, third, ... attempt of one copy; one entry per retry.
const RETRY_BACKOFF_MS: [u64; 4] = [250, 500, 1_000, 2_000];
/// One attempt gives up after this long and counts as failed.
const ATTEMPT_TIMEOUT_MS: u64 = 2_000;
/// Held (reordered) webhooks are sent at the latest this long after the first was held.
const REORDER_HOLD_MS: u64 = 1_000;

/// An event and what happened to it so far.
#[derive(Debug, Clone)]
pub struct EventRecord {
    pub event: Value,
    /// The exact bytes sent; the same for every attempt and copy.
    body: Bytes,
    /// HTTP attempts made, counting retries and duplicate copies.
    pub attempts: u32,
    /// Attempts answered 2xx.
    pub successes: u32,
    /// The drop fault swallowed it.
    pub dropped: bool,
}

/// The delivery side shared by the API (which publishes) and the two tasks.
pub struct Outbox {
    events: Mutex<Vec<EventRecord>>,
    queue: mpsc::UnboundedSender<usize>,
    flush: Notify,
    webhook_url: Mutex<Option<String>>,
    secret: String,
    faults: Arc<Mutex<Faults>>,
    client: reqwest::Client,
}

/// One copy of one event on its way out.
#[derive(Debug, Clone, Copy)]
struct Copy {
    index: usize,
    due: Instant,
}

enum Attempt {
    Delivered,
    Failed,
    NoEndpoint,
}

impl Outbox {
    /// Builds the outbox and starts its tasks; they stop when `shutdown` is cancelled.
    pub fn start(
        webhook_url: Option<String>,
        secret: String,
        faults: Arc<Mutex<Faults>>,
        shutdown: CancellationToken,
    ) -> Result<Arc<Self>, String> {
        let client = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_millis(ATTEMPT_TIMEOUT_MS))
            .timeout(Duration::from_millis(ATTEMPT_TIMEOUT_MS))
            .build()
            .map_err(|e| format!("cannot build the webhook client: {e}"))?;
        let (queue, queued) = mpsc::unbounded_channel();
        let (to_send, sends) = mpsc::unbounded_channel();
        let outbox = Arc::new(Outbox {
            events: Mutex::new(Vec::new()),
            queue,
            flush: Notify::new(),
            webhook_url: Mutex::new(webhook_url),
            secret,
            faults,
            client,
        });
        tokio::spawn(schedule(outbox.clone(), queued, to_send, shutdown.clone()));
        tokio::spawn(send_in_order(outbox.clone(), sends, shutdown));
        Ok(outbox)
    }

    /// Records an event and queues it. Call it while holding the ledger lock, so events
    /// leave in the order their changes happened.
    pub fn publish(&self, kind: &str, object: Value, created: i64) {
        let event = json!({
            "id": format!("evt_{}", uuid::Uuid::now_v7().simple()),
            "object": "event",
            "type": kind,
            "created": created,
            "data": { "object": object },
        });
        let body = Bytes::from(event.to_string());
        let mut events = lock(&self.events);
        events.push(EventRecord {
            event,
            body,
            attempts: 0,
            successes: 0,
            dropped: false,
        });
        // The scheduler only stops at shutdown, when losing the event is fine.
        let _ = self.queue.send(events.len() - 1);
    }

    /// Sends held (reordered) webhooks now.
    pub fn flush(&self) {
        self.flush.notify_one();
    }

    pub fn events(&self) -> Vec<EventRecord> {
        lock(&self.events).clone()
    }

    pub fn webhook_url(&self) -> Option<String> {
        lock(&self.webhook_url).clone()
    }

    pub fn set_webhook_url(&self, url: Option<String>) {
        *lock(&self.webhook_url) = url;
    }

    async fn attempt(&self, index: usize) -> Attempt {
        let Some(url) = self.webhook_url() else {
            return Attempt::NoEndpoint;
        };
        let body = {
            let mut events = lock(&self.events);
            let Some(record) = events.get_mut(index) else {
                return Attempt::NoEndpoint;
            };
            record.attempts += 1;
            record.body.clone()
        };
        let t = chrono::Utc::now().timestamp();
        let request = self
            .client
            .post(&url)
            .header("content-type", "application/json")
            .header(SIGNATURE_HEADER, signature_header(&self.secret, t, &body))
            .body(body);
        match request.send().await {
            Ok(response) if response.status().is_success() => {
                if let Some(record) = lock(&self.events).get_mut(index) {
                    record.successes += 1;
                }
                Attempt::Delivered
            }
            Ok(response) => {
                tracing::debug!(status = %response.status(), "webhook refused");
                Attempt::Failed
            }
            Err(error) => {
                tracing::debug!(%error, "webhook attempt failed");
                Attempt::Failed
            }
        }
    }

    fn mark_dropped(&self, index: usize) {
        if let Some(record) = lock(&self.events).get_mut(index) {
            record.dropped = true;
        }
    }
}

/// `t=<t>,v1=<lowercase hex HMAC-SHA256(secret, "<t>.<body>")>`.
pub fn signature_header(secret: &str, t: i64, body: &[u8]) -> String {
    // HMAC takes keys of any length, so this cannot fail.
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(secret.as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC accepts keys of any length"));
    mac.update(t.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("t={t},v1={}", hex::encode(mac.finalize().into_bytes()))
}

/// Applies the webhook faults and passes copies to the sender in the order they must go.
async fn schedule(
    outbox: Arc<Outbox>,
    mut queued: mpsc::UnboundedReceiver<usize>,
    to_send: mpsc::UnboundedSender<Copy>,
    shutdown: CancellationToken,
) {
    let mut held: Vec<Copy> = Vec::new();
    let mut release_at: Option<Instant> = None;
    loop {
        let hold_over = async {
            match release_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = shutdown.cancelled() => return,
            index = queued.recv() => {
                let Some(index) = index else { return };
                admit(&outbox, index, &mut held, &mut release_at, &to_send);
            }
            () = outbox.flush.notified() => {
                // Events published before the flush request count as part of the batch.
                while let Ok(index) = queued.try_recv() {
                    admit(&outbox, index, &mut held, &mut release_at, &to_send);
                }
                release(&mut held, &mut release_at, &to_send);
            }
            () = hold_over => release(&mut held, &mut release_at, &to_send),
        }
    }
}

fn admit(
    outbox: &Outbox,
    index: usize,
    held: &mut Vec<Copy>,
    release_at: &mut Option<Instant>,
    to_send: &mpsc::UnboundedSender<Copy>,
) {
    let faults = lock(&outbox.faults).clone();
    if faults.webhook_drop {
        outbox.mark_dropped(index);
        return;
    }
    let due = Instant::now() + Duration::from_millis(faults.webhook_delay_ms);
    for _ in 0..=faults.webhook_duplicates {
        let copy = Copy { index, due };
        if faults.webhook_reorder {
            held.push(copy);
            release_at
                .get_or_insert_with(|| Instant::now() + Duration::from_millis(REORDER_HOLD_MS));
        } else {
            let _ = to_send.send(copy);
        }
    }
}

/// Sends the held batch newest first.
fn release(
    held: &mut Vec<Copy>,
    release_at: &mut Option<Instant>,
    to_send: &mpsc::UnboundedSender<Copy>,
) {
    *release_at = None;
    for copy in held.drain(..).rev() {
        let _ = to_send.send(copy);
    }
}

/// Makes first attempts in order; a failed copy is retried by its own task.
async fn send_in_order(
    outbox: Arc<Outbox>,
    mut sends: mpsc::UnboundedReceiver<Copy>,
    shutdown: CancellationToken,
) {
    loop {
        let copy = tokio::select! {
            () = shutdown.cancelled() => return,
            copy = sends.recv() => match copy {
                Some(copy) => copy,
                None => return,
            },
        };
        tokio::time::sleep_until(copy.due).await;
        if let Attempt::Failed = outbox.attempt(copy.index).await {
            let outbox = outbox.clone();
            let shutdown = shutdown.clone();
            tokio::spawn(async move {
                tokio::select! {
                    () = shutdown.cancelled() => {}
                    () = retry(&outbox, copy.index) => {}
                }
            });
        }
    }
}

async fn retry(outbox: &Outbox, index: usize) {
    for backoff_ms in RETRY_BACKOFF_MS {
        tokio::time::sleep(Duration::from_millis(backoff_ms)).await;
        match outbox.attempt(index).await {
            Attempt::Failed => continue,
            Attempt::Delivered | Attempt::NoEndpoint => return,
        }
    }
    tracing::warn!(index, "webhook given up after every retry");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_matches_a_known_vector() {
        // HMAC-SHA256("secret", "1700000000.{}"), computed with Python's hmac module.
        assert_eq!(
            signature_header("secret", 1_700_000_000, b"{}"),
            "t=1700000000,v1=b8569b78799ff9e3cbff0fc2d63a33a2b57f3282abd07c37ae5e8e7d79a5f163"
        );
    }
}
