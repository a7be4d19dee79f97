//! The `[server]` section: the listeners, connection and request limits and the shutdown's
//! pace, declared beside the server that applies them; and the sections the handlers read.

use std::net::SocketAddr;
use std::ops::RangeInclusive;

use ipnet::IpNet;
use serde::Deserialize;

use crate::admission::AuthSettings;
use crate::events::EventSettings;
use crate::ops::audit;
use crate::orders::OrderSettings;
use crate::settings::require;
use crate::waiting_room::WaitingRoomSettings;

/// Most runtime worker threads `server.worker_threads` may ask for.
pub const WORKER_THREADS_MAX: usize = 1024;

/// Smallest `server.header_bytes_max`: ordinary request heads, cookies and tokens included,
/// must still fit.
pub const HEADER_BYTES_MIN: usize = 8192;

/// Smallest `server.body_bytes_max`: below it not even an order's body fits.
pub const BODY_BYTES_MIN: usize = 64;

/// The values `server.request_id_bytes_max` may take: room for a caller's id, short enough
/// for every log line.
pub const REQUEST_ID_BYTES_MAX_RANGE: RangeInclusive<usize> = 16..=128;

/// The listeners, the limits on each connection and request, and the shutdown's pace.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSettings {
    /// The public address, as host:port; a host name is resolved at start, port 0 picks a free
    /// port.
    pub listen: SocketAddr,
    /// The operations listener: `/metrics`, `/admin/*`, health. Keep it off the internet.
    pub ops_listen: SocketAddr,
    /// Runtime worker threads; 0 chooses them from the cores (see [`Self::runtime_threads`]).
    pub worker_threads: usize,
    /// Largest request head (request line and headers) in bytes; a larger head is refused by
    /// the parser.
    pub header_bytes_max: usize,
    /// How far an `Authorization` header may carry a head past `header_bytes_max`: such a
    /// head is read whole (and no further) and refused 401, as no token that large is
    /// accepted, rather than 431; a head over by anything else is still 431. 0: none.
    pub authorization_bytes_max: usize,
    /// Largest request body in bytes; a larger one is answered 413 without being read further.
    pub body_bytes_max: usize,
    /// A client that has not sent its whole request head within this is disconnected.
    pub header_read_timeout_ms: u64,
    /// A request not answered within this is answered 503 overloaded.
    pub request_timeout_ms: u64,
    /// Open connections beyond this are accepted and closed at once, so a flood cannot exhaust
    /// file descriptors.
    pub connections_max: usize,
    /// After the signal, how long in-flight requests get to finish before the process exits
    /// (the drain delay included).
    pub shutdown_grace_seconds: u64,
    /// After the signal, how long `/readyz` fails while requests are still served, so load
    /// balancers stop sending traffic before the listener closes.
    pub drain_delay_ms: u64,
    /// After the connections are drained, how long background tasks (sweeper, outbox,
    /// advancer) get to stop; a task still busy then is dropped mid-flight, which is safe
    /// because each of its transactions rolls back, and the process exits anyway.
    pub tasks_stop_ms: u64,
    /// Open connections one client address may hold; more are closed at once.
    pub connections_per_client_max: usize,
    /// A request body not fully received within this is answered 408.
    pub body_read_timeout_ms: u64,
    /// TCP peers in these networks are believed when they report the client address in
    /// `client_ip_header`.
    pub trusted_proxies: Vec<IpNet>,
    /// The header a trusted proxy or CDN puts the client address in.
    pub client_ip_header: String,
    /// How long a CDN may cache public deal reads (`Cache-Control: public, max-age=…`).
    pub public_cache_max_age_seconds: u32,
    /// Longest `X-Request-Id` a caller may send; a longer or unsafe one is replaced by a
    /// generated id.
    pub request_id_bytes_max: usize,
}

impl ServerSettings {
    /// The most bytes of one request head read before it is refused unparsed: what hyper
    /// and the connection's front buffer at most per connection.
    pub fn head_read_bytes_max(&self) -> usize {
        self.header_bytes_max
            .saturating_add(self.authorization_bytes_max)
    }

    /// Checks every limit of the section; the message names the key.
    pub fn validate(&self) -> Result<(), String> {
        require(
            self.header_bytes_max >= HEADER_BYTES_MIN,
            &format!("server.header_bytes_max must be at least {HEADER_BYTES_MIN}"),
        )?;
        require(
            self.body_bytes_max >= BODY_BYTES_MIN,
            &format!("server.body_bytes_max must be at least {BODY_BYTES_MIN}"),
        )?;
        require(
            REQUEST_ID_BYTES_MAX_RANGE.contains(&self.request_id_bytes_max),
            &format!("server.request_id_bytes_max must be {REQUEST_ID_BYTES_MAX_RANGE:?}"),
        )?;
        require(
            self.header_read_timeout_ms > 0,
            "server.header_read_timeout_ms must be > 0",
        )?;
        require(
            self.request_timeout_ms > 0,
            "server.request_timeout_ms must be > 0",
        )?;
        require(
            self.worker_threads <= WORKER_THREADS_MAX,
            &format!(
                "server.worker_threads must be at most {WORKER_THREADS_MAX} (0: from the cores)"
            ),
        )?;
        self.validate_connections()
    }

    /// The runtime's worker threads on `cores` cores: `worker_threads` when set, else one a
    /// core, or one fewer (at least one) when PostgreSQL runs `beside_database` on this
    /// machine. The spare core is the database's: a thread on every core makes the
    /// gateway's tasks wake each other across cores and take turns with PostgreSQL, which
    /// costs more CPU per purchase and a longer tail.
    pub fn runtime_threads(&self, cores: usize, beside_database: bool) -> usize {
        match self.worker_threads {
            0 if beside_database => cores.saturating_sub(1).max(1),
            0 => cores.max(1),
            threads => threads,
        }
    }

    /// Connection counts, the drain and the body's read time.
    fn validate_connections(&self) -> Result<(), String> {
        require(
            self.connections_max > 0,
            "server.connections_max must be > 0",
        )?;
        require(
            self.connections_per_client_max > 0,
            "server.connections_per_client_max must be > 0",
        )?;
        require(
            self.drain_delay_ms < self.shutdown_grace_seconds.saturating_mul(1000),
            "server.drain_delay_ms must be shorter than server.shutdown_grace_seconds",
        )?;
        require(
            self.body_read_timeout_ms > 0 && self.body_read_timeout_ms < self.request_timeout_ms,
            "server.body_read_timeout_ms must be > 0 and below server.request_timeout_ms",
        )?;
        require(
            http::HeaderName::from_bytes(self.client_ip_header.as_bytes()).is_ok(),
            "server.client_ip_header must be a header name",
        )
    }
}

/// The sections the handlers read, each declared by the module that owns it.
#[derive(Clone, Debug)]
pub struct HandlerSettings {
    /// Limits on connections, heads, bodies and request ids.
    pub server: ServerSettings,
    /// The admin token and the longest user id.
    pub auth: AuthSettings,
    /// The largest quantity and the longest idempotency key.
    pub orders: OrderSettings,
    /// The poll interval told to buyers in line, and the waiting page.
    pub waiting_room: WaitingRoomSettings,
    /// How the audit behind the admin API runs.
    pub audit: audit::Options,
    /// Where request traces go, and which are kept.
    pub telemetry: crate::telemetry::TelemetrySettings,
    /// Endpoint URL checks, rotation overlap and page limits of the events' admin API.
    pub events: EventSettings,
}
