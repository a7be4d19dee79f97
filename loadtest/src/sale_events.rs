//! What events cost a sale, measured by `sale --events-receiver`: an in-process receiver that
//! answers at once is subscribed to every event before the sale; after it, the backlog the
//! sale left is timed while it drains, and every order's events are checked to have arrived
//! in sequence. The endpoint is deleted afterwards, so the next sale runs without it.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::chaos::events::Receiver;
use crate::operator::Operator;

/// The longest the backlog gets to drain.
const DRAIN_MAX: Duration = Duration::from_secs(300);

/// How often the endpoint's backlog is looked at while it drains.
const POLL: Duration = Duration::from_millis(100);

/// A receiver subscribed to every event, and its endpoint's id.
pub struct Subscribed {
    receiver: Receiver,
    endpoint: String,
}

/// Starts the receiver and subscribes it through the admin API.
pub async fn subscribe(http: &reqwest::Client, operator: &Operator) -> Result<Subscribed, String> {
    let receiver = Receiver::start().await?;
    let endpoint = receiver
        .subscribe(http, &operator.ops_url, &operator.admin_token)
        .await?;
    Ok(Subscribed { receiver, endpoint })
}

impl Subscribed {
    /// Drains and adds the figures to the sale's `report` under `events`; a drain that
    /// did not finish or broke an order's sequence fails the sale's verdict.
    pub async fn report(
        self,
        http: &reqwest::Client,
        operator: &Operator,
        deal_id: &str,
        order_ids: &[String],
        report: &mut Value,
    ) {
        let events = self.drain(http, operator, deal_id, order_ids).await;
        if events["violations"] != 0 || events["drained"] != true {
            report["verdict"]["ok"] = json!(false);
            report["verdict"]["reasons"] = json!(["events lost, late or out of sequence"]);
        }
        report["events"] = events;
    }

    /// Waits until the endpoint has nothing pending and every order in `order_ids` was
    /// told of; the drain's figures, then deletes the endpoint.
    async fn drain(
        self,
        http: &reqwest::Client,
        operator: &Operator,
        deal_id: &str,
        order_ids: &[String],
    ) -> Value {
        let at_end = self.receiver.distinct();
        let started = Instant::now();
        let mut objects: HashSet<String> = order_ids.iter().cloned().collect();
        let backlog = self.pending(http, operator).await;
        let drained = loop {
            let told = self.receiver.objects_told(&objects);
            if told >= order_ids.len() && self.pending(http, operator).await == Some(0) {
                break true;
            }
            if started.elapsed() > DRAIN_MAX {
                break false;
            }
            tokio::time::sleep(POLL).await;
        };
        let seconds = started.elapsed().as_secs_f64();
        let moved = self.receiver.distinct() - at_end;
        objects.insert(format!("deal:{deal_id}"));
        let violations = self.receiver.violations(&objects);
        let url = format!(
            "{}/admin/event-endpoints/{}",
            operator.ops_url, self.endpoint
        );
        let _ = http
            .delete(url)
            .bearer_auth(&operator.admin_token)
            .send()
            .await;
        json!({
            "delivered_during_sale": at_end,
            "backlog_at_end": backlog,
            "drained": drained,
            "drained_events": moved,
            "drain_seconds": seconds,
            "drain_events_per_second": moved as f64 / seconds.max(1e-9),
            "violations": violations.len(),
            "first_violations": violations.iter().take(5).collect::<Vec<_>>(),
        })
    }

    /// The endpoint's pending events, as its admin view counts them.
    async fn pending(&self, http: &reqwest::Client, operator: &Operator) -> Option<i64> {
        let url = format!(
            "{}/admin/event-endpoints/{}",
            operator.ops_url, self.endpoint
        );
        let answer = http
            .get(url)
            .bearer_auth(&operator.admin_token)
            .send()
            .await
            .ok()?;
        let view: Value = answer.json().await.ok()?;
        view["pending"].as_i64()
    }
}
