//! Integration tests of the payment-provider simulator: each test starts the real
//! `flashgate-psp-sim` process on a free port, with a webhook receiver of its own, and
//! drives it over HTTP. No database or Redis is needed.
//!
//! Run with `cargo nextest run -p flashgate-psp-sim`; set `TEST_LOG=1` to see the
//! simulator's logs.

mod helpers;
/// The gateway tests' wait helper, so both suites poll and fail alike; this one needs only
/// part of it.
#[allow(dead_code)]
#[path = "../../../tests/api/helpers/wait.rs"]
mod wait;

mod api;
mod api_faults;
mod lifecycle;
mod refunds;
mod webhooks;
