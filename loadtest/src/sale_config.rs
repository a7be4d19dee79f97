//! What a sale runs: its command-line arguments, shared by `sale` and the runs built on it.

use crate::operator::Operator;

/// What to run.
#[derive(Debug, Clone, clap::Args)]
pub struct SaleConfig {
    /// Gateway base URL, or several separated by commas (gateways sharing one database
    /// and Redis): a user's successive attempts go to successive gateways. Loopback only.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub base_url: String,
    #[command(flatten)]
    pub operator: Operator,
    /// Units on sale.
    #[arg(long, default_value_t = 1000)]
    pub stock: i64,
    #[arg(long, default_value_t = 32)]
    pub buckets: i32,
    #[arg(long, default_value_t = 4000)]
    pub users: usize,
    /// Purchase attempts per user, each with its own idempotency key.
    #[arg(long, default_value_t = 1)]
    pub attempts: usize,
    #[arg(long, default_value_t = 1)]
    pub per_user_limit: i32,
    /// Requests in flight at once (closed loop), or the cap on them (open loop).
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Open loop: new purchases started per second; 0 means closed loop.
    #[arg(long, default_value_t = 0)]
    pub rate: u32,
    /// Hard stop, whatever is left.
    #[arg(long, default_value_t = 60)]
    pub duration_max_seconds: u64,
    /// Retries of one attempt after 429 or 503.
    #[arg(long, default_value_t = 5)]
    pub retries_max: u32,
    /// Put the deal behind a waiting room admitting this many users per second (0: none).
    /// Every user then queues, polls until admitted, and orders with the signed pass.
    #[arg(long, default_value_t = 0)]
    pub queue_admit_per_second: i32,
    /// Passes in use at once when queueing.
    #[arg(long, default_value_t = 1000)]
    pub queue_max_active: i32,
    /// With payments enabled: the share of orders paid at the provider's hosted checkout
    /// (the rest abandon theirs and let the reservation expire).
    #[arg(long, default_value_t = 0.0)]
    pub pay_fraction: f64,
    /// PostgreSQL of the gateway, to check the orders behind the answers.
    #[arg(long)]
    pub database_url: Option<String>,
    /// Subscribes a receiver in this process to every event before the sale and, after it,
    /// times the backlog draining to it and checks each order's events arrived in sequence.
    #[arg(long)]
    pub events_receiver: bool,
}

impl SaleConfig {
    /// Every gateway the purchases go to.
    pub(crate) fn base_urls(&self) -> impl Iterator<Item = &str> {
        self.base_url.split(',').map(str::trim)
    }

    /// The gateway that serves what is not a purchase (the waiting room's line).
    pub(crate) fn first_base_url(&self) -> &str {
        self.base_urls().next().unwrap_or(&self.base_url)
    }
}
