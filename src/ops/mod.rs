//! Operations: the tools an operator uses during a sale.
//!
//! - [`pause`]: the kill switch. A paused deal takes no new orders on any instance.
//! - [`stock`]: adding or removing available units.
//! - [`rebalance`]: changes a deal's bucket count, moving only available units.
//! - [`audit`]: the invariant audit behind `flashgate check`, `GET /admin/audit` and the
//!   periodic audit task.
//! - [`cli`]: the `flashgate deals …` and `flashgate check` subcommands; [`events_cli`]:
//!   `flashgate events …` and `flashgate event-endpoints …`.
//! - [`report`]: `flashgate deals report`, the line's report as a table or as JSON.
//! - [`output`]: how every command writes to stdout, safe in a pipe closed early.
//!
//! Everything here talks to PostgreSQL (and Redis for the sold-out flag) directly, so the
//! CLI works without a running gateway and the admin API shares the same code.

pub mod admission;
pub mod audit;
pub mod cli;
mod cli_settings;
pub mod events_cli;
pub mod output;
pub mod pause;
pub mod rebalance;
pub mod report;
mod room_args;
mod settings;
pub mod stock;

pub use settings::OpsSettings;
