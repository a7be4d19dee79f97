//! The sale: everything that happens around an order, in one place.
//!
//! Placing an order is admission (limits, token, window, pass), the batched reservation,
//! giving the waiting-room pass back, and opening the order's payment. Cancelling is the
//! conditional cancel, the units reported free, the waiting-room session ended and the
//! open checkout sessions closed. Paying and settling go through the same service. The
//! HTTP handlers only parse and render: each calls one method here, so a rule of the sale
//! is written once whoever triggers it.

mod error;

use std::sync::Arc;

use chrono::Duration;
use sqlx::PgPool;
use uuid::Uuid;

use crate::admission::{Admission, Admitted, Rejection, SoldOutChecked};
use crate::domain::{IdempotencyKey, InvalidInput, OrderStatus, Quantity, UserId};
use crate::inventory::StockEvents;
use crate::orders::lanes::Engine;
use crate::orders::{self, Order, OrderError};
use crate::payments::Payments;
use crate::payments::attempts::{self, Attempt};
use crate::payments::webhook::Received;
use crate::store::Pools;
use crate::telemetry::trace;
use crate::waiting_room::health::Served;
use crate::waiting_room::report;

pub use error::SaleError;

/// An order as a buyer asked for it, parsed but not yet admitted.
pub struct OrderRequest<'a> {
    /// The deal, past the sold-out mirror.
    pub deal: SoldOutChecked,
    pub authorization: Option<&'a [u8]>,
    pub pass: Option<&'a [u8]>,
    pub key: IdempotencyKey,
    /// Checked after admission, so that a bad quantity under a used key is a conflict.
    pub quantity: Result<Quantity, InvalidInput>,
}

/// An order with its payment, as the buyer sees it.
pub struct OrderOutcome {
    pub order: Order,
    /// The order's latest payment attempt; `None` without payments (or when reading it
    /// failed right after placing, see [`Sale::place`]).
    pub attempt: Option<Attempt>,
    /// The idempotency key had produced this order before.
    pub replayed: bool,
    /// The latest moment the units stay held, when payments are enabled.
    pub hold_grace: Option<Duration>,
}

/// The sale service: built once, shared by every request.
pub struct Sale {
    admission: Arc<Admission>,
    orders: Engine,
    payments: Option<Payments>,
    pools: Pools,
    stock_events: StockEvents,
}

impl Sale {
    pub fn new(
        admission: Arc<Admission>,
        orders: Engine,
        payments: Option<Payments>,
        pools: Pools,
        stock_events: StockEvents,
    ) -> Self {
        Self {
            admission,
            orders,
            payments,
            pools,
            stock_events,
        }
    }

    /// The payment provider and its settings, when payments are enabled.
    pub fn payments(&self) -> Option<&Payments> {
        self.payments.as_ref()
    }

    /// Where stock that became free or ran out is reported.
    pub fn stock_events(&self) -> &StockEvents {
        &self.stock_events
    }

    fn pool(&self) -> &PgPool {
        &self.pools.request
    }

    /// Admits, reserves, releases the waiting-room pass and opens the payment.
    pub async fn place(&self, request: OrderRequest<'_>) -> Result<OrderOutcome, SaleError> {
        let started = crate::clock::monotonic();
        // Admission does not depend on the quantity: a quantity out of range is refused
        // after it, so that its key check is held to the same limits.
        let asked = request.quantity.as_ref().map_or(Quantity::ONE, |q| *q);
        let mut span = trace::span("admission", trace::Kind::Internal);
        let decided = self
            .admission
            .admit_order(
                self.pool(),
                &request.deal,
                request.authorization,
                request.pass,
                asked,
            )
            .await;
        span.attribute("flashgate.admission", || match &decided {
            Ok(_) => "admitted",
            Err(rejection) => rejection.reason(),
        });
        drop(span);
        let mut admitted = decided?;
        crate::telemetry::record_user(&admitted.user);
        admitted.quantity = match request.quantity {
            Ok(quantity) => quantity,
            Err(invalid) => {
                return Err(self
                    .refuse_quantity(&admitted.user, &request.key, invalid)
                    .await);
            }
        };
        // Only orders that came with a verified pass count for the line's health, timed
        // from when the request reached the sale.
        let room = self.admission.waiting_room();
        let timing = admitted
            .pass
            .as_ref()
            .map(|_| room.health().begin_at(&admitted.deal.id, started));
        let placed = self.place_admitted(admitted, request.key).await;
        if let Some(timing) = timing {
            if let Some(payments) = &self.payments {
                room.health()
                    .set_breaker_open(payments.provider.breaker_open());
            }
            timing.finish(served(&placed));
        }
        placed
    }

    /// Reserves, releases the pass and opens the payment of an admitted order.
    async fn place_admitted(
        &self,
        admitted: Admitted,
        key: IdempotencyKey,
    ) -> Result<OrderOutcome, SaleError> {
        let pass = admitted.pass.clone();
        let placed = self.orders.place(admitted, key).await?;
        if let Some(pass) = pass.as_ref().filter(|_| !placed.replayed) {
            // Independent: the slot frees in Redis while PostgreSQL records the order.
            let room = self.admission.waiting_room();
            let release = Box::pin(room.release(&placed.order.deal_id, &pass.pass_id));
            tokio::join!(
                release,
                self.record_pass_order(&placed.order, &pass.pass_id)
            );
        }
        let attempt = Box::pin(self.payment_of_placed(&placed.order)).await;
        Ok(self.outcome(placed.order, attempt, placed.replayed))
    }

    /// Notes the order as placed with a pass, for the deal's report. The order is committed
    /// by now, so a failure is logged, not answered: the report then counts one buyer fewer.
    async fn record_pass_order(&self, order: &Order, pass_id: &str) {
        let (deal, user) = (&order.deal_id, &order.user_id);
        let recorded = report::record_order(self.pool(), order.id, deal, user, pass_id);
        if let Err(error) = recorded.await {
            tracing::warn!(%error, order = %order.id, "order with a pass not recorded for the report");
        }
    }

    /// The payment block of an order just placed or replayed. The order is committed by
    /// now, so a failure here (the database gone for a moment, the pool exhausted) must not
    /// turn the answer into an error: a client told to retry may meet a sold-out mirror
    /// that does not know it holds an order yet. The order is answered without its
    /// payment, which [`Sale::pay`] starts or returns.
    async fn payment_of_placed(&self, order: &Order) -> Option<Attempt> {
        let payments = self.payments.as_ref()?;
        let pending = order.status() == OrderStatus::PendingPayment;
        payments
            .for_new_order(self.pool(), order.id, order.expires_at, pending)
            .await
            .inspect_err(|error| {
                tracing::warn!(%error, order = %order.id, "order placed; its payment not read");
            })
            .ok()
            .flatten()
    }

    /// A quantity out of range was never stored, so under a key already used it is a
    /// conflict, answered before the range itself.
    async fn refuse_quantity(
        &self,
        user: &UserId,
        key: &IdempotencyKey,
        invalid: InvalidInput,
    ) -> SaleError {
        match orders::key_used(self.pool(), user, key.as_str()).await {
            Ok(true) => OrderError::IdempotencyConflict.into(),
            Ok(false) => invalid.into(),
            Err(error) => error.into(),
        }
    }

    /// The buyer's order with its latest payment attempt.
    pub async fn order(&self, user: &UserId, order_id: Uuid) -> Result<OrderOutcome, SaleError> {
        let order = orders::get(self.pool(), user, order_id).await?;
        let attempt = match self.payments {
            Some(_) => attempts::latest(self.pool(), order.id).await?,
            None => None,
        };
        Ok(self.outcome(order, attempt, false))
    }

    /// Cancels the buyer's pending order: its units go back on sale, the buyer's
    /// waiting-room session ends, and open checkout sessions are closed at the provider.
    pub async fn cancel(&self, user: &UserId, order_id: Uuid) -> Result<Order, SaleError> {
        let order = self.orders.cancel(user, order_id).await?;
        self.stock_events.freed([order.deal_id.clone()]).await;
        let room = self.admission.waiting_room();
        room.end_session(&order.deal_id, user.as_str()).await;
        if let Some(payments) = &self.payments
            && let Err(error) = payments.close_open_attempts(self.pool(), order.id).await
        {
            // The reconciler and the late-payment path still cover a session left open.
            tracing::warn!(%error, order = %order.id, "checkout session of a cancelled order not closed");
        }
        Ok(order)
    }

    /// Starts (or, for a key used before, returns) another payment attempt for the buyer's
    /// order still waiting for payment. The flag is true for a replayed key.
    pub async fn pay(
        &self,
        user: &UserId,
        order_id: Uuid,
        key: &IdempotencyKey,
    ) -> Result<(Attempt, bool), SaleError> {
        let order = orders::get(self.pool(), user, order_id).await?;
        let payments = self.payments.as_ref().ok_or(SaleError::PaymentsDisabled)?;
        if order.status() != OrderStatus::PendingPayment {
            return Err(SaleError::NotPayable(order.status()));
        }
        let started = payments
            .start_attempt(self.pool(), order.id, order.expires_at, key.as_str())
            .await?;
        Ok(started)
    }

    /// Applies a provider's signed webhook; units it released are reported free.
    pub async fn settle(
        &self,
        provider: &str,
        signature: Option<&[u8]>,
        raw: &[u8],
    ) -> Result<Received, SaleError> {
        let payments = self.payments.as_ref().ok_or(SaleError::PaymentsDisabled)?;
        let received = payments
            .receive(&self.pools.webhook, provider, signature, raw)
            .await?;
        if let Received::Accepted(applied) = &received
            && let Some(deal_id) = applied.released_deal()
        {
            self.stock_events.freed([deal_id.to_owned()]).await;
        }
        Ok(received)
    }

    fn outcome(&self, order: Order, attempt: Option<Attempt>, replayed: bool) -> OrderOutcome {
        let hold_grace = self
            .payments
            .as_ref()
            .map(|p| Duration::seconds(p.settings.expiry_grace_seconds.into()));
        OrderOutcome {
            order,
            attempt,
            replayed,
            hold_grace,
        }
    }
}

/// How a placement counts for the waiting room's health: a database error (answered 503,
/// retry later) is a signal of its own; every other answer counts by its latency.
fn served(placed: &Result<OrderOutcome, SaleError>) -> Served {
    match placed {
        Err(
            SaleError::Store(_)
            | SaleError::Order(OrderError::Store(_))
            | SaleError::Rejected(Rejection::Store(_)),
        ) => Served::Overloaded,
        _ => Served::Answered,
    }
}
