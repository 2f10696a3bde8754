//! QEMU VMs as a second provider, read over QMP.
//!
//! Unmodified QEMU keeps no stats fd open, and `KVM_GET_STATS_FD` on a VM or
//! vCPU fd taken from it fails with EIO, so its statistics come from QMP
//! `query-stats`. That is a request to QEMU, so it is not made per scrape: one
//! `exporter-qmp` thread per monitor refreshes the VM's figures every
//! `--qmp-interval` and the page shows the latest, with their age. The `vm`
//! target costs the guest nothing; the `vcpu` target (only with
//! `--qmp-vcpus`) makes QEMU before 8.1 kick every vCPU out of the guest on
//! each refresh (8.1 and later keep each vCPU's stats fd open and `pread` it).
//! The version comes from QEMU's greeting and is on the page. The monitor is
//! read with the crate's one QMP client (`client::Client`), with the bounded,
//! whole-request reading the exporter uses for kvmscope VMMs.
//!
//! QEMU 7.2 returns log2 histogram buckets highest first; they are reversed
//! here into the kernel's order (bucket 0 first), as the fd path reads them.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kvm_stats::{Base, Descriptor, StatType, Unit};

use super::provider::{Figures, Provider};
use super::qemu_reply::{
    AtMost, Cpus, NameInfo, Schemas, Stat, StatKind, StatSchema, StatUnit, StatValue, StatsResult,
    StatsResults, Target, MAX_BUCKETS, MAX_KEPT_BYTES, MAX_STATS, MAX_VALUES, MAX_VCPUS,
};
use crate::client::{self, Bounds, Client};
use crate::lock;
use crate::metrics::{label_value, Source, Values};
use crate::protocol::request::{NoArgs, QueryStatsArgs, SchemasArgs, StatsProvider};
use crate::protocol::{Command, StatsTarget};

/// Longest line taken from a QEMU monitor: QEMU 7.2's `query-stats` is
/// about 2.5 KiB a vCPU, so this holds some 3,000; a longer one fails the
/// read instead of growing a buffer. A line is read into its typed shape
/// (`qemu_reply`), which costs about what it says (a JSON tree took up to
/// some 30 times the line: 64 MiB of `[0,0,...]` took 3.4 GB).
const MAX_LINE: usize = 8 << 20;

/// The longest name and vCPU `qom-path` taken, in characters.
const MAX_TEXT: usize = 256;

/// Why a QEMU monitor could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MonitorError {
    /// Connecting, the greeting, or a transport failure.
    #[error(transparent)]
    Client(#[from] Box<client::Error>),
    /// The monitor accepted and finished no greeting and negotiation in time.
    #[error("it accepted the connection and finished no greeting and capabilities negotiation within {0:?} (QEMU serves one client at a time: another may hold it)")]
    Silent(Duration),
    /// A command's answer failed (the command given).
    #[error("QEMU's answer to {0}")]
    Command(&'static str, #[source] Box<client::Error>),
    /// QEMU answered a command with an error (the command, its class and
    /// words).
    #[error("QEMU refused {0} ({1}): {2}")]
    Refused(&'static str, String, String),
    /// The monitor closed the connection before a command's answer.
    #[error("QEMU closed the connection during {0} (it exited, or dropped this client)")]
    Closed(&'static str),
    /// A command's answer took longer than the whole request's bound.
    #[error("QEMU did not complete its answer to {0} within {1:?} (--attach-timeout)")]
    Slow(&'static str, Duration),
    /// A reply over one of this exporter's bounds, or of the wrong shape
    /// (the command and what is wrong).
    #[error("{0}: {1}")]
    Reply(&'static str, String),
}

/// A stat and its values as QEMU reported them, in the kernel's order.
pub(crate) type Reading = Vec<(Descriptor, Vec<u64>)>;

/// The latest figures of one QEMU VM.
#[derive(Debug, Clone, Default)]
pub(crate) struct QemuVm {
    /// `query-name`, or the socket's file name.
    pub(crate) name: String,
    /// The QEMU process, from the socket's peer credentials (`None` before
    /// the first read).
    pub(crate) pid: Option<u32>,
    /// Its page labels (`vm`, `pid`, `socket`), made when those are learnt.
    pub(crate) labels: String,
    /// VM stats (shared with the scrapes that show them: a scrape takes a
    /// copy of every VM's figures, and a copy of readings of up to 262,144
    /// values each was megabytes per scrape).
    pub(crate) vm: Arc<Reading>,
    /// Each vCPU's stats (with `--qmp-vcpus`): its index (`query-cpus-fast`'s
    /// `cpu-index`) and `qom-path`, in index order.
    pub(crate) vcpus: Arc<Vec<(usize, String, Reading)>>,
    /// When they were read; `None` before the first read.
    pub(crate) at: Option<Instant>,
    /// Why the last attempt failed, if it did.
    pub(crate) error: Option<Arc<MonitorError>>,
    /// QEMU's version from its greeting (major, minor, micro).
    pub(crate) version: (u64, u64, u64),
}

impl QemuVm {
    /// Whether reading its vCPU stats kicks every vCPU out of the guest:
    /// QEMU before 8.1 reads them on the vCPU threads.
    pub(crate) fn vcpu_query_kicks(&self) -> bool {
        self.version < (8, 1, 0)
    }
}

/// One refresh of a QEMU VM.
struct QemuReading {
    name: String,
    pid: Option<u32>,
    version: (u64, u64, u64),
    vm: Reading,
    vcpus: Vec<(usize, String, Reading)>,
}

/// The refreshing threads; dropping this stops them.
pub(crate) struct Pollers {
    stop: Arc<Mutex<bool>>,
    threads: Vec<JoinHandle<()>>,
}

impl Drop for Pollers {
    /// Tells the threads to stop, without waiting for them: one may be in a
    /// request to a monitor that answers slowly (each command has the
    /// attach timeout), and the exporter stops at once. Each ends at its next
    /// look at the flag.
    fn drop(&mut self) {
        *lock(&self.stop) = true;
        self.threads.clear();
    }
}

/// Starts one refreshing thread per monitor socket.
///
/// # Errors
/// A thread could not be started.
pub(crate) fn poll(
    sockets: &[PathBuf],
    interval: Duration,
    vcpus: bool,
    timeout: Duration,
) -> std::io::Result<QemuVms> {
    let vms = Arc::new(Mutex::new(
        sockets
            .iter()
            .map(|s| QemuVm {
                name: file_name(s),
                labels: super::labels::vm_labels(&file_name(s), None, s),
                ..QemuVm::default()
            })
            .collect::<Vec<_>>(),
    ));
    let stop = Arc::new(Mutex::new(false));
    let mut threads = Vec::new();
    for (i, socket) in sockets.iter().enumerate() {
        let (vms, stop, socket) = (vms.clone(), stop.clone(), socket.clone());
        threads.push(
            std::thread::Builder::new()
                .name("exporter-qmp".into())
                .spawn(move || refresh_loop(&socket, i, &vms, &stop, interval, vcpus, timeout))?,
        );
    }
    Ok(QemuVms {
        vms,
        stale_after: interval.saturating_mul(STALE_REFRESHES),
        _pollers: Pollers { stop, threads },
    })
}

/// Refreshes in a row a monitor may fail before its figures leave the page:
/// one that fails now and then (a slow answer) keeps its VM on the page;
/// a QEMU that is gone does not leave counters that no longer move.
const STALE_REFRESHES: u32 = 3;

/// QEMU VMs as a provider: the latest figures its threads fetched, with their age.
pub(crate) struct QemuVms {
    vms: Arc<Mutex<Vec<QemuVm>>>,
    /// How old the figures of a monitor that fails may be on the page.
    stale_after: Duration,
    _pollers: Pollers,
}

impl Provider for QemuVms {
    fn read(&mut self) -> Box<dyn Figures + '_> {
        Box::new(QemuFigures {
            vms: lock(&self.vms).clone(),
            stale_after: self.stale_after,
        })
    }
}

/// A copy of every QEMU VM's latest figures, taken for one scrape.
struct QemuFigures {
    vms: Vec<QemuVm>,
    stale_after: Duration,
}

impl QemuFigures {
    /// The VMs whose figures the page shows: read at least once, and not
    /// failing since longer than `stale_after` (its `qemu_up` 0 and age
    /// stay on the page).
    fn read(&self) -> impl Iterator<Item = &QemuVm> {
        self.vms.iter().filter(|q| {
            q.at.is_some_and(|at| q.error.is_none() || at.elapsed() < self.stale_after)
        })
    }
}

/// The page counts in a QEMU VM's stats (0 for one it lacks, as a kvmscope
/// VM's are read).
fn mapped(vm: &Reading) -> kvm_stats::Mapped {
    let get = |name: &str| {
        vm.iter()
            .find(|(d, _)| d.name == name)
            .and_then(|(_, values)| values.first().copied())
            .unwrap_or(0)
    };
    kvm_stats::Mapped {
        pages_4k: get("pages_4k"),
        pages_2m: get("pages_2m"),
        pages_1g: get("pages_1g"),
    }
}

impl Figures for QemuFigures {
    /// `up`, info (provider `qemu-qmp`), and how old each VM's figures are.
    fn write_families(&self, out: &mut String) {
        let qemu = &self.vms;
        if qemu.is_empty() {
            return;
        }
        let _ = writeln!(out, "# HELP kvmscope_exporter_qemu_up 1 for a QEMU monitor whose last query-stats answered, else 0.\n# TYPE kvmscope_exporter_qemu_up gauge");
        for q in qemu {
            let up = u8::from(q.at.is_some() && q.error.is_none());
            let _ = writeln!(out, "kvmscope_exporter_qemu_up{{{}}} {up}", q.labels);
        }
        let _ = writeln!(out, "# HELP kvmscope_exporter_qemu_info A QEMU VM read over QMP query-stats (provider qemu-qmp): values are as old as kvmscope_exporter_qemu_age_seconds; vCPU stats only with --qmp-vcpus. vcpu_kicks=\"1\": this QEMU (before 8.1) kicks every vCPU out of the guest for each refresh of them; 8.1 and later pread a stats fd kept open.\n# TYPE kvmscope_exporter_qemu_info gauge");
        for q in self.read() {
            let (major, minor, micro) = q.version;
            let _ = writeln!(
                out,
                "kvmscope_exporter_qemu_info{{{},provider=\"qemu-qmp\",qemu_version=\"{major}.{minor}.{micro}\",vcpus_read=\"{}\",vcpu_kicks=\"{}\"}} 1",
                q.labels,
                q.vcpus.len(),
                u8::from(!q.vcpus.is_empty() && q.vcpu_query_kicks())
            );
        }
        let _ = writeln!(out, "# HELP kvmscope_exporter_qemu_age_seconds Age of the QEMU VM's figures on this page.\n# TYPE kvmscope_exporter_qemu_age_seconds gauge");
        for q in qemu {
            if let Some(at) = q.at {
                let _ = writeln!(
                    out,
                    "kvmscope_exporter_qemu_age_seconds{{{}}} {}",
                    q.labels,
                    at.elapsed().as_secs_f64()
                );
            }
        }
    }

    fn mapped_bytes(&self) -> Vec<(&str, u64)> {
        self.read()
            .map(|q| (q.labels.as_str(), mapped(&q.vm).bytes()))
            .collect()
    }

    fn vm_stats(&self) -> Vec<Source<'_>> {
        self.read()
            .map(|q| Source::new(q.labels.as_str(), Values::Listed(&q.vm)))
            .collect()
    }

    fn vcpu_stats(&self) -> Vec<Source<'_>> {
        self.read()
            .flat_map(|q| {
                q.vcpus.iter().map(move |(i, path, r)| {
                    Source::new(
                        format!(
                            "{},qom_path=\"{}\"",
                            crate::metrics::vcpu_labels(&q.labels, *i),
                            label_value(path)
                        ),
                        Values::Listed(r),
                    )
                })
            })
            .collect()
    }
}

fn file_name(path: &Path) -> String {
    path.file_stem().map_or_else(
        || path.display().to_string(),
        |s| s.to_string_lossy().into_owned(),
    )
}

fn refresh_loop(
    socket: &Path,
    slot: usize,
    vms: &Mutex<Vec<QemuVm>>,
    stop: &Mutex<bool>,
    interval: Duration,
    vcpus: bool,
    timeout: Duration,
) {
    let mut monitor: Option<Monitor> = None;
    while !*lock(stop) {
        let result = match monitor.as_mut() {
            Some(m) => m.read(vcpus),
            None => Monitor::open(socket, timeout).and_then(|mut m| {
                let r = m.read(vcpus);
                monitor = Some(m);
                r
            }),
        };
        let mut all = lock(vms);
        let vm = &mut all[slot];
        match result {
            Ok(r) => {
                if vm.error.is_some() {
                    // Said once it failed: said when it is back.
                    log::info!(
                        "exporter: QEMU monitor {}: read again ({}{})",
                        socket.display(),
                        r.name,
                        r.pid.map(|p| format!(" pid {p}")).unwrap_or_default()
                    );
                }
                vm.labels = super::labels::vm_labels(&r.name, r.pid, socket);
                vm.name = r.name;
                vm.pid = r.pid;
                vm.version = r.version;
                vm.vm = Arc::new(r.vm);
                vm.vcpus = Arc::new(r.vcpus);
                vm.at = Some(Instant::now());
                vm.error = None;
            }
            Err(e) => {
                let text = crate::error_chain(&e);
                if vm
                    .error
                    .as_ref()
                    .is_none_or(|old| crate::error_chain(old) != text)
                {
                    log::warn!("exporter: QEMU monitor {}: {text}", socket.display());
                }
                vm.error = Some(Arc::new(e));
                monitor = None;
            }
        }
        drop(all);
        let until = Instant::now() + interval;
        while Instant::now() < until && !*lock(stop) {
            std::thread::sleep(Duration::from_millis(50).min(interval));
        }
    }
}

/// A command's failure in QEMU's words (the client's own speak of a VMM).
fn failed(command: &'static str, e: client::Error, timeout: Duration) -> MonitorError {
    match e {
        client::Error::BadReply(why) => MonitorError::Reply(command, why),
        client::Error::Closed => MonitorError::Closed(command),
        client::Error::Remote { class, desc } => {
            MonitorError::Refused(command, class.to_string(), desc)
        }
        // A QEMU without the command (`query-stats` came with 7.1).
        client::Error::NotKvmscope(version, desc) => MonitorError::Refused(
            command,
            "CommandNotFound".into(),
            format!("{desc} (QEMU {version})"),
        ),
        client::Error::Io(e) if e.kind() == std::io::ErrorKind::TimedOut => {
            MonitorError::Slow(command, timeout)
        }
        other => MonitorError::Command(command, Box::new(other)),
    }
}

/// A negotiated QMP connection to one QEMU, with its schemas.
struct Monitor {
    client: Client,
    /// Each command's whole bound (`--attach-timeout`).
    timeout: Duration,
    name: String,
    pid: Option<u32>,
    version: (u64, u64, u64),
    /// Each target's schema by stat name, made once at `open`.
    schemas: Vec<(Target, HashMap<String, StatSchema>)>,
    /// Each vCPU's index by its `qom-path` (`query-cpus-fast`): QEMU lists
    /// a `query-stats` reply's vCPUs in no set order (7.2: the last first).
    cpu_index: HashMap<String, usize>,
    /// vCPUs of the last reading left out (not in `query-cpus-fast`, or
    /// named twice), as last logged.
    unknown_vcpus: usize,
    /// Whether the last reading's vCPUs were left out for their values'
    /// number, as last logged.
    vcpus_over: bool,
}

impl Monitor {
    fn open(socket: &Path, timeout: Duration) -> Result<Monitor, MonitorError> {
        let bounds = Bounds {
            request: timeout,
            line_max: MAX_LINE,
        };
        let mut client = Client::connect_bounded(socket, bounds).map_err(|e| match e {
            client::Error::Silent(_, limit) | client::Error::SilentAfterGreeting(_, limit) => {
                MonitorError::Silent(limit)
            }
            client::Error::Closed => MonitorError::Closed("its greeting and qmp_capabilities"),
            other => Box::new(other).into(),
        })?;
        if client.greeting.qmp.version.is_kvmscope() {
            return Err(Box::new(client::Error::NotQemu(socket.to_path_buf())).into());
        }
        client.bound_each_request(timeout);
        let pid = client.peer_pid();
        let v = client.greeting.qmp.version.qemu;
        let mut m = Monitor {
            client,
            timeout,
            name: file_name(socket),
            pid,
            version: (v.major, v.minor, v.micro),
            schemas: Vec::new(),
            cpu_index: HashMap::new(),
            unknown_vcpus: 0,
            vcpus_over: false,
        };
        if let Ok(NameInfo { name: Some(n) }) = m.client.call_as(&Command::QueryName(NoArgs {})) {
            // The monitor's word, in logs and labels: one line, bounded.
            m.name = crate::units::peer_text(n.as_bytes(), MAX_TEXT);
        }
        const SCHEMAS: &str = "query-stats-schemas";
        let schemas: Schemas = m
            .client
            .call_as(&Command::QueryStatsSchemas(SchemasArgs {
                provider: Some(StatsProvider::Kvm),
                target: None,
            }))
            .map_err(|e| failed(SCHEMAS, e, timeout))?;
        for s in schemas.items {
            if s.stats.over() {
                let why = format!(
                    "{} stats for the {} target, over the {MAX_STATS} this exporter takes",
                    s.stats.len, s.target
                );
                return Err(MonitorError::Reply(SCHEMAS, why));
            }
            if s.target != Target::Other && m.schemas.iter().all(|(t, _)| *t != s.target) {
                // Each name once (the key), and only a name a stat could have.
                let by_name = s
                    .stats
                    .items
                    .into_iter()
                    .filter(|d| d.name.len() <= MAX_TEXT)
                    .map(|mut d| (std::mem::take(&mut d.name), d));
                m.schemas.push((s.target, by_name.collect()));
            }
        }
        Ok(m)
    }

    fn stats(&mut self, target: StatsTarget) -> Result<StatsResults, MonitorError> {
        let results = self
            .client
            .call_as(&Command::QueryStats(QueryStatsArgs {
                target,
                providers: None,
                names: None,
                vcpus: None,
            }))
            .map_err(|e| failed("query-stats", e, self.timeout))?;
        Ok(results)
    }

    fn read(&mut self, vcpus: bool) -> Result<QemuReading, MonitorError> {
        let vm = self.stats(StatsTarget::Vm)?;
        let vm_stats = match vm.items.first() {
            Some(r) => self.reading(Target::Vm, &r.stats)?,
            None => Reading::new(),
        };
        let mut vcpu_stats = Vec::new();
        // Whether the vCPUs' reply was over the values kept of a reply.
        let mut cut = false;
        if vcpus {
            let all = self.stats(StatsTarget::Vcpu)?;
            if all.over() {
                let why = format!(
                    "{} vCPUs, over the {MAX_VCPUS} this exporter reads",
                    all.len
                );
                return Err(MonitorError::Reply("query-stats", why));
            }
            // `query-cpus-fast` at most once a reading, however many paths
            // are new (a monitor naming vCPUs it does not list).
            let mut asked = false;
            let mut unknown = 0;
            // KVM's entries only: another provider's for the same vCPU is
            // not a vCPU named twice.
            let kvm = |r: &&StatsResult| r.provider.as_deref().is_none_or(|p| p == "kvm");
            cut = all.cut;
            // A reply cut short is left out whole (below), its vCPUs unlooked at.
            if !cut {
                for r in all.items.iter().filter(kvm) {
                    let path = r.qom_path.as_deref().unwrap_or_default();
                    let index = match self.index_of(path, &mut asked)? {
                        // One vCPU once: a path or index named twice is not two.
                        Some(i) if !vcpu_stats.iter().any(|(j, _, _)| *j == i) => i,
                        _ => {
                            unknown += 1;
                            continue;
                        }
                    };
                    let stats = self.reading(Target::Vcpu, &r.stats)?;
                    vcpu_stats.push((index, path.to_string(), stats));
                }
                if unknown != self.unknown_vcpus {
                    // Said when the count changes, not at every reading.
                    if unknown > 0 {
                        log::warn!(
                            "exporter: {}: {unknown} vCPUs of query-stats are not in query-cpus-fast, or named twice: their stats left out",
                            self.name
                        );
                    }
                    self.unknown_vcpus = unknown;
                }
            }
            vcpu_stats.sort_by_key(|(index, _, _)| *index);
        }
        let values: usize = std::iter::once(&vm_stats)
            .chain(vcpu_stats.iter().map(|(_, _, r)| r))
            .flat_map(|r| r.iter().map(|(_, v)| v.len()))
            .sum();
        let over = cut || values > MAX_VALUES;
        if over && !self.vcpus_over {
            let why = if cut {
                format!(
                    "more than this exporter keeps of one reply ({MAX_VALUES} values, {} MiB)",
                    MAX_KEPT_BYTES >> 20
                )
            } else {
                format!("{values} values, over the {MAX_VALUES} this exporter shows of one VM")
            };
            log::warn!(
                "exporter: {}: its vCPUs' stats are {why}: they are left out",
                self.name,
            );
        }
        // The VM's own stats stay on the page; its vCPUs' go (said when
        // that begins).
        self.vcpus_over = over;
        if self.vcpus_over {
            vcpu_stats.clear();
        }
        Ok(QemuReading {
            name: self.name.clone(),
            pid: self.pid,
            version: self.version,
            vm: vm_stats,
            vcpus: vcpu_stats,
        })
    }

    /// vCPU `path`'s index, asking `query-cpus-fast` again when the path is
    /// new (a vCPU plugged since) and it was not `asked` yet this reading;
    /// `None` where QEMU names no such vCPU.
    fn index_of(&mut self, path: &str, asked: &mut bool) -> Result<Option<usize>, MonitorError> {
        if let Some(&i) = self.cpu_index.get(path) {
            return Ok(Some(i));
        }
        if std::mem::replace(asked, true) {
            return Ok(None);
        }
        const CPUS: &str = "query-cpus-fast";
        let cpus: Cpus = self
            .client
            .call_as(&Command::QueryCpusFast(NoArgs {}))
            .map_err(|e| failed(CPUS, e, self.timeout))?;
        if cpus.over() {
            let why = format!(
                "{} vCPUs, over the {MAX_VCPUS} this exporter reads",
                cpus.len
            );
            return Err(MonitorError::Reply(CPUS, why));
        }
        self.cpu_index = cpus
            .items
            .into_iter()
            .filter_map(|c| {
                let path = c.qom_path?;
                let index = usize::try_from(c.cpu_index?).ok()?;
                (path.chars().count() <= MAX_TEXT).then_some((path, index))
            })
            .collect();
        Ok(self.cpu_index.get(path).copied())
    }

    fn reading(
        &self,
        target: Target,
        stats: &AtMost<Stat, MAX_STATS>,
    ) -> Result<Reading, MonitorError> {
        let schema = self
            .schemas
            .iter()
            .find(|(t, _)| *t == target)
            .map(|(_, s)| s);
        reading(schema, stats).map_err(|why| {
            MonitorError::Reply("query-stats", format!("the {target} target: {why}"))
        })
    }
}

/// QEMU's `[{name, value}]` with the schema's type, unit, base and exponent,
/// as descriptors and raw values in the kernel's order. A stat not in the
/// schema, or of a type this does not know, is left out; more stats than
/// [`MAX_STATS`], a stat named twice, a value that is not an unsigned
/// integer (or a boolean), or a histogram of more than [`MAX_BUCKETS`] fail
/// the reading, naming it.
fn reading(
    schema: Option<&HashMap<String, StatSchema>>,
    stats: &AtMost<Stat, MAX_STATS>,
) -> Result<Reading, String> {
    if stats.over() {
        return Err(format!(
            "{} stats, over the {MAX_STATS} this exporter takes",
            stats.len
        ));
    }
    let mut seen = HashSet::new();
    let mut out = Reading::new();
    for s in &stats.items {
        let Some(name) = s.name.as_deref() else {
            continue;
        };
        if !seen.insert(name) {
            return Err(format!("stat {:?} named twice", shown(name)));
        }
        let Some(desc) = schema.and_then(|by_name| by_name.get(name)) else {
            continue;
        };
        let not_a_count = || format!("stat {:?}'s value is not an unsigned integer", shown(name));
        let histogram = matches!(
            desc.kind,
            StatKind::LinearHistogram | StatKind::Log2Histogram
        );
        if histogram != matches!(s.value, StatValue::List(_)) {
            return Err(format!(
                "stat {:?} is {} but its value is {}",
                shown(name),
                if histogram {
                    "a histogram"
                } else {
                    "one value"
                },
                if histogram { "not a list" } else { "a list" }
            ));
        }
        let values: Vec<u64> = match &s.value {
            StatValue::Flag(b) => vec![u64::from(*b)],
            StatValue::List(a) if a.len > MAX_BUCKETS => {
                return Err(format!(
                    "stat {:?} has {} buckets, over the {MAX_BUCKETS} a histogram has",
                    shown(name),
                    a.len
                ))
            }
            StatValue::List(a) => a.counts.as_deref().ok_or_else(not_a_count)?.to_vec(),
            StatValue::Count(v) => vec![*v],
            StatValue::Other => return Err(not_a_count()),
        };
        out.extend(described(name, desc, values));
    }
    Ok(out)
}

/// A stat name as a message shows it: one line, bounded.
fn shown(name: &str) -> String {
    crate::units::peer_text(name.as_bytes(), 64)
}

/// A stat of `name` with `values`, as the schema entry `desc` describes it;
/// `None` for a type this does not know.
fn described(
    name: &str,
    desc: &StatSchema,
    mut values: Vec<u64>,
) -> Option<(Descriptor, Vec<u64>)> {
    let kind = match desc.kind {
        StatKind::Cumulative => StatType::Cumulative,
        StatKind::Instant => StatType::Instant,
        StatKind::Peak => StatType::Peak,
        StatKind::LinearHistogram => StatType::LinearHistogram,
        StatKind::Log2Histogram => StatType::Log2Histogram,
        StatKind::Other => return None,
    };
    if kind == StatType::Log2Histogram {
        values.reverse();
    }
    let unit = match desc.unit {
        Some(StatUnit::Bytes) => Unit::Bytes,
        Some(StatUnit::Seconds) => Unit::Seconds,
        Some(StatUnit::Cycles) => Unit::Cycles,
        Some(StatUnit::Boolean) => Unit::Boolean,
        Some(StatUnit::Other) | None => Unit::None,
    };
    let base = if desc.base == Some(2) {
        Base::Pow2
    } else {
        Base::Pow10
    };
    let d = Descriptor {
        name: name.to_string(),
        flags: kind.to_flags() | unit.to_flags() | base.to_flags(),
        kind,
        unit,
        base,
        exponent: desc
            .exponent
            .and_then(|e| i16::try_from(e).ok())
            .unwrap_or(0),
        size: u16::try_from(values.len()).unwrap_or(u16::MAX),
        offset: 0,
        bucket_size: desc
            .bucket_size
            .and_then(|b| u32::try_from(b).ok())
            .unwrap_or(0),
    };
    Some((d, values))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A target's schema as `open` keeps it.
    fn schema(list: &str) -> HashMap<String, StatSchema> {
        let list: Vec<StatSchema> = serde_json::from_str(list).unwrap();
        list.into_iter().map(|d| (d.name.clone(), d)).collect()
    }

    /// A reply's stats as they come off the line.
    fn stats(list: &serde_json::Value) -> AtMost<Stat, MAX_STATS> {
        serde_json::from_str(&list.to_string()).unwrap()
    }

    #[test]
    fn qemu_readings_take_the_schema_and_log2_buckets_come_back_in_kernel_order() {
        let schema = schema(
            r#"[{"name": "exits", "type": "cumulative", "exponent": 0},
                {"name": "guest_mode", "type": "instant", "unit": "boolean", "exponent": 0},
                {"name": "halt_wait_hist", "type": "log2-histogram", "unit": "seconds", "base": 10, "exponent": -9}]"#,
        );
        let list = json!([
            {"name": "exits", "value": 42},
            {"name": "guest_mode", "value": true},
            {"name": "halt_wait_hist", "value": [5, 0, 0, 1]},
            {"name": "not_in_the_schema", "value": 7}
        ]);
        let r = reading(Some(&schema), &stats(&list)).unwrap();
        let names: Vec<&str> = r.iter().map(|(d, _)| d.name.as_str()).collect();
        assert_eq!(names, ["exits", "guest_mode", "halt_wait_hist"]);
        assert_eq!(r[0].1, [42]);
        assert_eq!((r[1].0.unit, &r[1].1[..]), (Unit::Boolean, &[1][..]));
        let (hist, values) = &r[2];
        assert_eq!(
            (hist.kind, hist.unit, hist.exponent, hist.size),
            (StatType::Log2Histogram, Unit::Seconds, -9, 4)
        );
        // QEMU 7.2 sends the highest bucket first.
        assert_eq!(values, &[1, 0, 0, 5]);
    }

    /// A reply over a bound, or of the wrong shape, fails the reading
    /// naming what is wrong (a 9 MB reply of 200,000 stats took minutes of
    /// CPU; 65,535 buckets made a page of hundreds of MB; a value of -1 was
    /// left out without a word).
    #[test]
    fn a_reading_over_its_bounds_or_with_values_that_are_not_counts_is_refused() {
        let schema = schema(
            r#"[{"name": "exits", "type": "cumulative"},
                {"name": "hist", "type": "log2-histogram"}]"#,
        );
        let many: Vec<serde_json::Value> = (0..=MAX_STATS)
            .map(|i| json!({"name": format!("s{i}"), "value": 1}))
            .collect();
        let cases = [
            (json!(many), "513 stats"),
            (
                json!([{"name": "exits", "value": 1}, {"name": "exits", "value": 2}]),
                "named twice",
            ),
            (
                json!([{"name": "exits", "value": -1}]),
                "not an unsigned integer",
            ),
            (
                json!([{"name": "exits", "value": 1.5}]),
                "not an unsigned integer",
            ),
            (
                json!([{"name": "hist", "value": [1, -2]}]),
                "not an unsigned integer",
            ),
            (
                json!([{"name": "hist", "value": vec![0; 66]}]),
                "66 buckets",
            ),
            (
                json!([{"name": "exits", "value": [7, 7]}]),
                "one value but its value is a list",
            ),
            (
                json!([{"name": "hist", "value": 7}]),
                "a histogram but its value is not a list",
            ),
        ];
        for (list, why) in cases {
            let err = reading(Some(&schema), &stats(&list)).unwrap_err();
            assert!(err.contains(why), "{why}: {err}");
        }
        let fine = json!([{"name": "hist", "value": vec![1; 65]}]);
        assert_eq!(
            reading(Some(&schema), &stats(&fine)).unwrap()[0].1.len(),
            65
        );
    }

    /// A command's failure is said in QEMU's words: the client's errors
    /// speak of a VMM ("the VMM closed the connection", and a QEMU without
    /// `query-stats` was "not a kvmscope VMM ... read by kvmscope exporter
    /// --qmp-socket", to the exporter reading it that way).
    #[test]
    fn a_monitors_failures_name_qemu_and_the_command() {
        let t = Duration::from_secs(2);
        let timed_out = std::io::Error::new(std::io::ErrorKind::TimedOut, "late");
        let cases = [
            (client::Error::Closed, "QEMU closed the connection during query-stats"),
            (
                client::Error::Remote {
                    class: crate::protocol::ErrorClass::GenericError,
                    desc: "no".into(),
                },
                "QEMU refused query-stats (GenericError): no",
            ),
            (
                client::Error::NotKvmscope("7.0.0".into(), "The command query-stats has not been found".into()),
                "QEMU refused query-stats (CommandNotFound): The command query-stats has not been found (QEMU 7.0.0)",
            ),
            (
                client::Error::Io(timed_out),
                "QEMU did not complete its answer to query-stats within 2s",
            ),
            (
                client::Error::BadReply("expected a list".into()),
                "query-stats: expected a list",
            ),
        ];
        for (e, said) in cases {
            let text = crate::error_chain(&failed("query-stats", e, t));
            assert!(text.starts_with(said), "{text}");
            assert!(!text.contains("VMM"), "{text}");
        }
    }

    #[test]
    fn a_monitor_failing_for_longer_than_three_refreshes_leaves_only_its_up_and_age() {
        let ago = |secs| {
            Instant::now()
                .checked_sub(Duration::from_secs(secs))
                .unwrap()
        };
        let failing = || {
            Some(Arc::new(MonitorError::Client(Box::new(
                client::Error::Closed,
            ))))
        };
        let vm = |name: &str, at, error| QemuVm {
            labels: format!("vm=\"{name}\""),
            vm: Arc::default(),
            at: Some(at),
            error,
            ..QemuVm::default()
        };
        let figures = QemuFigures {
            vms: vec![
                vm("fine", ago(1), None),
                vm("failed-once", ago(6), failing()),
                vm("gone", ago(20), failing()),
                QemuVm::default(),
            ],
            stale_after: Duration::from_secs(15),
        };
        let shown: Vec<_> = figures
            .vm_stats()
            .iter()
            .map(|s| s.labels.to_string())
            .collect();
        assert_eq!(shown, ["vm=\"fine\"", "vm=\"failed-once\""]);
        let mut page = String::new();
        figures.write_families(&mut page);
        assert!(
            page.contains("kvmscope_exporter_qemu_up{vm=\"gone\"} 0"),
            "{page}"
        );
        assert!(
            page.contains("kvmscope_exporter_qemu_age_seconds{vm=\"gone\"} 2"),
            "{page}"
        );
        assert!(!page.contains("qemu_info{vm=\"gone\""), "{page}");
    }
}
