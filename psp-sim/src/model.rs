//! The provider's objects, the payment-intent state machine and the API error type. No IO.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Seconds a checkout session stays open when the request does not say.
pub const EXPIRES_IN_SECONDS_DEFAULT: i64 = 900;
/// Shortest checkout session a client may ask for.
pub const EXPIRES_IN_SECONDS_MIN: i64 = 60;
/// Longest checkout session a client may ask for.
pub const EXPIRES_IN_SECONDS_MAX: i64 = 86_400;
/// Largest amount accepted, in minor units; larger amounts are answered 400.
pub const AMOUNT_MINOR_MAX: i64 = 99_999_999_999;
/// Longest merchant reference accepted, in bytes.
pub const REFERENCE_BYTES_MAX: usize = 256;

/// Where a payment intent is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Created; the payer has not paid yet.
    RequiresPayment,
    /// Manual capture: the payer authorised, the merchant has not captured yet.
    RequiresCapture,
    /// Money taken.
    Succeeded,
    /// The payer's payment was declined.
    Failed,
    /// Voided by the merchant before money was taken.
    Canceled,
    /// The checkout session passed `expires_at` without payment.
    Expired,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::RequiresPayment => "requires_payment",
            Status::RequiresCapture => "requires_capture",
            Status::Succeeded => "succeeded",
            Status::Failed => "failed",
            Status::Canceled => "canceled",
            Status::Expired => "expired",
        }
    }
}

/// Whether paying takes the money at once or only authorises it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum CaptureMethod {
    #[default]
    Automatic,
    Manual,
}

/// Something that can happen to a payment intent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Pay,
    Decline,
    Capture,
    Cancel,
    Expire,
    /// The control API's "this payment went through after all", from any state.
    ForceSucceed,
}

/// What an action does to an intent in a given state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The intent moves to this status and an event of this type is sent.
    Moved(Status, &'static str),
    /// The action already happened; answer with the object unchanged, send nothing.
    Unchanged,
}

/// The pure state machine. `Err` carries the status that forbids the action.
pub fn transition(
    status: Status,
    method: CaptureMethod,
    action: Action,
) -> Result<Outcome, Status> {
    use Status::*;
    let moved = |to, event| Ok(Outcome::Moved(to, event));
    match (action, status) {
        (Action::Pay, RequiresPayment) => match method {
            CaptureMethod::Automatic => moved(Succeeded, "payment_intent.succeeded"),
            CaptureMethod::Manual => {
                moved(RequiresCapture, "payment_intent.amount_capturable_updated")
            }
        },
        (Action::Pay, RequiresCapture | Succeeded) => Ok(Outcome::Unchanged),
        (Action::Decline, RequiresPayment) => moved(Failed, "payment_intent.payment_failed"),
        (Action::Decline, Failed) => Ok(Outcome::Unchanged),
        (Action::Capture, RequiresCapture) => moved(Succeeded, "payment_intent.succeeded"),
        (Action::Capture, Succeeded) => Ok(Outcome::Unchanged),
        (Action::Cancel, RequiresPayment | RequiresCapture) => {
            moved(Canceled, "payment_intent.canceled")
        }
        (Action::Cancel, Canceled) => Ok(Outcome::Unchanged),
        (Action::Expire, RequiresPayment) => moved(Expired, "payment_intent.expired"),
        (Action::Expire, Expired) => Ok(Outcome::Unchanged),
        (Action::ForceSucceed, Succeeded) => Ok(Outcome::Unchanged),
        (Action::ForceSucceed, _) => moved(Succeeded, "payment_intent.succeeded"),
        (_, status) => Err(status),
    }
}

/// A payment as the provider keeps it; serialised exactly as the API returns it.
#[derive(Debug, Clone, Serialize)]
pub struct PaymentIntent {
    pub id: String,
    pub object: &'static str,
    pub status: Status,
    pub amount_minor: i64,
    pub currency: String,
    pub reference: String,
    pub capture_method: CaptureMethod,
    pub checkout_url: String,
    /// Unix seconds on the simulator's clock.
    pub expires_at: i64,
    /// Unix seconds on the simulator's clock.
    pub created: i64,
    pub amount_refunded_minor: i64,
    pub metadata: Map<String, Value>,
}

/// A refund of part or all of a succeeded payment.
#[derive(Debug, Clone, Serialize)]
pub struct Refund {
    pub id: String,
    pub object: &'static str,
    pub payment_intent: String,
    pub amount_minor: i64,
    pub currency: String,
    pub status: &'static str,
    pub created: i64,
}

/// The body of `POST /v1/payment_intents`, checked.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateIntent {
    pub amount_minor: i64,
    pub currency: String,
    pub reference: String,
    #[serde(default)]
    pub capture_method: CaptureMethod,
    #[serde(default)]
    pub expires_in_seconds: Option<i64>,
    #[serde(default)]
    pub metadata: Option<Map<String, Value>>,
}

impl CreateIntent {
    /// Parses and checks a create body; every rule a client can break is a 400.
    pub fn parse(body: &Value) -> Result<Self, SimError> {
        let create: CreateIntent =
            serde_json::from_value(body.clone()).map_err(|e| SimError::invalid(e.to_string()))?;
        check_amount(create.amount_minor)?;
        let currency_ok =
            create.currency.len() == 3 && create.currency.bytes().all(|b| b.is_ascii_uppercase());
        if !currency_ok {
            return Err(SimError::invalid(
                "currency must be three upper-case letters (ISO 4217)",
            ));
        }
        if create.reference.is_empty() || create.reference.len() > REFERENCE_BYTES_MAX {
            return Err(SimError::invalid(format!(
                "reference must be 1 to {REFERENCE_BYTES_MAX} bytes"
            )));
        }
        let expires = create.expires_in_seconds();
        if !(EXPIRES_IN_SECONDS_MIN..=EXPIRES_IN_SECONDS_MAX).contains(&expires) {
            return Err(SimError::invalid(format!(
                "expires_in_seconds must be between {EXPIRES_IN_SECONDS_MIN} and {EXPIRES_IN_SECONDS_MAX}"
            )));
        }
        Ok(create)
    }

    pub fn expires_in_seconds(&self) -> i64 {
        self.expires_in_seconds
            .unwrap_or(EXPIRES_IN_SECONDS_DEFAULT)
    }
}

/// The body of `POST /v1/refunds`, checked.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateRefund {
    pub payment_intent: String,
    #[serde(default)]
    pub amount_minor: Option<i64>,
}

impl CreateRefund {
    pub fn parse(body: &Value) -> Result<Self, SimError> {
        let refund: CreateRefund =
            serde_json::from_value(body.clone()).map_err(|e| SimError::invalid(e.to_string()))?;
        if let Some(amount) = refund.amount_minor {
            check_amount(amount)?;
        }
        Ok(refund)
    }
}

fn check_amount(amount_minor: i64) -> Result<(), SimError> {
    if (1..=AMOUNT_MINOR_MAX).contains(&amount_minor) {
        Ok(())
    } else {
        Err(SimError::invalid(format!(
            "amount_minor must be between 1 and {AMOUNT_MINOR_MAX}"
        )))
    }
}

/// Every answer the simulator gives that is not a success. Mapped to a status and the
/// `{"error": {"type", "message"}}` body in [`SimError::status`] and [`SimError::body`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SimError {
    /// Malformed JSON, a missing field, a value out of range: 400.
    InvalidRequest(String),
    /// Missing or wrong bearer token: 401.
    Authentication,
    /// No such object or route: 404.
    NotFound(String),
    /// Known route, other method: 405.
    MethodNotAllowed,
    /// The same idempotency key came with a different body: 409.
    IdempotencyConflict,
    /// The object's state forbids the action: 409.
    InvalidState(String),
    /// A refund larger than what is left to refund: 409.
    RefundExceedsAmount(String),
    /// Body over the size limit: 413.
    PayloadTooLarge,
    /// A failure injected through the control API, with the status to answer.
    Injected(u16),
}

impl SimError {
    pub fn invalid(message: impl Into<String>) -> Self {
        SimError::InvalidRequest(message.into())
    }

    pub fn status(&self) -> u16 {
        match self {
            SimError::InvalidRequest(_) => 400,
            SimError::Authentication => 401,
            SimError::NotFound(_) => 404,
            SimError::MethodNotAllowed => 405,
            SimError::IdempotencyConflict
            | SimError::InvalidState(_)
            | SimError::RefundExceedsAmount(_) => 409,
            SimError::PayloadTooLarge => 413,
            SimError::Injected(status) => *status,
        }
    }

    pub fn body(&self) -> Value {
        let (kind, message) = match self {
            SimError::InvalidRequest(m) => ("invalid_request", m.clone()),
            SimError::Authentication => (
                "authentication_error",
                "missing or wrong Authorization: Bearer <api key>".to_owned(),
            ),
            SimError::NotFound(m) => ("not_found", m.clone()),
            SimError::MethodNotAllowed => ("method_not_allowed", "method not allowed".to_owned()),
            SimError::IdempotencyConflict => (
                "idempotency_conflict",
                "this Idempotency-Key was used with a different request body".to_owned(),
            ),
            SimError::InvalidState(m) => ("invalid_state", m.clone()),
            SimError::RefundExceedsAmount(m) => ("refund_exceeds_amount", m.clone()),
            SimError::PayloadTooLarge => ("payload_too_large", "body too large".to_owned()),
            SimError::Injected(status) => (
                "injected_fault",
                format!("failure injected by the control API (status {status})"),
            ),
        };
        serde_json::json!({ "error": { "type": kind, "message": message } })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Status; 6] = [
        Status::RequiresPayment,
        Status::RequiresCapture,
        Status::Succeeded,
        Status::Failed,
        Status::Canceled,
        Status::Expired,
    ];

    #[test]
    fn force_succeed_reaches_succeeded_from_every_state() {
        for status in ALL {
            let outcome = transition(status, CaptureMethod::Automatic, Action::ForceSucceed);
            match outcome {
                Ok(Outcome::Moved(to, _)) => assert_eq!(to, Status::Succeeded),
                Ok(Outcome::Unchanged) => assert_eq!(status, Status::Succeeded),
                Err(_) => panic!("force succeed refused from {status:?}"),
            }
        }
    }

    #[test]
    fn terminal_states_refuse_payment() {
        for status in [Status::Failed, Status::Canceled, Status::Expired] {
            assert_eq!(
                transition(status, CaptureMethod::Automatic, Action::Pay),
                Err(status)
            );
        }
    }

    #[test]
    fn succeeded_cannot_be_canceled_and_only_requires_payment_expires() {
        assert!(transition(Status::Succeeded, CaptureMethod::Manual, Action::Cancel).is_err());
        for status in ALL {
            let moved = matches!(
                transition(status, CaptureMethod::Automatic, Action::Expire),
                Ok(Outcome::Moved(..))
            );
            assert_eq!(moved, status == Status::RequiresPayment);
        }
    }

    #[test]
    fn every_move_lands_where_the_action_says() {
        for status in ALL {
            for method in [CaptureMethod::Automatic, CaptureMethod::Manual] {
                for action in [
                    Action::Pay,
                    Action::Decline,
                    Action::Capture,
                    Action::Cancel,
                ] {
                    if let Ok(Outcome::Moved(to, _)) = transition(status, method, action) {
                        let expected = match (action, method) {
                            (Action::Pay, CaptureMethod::Manual) => Status::RequiresCapture,
                            (Action::Pay | Action::Capture, _) => Status::Succeeded,
                            (Action::Decline, _) => Status::Failed,
                            _ => Status::Canceled,
                        };
                        assert_eq!(to, expected, "{status:?} {method:?} {action:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn create_rejects_bad_input() {
        let ok = serde_json::json!({"amount_minor": 100, "currency": "EUR", "reference": "o1"});
        assert!(CreateIntent::parse(&ok).is_ok());
        for bad in [
            serde_json::json!({"amount_minor": 0, "currency": "EUR", "reference": "o1"}),
            serde_json::json!({"amount_minor": 1.5, "currency": "EUR", "reference": "o1"}),
            serde_json::json!({"amount_minor": 100, "currency": "eur", "reference": "o1"}),
            serde_json::json!({"amount_minor": 100, "currency": "EUR", "reference": ""}),
            serde_json::json!({"amount_minor": 100, "currency": "EUR", "reference": "o", "expires_in_seconds": 59}),
            serde_json::json!({"amount_minor": 100, "currency": "EUR", "reference": "o", "capture_method": "later"}),
            serde_json::json!({"amount_minor": 100, "currency": "EUR", "reference": "o", "extra": 1}),
            serde_json::json!([1, 2]),
        ] {
            assert!(CreateIntent::parse(&bad).is_err(), "{bad}");
        }
    }
}
