//! The HTTP front end: the only module that knows hyper.
//!
//! `server` accepts connections on the public and the operations listener with limits on
//! head size, head read time and connection counts, and drains every request that has
//! arrived on shutdown (`connection`); on the public listener a connection's `front` first
//! answers the refusals of a flood from prepared bytes, then hands the connection to hyper
//! at the first request it does not answer itself. `router` maps a request to a handler
//! and records its metrics; handlers parse input into domain types, call admission and the
//! order service, and turn results into JSON or problem+json (`problem`). Every request
//! gets an id (`request_id`) that its answer, its problem body and its log lines carry.

mod admin;
mod body;
mod connection;
mod events;
mod front;
mod guard;
mod http1;
mod integer;
mod join_body;
mod operator_log;
mod ops;
mod payments;
pub mod problem;
mod public;
mod queue;
pub mod request_id;
mod review;
mod revoked_feed;
mod router;
mod routes;
mod server;
mod settings;
mod stream;
mod ticket_view;
mod traced;
mod wait_page;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use http::HeaderName;

use crate::admission::Admission;
use crate::clock::Clock;
use crate::inventory::StockEvents;
use crate::orders::lanes::{Engine, LaneSettings};
use crate::payments::Payments;
use crate::payments::attempts::InitialAttempt;
use crate::redis_link::RedisHandle;
use crate::sale::Sale;
use crate::store::Pools;
use crate::telemetry::trace::Tracer;

pub use server::{Listeners, serve, serve_public};
pub use settings::{HandlerSettings, ServerSettings, WORKER_THREADS_MAX};

/// Everything a request handler can reach.
pub struct State {
    /// The sections the handlers read.
    pub settings: HandlerSettings,
    pub pools: Pools,
    pub redis: RedisHandle,
    /// The checks made before a request costs anything; the sale service shares it.
    pub admission: Arc<Admission>,
    /// Places, cancels and pays for orders: what the order and payment handlers call.
    pub sale: Sale,
    pub client_ip_header: HeaderName,
    /// The application's clock: what every time-dependent rule asks (admission's own copy
    /// is the same clock).
    pub clock: Clock,
    /// Starts and ends request traces; `None` with tracing off.
    pub tracer: Option<Tracer>,
    /// False once shutdown has begun, so load balancers stop sending traffic.
    pub ready: AtomicBool,
    /// True once shutdown has begun: every answer closes its connection.
    pub draining: AtomicBool,
}

impl State {
    pub fn new(
        settings: HandlerSettings,
        lanes: LaneSettings,
        pools: Pools,
        redis: RedisHandle,
        admission: Admission,
        payments: Option<Payments>,
        stock_events: StockEvents,
    ) -> Arc<Self> {
        let hook = payments
            .as_ref()
            .map(|p| InitialAttempt::hook(p.provider.name()));
        let orders = Engine::new(lanes, pools.request.clone(), hook, stock_events.clone());
        let admission = Arc::new(admission);
        let sale = Sale::new(
            Arc::clone(&admission),
            orders,
            payments,
            pools.clone(),
            stock_events,
        );
        let clock = admission.clock().clone();
        let client_ip_header = HeaderName::from_bytes(settings.server.client_ip_header.as_bytes())
            .expect("validated: client_ip_header is a header name");
        let tracer = Tracer::start(&settings.telemetry, clock.clone());
        Arc::new(Self {
            tracer,
            settings,
            pools,
            redis,
            admission,
            sale,
            client_ip_header,
            clock,
            ready: AtomicBool::new(true),
            draining: AtomicBool::new(false),
        })
    }
}
