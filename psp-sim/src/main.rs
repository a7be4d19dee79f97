//! `flashgate-psp-sim`: the payment-provider simulator as a command of its own.

use std::process::ExitCode;

use clap::Parser;
use psp_sim::SimConfig;
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(
    name = "flashgate-psp-sim",
    version,
    about = "A payment-provider simulator: hosted checkout, signed webhooks, fault injection"
)]
struct Cli {
    #[command(flatten)]
    config: SimConfig,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("flashgate-psp-sim: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(async move {
        let token = CancellationToken::new();
        tokio::spawn(psp_sim::cancel_on_signal(token.clone()));
        psp_sim::run(cli.config, token).await
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("flashgate-psp-sim: {error}");
            ExitCode::FAILURE
        }
    }
}
