//! The `flashgate-loadtest` command: a bounded sale against a gateway on loopback, or the
//! bare baseline server.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use flashgate_loadtest::{bare, chaos, chart, sale};

#[derive(Parser)]
#[command(about = "Flash sales against flashgate on loopback, bounded in count and time")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a sale; exits non-zero on oversell, a broken invariant or a lost order.
    Sale {
        #[command(flatten)]
        config: sale::SaleConfig,
        /// Where to write the JSON result.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Where to write the SVG chart of the timeline.
        #[arg(long)]
        chart: Option<PathBuf>,
    },
    /// A whole sale under a seeded fault schedule; exits non-zero on any ledger violation
    /// and prints the seed and the schedule to replay it.
    Chaos {
        #[command(flatten)]
        config: chaos::ChaosConfig,
    },
    /// Serve one fixed answer on every request: the baseline for rejection cost.
    BareServer {
        #[arg(long, default_value = "127.0.0.1:8099")]
        listen: SocketAddr,
        /// An HTTP/1.1 response as `curl -si` prints it, replayed as the answer; without
        /// it, a tiny JSON body.
        #[arg(long, value_name = "FILE")]
        answer: Option<PathBuf>,
        /// Serve on this many current-thread runtimes, one thread each, sharing the
        /// listener; 0 serves on the process's multi-thread runtime.
        #[arg(long, default_value_t = 0)]
        loops: usize,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Sale { config, out, chart } => run_sale(&config, out, chart).await,
        Command::Chaos { config } => run_chaos(&config).await,
        Command::BareServer {
            listen,
            answer,
            loops,
        } => run_bare(listen, answer, loops).await,
    }
}

async fn run_bare(listen: SocketAddr, answer: Option<PathBuf>, loops: usize) -> ExitCode {
    let answer = match answer.as_deref().map(bare::Answer::from_file) {
        None => bare::Answer::tiny_json(),
        Some(Ok(answer)) => answer,
        Some(Err(error)) => {
            eprintln!("bare server: {error}");
            return ExitCode::FAILURE;
        }
    };
    match bare::serve(listen, answer, loops).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("bare server: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run_sale(
    config: &sale::SaleConfig,
    out: Option<PathBuf>,
    chart_path: Option<PathBuf>,
) -> ExitCode {
    let report = match sale::run(config).await {
        Ok(report) => report,
        Err(error) => {
            eprintln!("sale failed to run: {error}");
            return ExitCode::FAILURE;
        }
    };
    println!("{}", sale::summary(&report));
    let written = write_outputs(&report, out, chart_path);
    if let Err(error) = written {
        eprintln!("cannot write results: {error}");
        return ExitCode::FAILURE;
    }
    if report["verdict"]["ok"] == serde_json::json!(true) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    }
}

fn write_outputs(
    report: &serde_json::Value,
    out: Option<PathBuf>,
    chart_path: Option<PathBuf>,
) -> std::io::Result<()> {
    if let Some(path) = out {
        std::fs::write(path, serde_json::to_vec_pretty(report)?)?;
    }
    if let Some(path) = chart_path {
        let timeline = sale::timeline_from_report(report);
        let title = format!(
            "flashgate sale: {} units over {} buckets, {} users, {:.0} req/s",
            report["stock"],
            report["buckets"],
            report["users"],
            report["requests_per_second"].as_f64().unwrap_or(0.0)
        );
        std::fs::write(path, chart::svg(&title, &timeline))?;
    }
    Ok(())
}

async fn run_chaos(config: &chaos::ChaosConfig) -> ExitCode {
    match chaos::run(config).await {
        Ok(report) => {
            println!(
                "{}",
                serde_json::to_string_pretty(&report).unwrap_or_default()
            );
            if report["ok"] == true {
                ExitCode::SUCCESS
            } else {
                eprintln!(
                    "chaos: violations with seed {} (replay: flashgate-loadtest chaos --seed {} \
                     --duration-seconds {}); schedule above",
                    config.seed, config.seed, config.duration_seconds
                );
                ExitCode::FAILURE
            }
        }
        Err(error) => {
            eprintln!("chaos run with seed {} could not run: {error}", config.seed);
            ExitCode::FAILURE
        }
    }
}
