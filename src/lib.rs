//! flashgate: a flash-sale gateway that sits behind the CDN and in front of the shop.
//!
//! A request travels one way through the modules (docs/ARCHITECTURE.md has the floors,
//! the path of a purchase and who writes each table):
//!
//! ```text
//! http ──► sale ──► admission ──► orders ──► inventory ──► PostgreSQL
//!  │        │        │  client IP, per-IP limit, sold-out mirror (memory, fed by Redis),
//!  │        │        │  JWT, per-user limit, per-deal limit, cached deal, sale window
//!  │        │        └─ rejects without touching PostgreSQL
//!  │        └─ one call per order operation: place, read, cancel, pay, settle
//!  └─ body/head limits, routing, problem+json, metrics
//! ```
//!
//! - [`http`]: hyper server, router, handlers; the only module that knows HTTP.
//! - [`sale`]: the sale service: placing, reading, cancelling and paying for an order and
//!   settling its payment, each one call for the handlers.
//! - [`admission`]: cheap checks, cheapest first; produces [`admission::Admitted`].
//! - [`orders`]: the order transaction (idempotency, per-user limit, reservation), cancel,
//!   and the expiry sweeper. It drives [`inventory`], which owns the bucket rows.
//! - [`deals`]: the catalogue and its per-instance cache.
//! - [`domain`]: pure types: ids, quantities, the order state machine.
//! - [`store`]: pools and migrations; [`redis_link`]: the optional Redis connection.
//! - [`app`]: builds everything from [`config::Settings`].
//! - [`clock`]: the one clock every time-dependent rule asks, carried in the state so that
//!   tests can move it.
//! - [`config`]: assembles the sections every module declares in its own `settings.rs` into
//!   one tree, in layers (defaults, file, environment), and checks them; [`settings`] holds
//!   what the sections' checks share.
//! - [`events`]: order and deal events for the shop, written with each change by triggers,
//!   put in commit order by one sequencer, pulled from the feed or pushed as signed webhooks.
//! - [`operators`]: the operator log: every admin change with who made it.
//! - [`ops`]: operator tools: pause/resume, bucket rebalance, the invariant audit, the CLI.
//! - [`waiting_room`]: the per-deal line in Redis, signed passes checked by admission, and
//!   the advancer that admits buyers at a controlled rate: the deal's fixed
//!   `admit_per_second`, or an adaptive outflow set from the health every instance reports.
//! - [`payments`]: payment attempts at a provider, signed webhooks, the outbox, late
//!   payments, refunds and the reconciler. The provider simulator to run against is a
//!   workspace crate of its own (`psp-sim`), spoken to only over HTTP.
//!
//! PostgreSQL is the source of truth. Redis shares the sold-out flag between instances
//! (without it flashgate is slower, never wrong) and holds the waiting-room lines (without
//! it those lines stand still, and nobody orders a waiting-room deal without a pass).

pub mod admission;
pub mod app;
pub mod clock;
pub mod config;
pub mod deals;
pub mod domain;
pub mod events;
pub mod http;
pub mod inventory;
pub mod operators;
pub mod ops;
pub mod orders;
pub mod payments;
pub mod redis_link;
pub mod sale;
pub mod settings;
pub mod shutdown;
pub mod store;
pub mod telemetry;
pub mod waiting_room;

/// Minting and verifying user tokens.
pub use admission::token as auth;
