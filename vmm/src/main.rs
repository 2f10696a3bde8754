//! The `kvmscope` command line: parses flags into config structs and hands them
//! to the library. Nothing else lives here.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use kvmscope::client::{self, demo::DemoConfig, stats::StatsConfig, watch::WatchConfig};
use kvmscope::dirty::DirtyMode;
use kvmscope::protocol::VcpuSelector;
use kvmscope::run::{self, RunConfig};
use kvmscope::sampler::export::Destination;
use kvmscope::sampler::SamplerConfig;
use kvmscope::units::{
    Bandwidth, Count, DirtyLog, Interval, Limit, Period, Size, Span, VcpuChoice,
};
use kvmscope::vm::VmConfig;
use kvmscope::workload::{parse_workload, Workload};

#[derive(Parser)]
#[command(
    name = "kvmscope",
    version = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("KVMSCOPE_COMMIT"), ")"),
    about = "A tiny VMM that shows KVM's binary statistics end to end"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Boot the built-in guest, run workloads, and print a summary per vCPU.
    #[command(after_help = RUN_EXIT_STATUS)]
    Run(RunArgs),
    /// Receive stats fds from a running VMM's socket and print the stats read through them.
    Stats(StatsArgs),
    /// A live view of stats and their rates, read through fds received once
    /// (and the VMM sampler's newest point, asked for at each refresh). Ends
    /// with exit status 1 when the VMM exits (the fds would still read, but
    /// nothing moves them), or after --count refreshes.
    Watch(WatchArgs),
    /// Send one raw JSON request to a VMM's socket and print the reply, one
    /// JSON line each. It negotiates first (qmp_capabilities is not to be
    /// sent); event lines that come before a reply (STOP,
    /// READINESS_PROGRESS...) are printed too, each on its own line. Waits
    /// as long as the command does (a guest-command with wait on a paused
    /// guest waits for its resume; Ctrl-C ends it). Exit status 0 when every
    /// reply is a success, 1 when one is an error or the VMM cannot be
    /// reached.
    Ctl(CtlArgs),
    /// The whole story: start a VMM with a socket, drive the guest through it,
    /// and show how the stats move, read through fds received from it.
    Demo(DemoArgs),
    /// Draw a series from `run --samples-out` (mapped memory, exit rates,
    /// phases; when the series has them, the guest's own progress per second
    /// and each vCPU's time lost to dirty tracking and to throttles) as SVG
    /// or PNG.
    #[cfg(feature = "plot")]
    Plot(PlotArgs),
    /// Ask a running VMM whether its guest is ready to live-migrate: non-zero
    /// RAM estimates, dirty rate, and a pre-copy prediction (docs/READINESS.md).
    Readiness(ReadinessArgs),
    /// Live-migrate a running VMM's guest to a `kvmscope run --incoming URI`,
    /// with a progress bar (on a terminal; else a line per pass on stderr)
    /// and a report like QEMU's `info migrate`. Ctrl-C
    /// (SIGINT) or SIGTERM cancels the migration (the guest runs on at the
    /// source) and reports it, except during the stop (status `device`),
    /// when it is too late; a second one ends the client at once. Before the
    /// migration starts, one ends the client. Exit status 0 only when it
    /// completed.
    Migrate(MigrateArgs),
    /// One telemetry agent per host: every VM's KVM stats on one Prometheus
    /// page, read through stats fds taken once from each VMM's control socket
    /// (one pread per KVM stats fd per scrape, the VMMs' own stats files
    /// mapped; no request to any VMM, no vCPU kicked).
    /// Runs until SIGINT/SIGTERM. See docs/EXPORTER.md.
    Exporter(ExporterArgs),
}

#[derive(clap::Args)]
struct ExporterArgs {
    /// Where to serve the page, at http://ADDR/metrics.
    #[arg(long, default_value = "127.0.0.1:9187", value_name = "ADDR", value_parser = listen_addr)]
    listen: std::net::SocketAddr,
    /// A directory of VMs' control sockets: every socket in it is read, and VMs
    /// that appear or go are picked up within a second (inotify). Repeatable.
    /// Better keep `run --incoming` sockets elsewhere (a source connecting
    /// while the exporter tries one waits up to --attach-timeout). Without
    /// it, --socket and --qmp-socket: /run/kvmscope, where `run --socket`'s
    /// help suggests VMs put theirs.
    #[arg(long = "vm-sockets", value_name = "DIR")]
    dirs: Vec<PathBuf>,
    /// One VM's control socket, read as long as it answers. Repeatable.
    #[arg(long = "socket", value_name = "PATH")]
    sockets: Vec<PathBuf>,
    /// Only these stats, KVM's and the VMMs' own (names, `*` for any run of
    /// characters, e.g. `pages_*,exits,halt_*,prediction_*`); one that matches
    /// no stat of the first VMs read is said once in the log. The exporter's
    /// own metrics are always there.
    #[arg(long, value_name = "NAMES", value_delimiter = ',', value_parser = stat_pattern)]
    stats: Vec<String>,
    /// Longest time to attach to one VMM (connect, greeting, fds); a VMM that
    /// does not answer in time is skipped and tried again 5 s later.
    #[arg(
        long,
        default_value = "2s",
        value_name = "DUR",
        allow_hyphen_values = true
    )]
    attach_timeout: Period,
    /// A QEMU VM's QMP monitor (`-qmp unix:PATH,server=on,wait=off`), read
    /// with `query-stats`: unmodified QEMU holds no stats fd to hand out.
    /// Repeatable. A monitor serves one client at a time: give QEMU a second
    /// `-qmp` for the exporter where libvirt holds the first.
    #[arg(long = "qmp-socket", value_name = "PATH")]
    qmp_sockets: Vec<PathBuf>,
    /// How often each QEMU VM's figures are refreshed (the page shows their age).
    #[arg(
        long,
        default_value = "5s",
        value_name = "DUR",
        allow_hyphen_values = true
    )]
    qmp_interval: Period,
    /// Also read QEMU's vCPU stats. With QEMU before 8.1 each refresh then
    /// kicks every vCPU of the VM out of the guest (it reads vCPU stats on the
    /// vCPU threads); 8.1 and later read them with `pread`, no kick.
    #[arg(long)]
    qmp_vcpus: bool,
    /// Also show the VMMs' own exit counters per vCPU
    /// (`kvmscope_vmm_vcpu_exits_<reason>_total`, twelve lines per vCPU).
    /// Without it they are summed per VM
    /// (`kvmscope_vmm_vm_exits_<reason>_total`, twelve lines per VM); either
    /// way only where `--stats`, if given, takes `exits_*`.
    #[arg(long)]
    vcpu_exits: bool,
}

#[derive(clap::Args)]
struct MigrateArgs {
    /// The source VMM's control socket.
    #[arg(long, value_name = "PATH")]
    socket: PathBuf,
    /// Where the destination listens: unix:PATH or tcp:HOST:PORT.
    #[arg(long, value_name = "URI")]
    to: kvmscope::migration::Uri,
    /// Cap the send rate (`max-bandwidth`), e.g. 1Gbit or 100MiB/s; 0bit or
    /// default: unlimited. Each of these three is set for every migrate, to
    /// its default when not given, whatever an earlier migrate or
    /// `migrate-set-parameters` left in the VMM.
    #[arg(long, value_name = "RATE")]
    bandwidth: Option<Bandwidth>,
    /// Longest acceptable downtime (`downtime-limit`); default 300ms, at
    /// most 2000s (QEMU's limit).
    #[arg(long, value_name = "DUR", allow_hyphen_values = true, value_parser = max_downtime)]
    max_downtime: Option<Period>,
    /// Stop and copy after N passes whatever is left (`x-max-rounds`); 0 or
    /// default: no limit.
    #[arg(long, value_name = "N")]
    max_rounds: Option<u64>,
    /// Ask the VMM for its readiness prediction first (exact scan, the VMM's
    /// dirty-rate window), print it, and end with predicted vs actual per field.
    #[arg(long)]
    predict: bool,
    /// Make a migration that would not converge converge: `auto` asks the
    /// VMM's readiness model what is needed and sets it from the start (nothing
    /// when it converges as it is): on a `--dirty-log ring` VM the dirty
    /// limit per vCPU that converges at the least vCPU time taken from the
    /// guest (only vCPUs dirtying faster are slowed), otherwise the smallest
    /// auto-converge throttle, of the vCPUs the VMM's window saw write (every
    /// vCPU where it could not tell them apart);
    /// `auto-converge` steps blindly as QEMU does (20 %, then +10 % after two
    /// periods of dirtying too fast); `dirty-limit` limits every vCPU to the
    /// VMM's `vcpu-dirty-limit` (1 MB/s unless set) after two such periods, as
    /// QEMU 8.1+ does (ring VMs only); `off` turns both off. Default: the
    /// VMM's capabilities as they are. The throttles and limits it sets on
    /// vCPUs are lifted when the migration ends, however it ends; the
    /// capabilities and parameters it sets stay in the VMM, as QEMU's do.
    #[arg(long, value_name = "HOW")]
    converge: Option<ConvergeArg>,
    /// Print the final `query-migrate` as JSON.
    #[arg(long)]
    json: bool,
}

/// `kvmscope migrate --converge`.
#[derive(Clone, Copy, clap::ValueEnum)]
enum ConvergeArg {
    Auto,
    AutoConverge,
    DirtyLimit,
    Off,
}

/// The exit codes of `kvmscope run` (also in the README).
const RUN_EXIT_STATUS: &str = "Exit status:
  0  the run ended in order: its workloads finished, a client sent `quit`, or
     SIGINT/SIGTERM stopped it (an orderly stop on a signal is a success, as
     for QEMU; the summary says `stopped by signal N`, and names a command
     cut short and how many queued ones never started)
  1  start-up failed (bad configuration, KVM, a port, socket or file), or
     an incoming migration failed, went silent or was stopped (SIGINT,
     SIGTERM or `quit` while the guest is still arriving)
  2  the guest failed (panic, fault, KVM error), or the command line is wrong
  3  vCPUs did not stop within a second of being told to
  4  the run ended, but something besides the guest failed (e.g. --samples-out)
  5  the guest did not check in within --boot-timeout (its registers are printed)";

#[derive(clap::Args)]
struct ReadinessArgs {
    /// The VMM's control socket (`kvmscope run --socket PATH`).
    #[arg(long, value_name = "PATH")]
    socket: PathBuf,
    /// Also count zero and non-zero pages exactly (pauses the guest while it reads RAM)
    /// and report each estimate's error.
    #[arg(long)]
    scan: bool,
    /// Window for the dirty rate (needs `run --dirty-log`; default 1s when the
    /// VMM has dirty logging, else none), at most 10m; 0s skips it. Ending
    /// this client (Ctrl-C) ends the window too.
    #[arg(long, value_name = "DUR", allow_hyphen_values = true, value_parser = calc_time)]
    calc_time: Option<Span>,
    /// Link bandwidth for the prediction, e.g. 10Gbit, 1.25GB/s, 800MiB/s: bits
    /// (bit, kbit, Mbit, Gbit, Tbit in any case, or Gbps) or bytes (KiB, MiB,
    /// GiB, TiB binary; KB, MB, GB, TB decimal); a bare 10G is refused as
    /// ambiguous; 0bit is unlimited;
    /// at most 80Tbit (1e13 B/s). Default: the VMM's `max-bandwidth`
    /// (unlimited unless set).
    #[arg(long, value_name = "RATE", value_parser = readiness_bandwidth)]
    bandwidth: Option<Bandwidth>,
    /// Longest acceptable downtime for the prediction, at most 2000s.
    /// Default: the VMM's `downtime-limit` (300ms unless set).
    #[arg(long, value_name = "DUR", allow_hyphen_values = true, value_parser = max_downtime)]
    max_downtime: Option<Period>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct StatsArgs {
    /// The VMM's control socket (`kvmscope run --socket PATH`).
    #[arg(long, value_name = "PATH")]
    socket: PathBuf,
    /// The VM's stats (with neither --vm nor --vcpu: the VM and every vCPU).
    #[arg(long)]
    vm: bool,
    /// A vCPU's stats: an index or `all`.
    #[arg(long, value_name = "N|all", allow_negative_numbers = true)]
    vcpu: Option<VcpuChoice>,
    /// Only these stats, KVM's and the VMM's own: names, `*` for any run of
    /// characters, e.g. pages_4k,exits,readiness_*.
    #[arg(long, value_name = "NAMES", value_delimiter = ',', value_parser = stat_pattern)]
    names: Option<Vec<String>>,
    /// Print QMP-like JSON (`{"return": [...]}`, as `query-stats`); as in
    /// the table, a VMM's readiness_*/prediction_* figures are left out
    /// until it has measured readiness (zeros would read as figures).
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct WatchArgs {
    /// The VMM's control socket.
    #[arg(long, value_name = "PATH")]
    socket: PathBuf,
    /// Time between refreshes, e.g. 500ms or 2s.
    #[arg(long, default_value = "1s")]
    interval: Period,
    /// The stats to show: names, `*` for any run of characters (default:
    /// the mapped pages, the shadow MMU's flushes, zaps and PTE writes, the
    /// exits, the faults and instruction emulation: pages_4k, pages_2m,
    /// pages_1g, remote_tlb_flush, mmu_shadow_zapped, mmu_pte_write, exits,
    /// io_exits, mmio_exits, halt_exits, irq_exits, signal_exits, pf_taken,
    /// pf_fixed, pf_emulate, insn_emulation).
    #[arg(long, value_name = "NAMES", value_delimiter = ',', value_parser = stat_pattern)]
    names: Option<Vec<String>>,
    /// Stop after N refreshes (at least 1).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    count: Option<u64>,
    /// The VM's stats (with neither --vm nor --vcpu: the VM and every vCPU).
    #[arg(long)]
    vm: bool,
    /// A vCPU's stats: an index or `all`.
    #[arg(long, value_name = "N|all", allow_negative_numbers = true)]
    vcpu: Option<VcpuChoice>,
}

#[derive(clap::Args)]
struct CtlArgs {
    /// The VMM's control socket.
    #[arg(long, value_name = "PATH")]
    socket: PathBuf,
    /// The request, e.g. '{"execute":"query-vm"}' (docs/PROTOCOL.md); several
    /// in one line (`{...} {...}`) get a reply each, in order.
    request: String,
}

#[derive(clap::Args)]
struct DemoArgs {
    /// Guest RAM (K, M, G, T and KiB..TiB are binary; KB, MB, GB, TB decimal).
    #[arg(long, default_value = "256M", value_parser = guest_memory)]
    memory: Size,
    /// Back guest RAM with transparent huge pages.
    #[arg(long)]
    hugepages: bool,
    /// Bytes each memory phase touches (same units as --memory).
    #[arg(long, value_name = "SIZE", default_value = "4M")]
    phase_size: Size,
}

#[cfg(feature = "plot")]
#[derive(clap::Args)]
struct PlotArgs {
    /// The series: JSON lines, or CSV if the name ends in .csv.
    file: PathBuf,
    /// The image to write; its extension picks the format: .svg or .png.
    #[arg(short, long, value_name = "OUT")]
    output: PathBuf,
    /// Chart title (default: the VM's name and the series' file name; a CSV
    /// series, which has no name, the file name).
    #[arg(long)]
    title: Option<String>,
    /// Width in pixels, 480 to 10000.
    #[arg(
        long,
        default_value_t = kvmscope::plot::DEFAULT_WIDTH,
        value_parser = clap::value_parser!(u32).range(
            i64::from(kvmscope::plot::MIN_WIDTH)..=i64::from(kvmscope::plot::MAX_SIDE)
        )
    )]
    width: u32,
    /// Height in pixels, 300 to 10000.
    #[arg(
        long,
        default_value_t = kvmscope::plot::DEFAULT_HEIGHT,
        value_parser = clap::value_parser!(u32).range(
            i64::from(kvmscope::plot::MIN_HEIGHT)..=i64::from(kvmscope::plot::MAX_SIDE)
        )
    )]
    height: u32,
    /// Draw only this vCPU's exit rates, progress and phases.
    #[arg(long, value_name = "N")]
    vcpu: Option<usize>,
    /// Scale of the exit-rate and progress axes.
    #[arg(long, value_enum, default_value_t)]
    rates: kvmscope::plot::RateScale,
}

#[derive(clap::Args)]
struct RunArgs {
    /// Guest RAM (a multiple of 2M, from 16M to 65534M, i.e. 64G less 2M),
    /// e.g. 512M or 2G. K, M, G, T and KiB, MiB, GiB, TiB are binary (1G = 2^30
    /// bytes); KB, MB, GB, TB are decimal (1GB = 10^9 bytes) [default: 256M;
    /// with --incoming, the stream's; given with --vcpus, the VM is built,
    /// and --socket served, before the stream arrives, which must then
    /// match].
    #[arg(long, value_parser = guest_memory)]
    memory: Option<Size>,
    /// Number of vCPUs, 1 to 256, one thread each [default: 1; with --incoming, the
    /// stream's; given with --memory, the VM is built, and --socket served,
    /// before the stream arrives].
    #[arg(long, value_name = "N", value_parser = vcpu_count, allow_negative_numbers = true)]
    vcpus: Option<usize>,
    /// Back guest RAM with transparent huge pages (MADV_HUGEPAGE).
    #[arg(long)]
    hugepages: bool,
    /// KVM dirty-page tracking on guest RAM, for `readiness`: `bitmap`
    /// (KVM_GET_DIRTY_LOG) or `ring[:ENTRIES]` (per-vCPU dirty ring; ENTRIES a
    /// power of two from 256 to 65536, default 65536, 1 MiB per vCPU: a
    /// smaller ring fills and is reset more often, and each reset makes the
    /// guest fault on its pages again).
    #[arg(long, value_name = "MODE")]
    dirty_log: Option<DirtyLog>,
    /// Boot this ELF instead of the built-in guest (it must follow docs/GUEST_ABI.md).
    #[arg(long, value_name = "PATH")]
    guest: Option<PathBuf>,
    /// A workload: `[TARGET:] COMMAND (; COMMAND)*`, e.g. "touch size=64M; dirty rate=2000/s for=5s"
    /// or "all: exits count=100". Repeatable. TARGET is all, N, N-M or N,M (default 0).
    /// Without any, vCPU 0 runs the demo workload; with --socket or
    /// --incoming, nothing runs until a client asks (`guest-command`).
    #[arg(long, value_name = "SPEC", value_parser = parse_workload)]
    workload: Vec<Workload>,
    /// Serve the control socket at PATH (see docs/PROTOCOL.md); the VM then runs
    /// until a client sends `quit` or the process gets SIGINT/SIGTERM (once it is
    /// up, one line on stderr says where it is served). Put it in
    /// /run/kvmscope/ (e.g. /run/kvmscope/NAME.sock) for `kvmscope exporter` to
    /// find it without configuration.
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Sampler tick: a duration from 1ms up, e.g. 100ms or 1s; `off` runs no sampler.
    #[arg(
        long,
        default_value = "100ms",
        value_name = "DUR",
        allow_hyphen_values = true
    )]
    sample_interval: Interval,
    /// Points the sampler keeps in memory (its ring buffer), 2 to 1000000;
    /// older ones are dropped.
    #[arg(long, default_value = "4096", value_name = "N")]
    sample_buffer: Count<2, { kvmscope::sampler::MAX_CAPACITY }>,
    /// Write every sample to FILE as it is taken: CSV for a name ending in
    /// .csv, JSON lines for .jsonl, .json or .ndjson (other names are
    /// refused). Flushed each tick. FILE appears (or
    /// is replaced) only once start-up has passed, written until then as
    /// .FILE.PID.XXXXXX.tmp beside it (such files of processes that are gone are
    /// removed); an existing FILE that is not a kvmscope samples file is
    /// refused unless --force is given.
    #[arg(long, value_name = "FILE", value_parser = samples_file)]
    samples_out: Option<PathBuf>,
    /// Let --samples-out replace an existing file that is not a samples file.
    #[arg(long, requires = "samples_out")]
    force: bool,
    /// Serve the sampler's readings as Prometheus text at http://ADDR/metrics,
    /// e.g. 127.0.0.1:9100. The VM then stays up after its workloads, for the
    /// scrapers, until SIGINT/SIGTERM (or `quit` on --socket), as with --socket.
    #[arg(long, value_name = "ADDR", value_parser = listen_addr)]
    metrics_addr: Option<std::net::SocketAddr>,
    /// Stop with exit status 5, printing each vCPU's registers, when a vCPU's
    /// guest has not checked in (its first port write) after running this
    /// long (its thread's time on a host CPU, so that a host busy starting
    /// many VMs does not make a slow start late), or after six times this
    /// long by the wall clock, whatever it ran (a guest that halts before
    /// checking in, or where the thread's time cannot be read); a pause
    /// restarts both clocks; `off` waits for ever.
    #[arg(
        long,
        default_value = "5s",
        value_name = "DUR",
        allow_hyphen_values = true
    )]
    boot_timeout: Limit,
    /// Be a migration destination: wait for one stream at unix:PATH or
    /// tcp:HOST:PORT, load it and run the guest on. Memory, vCPUs, huge pages
    /// and dirty tracking come from the stream; any given must match it.
    #[arg(long, value_name = "URI", conflicts_with_all = ["workload", "guest"])]
    incoming: Option<kvmscope::migration::Uri>,
    /// With --incoming: fail the migration (exit status 1) when the source,
    /// once it has sent its stream header, sends nothing for this long. Every
    /// peer has 5s for its header and the source 5s more for its config;
    /// SIGINT/SIGTERM or `quit` stop an incoming migration at any point.
    /// Default 30s.
    #[arg(
        long,
        value_name = "DUR",
        allow_hyphen_values = true,
        requires = "incoming"
    )]
    incoming_idle_timeout: Option<Period>,
    /// Measure migration readiness every DUR (90s when given no value): a
    /// dirty-rate window of --readiness-window, the mapped-pages estimate and
    /// the prediction for the migration parameters, published in the VMM's
    /// own stats (provider kvmscope) where `kvmscope exporter` shows them with
    /// no request. The guest pays for dirty tracking during the windows only:
    /// a guest writing as fast as it can loses about the window's length of
    /// its work each time with a small ring (ring:4096), about one fault per
    /// page it writes with the default ring or the bitmap (by default 0.5 s
    /// every 90 s: 0.03-0.15 % measured, 0.55-0.7 % with ring:4096;
    /// docs/BENCHMARKS.md). The first a second after start, then every DUR
    /// (each start within the control thread's sweep, at most a second late).
    /// Needs --socket and --dirty-log.
    #[arg(
        long,
        value_name = "DUR",
        num_args = 0..=1,
        default_missing_value = "90s",
        requires_all = ["socket", "dirty_log"]
    )]
    readiness_every: Option<Period>,
    /// The dirty-rate window of each --readiness-every measurement (shorter
    /// than the period).
    #[arg(
        long,
        default_value = "500ms",
        value_name = "DUR",
        allow_hyphen_values = true,
        requires = "readiness_every"
    )]
    readiness_window: Period,
    /// The VM's name, shown by `query-name`, in the greeting, on metrics and in
    /// JSON-lines samples files (a CSV file has only its columns) (default:
    /// the --socket file's name without extension, else kvmscope-PID); not
    /// empty. With --incoming, give the source's: the stream does not carry it.
    #[arg(long, value_name = "NAME", value_parser = non_empty_name)]
    name: Option<String>,
    /// What one write-protection fault for dirty logging costs the guest on
    /// this host (e.g. 2.6us; at most 1s), for the guest stall the VMM
    /// reports (`guest_stall`, `x-guest-stall`). By default a VMM that serves
    /// a socket or metrics measures it once at start (a destination: once
    /// its migration has loaded), on a 128 MiB VM of its own (about 0.25 s
    /// of one CPU; 2.6 us until then). Give it to skip that.
    #[arg(long, value_name = "DUR", allow_hyphen_values = true, value_parser = fault_cost)]
    fault_cost: Option<Period>,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

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

/// A `--names` entry: a stat name, `*` for any run of characters.
fn stat_pattern(text: &str) -> Result<String, String> {
    kvm_stats::NameFilter::patterns(vec![text.to_string()])
        .map(|_| text.to_string())
        .map_err(|e| e.to_string())
}

/// Guest RAM (`run`, `demo`): a size the guest ABI takes (at least its
/// minimum, whole 2 MiB pages, at most what its page tables cover), so that
/// a missing unit (`--memory 64`: 64 bytes) is a command-line error.
fn guest_memory(text: &str) -> Result<Size, String> {
    use kvmscope::memory::{check_size, Error};
    let size: Size = text
        .parse()
        .map_err(|e: kvmscope::units::UnitError| e.to_string())?;
    match check_size(size.0) {
        Ok(()) => Ok(size),
        Err(e @ Error::TooSmall { .. }) => Err(format!("{e} (a unit: 64M, 1G)")),
        Err(e) => Err(e.to_string()),
    }
}

/// An address to serve HTTP on: an IP address and a port (no name is
/// looked up: which of a name's addresses to bind would be a guess).
fn listen_addr(text: &str) -> Result<std::net::SocketAddr, String> {
    text.parse().map_err(|_| {
        format!("'{text}' is not an IP address and port: use e.g. 127.0.0.1:9100, 0.0.0.0:9100 or [::1]:9100 (host names such as localhost are not looked up)")
    })
}

/// A duration flag's value, parsed as `T` (a `Period`, a `Span`), of at
/// most `most` (its duration given by `of`); `why` says what the bound is.
fn duration_at_most<T: std::str::FromStr<Err = kvmscope::units::UnitError>>(
    text: &str,
    most: Duration,
    of: fn(&T) -> Duration,
    why: &str,
) -> Result<T, String> {
    let value: T = text
        .parse()
        .map_err(|e: kvmscope::units::UnitError| e.to_string())?;
    if of(&value) > most {
        return Err(format!("'{text}' is more than {why}"));
    }
    Ok(value)
}

/// `run --fault-cost`: a duration of at most a second.
fn fault_cost(text: &str) -> Result<Period, String> {
    duration_at_most(
        text,
        Duration::from_secs(1),
        |p: &Period| p.0,
        "1s (a write fault costs microseconds)",
    )
}

/// `run --samples-out`: a name whose extension says the format.
fn samples_file(text: &str) -> Result<PathBuf, String> {
    let path = PathBuf::from(text);
    kvmscope::sampler::export::check_extension(&path).map_err(|e| e.to_string())?;
    Ok(path)
}

/// `readiness --calc-time`: a window of at most 10 minutes, as the VMM
/// takes it (`query-readiness`' `calc-time`), refused here rather than by
/// the VMM.
fn calc_time(text: &str) -> Result<Span, String> {
    use kvmscope::protocol::request::MAX_SECONDS;
    duration_at_most(
        text,
        Duration::from_secs_f64(MAX_SECONDS),
        |s: &Span| s.0,
        &format!("{}m, the longest window", MAX_SECONDS / 60.0),
    )
}

/// `--max-downtime` (`readiness`, `migrate`): at most `downtime-limit`'s
/// most, refused here rather than by the VMM.
fn max_downtime(text: &str) -> Result<Period, String> {
    let most = kvmscope::protocol::MAX_DOWNTIME_LIMIT_MS;
    duration_at_most(
        text,
        Duration::from_millis(most),
        |p: &Period| p.0,
        &format!("{}s, the longest downtime-limit (QEMU's)", most / 1000),
    )
}

/// `readiness --bandwidth`: at most what `query-readiness` takes (1e13
/// B/s), refused here rather than by the VMM.
fn readiness_bandwidth(text: &str) -> Result<Bandwidth, String> {
    let b: Bandwidth = text
        .parse()
        .map_err(|e: kvmscope::units::UnitError| e.to_string())?;
    use kvmscope::protocol::request::MAX_BANDWIDTH;
    if b.0 > MAX_BANDWIDTH {
        return Err(format!(
            "'{text}' is more than 80Tbit ({MAX_BANDWIDTH:e} B/s), the fastest link a prediction takes"
        ));
    }
    Ok(b)
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

/// `--vcpus`: from 1 to the guest ABI's most (KVM's own limit, which may be
/// lower, is checked when the VM is made).
fn vcpu_count(text: &str) -> Result<usize, String> {
    let most = kvmscope::abi::MAX_VCPUS;
    match text.parse::<i128>() {
        Ok(n) if (1..=i128::from(most)).contains(&n) => {
            usize::try_from(n).map_err(|e| e.to_string())
        }
        Ok(_) => Err(format!("a VM has from 1 to {most} vCPUs")),
        Err(e) => Err(format!("not a number of vCPUs: {e}")),
    }
}

/// `--name`: a VM's name labels its metrics and answers `query-name`; an
/// empty one would label it `vm=""`.
fn non_empty_name(text: &str) -> Result<String, String> {
    if text.trim().is_empty() {
        Err("a VM's name cannot be empty (leave --name out for the default)".into())
    } else {
        Ok(text.to_string())
    }
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
    // clap's `requires` lets it through beside --workload, which --incoming
    // conflicts with: said here, as clap would.
    if args.incoming_idle_timeout.is_some() && args.incoming.is_none() {
        usage_error(
            "run",
            "the argument '--incoming-idle-timeout <DUR>' requires '--incoming <URI>'",
        );
    }
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
        sampler: match (args.sample_interval.0, args.samples_out) {
            (Some(interval), out) => Some(SamplerConfig {
                interval,
                capacity: args.sample_buffer.0,
                out: out.map(|path| Destination {
                    path,
                    force: args.force,
                }),
            }),
            (None, Some(_)) => usage_error(
                "run",
                "--samples-out needs the sampler: drop --sample-interval off",
            ),
            (None, None) => None,
        },
        metrics_addr: args.metrics_addr,
        boot_timeout: args.boot_timeout.0,
        name: args.name,
        control_limits: kvmscope::control::Limits::default(),
        readiness_every: match args.readiness_every {
            Some(every) if args.readiness_window.0 >= every.0 => usage_error(
                "run",
                format!(
                    "--readiness-window ({:?}) must be shorter than --readiness-every ({:?})",
                    args.readiness_window.0, every.0
                ),
            ),
            Some(every) => Some(kvmscope::control::Periodic {
                period: every.0,
                window: args.readiness_window.0,
            }),
            None => None,
        },
        fault_cost: args.fault_cost.map(|c| c.0),
        announce: true,
    };
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
    let text = if args.json {
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
    if let Some(late) = &summary.boot_timeout {
        kvmscope::say!("kvmscope: {}", late.describe());
        return Ok(ExitCode::from(5));
    }
    if let Some(failure) = summary.failure() {
        kvmscope::say!("kvmscope: the guest failed: {failure}");
        return Ok(ExitCode::from(2));
    }
    if !summary.stuck.is_empty() {
        kvmscope::say!(
            "kvmscope: vCPUs {:?} did not stop within a second",
            summary.stuck
        );
        return Ok(ExitCode::from(3));
    }
    if !summary.warnings.is_empty() {
        for w in &summary.warnings {
            kvmscope::say!("kvmscope: {w}");
        }
        return Ok(ExitCode::from(4));
    }
    Ok(ExitCode::SUCCESS)
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

/// Buffers of 1 MiB and more (pages of samples queued for clients, replies
/// being built) get mappings of their own, unmapped when freed: the memory a
/// crowd of clients made the VMM take goes back when they go. glibc's default
/// threshold rises after the first such buffer is freed, after which they come
/// from the heap, which keeps them (measured: 81 MB resident 2 s after 60
/// unread pages were dropped, against 46 MB with this; docs/BENCHMARKS.md).
fn give_large_buffers_back() {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: mallopt only sets an allocator tunable; called before any
        // thread of ours exists; an error (0) leaves glibc's default in force.
        let set = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20) };
        if set == 0 {
            log::debug!("mallopt(M_MMAP_THRESHOLD) refused; large buffers stay on the heap");
        }
    }
}

/// Standard output for the client commands: a reader that went away (`stats
/// | head -1`) ends the command quietly with status 0, as it ends other Unix
/// tools, instead of an error that would blame the VMM (`talking to the VMM:
/// Broken pipe`). The VMM and the exporter never write here.
struct Stdout {
    out: std::io::StdoutLock<'static>,
    /// What a reader that went away does: end the command (status 0), or,
    /// for `migrate`, whose status is the migration's, leave the rest of its
    /// output unwritten and let it follow the migration to its end.
    on_gone: OnGone,
    gone: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum OnGone {
    Exit,
    Discard,
}

impl Stdout {
    fn lock() -> Stdout {
        Stdout::with(OnGone::Exit)
    }

    fn with(on_gone: OnGone) -> Stdout {
        Stdout {
            out: std::io::stdout().lock(),
            on_gone,
            gone: false,
        }
    }

    /// A write's error: passed on, unless it says the reader went away.
    fn gone(&mut self, e: std::io::Error, len: usize) -> std::io::Result<usize> {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            return Err(e);
        }
        match self.on_gone {
            OnGone::Exit => std::process::exit(0),
            OnGone::Discard => {
                self.gone = true;
                Ok(len)
            }
        }
    }
}

impl std::io::Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.gone {
            return Ok(buf.len());
        }
        match self.out.write(buf) {
            Ok(n) => Ok(n),
            Err(e) => self.gone(e, buf.len()),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.gone {
            return Ok(());
        }
        match self.out.flush() {
            Ok(()) => Ok(()),
            Err(e) => self.gone(e, 0).map(drop),
        }
    }
}

fn main() -> ExitCode {
    let process_start = Instant::now();
    let cli = Cli::parse();
    if let Cmd::Run(_) | Cmd::Exporter(_) | Cmd::Migrate(_) = cli.command {
        // Before any thread exists. Other clients keep the default actions
        // (Ctrl-C ends them); `migrate` says what one does at each stage
        // (`MigrateConfig::stop`).
        if let Err(e) = kvmscope::signals::take_termination() {
            kvmscope::say!("kvmscope: taking SIGINT/SIGTERM: {e}");
            return ExitCode::from(1);
        }
    }
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    if let Cmd::Run(_) | Cmd::Exporter(_) = cli.command {
        give_large_buffers_back();
    }
    let result = match cli.command {
        Cmd::Run(args) => run_command(args, process_start),
        Cmd::Stats(a) => {
            let config = StatsConfig {
                socket: a.socket,
                vm: a.vm,
                vcpus: a.vcpu.map(vcpu_selector),
                names: a.names,
                json: a.json,
            };
            client::stats::run(&config, &mut Stdout::lock())
                .map(|()| ExitCode::SUCCESS)
                .map_err(anyhow::Error::from)
        }
        Cmd::Watch(a) => {
            let clear = std::io::stdout().is_terminal();
            let config = WatchConfig {
                socket: a.socket,
                interval: a.interval.0,
                names: a.names,
                count: a.count,
                vm: a.vm,
                vcpus: a.vcpu.map(vcpu_selector),
                clear,
            };
            client::watch::run(&config, &mut Stdout::lock())
                .map(|()| ExitCode::SUCCESS)
                .map_err(anyhow::Error::from)
        }
        Cmd::Ctl(a) => match client::ctl(&a.socket, &a.request, &mut Stdout::lock()) {
            Ok(true) => Ok(ExitCode::SUCCESS),
            Ok(false) => Ok(ExitCode::from(1)),
            Err(e) => Err(e.into()),
        },
        Cmd::Demo(a) => demo_command(a),
        #[cfg(feature = "plot")]
        Cmd::Plot(a) => plot_command(a),
        Cmd::Migrate(a) => {
            let config = client::migrate::MigrateConfig {
                socket: a.socket,
                to: a.to.to_string(),
                // A command line says the whole migration: what it leaves
                // out is its default, not what the VMM kept from before.
                bandwidth: Some(
                    a.bandwidth
                        .map_or(0, |b| kvmscope::units::saturating_u64(b.0)),
                ),
                max_downtime: Some(
                    a.max_downtime
                        .map_or(client::migrate::DEFAULT_MAX_DOWNTIME, |d| d.0),
                ),
                max_rounds: Some(a.max_rounds.unwrap_or(0)),
                predict: a.predict,
                converge: a.converge.map(|c| match c {
                    ConvergeArg::Auto => client::migrate::Converge::Auto,
                    ConvergeArg::AutoConverge => client::migrate::Converge::AutoConverge,
                    ConvergeArg::DirtyLimit => client::migrate::Converge::DirtyLimit,
                    ConvergeArg::Off => client::migrate::Converge::Off,
                }),
                json: a.json,
                stop: Some(client::migrate::Stop {
                    pending: kvmscope::signals::pending_termination,
                    exit_on_next: kvmscope::signals::exit_on_signal,
                    exit_on_second: kvmscope::signals::exit_on_second_signal,
                }),
            };
            // The migration goes on in the VMM whether or not anybody reads
            // its report: the status stays the migration's.
            match client::migrate::migrate(&config, &mut Stdout::with(OnGone::Discard)) {
                Ok(true) => Ok(ExitCode::SUCCESS),
                Ok(false) => Ok(ExitCode::from(1)),
                Err(e) => Err(e.into()),
            }
        }
        Cmd::Exporter(a) => exporter_command(a),
        Cmd::Readiness(a) => {
            let config = client::readiness::ReadinessConfig {
                socket: a.socket,
                scan: a.scan,
                calc_time: a.calc_time.map(|s| s.0),
                bandwidth: a.bandwidth.map(|b| b.0),
                max_downtime: a.max_downtime.map(|d| d.0),
                json: a.json,
            };
            client::readiness::readiness(&config, &mut Stdout::lock())
                .map(|()| ExitCode::SUCCESS)
                .map_err(anyhow::Error::from)
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            kvmscope::say!("kvmscope: {e:#}");
            ExitCode::FAILURE
        }
    }
}
