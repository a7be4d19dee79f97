//! The `flashgate` command: serve, migrate, run a demo sale, operate deals, mint tokens,
//! print the effective configuration.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use flashgate::app::Application;
use flashgate::config::{self, Settings};
use flashgate::deals::{self, DealError, NewDeal};
use flashgate::domain::DealId;
use flashgate::ops::output;
use flashgate::{auth, inventory, operators, ops, shutdown, store, telemetry};

/// The allocator: a request allocates and frees many small buffers (headers, JSON, rows)
/// on one thread; mimalloc's thread-local free lists serve them with fewer instructions
/// than the system allocator and without its periodic consolidation.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Exit code for a configuration that cannot be used (EX_USAGE).
const EXIT_BAD_CONFIG: u8 = 64;

#[derive(Parser)]
#[command(
    name = "flashgate",
    version,
    about = "A high-throughput flash-sale gateway"
)]
struct Cli {
    /// A TOML file overriding config/default.toml; environment variables override both.
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway (applies migrations first unless database.migrate_on_start = false).
    Serve,
    /// Apply database migrations and exit.
    Migrate,
    /// Serve with a ready demo sale and print how to try it.
    Demo,
    /// Operate deals directly in PostgreSQL: list, show, create, stock, pause, resume, rebalance,
    /// drain-queue.
    Deals {
        #[command(subcommand)]
        command: ops::cli::DealsCommand,
    },
    /// Read the order and deal events in commit order (the pull feed).
    Events {
        #[command(subcommand)]
        command: ops::events_cli::EventsCommand,
    },
    /// Manage where events are pushed: create, list, show, update, delete, rotate-secret,
    /// replay.
    EventEndpoints {
        #[command(subcommand)]
        command: ops::events_cli::EndpointsCommand,
    },
    /// Audit every invariant; exits non-zero when any is broken.
    Check,
    /// Compare payment attempts with the provider once, repair what is safe, print findings.
    Reconcile,
    /// Work through late payments held for a person (late-payment policy `manual_review`).
    Review {
        #[command(subcommand)]
        command: ReviewCommand,
    },
    /// Print the operator log (every admin change and who made it), oldest first, as JSON:
    /// `{"entries": [...], "next": "<cursor>"}`.
    OperatorLog {
        /// Print the entries after this cursor (`next` of an earlier page).
        #[arg(long)]
        after: Option<String>,
        /// Most entries to print (1-1000).
        #[arg(long, default_value_t = flashgate::operators::PAGE_ENTRIES_DEFAULT)]
        limit: i64,
    },
    /// Print every setting's effective value and where it came from, secrets redacted.
    ///
    /// One TOML line per setting, `key = value  # origin`, the origin being `default`,
    /// `file <the --config path>` or `environment <VARIABLE>`. Exits 64 when the
    /// configuration cannot be used, like every other command.
    Config,
    /// Print a user token (JWT) signed with the configured secret.
    Token {
        /// The user id (`sub`).
        #[arg(long)]
        user: String,
        /// Seconds until the token expires (1 to a year).
        #[arg(long, default_value_t = 3600, value_parser = token_ttl_seconds, allow_negative_numbers = true)]
        ttl_seconds: i64,
    },
}

#[derive(Subcommand)]
enum ReviewCommand {
    /// List the orders waiting for review, oldest first.
    List,
    /// Take the order's units again and keep the money; refused when the units are gone.
    Fulfil {
        /// The order's id (from `review list`).
        order_id: uuid::Uuid,
    },
    /// Give the money back.
    Refund {
        /// The order's id (from `review list`).
        order_id: uuid::Uuid,
    },
}

/// Longest lifetime `flashgate token` mints: a year (and no overflow of `exp`).
const TOKEN_TTL_SECONDS_MAX: i64 = 366 * 86_400;

fn token_ttl_seconds(raw: &str) -> Result<i64, String> {
    let seconds: i64 = raw
        .parse()
        .map_err(|_| format!("`{raw}` is not a whole number of seconds"))?;
    if seconds < 1 {
        return Err(format!(
            "must be at least 1: a token living {seconds} s is expired when it is printed"
        ));
    }
    if seconds > TOKEN_TTL_SECONDS_MAX {
        return Err(format!("must be at most {TOKEN_TTL_SECONDS_MAX} (a year)"));
    }
    Ok(seconds)
}

/// The command line with the environment variables in its help: every variable in
/// `config --help`, the scheme and the aliases in the top-level help.
fn command_line() -> clap::Command {
    let every_variable = config::env::help_list(&config::explain::defaults());
    Cli::command()
        .after_help(config::env::help_summary())
        .mut_subcommand("config", |config| config.after_help(every_variable))
}

/// `flashgate config`: one TOML line per setting, `key = value  # origin`.
fn print_config(config_file: Option<&Path>) -> ExitCode {
    let effective = match Settings::explain(config_file) {
        Ok(effective) => effective,
        Err(error) => {
            eprintln!("flashgate: {error}");
            return ExitCode::from(EXIT_BAD_CONFIG);
        }
    };
    for setting in effective {
        if let Err(error) = output::line(&setting.to_string()) {
            eprintln!("flashgate: {error}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

fn main() -> ExitCode {
    let cli = match Cli::from_arg_matches(&command_line().get_matches()) {
        Ok(cli) => cli,
        Err(error) => error.exit(),
    };
    if matches!(cli.command, Command::Config) {
        return print_config(cli.config.as_deref());
    }
    let settings = match Settings::load(cli.config.as_deref()) {
        Ok(settings) => settings,
        Err(error) => {
            eprintln!("flashgate: {error}");
            return ExitCode::from(EXIT_BAD_CONFIG);
        }
    };
    if matches!(cli.command, Command::Serve)
        && let Err(error) = settings.check_secrets()
    {
        eprintln!("flashgate: {error}");
        return ExitCode::from(EXIT_BAD_CONFIG);
    }
    if let Command::Token { user, ttl_seconds } = &cli.command {
        let token = auth::mint_token_for(
            &settings.auth.jwt_secret,
            flashgate::admission::token::Audience::of(&settings.auth),
            user,
            *ttl_seconds,
        );
        return match output::line(&token) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("flashgate: {error}");
                ExitCode::FAILURE
            }
        };
    }
    telemetry::init_logging(&settings.telemetry);
    let threads = settings.server.runtime_threads(
        flashgate::settings::cores(),
        store::database_on_this_machine(&settings.database),
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build();
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("flashgate: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli.command, settings)) {
        Ok(()) => ExitCode::SUCCESS,
        // Printed once, here: the log would only repeat it.
        Err(error) => {
            eprintln!("flashgate: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(command: Command, settings: Settings) -> Result<(), String> {
    match command {
        Command::Serve => serve(settings, false).await,
        Command::Demo => serve(settings, true).await,
        Command::Migrate => migrate(&settings).await,
        Command::Token { .. } | Command::Config => Ok(()),
        Command::Deals { command } => ops::cli::deals(&settings.cli(), command).await,
        Command::Events { command } => ops::events_cli::events(&settings.cli(), command).await,
        Command::EventEndpoints { command } => {
            ops::events_cli::endpoints(&settings.cli(), command).await
        }
        Command::Check => ops::cli::check(&settings.cli()).await,
        Command::OperatorLog { after, limit } => {
            ops::cli::operator_log(&settings.cli(), after, limit).await
        }
        Command::Reconcile => reconcile(&settings).await,
        Command::Review { command } => review(&settings, command).await,
    }
}

/// `flashgate migrate`: one line per migration applied, or one saying none was pending.
async fn migrate(settings: &Settings) -> Result<(), String> {
    let applied = store::migrate(&settings.database)
        .await
        .map_err(|e| e.to_string())?;
    if applied.is_empty() {
        output::line("no migrations pending; the schema is up to date")?;
    }
    for migration in &applied {
        output::line(&format!(
            "applied migration {} {}",
            migration.version, migration.description
        ))?;
    }
    Ok(())
}

async fn serve(mut settings: Settings, demo: bool) -> Result<(), String> {
    if demo {
        settings.database.migrate_on_start = true;
        // No load balancer stands in front of a demo, so nothing needs time to move traffic
        // away: Ctrl-C stops it at once.
        settings.server.drain_delay_ms = 0;
        // A receiver on this machine (scripts/events_receiver.py) may subscribe.
        settings.events.allow_private_targets = true;
        let defaults = settings.default_secrets();
        if !defaults.is_empty() {
            tracing::warn!(
                secrets = %defaults.join(", "),
                "demo runs with public development defaults for these secrets; never expose it"
            );
        }
    }
    let demo_token = auth::mint_token_for(
        &settings.auth.jwt_secret,
        flashgate::admission::token::Audience::of(&settings.auth),
        "alice",
        3600,
    );
    let admin_token = settings.auth.admin_token.clone();
    let cli = demo_cli_command(&settings);
    let app = Application::build(settings)
        .await
        .map_err(|e| e.to_string())?;
    let on_signal = shutdown::cancel_on_signal(app.shutdown_token())
        .map_err(|error| format!("cannot listen for SIGTERM and SIGINT: {error}"))?;
    tokio::spawn(on_signal);
    if demo {
        let found = create_demo_deal(&app).await?;
        print_demo_state(&found)?;
        print_demo_help(&app, &demo_token, &admin_token, &cli)?;
    }
    tracing::info!(addr = %app.local_addr(), ops = %app.ops_addr(), "flashgate listening");
    app.run().await.map_err(|e| e.to_string())
}

/// One reconciliation pass against the configured provider; findings go to stdout as JSON.
async fn reconcile(settings: &Settings) -> Result<(), String> {
    let payments = flashgate::app::build_payments(settings, &flashgate::clock::Clock::system())
        .map_err(|e| e.to_string())?
        .ok_or("payments are disabled (payments.enabled = false)")?;
    let pools = store::Pools::connect(&settings.database)
        .await
        .map_err(|e| e.to_string())?;
    let findings = payments
        .reconcile(&pools.admin)
        .await
        .map_err(|e| e.to_string())?;
    output::json(&findings)
}

async fn review(settings: &Settings, command: ReviewCommand) -> Result<(), String> {
    use flashgate::payments::review::{self, ReviewOutcome};
    let pools = store::Pools::connect(&settings.database)
        .await
        .map_err(|e| e.to_string())?;
    let pool = &pools.admin;
    let (order_id, outcome) = match command {
        ReviewCommand::List => {
            let orders = review::list(pool, u32::MAX)
                .await
                .map_err(|e| e.to_string())?;
            return output::json(&serde_json::json!({ "orders": orders }));
        }
        ReviewCommand::Fulfil { order_id } => (order_id, review::fulfil(pool, order_id).await),
        ReviewCommand::Refund { order_id } => (order_id, review::refund(pool, order_id).await),
    };
    let (status, action) = match outcome.map_err(|e| e.to_string())? {
        ReviewOutcome::Fulfilled => ("PAID", "review.fulfilled"),
        ReviewOutcome::RefundQueued => ("REFUND_PENDING", "review.refunded"),
        ReviewOutcome::NoStock => {
            return Err(format!(
                "order {order_id}: not enough units left; refund it instead"
            ));
        }
        ReviewOutcome::NotFound => return Err(format!("no order {order_id}")),
        ReviewOutcome::NotInReview(status) => {
            return Err(format!("order {order_id} is {status}, not MANUAL_REVIEW"));
        }
    };
    let change = operators::Change {
        action,
        target: &order_id.to_string(),
        detail: serde_json::json!({}),
    };
    operators::record(pool, &operators::Operator::command_line(), change).await;
    output::json(&serde_json::json!({ "order_id": order_id, "status": status }))
}

/// The demo deal as `flashgate demo` found it: made now, or left by an earlier run in the
/// same database (units sold or held then are still gone).
struct DemoDeal {
    created: bool,
    /// What the demo stocks a fresh deal with.
    stocked: i64,
    available: i64,
    reserved: i64,
}

async fn create_demo_deal(app: &Application) -> Result<DemoDeal, String> {
    let demo = NewDeal {
        id: DealId::parse("demo").map_err(|e| e.to_string())?,
        name: "Demo: 100 concert seats".into(),
        stock: 100,
        buckets: 8,
        unit_price_minor: 4_999,
        currency: "EUR".into(),
        per_user_limit: 2,
        reservation_ttl_seconds: 300,
        starts_at: None,
        ends_at: None,
        payment_terms: Default::default(),
        waiting_room: Default::default(),
    };
    let created = match deals::create(&app.admin_pool(), &demo).await {
        Ok(_) => true,
        Err(DealError::AlreadyExists(_)) => false,
        Err(error) => return Err(error.to_string()),
    };
    let snapshot = inventory::snapshot(&app.admin_pool(), demo.id.as_str())
        .await
        .map_err(|e| e.to_string())?
        .ok_or("the demo deal vanished while it was read")?;
    Ok(DemoDeal {
        created,
        stocked: demo.stock,
        available: snapshot.available,
        reserved: snapshot.reserved,
    })
}

/// Says when the demo deal is an earlier run's with seats gone, above all when nothing is
/// left to buy, so a rerun never looks like a fresh sale that refuses every order.
fn print_demo_state(found: &DemoDeal) -> Result<(), String> {
    if found.created || found.available >= found.stocked {
        return Ok(());
    }
    let start_over = "scripts/demo.sh --reset starts over with a fresh deal";
    if found.available == 0 {
        let back = match found.reserved {
            0 => String::new(),
            held => format!(" ({held} held by unpaid orders come back when they expire)"),
        };
        output::line(&format!(
            "\nThe demo deal is sold out from an earlier run{back}: {start_over}."
        ))
    } else {
        output::line(&format!(
            "\nThe demo deal is the one from an earlier run, {} of its seats left: {start_over}.",
            found.available
        ))
    }
}

/// The operator CLI's command line that sees what this demo serves: its database and its
/// Redis keys (the password, if any, redacted), with this program's own path.
fn demo_cli_command(settings: &Settings) -> String {
    let program = std::env::args()
        .next()
        .unwrap_or_else(|| "flashgate".into());
    format!(
        "DATABASE_URL='{}' REDIS_URL='{}' FLASHGATE__REDIS__KEY_PREFIX='{}' {program}",
        flashgate::settings::redact_url(&settings.database.url),
        flashgate::settings::redact_url(&settings.redis.url),
        settings.redis.key_prefix,
    )
}

fn print_demo_help(
    app: &Application,
    token: &str,
    admin_token: &str,
    cli: &str,
) -> Result<(), String> {
    let base = format!("http://{}", app.local_addr());
    let ops = format!("http://{}", app.ops_addr());
    output::line(&format!(
        "\nflashgate demo sale is live at {base}\n\n\
         Deal status:\n  curl -s {base}/v1/deals/demo\n\n\
         Buy two seats as alice (token valid for an hour):\n  \
         curl -s -X POST {base}/v1/deals/demo/orders \\\n    \
         -H 'Authorization: Bearer {token}' \\\n    \
         -H 'Idempotency-Key: first-try' -d '{{\"quantity\": 2}}'\n\n\
         Inventory (admin, on the operations listener):\n  curl -s {ops}/admin/deals/demo/inventory -H 'Authorization: Bearer {admin_token}'\n\n\
         Order and deal events, pulled in commit order:\n  curl -s {ops}/admin/events -H 'Authorization: Bearer {admin_token}'\n\n\
         Or pushed to a receiver that verifies the signatures (needs pip's standardwebhooks):\n  \
         curl -s -X POST {ops}/admin/event-endpoints -H 'Authorization: Bearer {admin_token}' \\\n    \
         -d '{{\"url\": \"http://127.0.0.1:9000/hooks\"}}'   # prints the whsec_ secret\n  \
         python3 scripts/events_receiver.py --port 9000 --secret whsec_...\n\n\
         Metrics:\n  curl -s {ops}/metrics\n\n\
         The operator CLI on this demo's database and Redis keys (deals, stock, the audit):\n  \
         {cli} deals list\n\n\
         Press Ctrl-C to stop.\n"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every option and argument of every subcommand says what it is for in `--help`.
    #[test]
    fn every_option_has_help() {
        fn walk(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
            let path = format!("{path} {}", command.get_name());
            if command.get_about().is_none() && command.get_long_about().is_none() {
                missing.push(format!("{path} (the command itself)"));
            }
            for arg in command.get_arguments() {
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} {}", arg.get_id()));
                }
            }
            for sub in command.get_subcommands() {
                walk(sub, &path, missing);
            }
        }
        let mut command = command_line();
        command.build();
        command.clone().debug_assert();
        let mut missing = Vec::new();
        walk(&command, "", &mut missing);
        assert!(missing.is_empty(), "without help text: {missing:#?}");
    }
}
