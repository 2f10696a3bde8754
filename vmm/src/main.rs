//! The `kvmscope` command line: parses flags into config structs and hands them
//! to the library. Nothing else lives here.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use kvmscope::run::{self, RunConfig, DEMO_WORKLOAD};
use kvmscope::sampler::SamplerConfig;
use kvmscope::units::parse_size;
use kvmscope::vm::VmConfig;
use kvmscope::workload::{parse_workload, Workload};

#[derive(Parser)]
#[command(
    name = "kvmscope",
    version,
    about = "A tiny VMM that shows KVM's binary statistics end to end"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Boot the built-in guest, run workloads, and print a summary per vCPU.
    Run(RunArgs),
}

#[derive(clap::Args)]
struct RunArgs {
    /// Guest RAM (a multiple of 2M, at least 16M), e.g. 512M or 2G.
    #[arg(long, default_value = "256M", value_parser = size_arg)]
    memory: u64,
    /// Number of vCPUs, one thread each.
    #[arg(long, default_value_t = 1)]
    vcpus: usize,
    /// Back guest RAM with transparent huge pages (MADV_HUGEPAGE).
    #[arg(long)]
    hugepages: bool,
    /// Enable KVM dirty-page logging on guest RAM.
    #[arg(long)]
    dirty_log: bool,
    /// Boot this ELF instead of the built-in guest (it must follow docs/GUEST_ABI.md).
    #[arg(long, value_name = "PATH")]
    guest: Option<PathBuf>,
    /// A workload: `[TARGET:] COMMAND (; COMMAND)*`, e.g. "touch size=64M; dirty rate=2000/s for=5s"
    /// or "all: exits count=100". Repeatable. TARGET is all, N, N-M or N,M (default 0).
    /// Without any, vCPU 0 runs the demo workload.
    #[arg(long, value_name = "SPEC", value_parser = workload_arg)]
    workload: Vec<Workload>,
    /// Serve the control socket at PATH (see docs/PROTOCOL.md); the VM then runs
    /// until a client sends `quit` or the process gets SIGINT/SIGTERM.
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Sampler tick: a duration from 1ms up, e.g. 100ms or 1s; `off` runs no sampler.
    #[arg(long, default_value = "100ms", value_name = "DUR", value_parser = interval_arg)]
    sample_interval: Interval,
    /// Points the sampler keeps in memory (its ring buffer); older ones are dropped.
    #[arg(long, default_value_t = 4096, value_name = "N")]
    sample_buffer: usize,
    /// Write every sample to FILE as it is taken: CSV if it ends in .csv, else
    /// JSON lines (.jsonl, .json, .ndjson). Flushed each tick.
    #[arg(long, value_name = "FILE")]
    samples_out: Option<PathBuf>,
    /// Serve the sampler's readings as Prometheus text at http://ADDR/metrics,
    /// e.g. 127.0.0.1:9100.
    #[arg(long, value_name = "ADDR")]
    metrics_addr: Option<std::net::SocketAddr>,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

/// A sampler interval, or none for `off`.
#[derive(Clone, Copy)]
struct Interval(Option<Duration>);

fn interval_arg(s: &str) -> Result<Interval, String> {
    if s == "off" {
        return Ok(Interval(None));
    }
    let d = kvmscope::units::parse_duration(s)
        .ok_or_else(|| format!("'{s}' is not a duration: use e.g. 100ms, 1s, or off"))?;
    if d < kvmscope::sampler::MIN_INTERVAL {
        return Err(format!("{s} is below the 1ms minimum"));
    }
    Ok(Interval(Some(d)))
}

fn size_arg(s: &str) -> Result<u64, String> {
    parse_size(s)
        .ok_or_else(|| format!("'{s}' is not a size: use a number with K, M, G or T, like 512M"))
}

fn workload_arg(s: &str) -> Result<Workload, String> {
    parse_workload(s).map_err(|e| e.to_string())
}

fn run_command(args: RunArgs, process_start: Instant) -> anyhow::Result<ExitCode> {
    let workloads = if args.workload.is_empty() {
        vec![workload_arg(DEMO_WORKLOAD).map_err(anyhow::Error::msg)?]
    } else {
        args.workload
    };
    let config = RunConfig {
        vm: VmConfig {
            memory: args.memory,
            vcpus: args.vcpus,
            hugepages: args.hugepages,
            dirty_log: args.dirty_log,
            guest: args.guest,
        },
        workloads,
        process_start,
        stop_timeout: Duration::from_secs(1),
        handle_signals: true,
        socket: args.socket,
        sampler: match (args.sample_interval.0, args.samples_out) {
            (Some(interval), out) => Some(SamplerConfig {
                interval,
                capacity: args.sample_buffer,
                out,
            }),
            (None, Some(_)) => {
                anyhow::bail!("--samples-out needs the sampler: drop --sample-interval off")
            }
            (None, None) => None,
        },
        metrics_addr: args.metrics_addr,
    };
    let summary = run::run(config)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary.to_json())?);
    } else {
        print!("{}", summary.to_text());
    }
    if let Some(failure) = summary.failure() {
        eprintln!("kvmscope: the guest failed: {failure}");
        return Ok(ExitCode::from(2));
    }
    if !summary.stuck.is_empty() {
        eprintln!(
            "kvmscope: vCPUs {:?} did not stop within a second",
            summary.stuck
        );
        return Ok(ExitCode::from(3));
    }
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    let process_start = Instant::now();
    kvmscope::signals::block_termination();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    let result = match cli.command {
        Cmd::Run(args) => run_command(args, process_start),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("kvmscope: {e:#}");
            ExitCode::FAILURE
        }
    }
}
