//! The `kvmscope` command line: parses flags into config structs and hands them
//! to the library. Nothing else lives here: the flags are `args.rs`, how
//! their values are read `values.rs`.

mod args;
mod values;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[cfg(feature = "plot")]
use args::PlotArgs;
use args::{
    Cli, Cmd, ConvergeArg, CtlArgs, DemoArgs, ExporterArgs, MigrateArgs, ReadinessArgs, RunArgs,
    StatsArgs, WatchArgs,
};
use clap::Parser;
use kvmscope::client::output::{OnGone, Stdout};
use kvmscope::client::{self, demo::DemoConfig, stats::StatsConfig, watch::WatchConfig};
use kvmscope::dirty::DirtyMode;
use kvmscope::protocol::VcpuSelector;
use kvmscope::run::{self, RunConfig};
use kvmscope::sampler::export::Destination;
use kvmscope::sampler::SamplerConfig;
use kvmscope::units::{DirtyLog, VcpuChoice};
use kvmscope::vm::VmConfig;
use kvmscope::workload::parse_workload;

/// The dirty-tracking mode `--dirty-log` names.
fn dirty_mode(log: DirtyLog) -> DirtyMode {
    match log {
        DirtyLog::Bitmap => DirtyMode::Bitmap,
        DirtyLog::Ring(entries) => DirtyMode::Ring(entries),
    }
}

/// The vCPUs `--vcpu` names.
fn vcpu_selector(choice: VcpuChoice) -> VcpuSelector {
    match choice {
        VcpuChoice::One(index) => VcpuSelector::One(index),
        VcpuChoice::All => VcpuSelector::All,
    }
}

/// Flags that disagree with each other: said as clap says its own errors,
/// with its exit status (2, "the command line is wrong").
fn usage_error(subcommand: &str, message: impl std::fmt::Display) -> ! {
    use clap::CommandFactory;
    let mut cli = Cli::command().bin_name("kvmscope");
    cli.build();
    let mut command = cli.find_subcommand(subcommand).cloned().unwrap_or(cli);
    command
        .error(clap::error::ErrorKind::ArgumentConflict, message)
        .exit()
}

fn exporter_command(a: ExporterArgs) -> anyhow::Result<ExitCode> {
    use kvmscope::exporter::{Exporter, ExporterConfig, DEFAULT_SOCKET_DIR};
    let defaulted = a.dirs.is_empty() && a.sockets.is_empty() && a.qmp_sockets.is_empty();
    let dirs = if defaulted {
        vec![PathBuf::from(DEFAULT_SOCKET_DIR)]
    } else {
        a.dirs
    };
    for dir in &dirs {
        let given = if defaulted {
            " (the default: no --vm-sockets, --socket or --qmp-socket given)"
        } else {
            ""
        };
        let why = match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => continue,
            Ok(_) => "not a directory",
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => "no such directory",
            Err(_) => "cannot be read",
        };
        anyhow::bail!(
            "--vm-sockets {}{given}: {why} (create it, or name another)",
            dir.display()
        );
    }
    // What it reads, for the line that says it is up.
    let mut reads: Vec<String> = dirs
        .iter()
        .map(|d| format!("the VMs in {}", d.display()))
        .collect();
    reads.extend(
        a.sockets
            .iter()
            .map(|s| format!("the VM at {}", s.display())),
    );
    reads.extend(
        a.qmp_sockets
            .iter()
            .map(|s| format!("the QEMU VM at {}", s.display())),
    );
    let exporter = Exporter::start(ExporterConfig {
        listen: a.listen,
        dirs: dirs.clone(),
        sockets: a.sockets,
        attach_timeout: a.attach_timeout.0,
        stats: kvm_stats::NameFilter::patterns(a.stats)
            .map_err(kvmscope::exporter::Error::Pattern)?,
        qmp_sockets: a.qmp_sockets,
        qmp_interval: a.qmp_interval.0,
        qmp_vcpus: a.qmp_vcpus,
        vcpu_exits: a.vcpu_exits,
    })?;
    kvmscope::say!(
        "kvmscope exporter: serving http://{}/metrics for {}",
        exporter.addr,
        reads.join(", ")
    );
    let sig = kvmscope::signals::wait_for_termination();
    log::info!("exporter: stopping on signal {sig}");
    Ok(ExitCode::SUCCESS)
}

fn run_command(args: RunArgs, process_start: Instant) -> anyhow::Result<ExitCode> {
    // The first stop signal stops the VMM in order; a second, while that
    // one is under way, ends the process at once: an orderly stop that
    // cannot finish (its summary written to a pipe nobody reads, which
    // held a stopped run for good) is ended by asking again.
    kvmscope::signals::exit_on_second_signal(Some(
        "a second stop signal: ending at once, before the run's summary (is its standard output read?)",
    ));
    let json = args.json;
    let (config, incoming) = run_config(args, process_start)?;
    let summary = match incoming {
        Some(incoming) => run::run_incoming(config, incoming),
        None => run::run(config),
    };
    let summary = match summary {
        // A --workload that names a vCPU the VM lacks, or a range outside
        // its arena, is the command line's fault, as an unknown command is
        // (exit status 2); checked against the VM before anything runs.
        Err(e @ (run::Error::Workload { .. } | run::Error::Target(_))) => {
            usage_error("run", kvmscope::error_chain(&e))
        }
        other => other?,
    };
    let text = if json {
        serde_json::to_string_pretty(&summary.to_json())? + "\n"
    } else {
        summary.to_text()
    };
    // A reader gone (`| head`, a parent that died) does not change how the
    // run went: its exit status says that, as it would have.
    if let Err(e) = std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes()) {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            return Err(e.into());
        }
    }
    Ok(run_exit_status(&summary))
}

/// `run`'s flags as the library's configs: the run's, and the incoming
/// migration's when `--incoming` is given.
fn run_config(
    args: RunArgs,
    process_start: Instant,
) -> anyhow::Result<(
    RunConfig,
    Option<kvmscope::migration::receiver::IncomingConfig>,
)> {
    // clap's `requires` lets it through beside --workload, which --incoming
    // conflicts with: said here, as clap would.
    if args.incoming_idle_timeout.is_some() && args.incoming.is_none() {
        usage_error(
            "run",
            "the argument '--incoming-idle-timeout <DUR>' requires '--incoming <URI>'",
        );
    }
    let sampler = sampler_config(&args);
    let readiness_every = periodic_readiness(&args);
    // With a socket, clients drive the guest: no demo workload by default.
    let memory = args.memory.map_or(VmConfig::default().memory, |m| m.0);
    let workloads = if args.workload.is_empty() && args.socket.is_none() && args.incoming.is_none()
    {
        vec![parse_workload(&run::demo_workload(memory))?]
    } else {
        args.workload
    };
    let incoming = args
        .incoming
        .map(|uri| kvmscope::migration::receiver::IncomingConfig {
            uri,
            memory: args.memory.map(|m| m.0),
            vcpus: args.vcpus,
            hugepages: args.hugepages.then_some(true),
            dirty_log: args.dirty_log.map(dirty_mode),
            idle_timeout: args
                .incoming_idle_timeout
                .map_or(kvmscope::migration::receiver::DEFAULT_IDLE_TIMEOUT, |p| p.0),
        });
    let config = RunConfig {
        vm: VmConfig {
            memory,
            vcpus: args.vcpus.unwrap_or(1),
            hugepages: args.hugepages,
            dirty_log: args.dirty_log.map(dirty_mode),
            guest: args.guest,
            dirty_manual_protect: true,
        },
        workloads,
        process_start,
        stop_timeout: Duration::from_secs(1),
        handle_signals: true,
        socket: args.socket,
        sampler,
        metrics_addr: args.metrics_addr,
        boot_timeout: args.boot_timeout.0,
        name: args.name,
        control_limits: kvmscope::control::Limits::default(),
        readiness_every,
        fault_cost: args.fault_cost.map(|c| c.0),
        announce: true,
    };
    Ok((config, incoming))
}

/// `run`'s sampler, from `--sample-interval`, `--sample-buffer` and `--samples-out`.
fn sampler_config(args: &RunArgs) -> Option<SamplerConfig> {
    match (args.sample_interval.0, &args.samples_out) {
        (Some(interval), out) => Some(SamplerConfig {
            interval,
            capacity: args.sample_buffer.0,
            out: out.clone().map(|path| Destination {
                path,
                force: args.force,
            }),
        }),
        (None, Some(_)) => usage_error(
            "run",
            "--samples-out needs the sampler: drop --sample-interval off",
        ),
        (None, None) => None,
    }
}

/// `run`'s periodic readiness, from `--readiness-every` and `--readiness-window`.
fn periodic_readiness(args: &RunArgs) -> Option<kvmscope::control::Periodic> {
    let every = args.readiness_every?;
    if args.readiness_window.0 >= every.0 {
        usage_error(
            "run",
            format!(
                "--readiness-window ({:?}) must be shorter than --readiness-every ({:?})",
                args.readiness_window.0, every.0
            ),
        );
    }
    Some(kvmscope::control::Periodic {
        period: every.0,
        window: args.readiness_window.0,
    })
}

/// `run`'s exit status from how the run went ([`RUN_EXIT_STATUS`]), saying
/// why on standard error when it is not 0.
fn run_exit_status(summary: &kvmscope::summary::Summary) -> ExitCode {
    if let Some(late) = &summary.boot_timeout {
        kvmscope::say!("kvmscope: {}", late.describe());
        return ExitCode::from(5);
    }
    if let Some(failure) = summary.failure() {
        kvmscope::say!("kvmscope: the guest failed: {failure}");
        return ExitCode::from(2);
    }
    if !summary.stuck.is_empty() {
        kvmscope::say!(
            "kvmscope: vCPUs {:?} did not stop within a second",
            summary.stuck
        );
        return ExitCode::from(3);
    }
    if !summary.warnings.is_empty() {
        for w in &summary.warnings {
            kvmscope::say!("kvmscope: {w}");
        }
        return ExitCode::from(4);
    }
    ExitCode::SUCCESS
}

fn stats_command(a: StatsArgs) -> anyhow::Result<ExitCode> {
    let config = StatsConfig {
        socket: a.socket,
        vm: a.vm,
        vcpus: a.vcpu.map(vcpu_selector),
        names: a.names,
        json: a.json,
    };
    client::stats::run(&config, &mut Stdout::lock())?;
    Ok(ExitCode::SUCCESS)
}

fn watch_command(a: WatchArgs) -> anyhow::Result<ExitCode> {
    let config = WatchConfig {
        socket: a.socket,
        interval: a.interval.0,
        names: a.names,
        count: a.count,
        vm: a.vm,
        vcpus: a.vcpu.map(vcpu_selector),
        clear: std::io::stdout().is_terminal(),
    };
    client::watch::run(&config, &mut Stdout::lock())?;
    Ok(ExitCode::SUCCESS)
}

fn ctl_command(a: CtlArgs) -> anyhow::Result<ExitCode> {
    let answered = client::ctl(&a.socket, &a.request, &mut Stdout::lock())?;
    Ok(if answered {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn readiness_command(a: ReadinessArgs) -> anyhow::Result<ExitCode> {
    let config = client::readiness::ReadinessConfig {
        socket: a.socket,
        scan: a.scan,
        calc_time: a.calc_time.map(|s| s.0),
        bandwidth: a.bandwidth.map(|b| b.0),
        max_downtime: a.max_downtime.map(|d| d.0),
        json: a.json,
    };
    client::readiness::readiness(&config, &mut Stdout::lock())?;
    Ok(ExitCode::SUCCESS)
}

fn migrate_command(a: MigrateArgs) -> anyhow::Result<ExitCode> {
    use client::migrate::{Converge, MigrateConfig, Stop, DEFAULT_MAX_DOWNTIME};
    let config = MigrateConfig {
        socket: a.socket,
        to: a.to.to_string(),
        // A command line says the whole migration: what it leaves out is
        // its default, not what the VMM kept from before.
        bandwidth: Some(
            a.bandwidth
                .map_or(0, |b| kvmscope::units::saturating_u64(b.0)),
        ),
        max_downtime: Some(a.max_downtime.map_or(DEFAULT_MAX_DOWNTIME, |d| d.0)),
        max_rounds: Some(a.max_rounds.unwrap_or(0)),
        predict: a.predict,
        converge: a.converge.map(|c| match c {
            ConvergeArg::Auto => Converge::Auto,
            ConvergeArg::AutoConverge => Converge::AutoConverge,
            ConvergeArg::DirtyLimit => Converge::DirtyLimit,
            ConvergeArg::Off => Converge::Off,
        }),
        json: a.json,
        stop: Some(Stop {
            pending: kvmscope::signals::pending_termination,
            exit_on_next: kvmscope::signals::exit_on_signal,
            exit_on_second: kvmscope::signals::exit_on_second_signal,
        }),
    };
    // The migration goes on in the VMM whether or not anybody reads its
    // report: the status stays the migration's.
    let completed = client::migrate::migrate(&config, &mut Stdout::with(OnGone::Discard))?;
    Ok(if completed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn demo_command(a: DemoArgs) -> anyhow::Result<ExitCode> {
    let exe = std::env::current_exe()?;
    let config = DemoConfig {
        exe,
        memory: a.memory.0,
        hugepages: a.hugepages,
        phase_size: a.phase_size.0,
        startup_timeout: Duration::from_secs(10),
    };
    if let Err(why) = config.check() {
        usage_error("demo", why);
    }
    client::demo::run(&config, &mut std::io::stdout().lock())?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(feature = "plot")]
fn plot_command(a: PlotArgs) -> anyhow::Result<ExitCode> {
    let source = kvmscope::plot::source_name(&a.file);
    let chart = kvmscope::plot::ChartOptions {
        title: a.title,
        source,
        width: a.width,
        height: a.height,
        vcpu: a.vcpu,
        rates: a.rates,
    };
    let config = kvmscope::plot::PlotConfig {
        input: a.file,
        output: a.output,
        chart,
    };
    let done = kvmscope::plot::plot(&config)?;
    println!("wrote {}: {done}", config.output.display());
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    let process_start = Instant::now();
    let cli = Cli::parse();
    if let Cmd::Run(_) | Cmd::Exporter(_) | Cmd::Migrate(_) = cli.command {
        // Before any thread exists. Other clients keep the default actions
        // (Ctrl-C ends them); `migrate` says what one does at each stage
        // (`MigrateConfig::stop`).
        if let Err(e) = kvmscope::signals::take_termination() {
            kvmscope::say!("kvmscope: taking SIGINT/SIGTERM/SIGHUP: {e}");
            return ExitCode::from(1);
        }
    }
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    if let Cmd::Run(_) | Cmd::Exporter(_) = cli.command {
        kvmscope::give_large_buffers_back();
    }
    let result = match cli.command {
        Cmd::Run(args) => run_command(args, process_start),
        Cmd::Stats(a) => stats_command(a),
        Cmd::Watch(a) => watch_command(a),
        Cmd::Ctl(a) => ctl_command(a),
        Cmd::Demo(a) => demo_command(a),
        #[cfg(feature = "plot")]
        Cmd::Plot(a) => plot_command(a),
        Cmd::Migrate(a) => migrate_command(a),
        Cmd::Exporter(a) => exporter_command(a),
        Cmd::Readiness(a) => readiness_command(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            kvmscope::say!("kvmscope: {e:#}");
            ExitCode::FAILURE
        }
    }
}
