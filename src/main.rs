//! The `flashgate` command: serve, migrate, run a demo sale, mint tokens.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use flashgate::app::Application;
use flashgate::config::Settings;
use flashgate::deals::{self, DealError, NewDeal};
use flashgate::domain::DealId;
use flashgate::{auth, ops, psp_sim, shutdown, store, telemetry};

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
    /// Audit every invariant; exits non-zero when any is broken.
    Check,
    /// Compare payment attempts with the provider once, repair what is safe, print findings.
    Reconcile,
    /// Print a user token (JWT) signed with the configured secret.
    Token {
        /// The user id (`sub`).
        #[arg(long)]
        user: String,
        /// Seconds until the token expires.
        #[arg(long, default_value_t = 3600)]
        ttl_seconds: i64,
    },
    /// Run the payment-provider simulator (hosted checkout, signed webhooks, fault injection).
    PspSim {
        /// Address to listen on; port 0 picks a free one (printed on the first stdout line).
        #[arg(long, default_value = "127.0.0.1:8090")]
        listen: SocketAddr,
        /// Where webhooks are POSTed; without it events are only recorded.
        #[arg(long, env = "FLASHGATE_PSP_WEBHOOK_URL")]
        webhook_url: Option<String>,
        /// Shared secret for the `Flashgate-Signature` webhook header.
        #[arg(
            long,
            env = "FLASHGATE_PSP_WEBHOOK_SECRET",
            default_value = "psp-dev-webhook-secret",
            hide_env_values = true
        )]
        webhook_secret: String,
        /// Bearer token the simulator's API requires.
        #[arg(
            long,
            env = "FLASHGATE_PSP_API_KEY",
            default_value = "psp-dev-api-key",
            hide_env_values = true
        )]
        api_key: String,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
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
        println!(
            "{}",
            auth::mint_token_for(
                &settings.auth.jwt_secret,
                settings.auth.audience(),
                user,
                *ttl_seconds
            )
        );
        return ExitCode::SUCCESS;
    }
    telemetry::init_logging(&settings.telemetry.log_filter);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("flashgate: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(async move {
        match cli.command {
            Command::Serve => serve(settings, false).await,
            Command::Demo => serve(settings, true).await,
            Command::Migrate => store::migrate(&settings.database)
                .await
                .map_err(|e| e.to_string()),
            Command::Token { .. } => Ok(()),
            Command::Deals { command } => ops::cli::deals(&settings, command).await,
            Command::Check => ops::cli::check(&settings).await,
            Command::Reconcile => reconcile(&settings).await,
            Command::PspSim {
                listen,
                webhook_url,
                webhook_secret,
                api_key,
            } => {
                let config = psp_sim::SimConfig {
                    listen,
                    webhook_url,
                    webhook_secret,
                    api_key,
                };
                let token = tokio_util::sync::CancellationToken::new();
                tokio::spawn(shutdown::cancel_on_signal(token.clone()));
                psp_sim::run(config, token).await
            }
        }
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "flashgate failed");
            eprintln!("flashgate: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(mut settings: Settings, demo: bool) -> Result<(), String> {
    if demo {
        settings.database.migrate_on_start = true;
    }
    let demo_token = auth::mint_token_for(
        &settings.auth.jwt_secret,
        settings.auth.audience(),
        "alice",
        3600,
    );
    let admin_token = settings.auth.admin_token.clone();
    let app = Application::build(settings)
        .await
        .map_err(|e| e.to_string())?;
    if demo {
        create_demo_deal(&app).await?;
        print_demo_help(&app, &demo_token, &admin_token);
    }
    tracing::info!(addr = %app.local_addr(), ops = %app.ops_addr(), "flashgate listening");
    tokio::spawn(shutdown::cancel_on_signal(app.shutdown_token()));
    app.run().await.map_err(|e| e.to_string())
}

/// One reconciliation pass against the configured provider; findings go to stdout as JSON.
async fn reconcile(settings: &Settings) -> Result<(), String> {
    let payments = flashgate::app::build_payments(settings)
        .map_err(|e| e.to_string())?
        .ok_or("payments are disabled (payments.enabled = false)")?;
    let pools = store::Pools::new(&settings.database).map_err(|e| e.to_string())?;
    let findings = payments
        .reconcile(&pools.admin)
        .await
        .map_err(|e| e.to_string())?;
    println!(
        "{}",
        serde_json::to_string_pretty(&findings).unwrap_or_default()
    );
    Ok(())
}

async fn create_demo_deal(app: &Application) -> Result<(), String> {
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
    match deals::create(&app.admin_pool(), &demo).await {
        Ok(_) | Err(DealError::AlreadyExists(_)) => Ok(()),
        Err(error) => Err(error.to_string()),
    }
}

fn print_demo_help(app: &Application, token: &str, admin_token: &str) {
    let base = format!("http://{}", app.local_addr());
    let ops = format!("http://{}", app.ops_addr());
    println!(
        "\nflashgate demo sale is live at {base}\n\n\
         Deal status:\n  curl -s {base}/v1/deals/demo\n\n\
         Buy two seats as alice (token valid for an hour):\n  \
         curl -s -X POST {base}/v1/deals/demo/orders \\\n    \
         -H 'Authorization: Bearer {token}' \\\n    \
         -H 'Idempotency-Key: first-try' -d '{{\"quantity\": 2}}'\n\n\
         Inventory (admin, on the operations listener):\n  curl -s {ops}/admin/deals/demo/inventory -H 'Authorization: Bearer {admin_token}'\n\n\
         Metrics:\n  curl -s {ops}/metrics\n\n\
         Press Ctrl-C to stop.\n"
    );
}
