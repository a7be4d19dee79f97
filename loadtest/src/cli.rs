//! The `flashgate-loadtest` command line, in the library so that tests can check every
//! command the docs show against the real definition (`Cli::try_parse_from`).

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::{chaos, crowd, flood, sale};

#[derive(Parser)]
#[command(
    name = "flashgate-loadtest",
    about = "Flash sales against flashgate on loopback, bounded in count and time"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
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
        /// Where to write the JSON report; with it, one line per run is printed instead of
        /// the report (the faults applied, the violations, the file).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// One order from each of many distinct users (tokens of their own), with the
    /// gateway's resident memory sampled during the flood and after it settles; prints the
    /// report as JSON.
    Flood {
        #[command(flatten)]
        config: flood::FloodConfig,
        /// Where to write the JSON result.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// A line of `--tickets` waiting behind the edge: origin requests/s, Redis commands/s and
    /// the edge's hit ratio over a window, then fairness, `max_active` and stock checked;
    /// exits non-zero when a check fails.
    Crowd {
        #[command(flatten)]
        config: crowd::CrowdConfig,
        /// Where to write the JSON result.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Draws the crowd rehearsals' results (JSON files of `crowd --out`) as an SVG chart.
    CrowdChart {
        /// Where to write the SVG.
        #[arg(long)]
        out: PathBuf,
        /// The results, one per crowd size.
        results: Vec<PathBuf>,
    },
    /// Serve the load tester's public key as an OpenID Connect provider would:
    /// `/jwks.json` and `/.well-known/openid-configuration`, for a gateway verifying the
    /// RS256 tokens of `--token-kind rs256`.
    Provider {
        #[arg(long, default_value = "127.0.0.1:8097")]
        listen: SocketAddr,
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
