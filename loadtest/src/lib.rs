//! flashgate-loadtest: flash sales against a running gateway, on loopback only.
//!
//! - [`verdict`]: what must hold after any sale, checked against the inventory and the
//!   database.
//! - [`cli`]: the command line, checked against every command in the docs.
//! - [`sale`]: a bounded sale (closed loop or open-loop arrivals) with HDR latency per
//!   outcome, a timeline, and a verdict checked against the inventory and, when given,
//!   the database; [`sale_config`]: its arguments (one gateway or several).
//! - [`line`]: following a deal's line as a waiting page does, until the pass.
//! - [`timeline`]: a sale's seconds as its report carries them.
//! - [`loopback`]: the check that keeps every command's load on this machine.
//! - [`order_client`]: the lean HTTP/1.1 client that places the sale's orders.
//! - [`summary`]: the report as text for people; [`progress`]: the live line meanwhile.
//! - [`chart`]: the timeline as an SVG chart.
//! - [`pow`]: the proof-of-work client that joins a line whose deal asks for one.
//! - [`bare`]: a bare hyper server giving one fixed answer (a refusal captured from the
//!   gateway, say), the baseline that rejection cost is compared with.
//! - [`flood`]: one order from each of a million distinct users, with the gateway's
//!   resident memory read during and after.
//! - [`crowd`]: a line of up to millions waiting behind the edge (clients as timers): origin
//!   and Redis load against the crowd's size, fairness and caps checked from Redis and the
//!   database; [`crowd_chart`] draws the results.
//! - [`operator`]: the operations listener, admin token and user-token secret every
//!   command acts with.
//! - [`provider`]: the load tester as an OpenID Connect provider: RS256 tokens signed with
//!   its own key and the JWKS the gateway verifies them with.
//! - [`chaos`]: a whole sale with payments across three gateway processes under a seeded
//!   fault schedule, checked against the ledger.

pub mod bare;
pub mod chaos;
pub mod chart;
pub mod cli;
pub mod crowd;
pub mod crowd_chart;
pub mod flood;
pub mod line;
pub mod loopback;
pub mod operator;
pub mod order_client;
pub mod pow;
pub mod progress;
pub mod provider;
pub mod sale;
pub mod sale_config;
pub mod sale_events;
pub mod summary;
pub mod timeline;
pub mod verdict;
