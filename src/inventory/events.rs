//! Stock that became free or ran out, reported after the commit that caused it.
//!
//! Several things care when a deal's stock changes (the sold-out mirror, the waiting
//! room); several paths change it (cancel, expiry, failed payments, stock adjustments, the
//! order engine). Each path reports its change here once, after its transaction committed,
//! and one handler wired by the application informs every subscriber, so a new path cannot
//! forget one of them.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};

/// A change of a deal's stock, already committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StockChange {
    /// Units of this deal went back to available.
    Freed(String),
    /// This deal has no available unit left.
    RanOut(String),
}

type Handler = Arc<dyn Fn(StockChange) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// Where stock changes are reported. Cloning shares the one handler.
#[derive(Clone, Default)]
pub struct StockEvents {
    handler: Arc<OnceLock<Handler>>,
}

impl std::fmt::Debug for StockEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StockEvents")
            .field("subscribed", &self.handler.get().is_some())
            .finish()
    }
}

impl StockEvents {
    /// Installs the one handler; a second call is a wiring bug.
    pub fn subscribe<F, Fut>(&self, handler: F)
    where
        F: Fn(StockChange) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let boxed: Handler = Arc::new(move |change| Box::pin(handler(change)));
        assert!(
            self.handler.set(boxed).is_ok(),
            "stock events have exactly one handler"
        );
    }

    /// Reports one change and waits until the handler has dealt with it.
    async fn emit(&self, change: StockChange) {
        if let Some(handler) = self.handler.get() {
            handler(change).await;
        }
    }

    /// Reports that units of each of `deals` went back to available: the one place units
    /// are reported free, whichever path freed them.
    pub async fn freed(&self, deals: impl IntoIterator<Item = String>) {
        for deal in deals {
            self.emit(StockChange::Freed(deal)).await;
        }
    }

    /// Reports that `deal` has no available unit left.
    pub async fn ran_out(&self, deal: &str) {
        self.emit(StockChange::RanOut(deal.to_owned())).await;
    }

    /// [`StockEvents::freed`] as a callback, for background work that frees units in
    /// passes (the expiry sweeper, the payment workers).
    pub fn freed_reporter<I>(&self) -> impl Fn(I) -> ReportFuture + Clone + Send + Sync + 'static
    where
        I: IntoIterator<Item = String> + Send + 'static,
        I::IntoIter: Send,
    {
        let events = self.clone();
        move |deals: I| {
            let events = events.clone();
            Box::pin(async move { events.freed(deals).await })
        }
    }
}

/// The future of one report made through [`StockEvents::freed_reporter`].
pub type ReportFuture = Pin<Box<dyn Future<Output = ()> + Send>>;
