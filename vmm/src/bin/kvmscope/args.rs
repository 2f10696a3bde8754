//! The flags of every `kvmscope` subcommand, with their help (`--help`
//! shows these doc comments), as clap reads them.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use kvmscope::units::{
    Bandwidth, Count, DirtyLog, Interval, Limit, Period, Size, Span, VcpuChoice,
};
use kvmscope::workload::{parse_workload, Workload};

use crate::values::{
    calc_time, fault_cost, guest_memory, listen_addr, max_downtime, non_empty_name,
    readiness_bandwidth, refresh_count, samples_file, stat_pattern, vcpu_count,
};

#[derive(Parser)]
#[command(
    name = "kvmscope",
    version = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("KVMSCOPE_COMMIT"), ")"),
    about = "A tiny VMM that shows KVM's binary statistics end to end"
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Cmd,
}

#[derive(Subcommand)]
pub(crate) enum Cmd {
    /// Boot the built-in guest, run workloads, and print a summary per vCPU.
    #[command(after_help = RUN_EXIT_STATUS)]
    #[command(allow_negative_numbers = true)]
    Run(RunArgs),
    /// Receive stats fds from a running VMM's socket and print the stats read through them.
    #[command(allow_negative_numbers = true)]
    Stats(StatsArgs),
    /// A live view of stats and their rates, read through fds received once
    /// (and the VMM sampler's newest point, asked for at each refresh). Ends
    /// with exit status 1 when the VMM exits (the fds would still read, but
    /// nothing moves them), or after --count refreshes.
    #[command(allow_negative_numbers = true)]
    Watch(WatchArgs),
    /// Send one raw JSON request to a VMM's socket and print the reply, one
    /// JSON line each. It negotiates first (qmp_capabilities is not to be
    /// sent); event lines that come before a reply (STOP,
    /// READINESS_PROGRESS...) are printed too, each on its own line. Waits
    /// as long as the command does (a guest-command with wait on a paused
    /// guest waits for its resume; Ctrl-C ends it). Exit status 0 when every
    /// reply is a success, 1 when one is an error or the VMM cannot be
    /// reached.
    #[command(allow_negative_numbers = true)]
    Ctl(CtlArgs),
    /// The whole story: start a VMM with a socket, drive the guest through it,
    /// and show how the stats move, read through fds received from it.
    #[command(allow_negative_numbers = true)]
    Demo(DemoArgs),
    /// Draw a series from `run --samples-out` (mapped memory, exit rates,
    /// phases; when the series has them, the guest's own progress per second
    /// and each vCPU's time lost to dirty tracking and to throttles) as SVG
    /// or PNG.
    #[cfg(feature = "plot")]
    #[command(allow_negative_numbers = true)]
    Plot(PlotArgs),
    /// Ask a running VMM whether its guest is ready to live-migrate: non-zero
    /// RAM estimates, dirty rate, and a pre-copy prediction (docs/READINESS.md).
    #[command(allow_negative_numbers = true)]
    Readiness(ReadinessArgs),
    /// Live-migrate a running VMM's guest to a `kvmscope run --incoming URI`,
    /// with a progress bar (on a terminal; else a line per pass on stderr)
    /// and a report like QEMU's `info migrate`. Ctrl-C
    /// (SIGINT), SIGTERM or SIGHUP cancels the migration (the guest runs on at the
    /// source) and reports it, except during the stop (status `device`),
    /// when it is too late; a second one ends the client at once. Before the
    /// migration starts, one ends the client. Exit status 0 only when it
    /// completed.
    #[command(allow_negative_numbers = true)]
    Migrate(MigrateArgs),
    /// One telemetry agent per host: every VM's KVM stats on one Prometheus
    /// page, read through stats fds taken once from each VMM's control socket
    /// (one pread per KVM stats fd per scrape, the VMMs' own stats files
    /// mapped; no request to any VMM, no vCPU kicked).
    /// Runs until SIGINT/SIGTERM/SIGHUP. See docs/EXPORTER.md.
    #[command(allow_negative_numbers = true)]
    Exporter(ExporterArgs),
}

#[derive(clap::Args)]
pub(crate) struct ExporterArgs {
    /// Where to serve the page, at http://ADDR/metrics.
    #[arg(long, default_value = "127.0.0.1:9187", value_name = "ADDR", value_parser = listen_addr)]
    pub(crate) listen: std::net::SocketAddr,
    /// A directory of VMs' control sockets: every socket in it is read, and VMs
    /// that appear or go are picked up within a second (inotify). Repeatable.
    /// Better keep `run --incoming` sockets elsewhere (a source connecting
    /// while the exporter tries one waits up to --attach-timeout). Without
    /// it, --socket and --qmp-socket: /run/kvmscope, where `run --socket`'s
    /// help suggests VMs put theirs.
    #[arg(long = "vm-sockets", value_name = "DIR")]
    pub(crate) dirs: Vec<PathBuf>,
    /// One VM's control socket, read as long as it answers. Repeatable.
    #[arg(long = "socket", value_name = "PATH")]
    pub(crate) sockets: Vec<PathBuf>,
    /// Only these stats, KVM's and the VMMs' own (names, `*` for any run of
    /// characters, e.g. `pages_*,exits,halt_*,prediction_*`); one that matches
    /// no stat of the first VMs read is said once in the log. The exporter's
    /// own metrics are always there.
    #[arg(long, value_name = "NAMES", value_delimiter = ',', value_parser = stat_pattern)]
    pub(crate) stats: Vec<String>,
    /// Longest time to attach to one VMM (connect, greeting, fds); a VMM that
    /// does not answer in time is skipped and tried again 5 s later.
    #[arg(
        long,
        default_value = "2s",
        value_name = "DUR",
        allow_hyphen_values = true
    )]
    pub(crate) attach_timeout: Period,
    /// A QEMU VM's QMP monitor (`-qmp unix:PATH,server=on,wait=off`), read
    /// with `query-stats`: unmodified QEMU holds no stats fd to hand out.
    /// Repeatable. A monitor serves one client at a time: give QEMU a second
    /// `-qmp` for the exporter where libvirt holds the first.
    #[arg(long = "qmp-socket", value_name = "PATH")]
    pub(crate) qmp_sockets: Vec<PathBuf>,
    /// How often each QEMU VM's figures are refreshed (the page shows their age).
    #[arg(
        long,
        default_value = "5s",
        value_name = "DUR",
        allow_hyphen_values = true
    )]
    pub(crate) qmp_interval: Period,
    /// Also read QEMU's vCPU stats. With QEMU before 8.1 each refresh then
    /// kicks every vCPU of the VM out of the guest (it reads vCPU stats on the
    /// vCPU threads); 8.1 and later read them with `pread`, no kick.
    #[arg(long)]
    pub(crate) qmp_vcpus: bool,
    /// Also show the VMMs' own exit counters per vCPU
    /// (`kvmscope_vmm_vcpu_exits_<reason>_total`, twelve lines per vCPU).
    /// Without it they are summed per VM
    /// (`kvmscope_vmm_vm_exits_<reason>_total`, twelve lines per VM); either
    /// way only where `--stats`, if given, takes `exits_*`.
    #[arg(long)]
    pub(crate) vcpu_exits: bool,
}

#[derive(clap::Args)]
pub(crate) struct MigrateArgs {
    /// The source VMM's control socket.
    #[arg(long, value_name = "PATH")]
    pub(crate) socket: PathBuf,
    /// Where the destination listens: unix:PATH or tcp:HOST:PORT.
    #[arg(long, value_name = "URI")]
    pub(crate) to: kvmscope::migration::Uri,
    /// Cap the send rate (`max-bandwidth`), e.g. 1Gbit or 100MiB/s; 0bit or
    /// default: unlimited. Each of these three is set for every migrate, to
    /// its default when not given, whatever an earlier migrate or
    /// `migrate-set-parameters` left in the VMM.
    #[arg(long, value_name = "RATE", allow_hyphen_values = true)]
    pub(crate) bandwidth: Option<Bandwidth>,
    /// Longest acceptable downtime (`downtime-limit`); default 300ms, at
    /// most 2000s (QEMU's limit).
    #[arg(long, value_name = "DUR", allow_hyphen_values = true, value_parser = max_downtime)]
    pub(crate) max_downtime: Option<Period>,
    /// Stop and copy after N passes whatever is left (`x-max-rounds`); 0 or
    /// default: no limit.
    #[arg(long, value_name = "N")]
    pub(crate) max_rounds: Option<u64>,
    /// Ask the VMM for its readiness prediction first (exact scan, the VMM's
    /// dirty-rate window), print it, and end with predicted vs actual per field.
    #[arg(long)]
    pub(crate) predict: bool,
    /// Make a migration that would not converge converge: `auto` asks the
    /// VMM's readiness model what is needed and sets it from the start (nothing
    /// when it converges as it is): on a `--dirty-log ring` VM the dirty
    /// limit that converges at the least vCPU time taken from the guest, set
    /// on the vCPUs that dirty faster than it only (x-vcpu-dirty-limit-vcpus;
    /// the others get no limit), otherwise the smallest
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
    pub(crate) converge: Option<ConvergeArg>,
    /// Print the final `query-migrate` as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `kvmscope migrate --converge`.
#[derive(Clone, Copy, clap::ValueEnum)]
pub(crate) enum ConvergeArg {
    Auto,
    AutoConverge,
    DirtyLimit,
    Off,
}

/// The exit codes of `kvmscope run` (also in the README).
pub(crate) const RUN_EXIT_STATUS: &str = "Exit status:
  0  the run ended in order: its workloads finished, a client sent `quit`, or
     SIGINT/SIGTERM/SIGHUP stopped it (an orderly stop on a signal is a success, as
     for QEMU; the summary says `stopped by signal N`, and names a command
     cut short and how many queued ones never started)
  1  start-up failed (bad configuration, KVM, a port, socket or file), or
     an incoming migration failed, went silent or was stopped (SIGINT,
     SIGTERM, SIGHUP or `quit` while the guest is still arriving)
  2  the guest failed (panic, fault, KVM error), or the command line is wrong
  3  vCPUs did not stop within a second of being told to
  4  the run ended, but something besides the guest failed (e.g. --samples-out)
  5  the guest did not check in within --boot-timeout (its registers are printed)
  128+N  a second stop signal N while the first one's orderly stop was under
     way ended the process at once (no summary; its socket file may be left)";

#[derive(clap::Args)]
pub(crate) struct ReadinessArgs {
    /// The VMM's control socket (`kvmscope run --socket PATH`).
    #[arg(long, value_name = "PATH")]
    pub(crate) socket: PathBuf,
    /// Also count zero and non-zero pages exactly (pauses the guest while it reads RAM)
    /// and report each estimate's error.
    #[arg(long)]
    pub(crate) scan: bool,
    /// Window for the dirty rate (needs `run --dirty-log`; default 1s when the
    /// VMM has dirty logging, else none), at most 10m; 0s skips it. Ending
    /// this client (Ctrl-C) ends the window too.
    #[arg(long, value_name = "DUR", allow_hyphen_values = true, value_parser = calc_time)]
    pub(crate) calc_time: Option<Span>,
    /// Link bandwidth for the prediction, e.g. 10Gbit, 1.25GB/s, 800MiB/s: bits
    /// (bit, kbit, Mbit, Gbit, Tbit in any case, or Gbps) or bytes (KiB, MiB,
    /// GiB, TiB binary; KB, MB, GB, TB decimal); a bare 10G is refused as
    /// ambiguous; 0bit is unlimited;
    /// at most 80Tbit (1e13 B/s). Default: the VMM's `max-bandwidth`
    /// (unlimited unless set).
    #[arg(
        long,
        value_name = "RATE",
        value_parser = readiness_bandwidth,
        allow_hyphen_values = true
    )]
    pub(crate) bandwidth: Option<Bandwidth>,
    /// Longest acceptable downtime for the prediction, at most 2000s.
    /// Default: the VMM's `downtime-limit` (300ms unless set).
    #[arg(long, value_name = "DUR", allow_hyphen_values = true, value_parser = max_downtime)]
    pub(crate) max_downtime: Option<Period>,
    /// Print the report as JSON: `query-readiness`'s reply without its
    /// `text` member (the text report is what the command prints without
    /// --json).
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(clap::Args)]
pub(crate) struct StatsArgs {
    /// The VMM's control socket (`kvmscope run --socket PATH`).
    #[arg(long, value_name = "PATH")]
    pub(crate) socket: PathBuf,
    /// The VM's stats (with neither --vm nor --vcpu: the VM and every vCPU).
    #[arg(long)]
    pub(crate) vm: bool,
    /// A vCPU's stats: an index or `all`.
    #[arg(long, value_name = "N|all", allow_negative_numbers = true)]
    pub(crate) vcpu: Option<VcpuChoice>,
    /// Only these stats, KVM's and the VMM's own: names, `*` for any run of
    /// characters, e.g. pages_4k,exits,readiness_*.
    #[arg(long, value_name = "NAMES", value_delimiter = ',', value_parser = stat_pattern)]
    pub(crate) names: Option<Vec<String>>,
    /// Print QMP-like JSON (`{"return": [...]}`, as `query-stats`); as in
    /// the table, a VMM's readiness_*/prediction_* figures are left out
    /// until it has measured readiness (zeros would read as figures).
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(clap::Args)]
pub(crate) struct WatchArgs {
    /// The VMM's control socket.
    #[arg(long, value_name = "PATH")]
    pub(crate) socket: PathBuf,
    /// Time between refreshes, e.g. 500ms or 2s.
    #[arg(long, default_value = "1s")]
    pub(crate) interval: Period,
    /// The stats to show: names, `*` for any run of characters (default:
    /// the mapped pages, the shadow MMU's flushes, zaps and PTE writes, the
    /// exits, the faults and instruction emulation: pages_4k, pages_2m,
    /// pages_1g, remote_tlb_flush, mmu_shadow_zapped, mmu_pte_write, exits,
    /// io_exits, mmio_exits, halt_exits, irq_exits, signal_exits, pf_taken,
    /// pf_fixed, pf_emulate, insn_emulation).
    #[arg(long, value_name = "NAMES", value_delimiter = ',', value_parser = stat_pattern)]
    pub(crate) names: Option<Vec<String>>,
    /// Stop after N refreshes (at least 1).
    #[arg(long, value_name = "N", value_parser = refresh_count)]
    pub(crate) count: Option<u64>,
    /// The VM's stats (with neither --vm nor --vcpu: the VM and every vCPU).
    #[arg(long)]
    pub(crate) vm: bool,
    /// A vCPU's stats: an index or `all`.
    #[arg(long, value_name = "N|all", allow_negative_numbers = true)]
    pub(crate) vcpu: Option<VcpuChoice>,
}

#[derive(clap::Args)]
pub(crate) struct CtlArgs {
    /// The VMM's control socket.
    #[arg(long, value_name = "PATH")]
    pub(crate) socket: PathBuf,
    /// The request, e.g. '{"execute":"query-vm"}' (docs/PROTOCOL.md); several
    /// in one line (`{...} {...}`) get a reply each, in order.
    pub(crate) request: String,
}

#[derive(clap::Args)]
pub(crate) struct DemoArgs {
    /// Guest RAM (K, M, G, T and KiB..TiB are binary; KB, MB, GB, TB decimal).
    #[arg(long, default_value = "256M", value_parser = guest_memory)]
    pub(crate) memory: Size,
    /// Back guest RAM with transparent huge pages.
    #[arg(long)]
    pub(crate) hugepages: bool,
    /// Bytes each memory phase touches (same units as --memory).
    #[arg(long, value_name = "SIZE", default_value = "4M")]
    pub(crate) phase_size: Size,
}

#[cfg(feature = "plot")]
#[derive(clap::Args)]
pub(crate) struct PlotArgs {
    /// The series: JSON lines, or CSV if the name ends in .csv (at most
    /// 1 GiB, about 10 million samples; a larger one is refused).
    pub(crate) file: PathBuf,
    /// The image to write; its extension picks the format: .svg or .png.
    /// An image already there is replaced whole (written beside it, then
    /// renamed over it, keeping its mode), so that a stop or a full disk
    /// leaves the old one.
    #[arg(short, long, value_name = "OUT")]
    pub(crate) output: PathBuf,
    /// Chart title (default: the VM's name and the series' file name; a CSV
    /// series, which has no name, the file name).
    #[arg(long)]
    pub(crate) title: Option<String>,
    /// Width in pixels, 480 to 10000.
    #[arg(
        long,
        default_value_t = kvmscope::plot::DEFAULT_WIDTH,
        value_parser = clap::value_parser!(u32).range(
            i64::from(kvmscope::plot::MIN_WIDTH)..=i64::from(kvmscope::plot::MAX_SIDE)
        )
    )]
    pub(crate) width: u32,
    /// Height in pixels, 300 to 10000.
    #[arg(
        long,
        default_value_t = kvmscope::plot::DEFAULT_HEIGHT,
        value_parser = clap::value_parser!(u32).range(
            i64::from(kvmscope::plot::MIN_HEIGHT)..=i64::from(kvmscope::plot::MAX_SIDE)
        )
    )]
    pub(crate) height: u32,
    /// Draw only this vCPU's exit rates, progress and phases.
    #[arg(long, value_name = "N")]
    pub(crate) vcpu: Option<usize>,
    /// Scale of the exit-rate and progress axes.
    #[arg(long, value_enum, default_value_t)]
    pub(crate) rates: kvmscope::plot::RateScale,
}

#[derive(clap::Args)]
pub(crate) struct RunArgs {
    /// Guest RAM (a multiple of 2M, from 16M to 65534M, i.e. 64G less 2M),
    /// e.g. 512M or 2G. K, M, G, T and KiB, MiB, GiB, TiB are binary (1G = 2^30
    /// bytes); KB, MB, GB, TB are decimal (1GB = 10^9 bytes) [default: 256M;
    /// with --incoming, the stream's; given with --vcpus, the VM is built,
    /// and --socket served, before the stream arrives, which must then
    /// match].
    #[arg(long, value_parser = guest_memory)]
    pub(crate) memory: Option<Size>,
    /// Number of vCPUs, 1 to 256, one thread each [default: 1; with --incoming, the
    /// stream's; given with --memory, the VM is built, and --socket served,
    /// before the stream arrives].
    #[arg(long, value_name = "N", value_parser = vcpu_count, allow_negative_numbers = true)]
    pub(crate) vcpus: Option<usize>,
    /// Back guest RAM with transparent huge pages (MADV_HUGEPAGE). KVM maps
    /// them 2 MiB at a time, except while dirty logging runs, when it maps
    /// 4 KiB pieces: always with --dirty-log bitmap (it logs from boot), only
    /// while observed with a ring or no mode.
    #[arg(long)]
    pub(crate) hugepages: bool,
    /// KVM dirty-page tracking on guest RAM, for `readiness`: `bitmap`
    /// (KVM_GET_DIRTY_LOG) or `ring[:ENTRIES]` (per-vCPU dirty ring; ENTRIES a
    /// power of two from 256 to 65536, default 65536, 1 MiB per vCPU: a
    /// smaller ring fills and is reset more often, and each reset makes the
    /// guest fault on its pages again).
    #[arg(long, value_name = "MODE")]
    pub(crate) dirty_log: Option<DirtyLog>,
    /// Boot this ELF instead of the built-in guest (it must follow docs/GUEST_ABI.md).
    #[arg(long, value_name = "PATH")]
    pub(crate) guest: Option<PathBuf>,
    /// A workload: `[TARGET:] COMMAND (; COMMAND)*`, e.g. "touch size=64M; dirty rate=2000/s for=5s"
    /// or "all: exits count=100". Repeatable. TARGET is all, N, N-M or N,M (default 0).
    /// Without any, vCPU 0 runs the demo workload; with --socket or
    /// --incoming, nothing runs until a client asks (`guest-command`).
    #[arg(long, value_name = "SPEC", value_parser = parse_workload)]
    pub(crate) workload: Vec<Workload>,
    /// Serve the control socket at PATH (see docs/PROTOCOL.md); the VM then runs
    /// until a client sends `quit` or the process gets SIGINT/SIGTERM/SIGHUP (once it is
    /// up, one line on stderr says where it is served). Put it in
    /// /run/kvmscope/ (e.g. /run/kvmscope/NAME.sock) for `kvmscope exporter` to
    /// find it without configuration.
    #[arg(long, value_name = "PATH")]
    pub(crate) socket: Option<PathBuf>,
    /// Sampler tick: a duration from 1ms up, e.g. 100ms or 1s; `off` runs no sampler.
    #[arg(
        long,
        default_value = "100ms",
        value_name = "DUR",
        allow_hyphen_values = true
    )]
    pub(crate) sample_interval: Interval,
    /// Points the sampler keeps in memory (its ring buffer), 2 to 1000000;
    /// older ones are dropped.
    #[arg(long, default_value = "4096", value_name = "N")]
    pub(crate) sample_buffer: Count<2, { kvmscope::sampler::MAX_CAPACITY }>,
    /// Write every sample to FILE as it is taken: CSV for a name ending in
    /// .csv, JSON lines for .jsonl, .json or .ndjson (other names are
    /// refused). Flushed each tick. FILE appears (or
    /// is replaced) only once start-up has passed, written until then as
    /// .FILE.PID.XXXXXX.tmp beside it (such files of processes that are gone are
    /// removed); an existing FILE that is not a kvmscope samples file is
    /// refused unless --force is given.
    #[arg(long, value_name = "FILE", value_parser = samples_file)]
    pub(crate) samples_out: Option<PathBuf>,
    /// Let --samples-out replace an existing file that is not a samples file.
    #[arg(long, requires = "samples_out")]
    pub(crate) force: bool,
    /// Serve the sampler's readings as Prometheus text at http://ADDR/metrics,
    /// e.g. 127.0.0.1:9100. The VM then stays up after its workloads, for the
    /// scrapers, until SIGINT/SIGTERM/SIGHUP (or `quit` on --socket), as with --socket.
    #[arg(long, value_name = "ADDR", value_parser = listen_addr)]
    pub(crate) metrics_addr: Option<std::net::SocketAddr>,
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
    pub(crate) boot_timeout: Limit,
    /// Be a migration destination: wait for one stream at unix:PATH or
    /// tcp:HOST:PORT, load it and run the guest on. Memory, vCPUs, huge pages
    /// and dirty tracking come from the stream; any given must match it.
    #[arg(long, value_name = "URI", conflicts_with_all = ["workload", "guest"])]
    pub(crate) incoming: Option<kvmscope::migration::Uri>,
    /// With --incoming: fail the migration (exit status 1) when the source,
    /// once it has sent its stream header, sends nothing for this long. Every
    /// peer has 5s for its header and the source 5s more for its config;
    /// SIGINT/SIGTERM/SIGHUP or `quit` stop an incoming migration at any point.
    /// Default 30s.
    #[arg(
        long,
        value_name = "DUR",
        allow_hyphen_values = true,
        requires = "incoming"
    )]
    pub(crate) incoming_idle_timeout: Option<Period>,
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
    /// (each start within the control thread's sweep, at most a second late),
    /// while the guest runs: paused or migrated away, none is taken and the
    /// figures keep their age. Needs --socket and --dirty-log.
    #[arg(
        long,
        value_name = "DUR",
        num_args = 0..=1,
        default_missing_value = "90s",
        requires_all = ["socket", "dirty_log"]
    )]
    pub(crate) readiness_every: Option<Period>,
    /// The dirty-rate window of each --readiness-every measurement (shorter
    /// than the period).
    #[arg(
        long,
        default_value = "500ms",
        value_name = "DUR",
        allow_hyphen_values = true,
        requires = "readiness_every"
    )]
    pub(crate) readiness_window: Period,
    /// The VM's name, shown by `query-name`, in the greeting, on metrics and in
    /// JSON-lines samples files (a CSV file has only its columns) (default:
    /// the --socket file's name without extension, else kvmscope-PID); not
    /// empty. With --incoming, give the source's: the stream does not carry it.
    #[arg(long, value_name = "NAME", value_parser = non_empty_name)]
    pub(crate) name: Option<String>,
    /// What one write-protection fault for dirty logging costs the guest on
    /// this host (e.g. 2.6us; at most 1s), for the guest stall the VMM
    /// reports (`guest_stall`, `x-guest-stall`). By default a VMM that serves
    /// a socket or metrics measures it once at start (a destination: once
    /// its migration has loaded), on a 128 MiB VM of its own (about 0.25 s
    /// of one CPU; 2.6 us until then). Give it to skip that.
    #[arg(long, value_name = "DUR", allow_hyphen_values = true, value_parser = fault_cost)]
    pub(crate) fault_cost: Option<Period>,
    /// Print the summary as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}
