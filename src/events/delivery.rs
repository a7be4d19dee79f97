//! Pushing the feed to one endpoint, Standard Webhooks style, at least once and in order
//! per order.
//!
//! A round takes the next events after the endpoint's accepted position, groups them by
//! order (or deal), and sends the groups in parallel (at most
//! `events.concurrency_per_endpoint` requests in flight), each group one event after the
//! other: an order's later event is sent only once its earlier one was accepted. The
//! endpoint's position then moves past every event accepted without a gap; accepted events
//! beyond a gap are remembered, so a retry sends only what was not accepted. A process that
//! dies forgets that, and sends them again with the same `webhook-id`, which is what "at
//! least once" allows.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use http::HeaderMap;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::endpoints::Endpoint;
use super::feed::Event;
use super::signing;
use crate::clock::{Clock, elapsed_since, monotonic};
use crate::telemetry;
use crate::telemetry::trace::{Alone, Kind, Tracer, Value};

/// Why a delivery was not accepted, and how long the receiver asked to be left alone.
#[derive(Debug, Clone)]
pub struct Failure {
    pub error: String,
    pub retry_after: Option<Duration>,
}

/// What a round achieved: the position the endpoint may move to, and the first failure.
#[derive(Debug)]
pub struct Outcome {
    pub accepted_to: Option<i64>,
    pub failure: Option<Failure>,
}

/// Sends `batch` (in position order) to `endpoint`, skipping events in `accepted`, and
/// adds the ones accepted now to it.
pub async fn round(
    client: &reqwest::Client,
    tracer: Option<&Tracer>,
    clock: &Clock,
    endpoint: &Endpoint,
    batch: &[Event],
    accepted: &mut HashSet<i64>,
    concurrency: usize,
) -> Outcome {
    let mut groups: BTreeMap<String, Vec<Event>> = BTreeMap::new();
    for event in batch.iter().filter(|e| !accepted.contains(&e.id)) {
        groups
            .entry(event.object())
            .or_default()
            .push(event.clone());
    }
    let permits = Arc::new(Semaphore::new(concurrency));
    let endpoint = Arc::new(endpoint.clone());
    let mut running = JoinSet::new();
    for (_, group) in groups {
        let (client, endpoint, permits) = (client.clone(), endpoint.clone(), permits.clone());
        let (clock, tracer) = (clock.clone(), tracer.cloned());
        running.spawn(async move {
            let _permit = permits.acquire_owned().await;
            send_group(&client, tracer.as_ref(), &clock, &endpoint, group).await
        });
    }
    let mut failure = None;
    while let Some(joined) = running.join_next().await {
        let (done, failed) = joined.unwrap_or_else(|error| {
            let error = format!("delivery task failed: {error}");
            (
                Vec::new(),
                Some(Failure {
                    error,
                    retry_after: None,
                }),
            )
        });
        accepted.extend(done);
        failure = failure.or(failed);
    }
    let accepted_to = batch
        .iter()
        .take_while(|e| accepted.contains(&e.id))
        .last()
        .map(|e| e.position);
    if let Some(to) = accepted_to {
        for event in batch.iter().take_while(|e| e.position <= to) {
            accepted.remove(&event.id);
        }
    }
    Outcome {
        accepted_to,
        failure,
    }
}

/// One order's events, in sequence, stopping at the first not accepted.
async fn send_group(
    client: &reqwest::Client,
    tracer: Option<&Tracer>,
    clock: &Clock,
    endpoint: &Endpoint,
    group: Vec<Event>,
) -> (Vec<i64>, Option<Failure>) {
    let mut done = Vec::with_capacity(group.len());
    for event in group {
        match send(client, tracer, clock, endpoint, &event).await {
            Ok(()) => done.push(event.id),
            Err(failure) => return (done, Some(failure)),
        }
    }
    (done, None)
}

/// One signed request; a 2xx answer is acceptance.
async fn send(
    client: &reqwest::Client,
    tracer: Option<&Tracer>,
    clock: &Clock,
    endpoint: &Endpoint,
    event: &Event,
) -> Result<(), Failure> {
    let body = serde_json::to_vec(&event.body()).expect("an event serialises");
    let id = event.public_id();
    // The receiver compares it with its own clock: wall time.
    let timestamp = clock.now().timestamp();
    let mut keys: Vec<&[u8]> = vec![&endpoint.secret];
    keys.extend(endpoint.previous_secret.as_deref());
    let signature = signing::header(&keys, &id, timestamp, &body);
    let label = endpoint.id.to_string();
    let started = monotonic();
    let sent = client
        .post(&endpoint.url)
        .header("content-type", "application/json")
        .header("webhook-id", &id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", signature)
        .body(body)
        .send()
        .await;
    metrics::histogram!(telemetry::EVENT_DELIVERY_SECONDS)
        .record(elapsed_since(started).as_secs_f64());
    let status = sent.as_ref().ok().map(|answer| answer.status().as_u16());
    let (outcome, result) = match sent {
        Ok(answer) if answer.status().is_success() => ("accepted", Ok(())),
        Ok(answer) => (
            "refused",
            Err(Failure {
                error: format!("answered {}", answer.status()),
                retry_after: retry_after(answer.headers()),
            }),
        ),
        Err(error) => (
            if error.is_timeout() {
                "timeout"
            } else {
                "unreachable"
            },
            Err(Failure {
                error: describe(&error),
                retry_after: None,
            }),
        ),
    };
    if let Some(tracer) = tracer {
        let attempt = Attempt {
            endpoint: &label,
            event: &id,
            outcome,
            status,
        };
        tracer.alone(attempt.span(), started);
    }
    metrics::counter!(telemetry::EVENT_DELIVERIES, "endpoint" => label, "outcome" => outcome)
        .increment(1);
    result
}

/// What a delivery attempt's span tells: to whom, what, and how it went.
struct Attempt<'a> {
    endpoint: &'a str,
    event: &'a str,
    outcome: &'static str,
    status: Option<u16>,
}

impl Attempt<'_> {
    fn span(&self) -> Alone {
        let mut attributes = vec![
            ("flashgate.webhook.endpoint", Value::from(self.endpoint)),
            ("flashgate.webhook.event_id", Value::from(self.event)),
            ("flashgate.webhook.outcome", Value::from(self.outcome)),
        ];
        if let Some(status) = self.status {
            attributes.push(("http.response.status_code", Value::Int(i64::from(status))));
        }
        Alone {
            name: "webhook delivery",
            kind: Kind::Client,
            attributes,
            failed: self.outcome != "accepted",
        }
    }
}

/// The error with its causes, which name a refused address or a closed port.
fn describe(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// `Retry-After` in seconds (the HTTP-date form is read as no advice).
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(http::header::RETRY_AFTER)?.to_str().ok()?;
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

/// The wait before attempt `attempt` (0 is the first retry): exponential from `initial`,
/// at most `max`, with full jitter over its upper half; a receiver's `Retry-After` is
/// honoured up to `max`.
pub fn backoff(
    attempt: u32,
    initial: Duration,
    max: Duration,
    retry_after: Option<Duration>,
) -> Duration {
    let exponential = initial.saturating_mul(1u32 << attempt.min(20)).min(max);
    let half = exponential / 2;
    let jitter = half.mul_f64(rand::random::<f64>());
    let wait = half + jitter;
    match retry_after {
        Some(asked) => wait.max(asked.min(max)),
        None => wait,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_is_bounded_and_honours_retry_after() {
        let (initial, max) = (Duration::from_millis(100), Duration::from_secs(5));
        for attempt in 0..30 {
            let wait = backoff(attempt, initial, max, None);
            let ceiling = initial.saturating_mul(1 << attempt.min(20)).min(max);
            assert!(
                wait >= ceiling / 2 && wait <= ceiling,
                "{attempt}: {wait:?}"
            );
        }
        let asked = backoff(0, initial, max, Some(Duration::from_secs(3)));
        assert_eq!(asked, Duration::from_secs(3));
        let capped = backoff(0, initial, max, Some(Duration::from_secs(3600)));
        assert_eq!(capped, max);
    }
}
