//! Pure types and rules, no IO.
//!
//! Everything that arrives from the network is parsed into one of these types at the edge
//! (`DealId::parse`, `Quantity::new`, …), so deeper layers can trust their inputs.

mod ids;
mod payment_terms;
mod status;

pub use ids::{DealId, IdempotencyKey, InvalidInput, Quantity, UserId};
pub use payment_terms::{CaptureMethod, LatePaymentPolicy};
pub use status::{AttemptStatus, InvalidTransition, OrderEvent, OrderStatus};

/// A verified token's claims, for rules that read one (a waiting room's invitation and
/// priority group).
pub type ClaimSet = std::sync::Arc<serde_json::Map<String, serde_json::Value>>;
