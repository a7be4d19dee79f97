//! The `flashgate-loadtest` command: a bounded sale against a gateway on loopback, or the
//! bare baseline server.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use flashgate_loadtest::cli::{Cli, Command};
use flashgate_loadtest::{bare, chaos, chart, crowd, crowd_chart, flood, provider, sale, timeline};

fn main() -> ExitCode {
    let command = Cli::parse().command;
    // A sale's or a flood's client runs on one thread: the generator shares the machine with what it
    // measures, and one thread never wakes another for its own work. Everything else
    // (the baseline server above all) keeps the multi-thread runtime a server uses.
    let runtime = match &command {
        Command::Sale { .. } | Command::Flood { .. } => {
            tokio::runtime::Builder::new_current_thread()
        }
        _ => tokio::runtime::Builder::new_multi_thread(),
    }
    .enable_all()
    .build();
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(run(command))
}

async fn run(command: Command) -> ExitCode {
    match command {
        Command::Sale { config, out, chart } => run_sale(&config, out, chart).await,
        Command::Chaos { config, out } => run_chaos(&config, out).await,
        Command::Flood { config, out } => run_flood(&config, out).await,
        Command::Crowd { config, out } => run_crowd(&config, out).await,
        Command::CrowdChart { out, results } => run_crowd_chart(&out, &results),
        Command::Provider { listen } => match provider::serve(listen).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("provider: {error}");
                ExitCode::FAILURE
            }
        },
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
        let timeline = timeline::timeline_from_report(report);
        let title = format!(
            "flashgate sale: {} units over {} buckets, {} users, {:.0} req/s",
            report["stock"],
            report["buckets"],
            report["users"],
            report["requests_per_second"].as_f64().unwrap_or(0.0)
        );
        let samples = timeline::stock_samples_from_report(report);
        let run = chart::Run {
            stock: report["stock"].as_i64().unwrap_or(0),
            elapsed_seconds: report["elapsed_seconds"].as_f64().unwrap_or(0.0),
            timeline: &timeline,
            stock_samples: &samples,
        };
        std::fs::write(path, chart::svg(&title, &run))?;
    }
    Ok(())
}

async fn run_flood(config: &flood::FloodConfig, out: Option<PathBuf>) -> ExitCode {
    let report = match flood::run(config).await {
        Ok(report) => report,
        Err(error) => {
            eprintln!("flood failed to run: {error}");
            return ExitCode::FAILURE;
        }
    };
    if !print_report(&report, out) {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// Prints `report` as JSON and writes it to `out` when given; false when it could not.
fn print_report(report: &serde_json::Value, out: Option<PathBuf>) -> bool {
    let text = serde_json::to_string_pretty(report).unwrap_or_default();
    println!("{text}");
    if let Some(path) = out
        && let Err(error) = std::fs::write(&path, &text)
    {
        eprintln!("cannot write {}: {error}", path.display());
        return false;
    }
    true
}

async fn run_crowd(config: &crowd::CrowdConfig, out: Option<PathBuf>) -> ExitCode {
    let report = match crowd::run(config).await {
        Ok(report) => report,
        Err(error) => {
            eprintln!("crowd rehearsal failed to run: {error}");
            return ExitCode::FAILURE;
        }
    };
    if !print_report(&report, out) {
        return ExitCode::FAILURE;
    }
    if report["ok"] == serde_json::json!(true) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    }
}

fn run_crowd_chart(out: &std::path::Path, results: &[PathBuf]) -> ExitCode {
    let mut runs = Vec::new();
    for path in results {
        let read = std::fs::read(path).map_err(|e| e.to_string());
        match read.and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string())) {
            Ok(run) => runs.push(run),
            Err(error) => {
                eprintln!("cannot read {}: {error}", path.display());
                return ExitCode::FAILURE;
            }
        }
    }
    match std::fs::write(out, crowd_chart::svg(&runs)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("cannot write {}: {error}", out.display());
            ExitCode::FAILURE
        }
    }
}

async fn run_chaos(config: &chaos::ChaosConfig, out: Option<PathBuf>) -> ExitCode {
    match chaos::run(config).await {
        Ok(report) => {
            let shown = match out {
                Some(path) => write_chaos_report(&report, &path),
                None => print_report(&report, None),
            };
            if !shown {
                return ExitCode::FAILURE;
            }
            if report["ok"] == true {
                ExitCode::SUCCESS
            } else {
                eprintln!(
                    "chaos: violations with seed {} (replay: flashgate-loadtest chaos --seed {} \
                     --duration-seconds {}); schedule in the report",
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

/// Writes a chaos run's report to `path` and prints one line: the seed, the verdict, the
/// faults applied, the violations and where the report is.
fn write_chaos_report(report: &serde_json::Value, path: &std::path::Path) -> bool {
    let text = serde_json::to_string_pretty(report).unwrap_or_default();
    if let Err(error) = std::fs::write(path, &text) {
        eprintln!("cannot write {}: {error}", path.display());
        return false;
    }
    let violations = report["violations"].as_array().map_or(0, Vec::len);
    println!(
        "chaos: seed {} {}: {} faults applied, {violations} violations; report {}",
        report["seed"],
        if report["ok"] == true { "ok" } else { "FAILED" },
        report["faults_applied"],
        path.display()
    );
    true
}
