//! Order and deal events for the shop's systems: written with each change, put in commit
//! order by one sequencer, pulled from the feed or pushed to endpoints as Standard Webhooks.
//!
//! - The rows are written by statement triggers on `orders` and `deals` (see the migration
//!   `20261206100000_events.sql`), in the changing transaction: an event exists if and only
//!   if its change committed.
//! - [`sequencer`] gives committed events their feed position (commit order, safely) and
//!   announces a deal selling out or reopening.
//! - [`feed`] reads the feed for `GET /admin/events` and the deliveries, and expires it.
//! - [`endpoints`] keeps the endpoints; [`delivery`] pushes to one; [`runner`] runs the
//!   sequencer, one delivery task per endpoint and the retention on one instance at a time.
//! - [`pace`] counts how fast the feed grows, so that deliveries give way to a hot sale.
//! - [`target`] refuses endpoints pointing inwards; [`signing`] signs.

pub mod delivery;
pub mod endpoints;
pub mod feed;
pub mod manage;
pub mod pace;
pub mod runner;
pub mod sequencer;
mod settings;
pub mod signing;
pub mod target;

pub use settings::EventSettings;

use crate::store::StoreError;

/// Every event type, as the feed and the deliveries name them.
pub const TYPES: [&str; 11] = [
    "order.reserved",
    "order.paid",
    "order.cancelled",
    "order.expired",
    "order.refund_pending",
    "order.refunded",
    "order.needs_review",
    "deal.sold_out",
    "deal.reopened",
    "deal.paused",
    "deal.resumed",
];

/// What the event operations answer besides success.
#[derive(Debug, thiserror::Error)]
pub enum EventError {
    /// Bad input: a refused URL, an unknown type or cursor, an overlap out of range.
    #[error("{0}")]
    Invalid(String),
    #[error("no such endpoint")]
    NotFound,
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<target::TargetError> for EventError {
    fn from(error: target::TargetError) -> Self {
        Self::Invalid(format!("url: {error}"))
    }
}

/// Every type's counter at zero, so a dashboard shows 0 before the first event.
pub fn export_zeroes() {
    for kind in TYPES {
        metrics::counter!(crate::telemetry::EVENTS, "type" => kind).increment(0);
    }
}
