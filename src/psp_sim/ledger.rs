//! The provider's books: payment intents, refunds and idempotency keys behind one lock.
//! Every change and the event it causes happen under that lock, so events are published
//! in the order the changes happened.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use serde_json::{Map, Value, json};

use super::lock;
use super::model::{
    Action, CreateIntent, CreateRefund, Outcome, PaymentIntent, Refund, SimError, Status,
    transition,
};
use super::webhooks::Outbox;

/// Longest idempotency key accepted, in bytes.
pub const IDEMPOTENCY_KEY_BYTES_MAX: usize = 255;
/// Furthest the clock may be moved in one call: ten years, in seconds.
pub const CLOCK_ADVANCE_SECONDS_MAX: i64 = 315_360_000;

/// The simulator's clock: wall-clock time plus an offset that tests can only move forward.
/// Intent timestamps and expiry use it; webhook signatures use the real time, so a
/// receiver's timestamp tolerance is not affected by advancing it.
#[derive(Debug, Default)]
pub struct Clock {
    offset_seconds: AtomicI64,
}

impl Clock {
    pub fn now(&self) -> i64 {
        chrono::Utc::now().timestamp() + self.offset_seconds.load(Ordering::Relaxed)
    }

    fn advance(&self, seconds: i64) {
        self.offset_seconds.fetch_add(seconds, Ordering::Relaxed);
    }
}

/// A stored idempotency key: the request body it came with and the object it created.
struct KeyUse {
    body: Value,
    object_id: String,
}

#[derive(Default)]
struct Books {
    intents: BTreeMap<String, PaymentIntent>,
    refunds: BTreeMap<String, Refund>,
    refunds_by_intent: HashMap<String, Vec<String>>,
    intent_keys: HashMap<String, KeyUse>,
    refund_keys: HashMap<String, KeyUse>,
}

/// An object and whether it was answered from an earlier request with the same key.
pub struct Created<T> {
    pub object: T,
    pub replayed: bool,
}

pub struct Ledger {
    books: Mutex<Books>,
    outbox: Arc<Outbox>,
    clock: Clock,
    /// `http://<addr>`, the start of every checkout URL.
    base_url: String,
}

/// Checks an `Idempotency-Key` header value.
pub fn parse_idempotency_key(raw: Option<&str>) -> Result<String, SimError> {
    match raw {
        None => Err(SimError::invalid("the Idempotency-Key header is required")),
        Some(key) if key.is_empty() || key.len() > IDEMPOTENCY_KEY_BYTES_MAX => {
            Err(SimError::invalid(format!(
                "Idempotency-Key must be 1 to {IDEMPOTENCY_KEY_BYTES_MAX} bytes"
            )))
        }
        Some(key) => Ok(key.to_owned()),
    }
}

/// Serialises one of our own objects, which cannot fail (string keys, no custom impls).
pub fn to_json<T: Serialize>(object: &T) -> Value {
    serde_json::to_value(object).unwrap_or(Value::Null)
}

fn not_found(what: &str, id: &str) -> SimError {
    SimError::NotFound(format!("no such {what}: {id}"))
}

impl Ledger {
    pub fn new(outbox: Arc<Outbox>, base_url: String) -> Self {
        Ledger {
            books: Mutex::new(Books::default()),
            outbox,
            clock: Clock::default(),
            base_url,
        }
    }

    pub fn now(&self) -> i64 {
        self.clock.now()
    }

    /// `POST /v1/payment_intents`.
    pub fn create_intent(
        &self,
        key: &str,
        body: &Value,
    ) -> Result<Created<PaymentIntent>, SimError> {
        let create = CreateIntent::parse(body)?;
        let now = self.now();
        let mut books = lock(&self.books);
        if let Some(used) = books.intent_keys.get(key) {
            if used.body != *body {
                return Err(SimError::IdempotencyConflict);
            }
            let id = used.object_id.clone();
            let object = self.expire_if_due(&mut books, &id, now)?;
            return Ok(Created {
                object,
                replayed: true,
            });
        }
        let id = format!("pi_{}", uuid::Uuid::now_v7().simple());
        let intent = PaymentIntent {
            checkout_url: format!("{}/checkout/{id}", self.base_url),
            id: id.clone(),
            object: "payment_intent",
            status: Status::RequiresPayment,
            amount_minor: create.amount_minor,
            expires_at: now + create.expires_in_seconds(),
            currency: create.currency,
            reference: create.reference,
            capture_method: create.capture_method,
            created: now,
            amount_refunded_minor: 0,
            metadata: create.metadata.unwrap_or_else(Map::new),
        };
        books.intents.insert(id.clone(), intent.clone());
        let used = KeyUse {
            body: body.clone(),
            object_id: id,
        };
        books.intent_keys.insert(key.to_owned(), used);
        Ok(Created {
            object: intent,
            replayed: false,
        })
    }

    /// `GET /v1/payment_intents/{id}`; expiry is applied first.
    pub fn intent(&self, id: &str) -> Result<PaymentIntent, SimError> {
        let now = self.now();
        let mut books = lock(&self.books);
        self.expire_if_due(&mut books, id, now)
    }

    /// Pay, decline, capture, cancel or force-succeed an intent, after applying expiry.
    pub fn act(&self, id: &str, action: Action) -> Result<PaymentIntent, SimError> {
        let now = self.now();
        let mut books = lock(&self.books);
        self.expire_if_due(&mut books, id, now)?;
        self.apply(&mut books, id, action, now)
    }

    /// Changes the amount or currency the provider has on record for an intent, without an
    /// event: a provider-side error, or a provider spelling currency codes its own way (in
    /// lower case, say). Lets tests check that money differing from the order is never
    /// taken.
    pub fn amend(
        &self,
        id: &str,
        amount_minor: Option<i64>,
        currency: Option<String>,
    ) -> Result<PaymentIntent, SimError> {
        if amount_minor.is_some_and(|a| a <= 0)
            || currency
                .as_ref()
                .is_some_and(|c| c.len() != 3 || !c.bytes().all(|b| b.is_ascii_alphabetic()))
        {
            return Err(SimError::invalid(
                "amount_minor must be > 0, currency three letters",
            ));
        }
        let mut books = lock(&self.books);
        let intent = books
            .intents
            .get_mut(id)
            .ok_or_else(|| not_found("payment intent", id))?;
        if let Some(amount) = amount_minor {
            intent.amount_minor = amount;
        }
        if let Some(currency) = currency {
            intent.currency = currency;
        }
        Ok(intent.clone())
    }

    /// Moves every `requires_payment` intent past its `expires_at` to `expired`.
    pub fn expire_due(&self) -> usize {
        let now = self.now();
        let mut books = lock(&self.books);
        let due: Vec<String> = books
            .intents
            .values()
            .filter(|i| i.status == Status::RequiresPayment && now >= i.expires_at)
            .map(|i| i.id.clone())
            .collect();
        for id in &due {
            let _ = self.apply(&mut books, id, Action::Expire, now);
        }
        due.len()
    }

    /// Moves the simulator's clock forward and expires what became due.
    pub fn advance_clock(&self, seconds: i64) -> Result<i64, SimError> {
        if !(0..=CLOCK_ADVANCE_SECONDS_MAX).contains(&seconds) {
            return Err(SimError::invalid(format!(
                "seconds must be between 0 and {CLOCK_ADVANCE_SECONDS_MAX}"
            )));
        }
        self.clock.advance(seconds);
        self.expire_due();
        Ok(self.now())
    }

    pub fn intents(&self) -> Vec<PaymentIntent> {
        self.expire_due();
        lock(&self.books).intents.values().cloned().collect()
    }

    /// `POST /v1/refunds`.
    pub fn create_refund(&self, key: &str, body: &Value) -> Result<Created<Refund>, SimError> {
        let create = CreateRefund::parse(body)?;
        let now = self.now();
        let mut books = lock(&self.books);
        if let Some(used) = books.refund_keys.get(key) {
            if used.body != *body {
                return Err(SimError::IdempotencyConflict);
            }
            let object = books
                .refunds
                .get(&used.object_id)
                .cloned()
                .ok_or_else(|| not_found("refund", &used.object_id))?;
            return Ok(Created {
                object,
                replayed: true,
            });
        }
        let intent_id = create.payment_intent;
        let intent = self.expire_if_due(&mut books, &intent_id, now)?;
        if intent.status != Status::Succeeded {
            return Err(SimError::InvalidState(format!(
                "payment intent {intent_id} is {}; only succeeded payments can be refunded",
                intent.status.as_str()
            )));
        }
        let remaining = intent.amount_minor - intent.amount_refunded_minor;
        let amount = create.amount_minor.unwrap_or(remaining);
        if amount <= 0 || amount > remaining {
            return Err(SimError::RefundExceedsAmount(format!(
                "{remaining} of {} {} is left to refund",
                intent.amount_minor, intent.currency
            )));
        }
        let refund = Refund {
            id: format!("re_{}", uuid::Uuid::now_v7().simple()),
            object: "refund",
            payment_intent: intent_id.clone(),
            amount_minor: amount,
            currency: intent.currency.clone(),
            status: "succeeded",
            created: now,
        };
        if let Some(stored) = books.intents.get_mut(&intent_id) {
            stored.amount_refunded_minor += amount;
            assert!(stored.amount_refunded_minor <= stored.amount_minor);
        }
        books.refunds.insert(refund.id.clone(), refund.clone());
        let list = books.refunds_by_intent.entry(intent_id).or_default();
        list.push(refund.id.clone());
        let used = KeyUse {
            body: body.clone(),
            object_id: refund.id.clone(),
        };
        books.refund_keys.insert(key.to_owned(), used);
        self.outbox
            .publish("charge.refunded", to_json(&refund), now);
        Ok(Created {
            object: refund,
            replayed: false,
        })
    }

    pub fn refund(&self, id: &str) -> Result<Refund, SimError> {
        lock(&self.books)
            .refunds
            .get(id)
            .cloned()
            .ok_or_else(|| not_found("refund", id))
    }

    /// `GET /v1/payment_intents/{id}/refunds`: `{"data": [refunds]}`, oldest first.
    pub fn refunds_of(&self, intent_id: &str) -> Result<Value, SimError> {
        let books = lock(&self.books);
        if !books.intents.contains_key(intent_id) {
            return Err(not_found("payment intent", intent_id));
        }
        let refunds: Vec<Value> = books
            .refunds_by_intent
            .get(intent_id)
            .into_iter()
            .flatten()
            .filter_map(|id| books.refunds.get(id))
            .map(to_json)
            .collect();
        Ok(json!({ "data": refunds }))
    }

    fn expire_if_due(
        &self,
        books: &mut Books,
        id: &str,
        now: i64,
    ) -> Result<PaymentIntent, SimError> {
        let intent = books
            .intents
            .get(id)
            .ok_or_else(|| not_found("payment intent", id))?;
        if intent.status == Status::RequiresPayment && now >= intent.expires_at {
            return self.apply(books, id, Action::Expire, now);
        }
        Ok(intent.clone())
    }

    /// Runs the state machine on one intent and publishes the event of a move.
    fn apply(
        &self,
        books: &mut Books,
        id: &str,
        action: Action,
        now: i64,
    ) -> Result<PaymentIntent, SimError> {
        let intent = books
            .intents
            .get_mut(id)
            .ok_or_else(|| not_found("payment intent", id))?;
        match transition(intent.status, intent.capture_method, action) {
            Ok(Outcome::Unchanged) => Ok(intent.clone()),
            Ok(Outcome::Moved(status, kind)) => {
                intent.status = status;
                let snapshot = intent.clone();
                self.outbox.publish(kind, to_json(&snapshot), now);
                Ok(snapshot)
            }
            Err(status) => Err(SimError::InvalidState(format!(
                "payment intent {id} is {}",
                status.as_str()
            ))),
        }
    }
}
