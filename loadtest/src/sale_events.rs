//! What events cost a sale, measured by `sale --events-receiver`: an in-process receiver that
//! answers at once is subscribed to every event before the sale and gets them live during
//! it. After the sale, the endpoint is replayed from where the feed stood before it (read in
//! the gateway's database), so the whole
//! sale's events are a backlog draining to the receiver, timed; both the live deliveries and
//! the replayed ones are checked to keep every order's sequence. The endpoint is deleted
//! afterwards, so the next sale runs without it.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sqlx::PgPool;

use crate::chaos::events::Receiver;
use crate::operator::Operator;

/// The longest the live deliveries, then the replayed backlog, get to arrive.
const DRAIN_MAX: Duration = Duration::from_secs(300);

/// How often the endpoint's backlog is looked at while it drains.
const POLL: Duration = Duration::from_millis(100);

/// A receiver subscribed to every event, its endpoint's id, and the feed's last position
/// before the sale.
pub struct Subscribed {
    receiver: Receiver,
    endpoint: String,
    db: PgPool,
    start: i64,
}

/// Starts the receiver and subscribes it through the admin API.
pub async fn subscribe(
    http: &reqwest::Client,
    operator: &Operator,
    database_url: Option<&str>,
) -> Result<Subscribed, String> {
    let url = database_url.ok_or("--events-receiver needs --database-url")?;
    let db = PgPool::connect(url).await.map_err(|e| e.to_string())?;
    let start = sqlx::query_scalar("SELECT coalesce(max(position), 0) FROM event_positions")
        .fetch_one(&db)
        .await
        .map_err(|e| e.to_string())?;
    let receiver = Receiver::start().await?;
    let endpoint = receiver
        .subscribe(http, &operator.ops_url, &operator.admin_token)
        .await?;
    Ok(Subscribed {
        receiver,
        endpoint,
        db,
        start,
    })
}

impl Subscribed {
    /// Waits for the live deliveries, then replays and times the backlog; adds the figures
    /// to the sale's `report` under `events`. A delivery that did not finish or broke an
    /// order's sequence fails the sale's verdict.
    pub async fn report(
        self,
        http: &reqwest::Client,
        operator: &Operator,
        deal_id: &str,
        order_ids: &[String],
        report: &mut Value,
    ) {
        let mut objects: HashSet<String> = order_ids.iter().cloned().collect();
        let live_at_end = self.receiver.distinct();
        let started = Instant::now();
        let live = self
            .wait(http, operator, || {
                self.receiver.objects_told(&objects) >= order_ids.len()
            })
            .await;
        let live_seconds = started.elapsed().as_secs_f64();
        objects.insert(format!("deal:{deal_id}"));
        let mut violations = self.receiver.violations(&objects, 0);
        let from = self.receiver.arrivals();
        let backlog: i64 =
            sqlx::query_scalar("SELECT count(*) FROM event_positions WHERE position > $1")
                .bind(self.start)
                .fetch_one(&self.db)
                .await
                .unwrap_or(0);
        let backlog = usize::try_from(backlog).unwrap_or(0);
        let started = Instant::now();
        let replayed = self.replay(http, operator).await
            && self
                .wait(http, operator, || {
                    self.receiver.arrivals() - from >= backlog
                })
                .await;
        let drain_seconds = started.elapsed().as_secs_f64();
        let drained = self.receiver.arrivals() - from;
        violations.extend(self.receiver.violations(&objects, from));
        let url = format!(
            "{}/admin/event-endpoints/{}",
            operator.ops_url, self.endpoint
        );
        let _ = http
            .delete(url)
            .bearer_auth(&operator.admin_token)
            .send()
            .await;
        if !violations.is_empty() || !live || !replayed {
            report["verdict"]["ok"] = json!(false);
            report["verdict"]["reasons"] = json!(["events lost, late or out of sequence"]);
        }
        report["events"] = json!({
            "live_by_sale_end": live_at_end,
            "live_done_after_seconds": live_seconds,
            "replayed_backlog": backlog,
            "drained": drained,
            "drain_seconds": drain_seconds,
            "drain_events_per_second": drained as f64 / drain_seconds.max(1e-9),
            "violations": violations.len(),
            "first_violations": violations.iter().take(5).collect::<Vec<_>>(),
        });
    }

    /// Sends the endpoint again everything after the feed's position before the sale.
    async fn replay(&self, http: &reqwest::Client, operator: &Operator) -> bool {
        let path = format!("/admin/event-endpoints/{}/replay", self.endpoint);
        let after = json!({"after": self.start.to_string()});
        let sent = operator.post(http, &path).json(&after).send().await;
        sent.is_ok_and(|answer| answer.status().is_success())
    }

    /// Waits until `arrived` holds and the endpoint has nothing pending; false past
    /// `DRAIN_MAX`.
    async fn wait(
        &self,
        http: &reqwest::Client,
        operator: &Operator,
        arrived: impl Fn() -> bool,
    ) -> bool {
        let started = Instant::now();
        loop {
            if arrived() && self.pending(http, operator).await == Some(0) {
                return true;
            }
            if started.elapsed() > DRAIN_MAX {
                return false;
            }
            tokio::time::sleep(POLL).await;
        }
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
