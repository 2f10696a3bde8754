//! `kvmscope run`: boot the guest, run the workloads, stop in order, summarise.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvm_stats::{Sample, StatsFd};

use crate::boot;
use crate::control;
use crate::messages::{RunRequest, RunStateError, VmEvent};
use crate::migration::receiver::{self, Incoming, IncomingConfig};
use crate::migration::{self, Migration};
use crate::protocol::events::ShutdownCause;
use crate::runstate::{RunState, SharedRunState};
use crate::sampler::{self, Sampler, SamplerConfig};
use crate::summary::{kvm_growth, BootTimeout, Summary, VcpuSummary};
use crate::vcpu::{stall, Control, Outcome};
use crate::vm::{self, Vm, VmConfig};
use crate::workload::{parse_workload, SpecError, Workload};
use kvm_stats::Mapped;

/// The workload `kvmscope run` gives vCPU 0 when none is named, for a guest of
/// `memory` bytes: touch a quarter of the arena (at most 16 MiB), zero-fill and
/// read half as much each, dirty the touched range, then exits.
pub fn demo_workload(memory: u64) -> String {
    let quarter = boot::arena_size(memory) / 4 / crate::abi::PAGE_SIZE * crate::abi::PAGE_SIZE;
    let a = quarter.min(16 << 20);
    let half = a / 2;
    format!(
        "touch size={a}; touch-zero offset={a} size={half}; read offset={} size={half}; dirty ws={a} rate=20000/s for=200ms; exits count=1000",
        a + half
    )
}

/// Everything `kvmscope run` needs.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// The VM to build (ignored for what a `--incoming` stream decides).
    pub vm: VmConfig,
    /// Workloads queued at start, each for its target vCPUs.
    pub workloads: Vec<Workload>,
    /// When the process started, for start-up timing.
    pub process_start: Instant,
    /// How long to wait for vCPUs to stop.
    pub stop_timeout: Duration,
    /// Turn SIGINT/SIGTERM/SIGHUP into an orderly stop (the binary; the caller must have
    /// called `signals::take_termination` before starting any thread).
    pub handle_signals: bool,
    /// Serve the control socket at this path; the VM then runs until `quit` or a signal.
    pub socket: Option<std::path::PathBuf>,
    /// Run the sampler thread.
    pub sampler: Option<SamplerConfig>,
    /// Stop and report when a vCPU's guest has not checked in (its first port
    /// write) this long after start; `None` waits for ever.
    pub boot_timeout: Option<Duration>,
    /// Serve the sampler's readings as Prometheus text at this address (needs
    /// the sampler); the VM then runs until a signal (or `quit`, with `socket`).
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// The VM's name (`query-name`, metrics, samples); default from the
    /// socket's file name, else `kvmscope-<pid>`.
    pub name: Option<String>,
    /// Deadlines for control-socket clients.
    pub control_limits: control::Limits,
    /// A readiness measurement every period, published in the VMM's own
    /// stats (needs the socket and dirty logging).
    pub readiness_every: Option<control::Periodic>,
    /// What a dirty-logging fault costs the guest here, for the stall; `None`:
    /// measured once at start (`readiness::calibrate`) when the VM serves a
    /// socket or metrics.
    pub fault_cost: Option<Duration>,
    /// Say on stderr, once they are up, where the VM is served (its control
    /// socket, its metrics page) and how to stop it: the CLI's `run`, which
    /// otherwise prints nothing until the VM stops.
    pub announce: bool,
}

/// Why a run could not happen.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The VM could not be built or started.
    #[error(transparent)]
    Vm(#[from] vm::Error),
    /// The sampler could not start (its fds, its export file).
    #[error("starting the sampler")]
    Sampler(#[from] sampler::Error),
    /// The metrics server could not start (the address is taken).
    #[error("starting the metrics server")]
    Metrics(#[from] crate::metrics::Error),
    /// `--metrics-addr` with `--sample-interval off`.
    #[error("--metrics-addr needs the sampler")]
    MetricsWithoutSampler,
    /// The control socket could not be served.
    #[error("starting the control socket")]
    Control(#[from] control::Error),
    /// A workload does not fit its vCPU (e.g. a range outside the arena).
    #[error("workload for vCPU {vcpu}")]
    Workload {
        /// The vCPU it was for.
        vcpu: usize,
        /// What is wrong with it.
        source: SpecError,
    },
    /// A workload names vCPUs the VM does not have.
    #[error("workload target")]
    Target(#[source] SpecError),
    /// `--incoming`: the stream could not be taken or loaded.
    #[error("incoming migration")]
    Incoming(#[from] receiver::Error),
    /// The migration service could not be set up.
    #[error("setting up migration")]
    Migration(#[from] migration::sender::Error),
}

impl RunConfig {
    /// A run of the demo workload on a default VM.
    pub fn demo() -> Self {
        let vm = VmConfig::default();
        let demo = parse_workload(&demo_workload(vm.memory))
            .unwrap_or_else(|e| unreachable!("the demo workload parses: {e}"));
        RunConfig {
            vm,
            workloads: vec![demo],
            process_start: Instant::now(),
            stop_timeout: Duration::from_secs(1),
            handle_signals: false,
            socket: None,
            sampler: None,
            metrics_addr: None,
            boot_timeout: Some(DEFAULT_BOOT_TIMEOUT),
            name: None,
            control_limits: control::Limits::default(),
            readiness_every: None,
            fault_cost: None,
            announce: false,
        }
    }

    /// The VM's name: `name`, else the socket's file stem, else `kvmscope-<pid>`.
    pub(crate) fn vm_name(&self) -> String {
        self.name
            .clone()
            .or_else(|| {
                self.socket
                    .as_deref()
                    .and_then(std::path::Path::file_stem)
                    .map(|s| s.to_string_lossy().into_owned())
            })
            .unwrap_or_else(|| format!("kvmscope-{}", std::process::id()))
    }
}

/// How long a guest has to check in unless told otherwise: start-up to the
/// first port write takes a few milliseconds (docs/BENCHMARKS.md).
pub(crate) const DEFAULT_BOOT_TIMEOUT: Duration = Duration::from_secs(5);

/// Checks every workload against the VM (vCPU targets, arena ranges) before
/// anything runs, and queues them.
fn queue_workloads(vm: &Vm, workloads: &[Workload]) -> Result<(), Error> {
    let arena = boot::arena_size(vm.config.memory);
    let mut per_vcpu = vec![Vec::new(); vm.config.vcpus];
    for w in workloads {
        let targets = w.target.resolve(vm.config.vcpus).map_err(Error::Target)?;
        for &vcpu in &targets {
            for c in &w.commands {
                c.to_guest(arena)
                    .map_err(|source| Error::Workload { vcpu, source })?;
                per_vcpu[vcpu].push(c.clone());
            }
        }
    }
    for (vcpu, cmds) in per_vcpu.into_iter().enumerate() {
        let count = cmds.len();
        if let Some(Err(_)) = vm.push_commands(vcpu, cmds) {
            let source = SpecError::TooMany(count, crate::vcpu::MAX_QUEUED_COMMANDS);
            return Err(Error::Workload { vcpu, source });
        }
    }
    Ok(())
}

/// What the main loop saw.
#[derive(Default)]
struct Watch {
    signal: Option<i32>,
    /// A control-socket client sent `quit`.
    quit: bool,
    first_done: Option<Instant>,
    /// The vCPUs that had not checked in when the boot deadline passed.
    not_checked_in: Option<Vec<usize>>,
}

/// The boot deadline: every vCPU's guest must check in (its first port write)
/// within `limit` of its own time on a host CPU (its thread's, schedstat's:
/// guest time included) while the VM is not paused; a pause restarts it. A
/// guest that spins without checking in is late after `limit` of running; a
/// host starting hundreds of VMs at once, whose vCPU threads wait seconds
/// for a CPU and on its locks, makes none late. Whatever a vCPU ran, it is
/// late after [`BOOT_WALL_FACTOR`] times `limit` of wall time (a guest
/// halted before its first port write, which does not run, or a thread
/// whose time cannot be read).
struct BootWatch {
    limit: Option<Duration>,
    /// Since when the clock runs, and the time on a CPU then (ns) of each
    /// vCPU (by index) waiting to check in (none at start: a thread not
    /// started yet has all its time after); `None` once every vCPU checked in.
    since: Option<(Instant, Vec<(usize, u64)>)>,
    /// The earliest a vCPU can be late, as of the last look: a thread's
    /// time on a CPU grows no faster than the wall clock.
    next: Option<Instant>,
    /// Each vCPU's time on a CPU as last read (ns), for a restart that
    /// cannot read it.
    last: Vec<(usize, u64)>,
}

/// The wall-clock cap on `--boot-timeout`, as a multiple of it.
const BOOT_WALL_FACTOR: u32 = 6;

impl BootWatch {
    fn new(limit: Option<Duration>, started: Instant) -> Self {
        BootWatch {
            limit,
            since: limit.map(|_| (started, Vec::new())),
            next: limit.map(|l| started + l),
            last: Vec::new(),
        }
    }

    /// How long the main loop may wait for an event: at most a second, and
    /// not past the earliest a vCPU could be late.
    fn wait(&self, now: Instant) -> Duration {
        let second = Duration::from_secs(1);
        self.next
            .map_or(second, |n| n.saturating_duration_since(now).min(second))
    }

    /// The vCPUs that have not checked in, once one of them is late.
    fn late(&mut self, vm: &Vm, paused: bool, now: Instant) -> Option<Vec<usize>> {
        self.since.as_ref()?;
        let waiting: Vec<(usize, Option<u64>)> = (vm.vcpus.iter().enumerate())
            .filter(|(_, v)| v.shared.first_exit.get().is_none())
            .map(|(i, v)| (i, v.shared.tid.get().and_then(|&t| stall::on_cpu_ns(t))))
            .collect();
        self.late_of(&waiting, paused, now)
    }

    /// [`BootWatch::late`] for the vCPUs `waiting` to check in, each with
    /// its thread's time on a CPU so far (`None`: not known).
    fn late_of(
        &mut self,
        waiting: &[(usize, Option<u64>)],
        paused: bool,
        now: Instant,
    ) -> Option<Vec<usize>> {
        let limit = self.limit?;
        if waiting.is_empty() {
            self.since = None;
            self.next = None;
            return None;
        }
        // A vCPU's time in a list of them (0: not started then).
        let of = |list: &[(usize, u64)], i: usize| {
            list.iter().find(|&&(j, _)| j == i).map_or(0, |&(_, t)| t)
        };
        let read: Vec<(usize, u64)> = waiting
            .iter()
            .map(|&(i, t)| (i, t.unwrap_or_else(|| of(&self.last, i))))
            .collect();
        let (since, at) = self.since.as_mut()?;
        if paused {
            // Restarted from the times now (one that cannot be read now,
            // from the last read).
            *since = now;
            at.clone_from(&read);
            self.last = read;
            self.next = Some(now + limit);
            return None;
        }
        let then = |i: usize| of(at, i);
        let cap = *since + limit * BOOT_WALL_FACTOR;
        let mut next = cap;
        for &(i, on_cpu) in waiting {
            let Some(on_cpu) = on_cpu else { continue };
            let ran = Duration::from_nanos(on_cpu.saturating_sub(then(i)));
            next = next.min(now + limit.saturating_sub(ran));
        }
        self.last = read;
        self.next = Some(next);
        (now >= next).then(|| waiting.iter().map(|&(i, _)| i).collect())
    }
}

/// Who wants the guest paused: a user (`pause`/`resume`) and any number of
/// holds (readiness scans). The guest runs only when nobody does, so a scan
/// never resumes a guest a user paused, and a user cannot resume one mid-scan.
#[derive(Debug, Default)]
struct PauseState {
    user: bool,
    holds: u32,
    /// The guest migrated away: it never runs here again.
    migrated: bool,
    /// Where `query-status` reads the outcome.
    status: Arc<SharedRunState>,
}

impl PauseState {
    /// Takes a request; returns what every vCPU must now be told.
    fn decide(&mut self, request: RunRequest) -> Result<Control, RunStateError> {
        match request {
            RunRequest::Pause => self.user = true,
            RunRequest::Resume if self.holds > 0 => return Err(RunStateError::HeldByScan),
            // As QEMU's: `cont` after a completed migration runs the guest
            // here again (a management stack's way back when the destination
            // could not start it; that it does not run there is its call).
            RunRequest::Resume => (self.user, self.migrated) = (false, false),
            RunRequest::Hold => self.holds += 1,
            RunRequest::Release => self.holds = self.holds.saturating_sub(1),
            RunRequest::Postmigrate => self.migrated = true,
            RunRequest::Quit => {}
        }
        Ok(if self.user || self.holds > 0 || self.migrated {
            Control::Pause
        } else {
            Control::Run
        })
    }

    fn paused(&self) -> bool {
        self.user || self.holds > 0
    }

    fn apply(&mut self, vm: &Vm, request: RunRequest) -> Result<(), RunStateError> {
        let control = self.decide(request)?;
        vm.control_all(control);
        self.status.set(match control {
            Control::Pause if self.migrated => RunState::Postmigrate,
            Control::Pause => RunState::Paused,
            _ => RunState::Running,
        });
        Ok(())
    }
}

/// Waits until every vCPU has run out of work (unless `serving` a control
/// socket or metrics: then the VM stays up for its clients and scrapers), one
/// fails, a signal arrives, a client asks to quit or the guest misses its boot
/// deadline.
fn wait_until_done(
    vm: &mut Vm,
    watch: &mut Watch,
    serving: bool,
    status: Arc<SharedRunState>,
    boot: &mut BootWatch,
) {
    let n = vm.vcpus.len();
    let mut idle = vec![false; n];
    status.set(RunState::Running);
    let mut pause = PauseState {
        status: status.clone(),
        ..PauseState::default()
    };
    let mut last_kick = Instant::now();
    loop {
        // Throttled vCPUs are kicked every timeslice to take their sleep.
        let slice = crate::vcpu::throttle::TIMESLICE;
        let wait = match vm.throttled() {
            true => boot
                .wait(Instant::now())
                .min(slice.saturating_sub(last_kick.elapsed())),
            false => boot.wait(Instant::now()),
        };
        let event = vm.next_event(wait);
        if vm.throttled() && last_kick.elapsed() >= slice {
            vm.kick_throttled();
            last_kick = Instant::now();
        }
        match event {
            Some(VmEvent::Idle(i)) => idle[i] = true,
            Some(VmEvent::CommandDone(i, _)) => {
                watch.first_done.get_or_insert_with(Instant::now);
                idle[i] = false;
            }
            Some(VmEvent::Finished(_, outcome)) if outcome != Outcome::Stopped => {
                status.set(RunState::InternalError);
                return;
            }
            Some(VmEvent::Finished(..)) => {}
            Some(VmEvent::Signal(sig)) => {
                watch.signal = Some(sig);
                return;
            }
            Some(VmEvent::Control(RunRequest::Quit, reply)) => {
                watch.quit = true;
                let _ = reply.send(Ok(()));
                return;
            }
            Some(VmEvent::Control(request, reply)) => {
                let _ = reply.send(pause.apply(vm, request));
            }
            Some(VmEvent::Loaded | VmEvent::Throttled) | None => {}
        }
        if let Some(late) = boot.late(vm, pause.paused(), Instant::now()) {
            watch.not_checked_in = Some(late);
            status.set(RunState::InternalError);
            return;
        }
        if !serving && idle.iter().all(|&b| b) && vm.vcpus.iter().all(|v| v.shared.queued() == 0) {
            return;
        }
    }
}

/// KVM's per-vCPU stats before the guest runs, to diff against at the end.
struct Baseline {
    vm: Sample,
    vcpus: Vec<Sample>,
}

impl Baseline {
    fn read(vm: &Vm) -> Result<Baseline, Error> {
        let read = |fd: &StatsFd| -> Result<Sample, Error> {
            let mut sample = fd.new_sample();
            fd.read_sample(&mut sample).map_err(vm::Error::Stats)?;
            Ok(sample)
        };
        let vcpus = vm.vcpu_stats.iter().map(read).collect::<Result<_, _>>()?;
        Ok(Baseline {
            vm: read(&vm.vm_stats)?,
            vcpus,
        })
    }
}

/// The threads that serve a run: the sampler, its metrics page, the control socket.
struct Services {
    sampler: Option<Sampler>,
    metrics: Option<crate::metrics::MetricsServer>,
    server: Option<control::Server>,
    /// The run state the main loop keeps and the control socket reports.
    status: Arc<SharedRunState>,
}

impl Services {
    /// Starts what `config` asks for. The socket is bound before the guest
    /// starts, so a bad path fails before any workload runs; the samples file
    /// is moved into place only once everything else has started.
    fn start(config: &RunConfig, vm: &Vm, migration: &Arc<Migration>) -> Result<Services, Error> {
        let status = Arc::new(SharedRunState::default());
        let mut sampler = match &config.sampler {
            Some(c) => {
                let vcpus = vm.vcpus.iter().map(|v| v.shared.clone()).collect();
                Some(Sampler::start(
                    c.clone(),
                    &vm.fd_file()?,
                    &vm.vcpu_fds,
                    vcpus,
                    sampler::SampledVm {
                        name: config.vm_name(),
                        memory: vm.config.memory,
                    },
                )?)
            }
            None => None,
        };
        let metrics = match (&config.metrics_addr, &sampler) {
            (Some(addr), Some(s)) => Some(crate::metrics::MetricsServer::start(
                *addr,
                s.shared.clone(),
            )?),
            (Some(_), None) => return Err(Error::MetricsWithoutSampler),
            (None, _) => None,
        };
        if let Some(m) = &metrics {
            log::info!("metrics at http://{}/metrics", m.addr);
        }
        let server = match &config.socket {
            Some(path) => {
                let mut context = control::Context::new(vm)?;
                context.samples = sampler.as_ref().map(|s| s.shared.clone());
                context.name = config.vm_name();
                context.run_state = status.clone();
                context.periodic = config.readiness_every;
                context.migration = Some((
                    migration.clone(),
                    migration::Source::from_vm(vm).map_err(migration::sender::Error::MsrList)?,
                ));
                Some(control::Server::start(
                    path,
                    context,
                    config.control_limits,
                )?)
            }
            None => None,
        };
        // Last: only a start-up that got this far may replace the user's file.
        if let Some(s) = sampler.as_mut() {
            s.commit_export()?;
        }
        let services = Services {
            sampler,
            metrics,
            server,
            status,
        };
        if config.announce && services.serving() {
            crate::say!("kvmscope run: {}", services.where_served(config, vm));
        }
        Ok(services)
    }

    /// Where the VM named in `config` is served, and how it stops: one line.
    fn where_served(&self, config: &RunConfig, vm: &Vm) -> String {
        let mut line = format!(
            "serving VM \"{}\" ({} vCPU(s), {})",
            config.vm_name(),
            vm.vcpus.len(),
            crate::units::format_bytes(vm.config.memory)
        );
        if let Some(path) = &config.socket {
            line.push_str(&format!(": control socket {} (QMP)", path.display()));
        }
        if let Some(m) = &self.metrics {
            line.push_str(&format!(", metrics http://{}/metrics", m.addr));
        }
        line.push_str(match config.socket {
            Some(_) => "; it runs until `quit` or SIGINT/SIGTERM/SIGHUP",
            None => "; it runs until SIGINT/SIGTERM/SIGHUP",
        });
        line
    }

    /// Whether anything serves clients (the control socket, the metrics
    /// page): the VM then runs until a signal (or `quit`), not until its
    /// workloads end.
    fn serving(&self) -> bool {
        self.server.is_some() || self.metrics.is_some()
    }

    /// Stops them (call once the vCPUs have stopped): the sampler takes a last
    /// point of the final state. What went wrong comes back as warnings, so
    /// that the run's results are not lost to a full disk.
    fn stop(mut self, cause: Option<ShutdownCause>) -> Vec<String> {
        let mut warnings = Vec::new();
        if let Some(Err(e)) = self.server.take().map(|s| s.shutdown(cause)) {
            warnings.push(crate::error_chain(&e));
        }
        if let Some(Err(e)) = self.sampler.as_mut().map(Sampler::stop) {
            warnings.push(format!("the sampler failed: {}", crate::error_chain(&e)));
        }
        if let Some(Err(e)) = self
            .metrics
            .take()
            .map(crate::metrics::MetricsServer::shutdown)
        {
            warnings.push(crate::error_chain(&e));
        }
        warnings
    }
}

/// Boots the guest, runs the workloads and returns the summary. A guest
/// failure is in the summary (`Summary::failure`), not an error.
///
/// # Errors
/// The VM could not be built, or a workload does not fit it.
pub fn run(config: RunConfig) -> Result<Summary, Error> {
    run_vm(config, None)
}

/// Sets the stall's cost per fault: the one given, else measured on a
/// thread of its own when the VM serves a socket or metrics (someone may
/// observe it).
fn fault_cost(config: &RunConfig) {
    match config.fault_cost {
        Some(cost) => {
            crate::vcpu::stall::set_fault_cost(cost, crate::vcpu::stall::FaultCostSource::Given);
        }
        None if config.socket.is_some() || config.metrics_addr.is_some() => {
            crate::readiness::calibrate::in_background();
        }
        None => {}
    }
}

/// `kvmscope run --incoming`: waits for one migration stream, builds the VM
/// it describes (checked against `incoming`; built before listening where
/// `incoming` gives memory and vCPUs), loads it and runs the guest on from
/// where the source stopped. With a control socket, it serves
/// `query-migrate` while loading.
///
/// # Errors
/// As [`run`], and a stream that is refused (the source keeps its guest).
pub fn run_incoming(config: RunConfig, incoming: IncomingConfig) -> Result<Summary, Error> {
    run_vm(config, Some(incoming))
}

/// Waits for a migration source. Where the command line says what the VM
/// will be, the VM is built before listening, so that no source waits for
/// it (registering guest RAM with KVM waits for an SRCU grace period, which
/// took 0.5 to 32 s on a busy host here, docs/MIGRATION.md), and its control
/// socket, sampler and metrics serve while it waits, as QEMU's `-incoming`
/// serves QMP: an orchestrator can connect to the destination before it
/// starts the source. Returns the stream and, built ahead, the VM and what
/// serves it.
fn wait_for_source(
    config: &RunConfig,
    given: &IncomingConfig,
    migration: &Arc<Migration>,
) -> Result<(Incoming, Option<(Vm, Services)>), Error> {
    let stop = incoming_stop(config, migration);
    let waiting = || {
        if config.announce {
            crate::say!("kvmscope run: waiting for a migration on {}", given.uri);
        }
    };
    let Some(mut vm) = given.ahead(&config.vm).map(Vm::new).transpose()? else {
        waiting();
        return Ok((Incoming::accept(given, migration, &stop)?, None));
    };
    if config.handle_signals {
        crate::signals::forward_termination(vm.event_sender());
    }
    let services = Services::start(config, &vm, migration)?;
    waiting();
    services.status.set(RunState::Inmigrate);
    let stream = migration::watch::accept(given, &mut vm, migration, &stop)?;
    Ok((stream, Some((vm, services))))
}

/// What stops an incoming migration: `quit`, a signal taken by the signal
/// thread, `migrate_cancel` (all through the migration handle), or before
/// that thread exists, a pending SIGINT/SIGTERM/SIGHUP.
fn incoming_stop(config: &RunConfig, m: &Arc<Migration>) -> migration::inbound::Stop {
    let (m, signals) = (m.clone(), config.handle_signals);
    Arc::new(move || {
        m.incoming_stop().or_else(|| {
            signals
                .then(crate::signals::pending_termination)
                .flatten()
                .map(|sig| format!("signal {sig}"))
        })
    })
}

fn run_vm(config: RunConfig, incoming: Option<IncomingConfig>) -> Result<Summary, Error> {
    let migration = Arc::new(Migration::new());
    let (mut vm, stream, early) = match &incoming {
        None => (Vm::new(config.vm.clone())?, None, None),
        Some(given) => {
            let (stream, early) = wait_for_source(&config, given, &migration)?;
            let wanted = stream.vm_config(&config.vm);
            let built = match early {
                Some((vm, services)) if *vm.config() == wanted => Ok((vm, Some(services))),
                Some((vm, services)) => {
                    log::info!(
                        "migration stream: its VM ({}) is not the one built ahead ({}): building it; the control socket comes up again with it",
                        receiver::describe(&wanted),
                        receiver::describe(vm.config())
                    );
                    // Its clients go with it, and its memory before the next is made.
                    for w in services.stop(None) {
                        log::warn!("{w}");
                    }
                    drop(vm);
                    Vm::new(wanted).map(|vm| (vm, None))
                }
                None => Vm::new(wanted).map(|vm| (vm, None)),
            };
            match built {
                Ok((vm, services)) => (vm, Some(stream), services),
                Err(e) => {
                    stream.refuse(&e);
                    return Err(e.into());
                }
            }
        }
    };
    queue_workloads(&vm, &config.workloads)?;
    let before = Baseline::read(&vm)?;
    if config.handle_signals {
        crate::signals::forward_termination(vm.event_sender());
    }
    let services = match early {
        Some(services) => services,
        None => Services::start(&config, &vm, &migration)?,
    };
    if let Some(stream) = stream {
        services.status.set(RunState::Inmigrate);
        migration::watch::load(stream, &mut vm, &migration)?;
        if let Some(server) = &services.server {
            server.note_loaded_pages(migration.loaded_pages());
        }
    }
    // Once the guest is about to run: a destination's CPU and memory go to
    // the stream first.
    fault_cost(&config);
    let started = Instant::now();
    vm.start()?;
    let mut watch = Watch::default();
    let mut boot = BootWatch::new(config.boot_timeout, started);
    wait_until_done(
        &mut vm,
        &mut watch,
        services.serving(),
        services.status.clone(),
        &mut boot,
    );
    let migrated = services.status.get() == RunState::Postmigrate;
    if services.status.get() != RunState::InternalError {
        services.status.set(RunState::Shutdown);
    }
    let stuck = vm.stop(config.stop_timeout);
    // QEMU's causes: a guest that panicked is the guest's doing; a fault, a
    // KVM error or a missed boot deadline is the host's (libvirt reads
    // `guest-shutdown` as a clean poweroff from inside the guest); a guest
    // whose work ended (no socket or metrics to serve) shut down.
    let panicked = vm
        .vcpus
        .iter()
        .any(|v| matches!(v.outcome(), Some(Outcome::GuestPanic { .. })));
    let cause = if watch.quit {
        ShutdownCause::HostQmpQuit
    } else if watch.signal.is_some() {
        ShutdownCause::HostSignal
    } else if panicked {
        ShutdownCause::GuestPanic
    } else if services.status.get() == RunState::InternalError || watch.not_checked_in.is_some() {
        ShutdownCause::HostError
    } else {
        ShutdownCause::GuestShutdown
    };
    let warnings = services.stop(Some(cause));
    // An outgoing migration the stop cut short: said, as the stop asked for
    // it (the exit status stays the stop's).
    if let Some(status) = migration.status().status.filter(|s| !s.is_final()) {
        if migration.committed() {
            log::warn!(
                "the run stopped as a migration waited for the destination's answer to its whole stream (status {}): the destination may run the guest (its query-status says)",
                status.name()
            );
        } else {
            log::warn!(
                "the run stopped during a migration (status {}), which ended with it: the guest did not move (the destination refuses the stream cut short)",
                status.name()
            );
        }
    }
    let elapsed = started.elapsed();
    summarize(
        &vm,
        &before,
        &watch,
        Ending {
            boot_limit: config.boot_timeout,
            migrated,
            stuck,
            warnings,
            elapsed,
            process_start: config.process_start,
        },
    )
}

/// The boot-timeout report: each late vCPU with the registers its thread read
/// when it stopped.
fn boot_timeout(vm: &Vm, watch: &Watch, limit: Option<Duration>) -> Option<BootTimeout> {
    let late = watch.not_checked_in.as_ref()?;
    Some(BootTimeout {
        limit: limit.unwrap_or_default(),
        vcpus: late
            .iter()
            .map(|&i| (i, vm.vcpus[i].shared.boot_registers.get().copied()))
            .collect(),
    })
}

/// How the run ended, for the summary.
struct Ending {
    boot_limit: Option<Duration>,
    /// The guest had migrated away (postmigrate) when the run ended.
    migrated: bool,
    stuck: Vec<usize>,
    warnings: Vec<String>,
    elapsed: Duration,
    process_start: Instant,
}

fn summarize(vm: &Vm, before: &Baseline, watch: &Watch, end: Ending) -> Result<Summary, Error> {
    let after = Baseline::read(vm)?;
    let vcpus = (0..vm.vcpus.len())
        .map(|i| {
            let shared = &vm.vcpus[i].shared;
            VcpuSummary {
                index: i,
                outcome: vm.vcpus[i].outcome().cloned(),
                kvm: kvm_growth(&vm.vcpu_stats[i], &before.vcpus[i], &after.vcpus[i]),
                ours: shared.counters.to_json(),
                results: shared.results(),
                interrupted: shared.interrupted.get().cloned(),
                not_started: shared.queued(),
            }
        })
        .collect();
    let since = |t: Option<Instant>| t.map(|t| t.saturating_duration_since(end.process_start));
    let first_exit = vm
        .vcpus
        .iter()
        .filter_map(|v| v.shared.first_exit.get().copied())
        .min();
    Ok(Summary {
        backend: vm.backend.clone(),
        memory: vm.config.memory,
        hugepages: vm.config.hugepages,
        elapsed: end.elapsed,
        to_first_exit: since(first_exit),
        to_first_done: since(watch.first_done),
        before: Mapped::from_sample(vm.vm_stats.schema(), &before.vm),
        after: Mapped::from_sample(vm.vm_stats.schema(), &after.vm),
        vcpus,
        signal: watch.signal,
        quit: watch.quit,
        migrated: end.migrated,
        stuck: end.stuck,
        warnings: end.warnings,
        boot_timeout: boot_timeout(vm, watch, end.boot_limit),
    })
}

#[cfg(test)]
#[path = "run_tests.rs"]
mod tests;
