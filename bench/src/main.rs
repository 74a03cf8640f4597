//! `wrbench`: the Rust half of waitroom's benchmark (`bench/run.sh` drives it, with wrk,
//! redis-benchmark and nginx). Each subcommand is one tool:
//!
//! - `seed-queue`, `mint-tokens`: Redis protocol streams for `redis-cli --pipe`, in the room's
//!   key layout (`{prefix}:queue` scored by `{prefix}:seq`, `{prefix}:token:<user>`);
//! - `crowd`: N simulated users arriving within a second, entering, polling as told and ordering;
//! - `idle`: opens many keep-alive connections and holds them (proxy RSS per connection);
//! - `fire`: a fixed number of requests on one connection (instruction counts under callgrind);
//! - `report`: medians, ratios, `results.json` and the SVG charts from a run's raw measurements.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cg;
mod charts;
mod crowd;
mod fire;
mod idle;
// The proxy's own key names, compiled from its source: depending on the `waitroom` crate would
// build pingora's tree a second time with the chart library's features (see the root
// Cargo.toml). Only some of the names are used here.
#[allow(dead_code)]
#[path = "../../src/store/keys.rs"]
mod keys;
mod report;
mod resp;
mod seed;
mod stats;

#[derive(Parser)]
#[command(name = "wrbench", about = "waitroom benchmark tools (driven by bench/run.sh)")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Writes a RESP stream that puts `count` users in a room's line (pipe it to `redis-cli --pipe`).
    SeedQueue(seed::SeedArgs),
    /// Writes a RESP stream that mints entry tokens, and a file of `user token` pairs.
    MintTokens(seed::MintArgs),
    /// Runs a crowd of simulated users against a room (or straight at the backend).
    Crowd(crowd::CrowdArgs),
    /// Opens keep-alive connections, sends one request on each, and holds them.
    Idle(idle::IdleArgs),
    /// Sends a fixed number of requests, one after another, on one keep-alive connection.
    Fire(fire::FireArgs),
    /// Reads a callgrind dump: instructions, mallocs and socket calls per request, top costs.
    Callgrind(cg::CgArgs),
    /// Tabulates bench/callgrind.sh summaries side by side.
    CallgrindTable(cg::CgTableArgs),
    /// Turns a run's raw measurements into the table, results.json and the charts.
    Report(report::ReportArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::SeedQueue(args) => seed::seed_queue(args),
        Command::MintTokens(args) => seed::mint_tokens(args),
        Command::Crowd(args) => runtime(true).block_on(crowd::run(args)),
        Command::Idle(args) => runtime(false).block_on(idle::run(args)),
        Command::Fire(args) => runtime(false).block_on(fire::run(args)),
        Command::Callgrind(args) => cg::run(args),
        Command::CallgrindTable(args) => cg::table(args),
        Command::Report(args) => report::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("wrbench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn runtime(multi: bool) -> tokio::runtime::Runtime {
    let mut builder = if multi {
        tokio::runtime::Builder::new_multi_thread()
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    builder.enable_all().build().expect("a tokio runtime")
}

pub type Result<T> = std::result::Result<T, String>;

/// Maps any displayable error into the tool's string errors, with some context.
pub fn ctx<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> String + '_ {
    move |e| format!("{what}: {e}")
}
