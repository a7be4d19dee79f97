//! Buyers that behave as real clients do: an answer that does not come, or a 5xx, is
//! retried with the same idempotency key on another gateway; an order is then paid or
//! abandoned. Every outcome is written down, so the ledger can be checked against what
//! clients were told.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::cluster::JWT_SECRET;
use super::schedule::Rng;

/// What one `(user, key)` purchase ended as, from the client's side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// 201 with this order id (the client believes it holds the units).
    Acknowledged(String),
    /// A definitive refusal (sold out, limit): no order may exist for it. Beside the
    /// status, what the client saw, in words, to name the cause of a violation.
    Refused(u16, String),
    /// No definitive answer before the client gave up: either is fine.
    Unknown,
}

/// Everything the buyers saw.
#[derive(Debug, Default)]
pub struct Journal {
    pub purchases: HashMap<(String, String), Outcome>,
    /// Intents whose checkout the buyer completed (the provider may say it succeeded).
    pub paid_intents: HashSet<String>,
    pub requests: u64,
    pub retries: u64,
}

/// Where buyers send requests; gateways may be down at any moment.
#[derive(Clone)]
pub struct Targets {
    pub gateways: Vec<String>,
    pub psp_base: String,
    pub deal: String,
}

/// Runs `buyers` buyers until `until`; returns the journal.
pub async fn run(
    targets: Targets,
    buyers: usize,
    seed: u64,
    until: Instant,
) -> Arc<Mutex<Journal>> {
    let journal = Arc::new(Mutex::new(Journal::default()));
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(5))
        .pool_max_idle_per_host(8)
        .build()
        .expect("an HTTP client builds");
    let mut tasks = tokio::task::JoinSet::new();
    for buyer in 0..buyers {
        let (targets, client, journal) = (targets.clone(), client.clone(), journal.clone());
        let rng = Rng::new(seed ^ (buyer as u64).wrapping_mul(0x9E37_79B9));
        tasks.spawn(async move {
            Buyer {
                id: buyer,
                rng,
                targets,
                client,
                journal,
            }
            .shop(until)
            .await;
        });
    }
    tasks.join_all().await;
    journal
}

struct Buyer {
    id: usize,
    rng: Rng,
    targets: Targets,
    client: reqwest::Client,
    journal: Arc<Mutex<Journal>>,
}

impl Buyer {
    async fn shop(mut self, until: Instant) {
        let mut purchase = 0;
        while Instant::now() < until {
            let user = format!("buyer-{}-{purchase}", self.id);
            let key = format!("key-{purchase}");
            let quantity = self.rng.between(1, 3);
            let outcome = self.order(&user, &key, quantity, until).await;
            if let Outcome::Acknowledged(order) = &outcome
                && self.rng.chance(70)
            {
                self.pay(&user, order).await;
            }
            self.note(|j| {
                j.purchases.insert((user, key), outcome);
            });
            purchase += 1;
            let think = self.rng.between(20, 200);
            tokio::time::sleep(Duration::from_millis(think)).await;
        }
    }

    fn note(&self, write: impl FnOnce(&mut Journal)) {
        let mut journal = self.journal.lock().unwrap_or_else(|e| e.into_inner());
        write(&mut journal);
    }

    fn gateway(&mut self) -> String {
        let at = self.rng.between(0, self.targets.gateways.len() as u64) as usize;
        self.targets.gateways[at].clone()
    }

    /// Places one order, retrying the same key until a definitive answer or `until`.
    async fn order(&mut self, user: &str, key: &str, quantity: u64, until: Instant) -> Outcome {
        let token = flashgate::auth::mint_token(JWT_SECRET, user, 3600);
        let give_up = until + Duration::from_secs(5);
        let mut tries = 0;
        let started = Instant::now();
        while Instant::now() < give_up && tries < 30 {
            tries += 1;
            let url = format!("{}/v1/deals/{}/orders", self.gateway(), self.targets.deal);
            let sent = self
                .client
                .post(url)
                .bearer_auth(&token)
                .header("Idempotency-Key", key)
                .json(&json!({ "quantity": quantity }))
                .send()
                .await;
            self.note(|j| j.requests += 1);
            if let Ok(response) = sent {
                let status = response.status().as_u16();
                let body: Value = response.json().await.unwrap_or(Value::Null);
                match status {
                    201 => {
                        let id = body["order_id"].as_str().unwrap_or_default();
                        return Outcome::Acknowledged(id.to_owned());
                    }
                    400..=499 if status != 408 && status != 429 => {
                        let seen = format!(
                            "{} on try {tries} of a purchase started {} ms earlier",
                            body["type"].as_str().unwrap_or("no problem type"),
                            started.elapsed().as_millis()
                        );
                        return Outcome::Refused(status, seen);
                    }
                    _ => {}
                }
            }
            self.note(|j| j.retries += 1);
            let backoff = self.rng.between(50, 400);
            tokio::time::sleep(Duration::from_millis(backoff)).await;
        }
        Outcome::Unknown
    }

    /// Starts a payment (again, if the order answer had none) and pays on the provider's
    /// checkout page; failures are left to the gateway's repair work.
    async fn pay(&mut self, user: &str, order: &str) {
        let token = flashgate::auth::mint_token(JWT_SECRET, user, 3600);
        let url = format!("{}/v1/orders/{order}/payments", self.gateway());
        let started = self
            .client
            .post(url)
            .bearer_auth(&token)
            .header("Idempotency-Key", format!("pay-{order}"))
            .send()
            .await;
        let Ok(response) = started else {
            return;
        };
        let body: Value = response.json().await.unwrap_or(Value::Null);
        let checkout = body["checkout_url"]
            .as_str()
            .or_else(|| body["payment"]["checkout_url"].as_str());
        let Some(intent) = checkout.and_then(|url| url.rsplit('/').next()) else {
            return;
        };
        let intent = intent.to_owned();
        let pay = format!("{}/checkout/{intent}/pay", self.targets.psp_base);
        if let Ok(answer) = self.client.post(pay).json(&json!({})).send().await
            && answer.status().is_success()
        {
            self.note(|j| {
                j.paid_intents.insert(intent);
            });
        }
    }
}
