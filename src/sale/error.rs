//! The one error of the sale service, so that its callers (the HTTP handlers) map a single
//! type to problem+json.

use crate::admission::Rejection;
use crate::domain::{InvalidInput, OrderStatus};
use crate::orders::OrderError;
use crate::payments::checkout::CheckoutError;
use crate::payments::webhook::WebhookRejection;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum SaleError {
    /// Refused by admission: limits, token, window, pass, sold-out mirror.
    #[error(transparent)]
    Rejected(#[from] Rejection),
    /// The request itself is malformed (a quantity out of range, say).
    #[error(transparent)]
    Invalid(#[from] InvalidInput),
    #[error(transparent)]
    Order(#[from] OrderError),
    /// Only an order waiting for payment can be paid.
    #[error("the order is {0}; only PENDING_PAYMENT orders can be paid")]
    NotPayable(OrderStatus),
    #[error("payments are not enabled")]
    PaymentsDisabled,
    #[error(transparent)]
    Checkout(#[from] CheckoutError),
    #[error(transparent)]
    Webhook(#[from] WebhookRejection),
    #[error(transparent)]
    Store(#[from] StoreError),
}
