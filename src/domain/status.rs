//! The order state machine.
//!
//! `transition` is the only definition of which moves are legal. SQL repeats the old state
//! in its `WHERE` clause so that two racing writers (a cancel and the sweeper, say) produce
//! exactly one outcome; this function decides what that outcome may be.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OrderStatus {
    /// Stock is reserved and waits for payment until `expires_at`.
    PendingPayment,
    /// Payment confirmed; the reserved units are sold.
    Paid,
    /// The reservation ran out before payment; units went back to the buckets.
    Expired,
    /// The user (or a failed payment) cancelled; units went back to the buckets.
    Cancelled,
    /// Money arrived for an order that no longer holds stock; it must be returned.
    RefundPending,
    /// The money was returned.
    Refunded,
    /// Money arrived for an order that no longer holds stock, on a deal whose late-payment
    /// policy is `manual_review`: an operator fulfils it (if units are left) or refunds it.
    ManualReview,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrderEvent {
    Cancel,
    Expire,
    PaymentSucceeded,
    PaymentFailed,
    RefundRequested,
    RefundCompleted,
    /// Late money parked for an operator (policy `manual_review`).
    HoldForReview,
    /// Late money kept: the units were taken again.
    ReserveAgain,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("an order in {from} cannot take {event:?}")]
pub struct InvalidTransition {
    pub from: OrderStatus,
    pub event: OrderEvent,
}

impl OrderStatus {
    pub const ALL: [OrderStatus; 7] = [
        Self::PendingPayment,
        Self::Paid,
        Self::Expired,
        Self::Cancelled,
        Self::RefundPending,
        Self::Refunded,
        Self::ManualReview,
    ];

    pub fn transition(self, event: OrderEvent) -> Result<OrderStatus, InvalidTransition> {
        use OrderEvent as E;
        use OrderStatus as S;
        match (self, event) {
            (S::PendingPayment, E::Cancel | E::PaymentFailed) => Ok(S::Cancelled),
            (S::PendingPayment, E::Expire) => Ok(S::Expired),
            (S::PendingPayment, E::PaymentSucceeded) => Ok(S::Paid),
            (S::Expired | S::Cancelled, E::PaymentSucceeded) => Ok(S::RefundPending),
            (S::Expired | S::Cancelled, E::HoldForReview) => Ok(S::ManualReview),
            (S::Expired | S::Cancelled | S::ManualReview, E::ReserveAgain) => Ok(S::Paid),
            (S::Paid | S::ManualReview, E::RefundRequested) => Ok(S::RefundPending),
            (S::RefundPending, E::RefundCompleted) => Ok(S::Refunded),
            (from, event) => Err(InvalidTransition { from, event }),
        }
    }

    /// Whether an order in this status holds units of its deal: reserved while it waits for
    /// payment, sold once paid. Every other status has given them back or never took them.
    pub fn holds_units(self) -> bool {
        matches!(self, Self::PendingPayment | Self::Paid)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::PendingPayment => "PENDING_PAYMENT",
            Self::Paid => "PAID",
            Self::Expired => "EXPIRED",
            Self::Cancelled => "CANCELLED",
            Self::RefundPending => "REFUND_PENDING",
            Self::Refunded => "REFUNDED",
            Self::ManualReview => "MANUAL_REVIEW",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|status| status.as_str() == raw)
    }
}

impl fmt::Display for OrderStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const EVENTS: [OrderEvent; 8] = [
        OrderEvent::Cancel,
        OrderEvent::Expire,
        OrderEvent::PaymentSucceeded,
        OrderEvent::PaymentFailed,
        OrderEvent::RefundRequested,
        OrderEvent::RefundCompleted,
        OrderEvent::HoldForReview,
        OrderEvent::ReserveAgain,
    ];

    #[test]
    fn names_round_trip() {
        for status in OrderStatus::ALL {
            assert_eq!(OrderStatus::parse(status.as_str()), Some(status));
        }
        assert_eq!(OrderStatus::parse("paid"), None);
    }

    #[test]
    fn only_pending_orders_can_be_cancelled_or_expired() {
        for status in OrderStatus::ALL {
            for event in [OrderEvent::Cancel, OrderEvent::Expire] {
                assert_eq!(
                    status.transition(event).is_ok(),
                    status == OrderStatus::PendingPayment
                );
            }
        }
    }

    #[test]
    fn an_order_in_review_is_fulfilled_or_refunded_and_nothing_else() {
        let review = OrderStatus::Expired
            .transition(OrderEvent::HoldForReview)
            .unwrap();
        assert_eq!(review, OrderStatus::ManualReview);
        for event in EVENTS {
            let allowed = matches!(
                event,
                OrderEvent::ReserveAgain | OrderEvent::RefundRequested
            );
            assert_eq!(review.transition(event).is_ok(), allowed, "{event:?}");
        }
        assert!(
            OrderStatus::PendingPayment
                .transition(OrderEvent::HoldForReview)
                .is_err()
        );
    }

    #[test]
    fn terminal_states_accept_nothing() {
        for event in EVENTS {
            assert!(OrderStatus::Refunded.transition(event).is_err());
        }
    }

    fn event() -> impl Strategy<Value = OrderEvent> {
        proptest::sample::select(EVENTS.to_vec())
    }

    proptest! {
        /// Over any sequence of events an order is paid at most once, and once it has left
        /// PENDING_PAYMENT it never returns there.
        #[test]
        fn random_event_sequences(events in proptest::collection::vec(event(), 0..40)) {
            let mut status = OrderStatus::PendingPayment;
            let mut paid = 0;
            for event in events {
                if let Ok(next) = status.transition(event) {
                    prop_assert_ne!(next, OrderStatus::PendingPayment);
                    if next == OrderStatus::Paid {
                        paid += 1;
                    }
                    status = next;
                }
            }
            prop_assert!(paid <= 1);
        }
    }
}

/// Where an attempt stands; stored as its upper-case name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AttemptStatus {
    /// Open at the provider (or not yet created there): money may still come.
    Pending,
    Succeeded,
    Failed,
    Expired,
}

impl AttemptStatus {
    pub const ALL: [Self; 4] = [Self::Pending, Self::Succeeded, Self::Failed, Self::Expired];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "PENDING",
            Self::Succeeded => "SUCCEEDED",
            Self::Failed => "FAILED",
            Self::Expired => "EXPIRED",
        }
    }
}

impl TryFrom<String> for AttemptStatus {
    type Error = String;
    fn try_from(raw: String) -> Result<Self, String> {
        Self::ALL.into_iter().find(|s| s.as_str() == raw).ok_or(raw)
    }
}
