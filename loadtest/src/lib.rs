//! flashgate-loadtest: flash sales against a running gateway, on loopback only.
//!
//! - [`sale`]: a bounded sale (closed loop or open-loop arrivals) with HDR latency per
//!   outcome, a timeline, and a verdict checked against the inventory and, when given,
//!   the database.
//! - [`chart`]: the timeline as an SVG chart.
//! - [`pow`]: the proof-of-work client that joins a line whose deal asks for one.
//! - [`bare`]: a bare hyper server giving one fixed answer (a refusal captured from the
//!   gateway, say), the baseline that rejection cost is compared with.
//! - [`chaos`]: a whole sale with payments across three gateway processes under a seeded
//!   fault schedule, checked against the ledger.

pub mod bare;
pub mod chaos;
pub mod chart;
pub mod pow;
pub mod sale;
