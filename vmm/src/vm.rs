//! The VM: KVM handles, guest RAM, vCPU threads and their stats fds, and the
//! orderly start and stop of it all.

use std::path::PathBuf;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kvm_bindings::KVM_MAX_CPUID_ENTRIES;
use kvm_ioctls::{Kvm, VmFd};
use kvm_stats::StatsFd;
use vm_memory::GuestMemoryBackend as _;
use vmm_sys_util::signal::Killable;

use crate::abi;
use crate::backend::{self, Backend};
use crate::boot;
use crate::dirty::{self, DirtyLog, DirtyMode};
use crate::exits::Bus;
use crate::kick;
use crate::memory::{self, GuestMemory};
use crate::messages::VmEvent;
use crate::vcpu::snapshot::Snapshot;
use crate::vcpu::{Control, Outcome, Report, Reporter, Vcpu, VcpuError, VcpuShared};
use crate::workload::Command;
use crate::x86_64::{paging, regs};

/// Everything needed to build a VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmConfig {
    /// Bytes of guest RAM.
    pub memory: u64,
    /// Number of vCPUs, from 1 to the smaller of KVM's and the guest ABI's limit.
    pub vcpus: usize,
    /// Back guest RAM with transparent huge pages.
    pub hugepages: bool,
    /// KVM dirty-page tracking on guest RAM: the bitmap or the per-vCPU ring.
    pub dirty_log: Option<DirtyMode>,
    /// An ELF to boot instead of the built-in guest.
    pub guest: Option<PathBuf>,
    /// Use `KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2` for the dirty bitmap where the
    /// kernel offers it (the default); `false` keeps the fallback, whole-slot
    /// protection, so that tests and benchmarks can compare the two.
    pub dirty_manual_protect: bool,
}

impl Default for VmConfig {
    fn default() -> Self {
        VmConfig {
            memory: 256 << 20,
            vcpus: 1,
            hugepages: false,
            dirty_log: None,
            guest: None,
            dirty_manual_protect: true,
        }
    }
}

/// Why the VM could not be built or run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `/dev/kvm` could not be opened (missing, or no permission).
    #[error("opening /dev/kvm")]
    OpenKvm(#[source] kvm_ioctls::Error),
    /// The kernel lacks `KVM_CAP_BINARY_STATS_FD` (before Linux 5.14).
    #[error("this kernel has no KVM binary stats (KVM_CAP_BINARY_STATS_FD)")]
    NoBinaryStats,
    /// `KVM_CREATE_VM` failed.
    #[error("creating the VM")]
    CreateVm(#[source] kvm_ioctls::Error),
    /// The vCPU count is 0 or over the limit.
    #[error("{requested} vCPUs requested; this host and the guest ABI allow 1 to {max}")]
    VcpuCount {
        /// The count asked for.
        requested: usize,
        /// The smaller of KVM's maximum and the guest ABI's.
        max: usize,
    },
    /// Guest RAM could not be mapped.
    #[error("setting up guest memory")]
    Memory(#[from] memory::Error),
    /// The `--guest` ELF could not be read (path given).
    #[error("reading the guest image {0}")]
    ReadGuest(PathBuf, #[source] std::io::Error),
    /// The `--guest` path is a directory, device or the like.
    #[error("the guest image {0} is not a regular file")]
    GuestNotAFile(PathBuf),
    /// The `--guest` file is over the size limit; refused before reading it.
    #[error("the guest image {path} is {size} bytes, over the {max}-byte limit")]
    GuestTooLarge {
        /// The image's path.
        path: PathBuf,
        /// Its size in bytes.
        size: u64,
        /// The limit in bytes.
        max: u64,
    },
    /// Loading the guest or writing its boot structures failed.
    #[error("booting the guest")]
    Boot(#[from] boot::Error),
    /// `KVM_SET_USER_MEMORY_REGION` failed.
    #[error("registering guest memory with KVM")]
    SetMemory(#[source] kvm_ioctls::Error),
    /// `KVM_GET_SUPPORTED_CPUID` failed.
    #[error("reading the supported CPUID")]
    Cpuid(#[source] kvm_ioctls::Error),
    /// `KVM_CREATE_VCPU` failed (vCPU index given).
    #[error("creating vCPU {0}")]
    CreateVcpu(usize, #[source] kvm_ioctls::Error),
    /// Setting a new vCPU's CPUID, registers or MSRs failed (vCPU index given).
    #[error("setting up vCPU {0}")]
    SetupVcpu(usize, #[source] regs::Error),
    /// `KVM_GET_STATS_FD` failed on the VM or a vCPU.
    #[error("opening a stats fd")]
    StatsFd(#[from] kvm_stats::ioctl::Error),
    /// A stats fd's header or descriptors could not be read.
    #[error("reading a stats fd")]
    Stats(#[from] kvm_stats::Error),
    /// The no-op handler for the kick signal could not be installed.
    #[error("installing the vCPU kick signal handler")]
    Signal(#[source] vmm_sys_util::errno::Error),
    /// `dup` of the VM fd failed.
    #[error("duplicating the VM fd")]
    DupVm(#[source] std::io::Error),
    /// `dup` of a vCPU fd failed (vCPU index given).
    #[error("duplicating the vCPU {0} fd")]
    DupVcpu(usize, #[source] std::io::Error),
    /// Turning on the dirty bitmap or ring failed.
    #[error("setting up dirty tracking")]
    Dirty(#[from] dirty::Error),
    /// KVM refused a migrated vCPU's state (the error, as text).
    #[error("{0}")]
    Restore(String),
    /// A `vcpu<N>` thread could not be spawned (vCPU index given).
    #[error("starting the vCPU {0} thread")]
    Spawn(usize, #[source] std::io::Error),
}

/// The VMM's grip on one vCPU thread.
pub struct VcpuHandle {
    /// The state the VMM shares with the thread: its control inbox, queue and counters.
    pub shared: Arc<VcpuShared>,
    thread: Option<JoinHandle<()>>,
    outcome: Option<Outcome>,
}

impl VcpuHandle {
    /// Records a control request and kicks the thread out of KVM_RUN (see `kick`).
    pub(crate) fn control(&self, c: Control) {
        self.shared.set_control(c);
        self.kick();
    }

    /// Kicks the thread out of KVM_RUN with no request: a throttled vCPU then
    /// takes its sleep (`vcpu::throttle`, `vcpu::dirty_limit`).
    fn kick(&self) {
        if let (Some(t), None) = (&self.thread, &self.outcome) {
            // ESRCH only if the thread already ended, which is fine.
            let _ = t.kill(kick::kick_signal());
            // A throttled or limited vCPU asleep between steps wakes at once.
            t.thread().unpark();
        }
    }

    /// How the thread ended, once it has.
    pub fn outcome(&self) -> Option<&Outcome> {
        self.outcome.as_ref()
    }
}

/// A VM with its vCPUs (threads started by [`Vm::start`]).
pub struct Vm {
    /// The host's KVM backend, detected when the VM was built.
    pub(crate) backend: Backend,
    /// What the VM was built from.
    pub(crate) config: VmConfig,
    /// Guest RAM, mapped in this process.
    pub(crate) mem: GuestMemory,
    /// The VM's stats fd, opened once at build time.
    pub(crate) vm_stats: StatsFd,
    /// Each vCPU's stats fd, by index, opened once at build time.
    pub(crate) vcpu_stats: Vec<StatsFd>,
    /// Duplicates of the vCPU fds (their threads own the originals), for making
    /// fresh stats fds; never handed out.
    pub(crate) vcpu_fds: Vec<std::fs::File>,
    /// The VMM's handle on each vCPU thread, by index.
    pub(crate) vcpus: Vec<VcpuHandle>,
    /// Dirty tracking: the mode configured at start, or bitmap logging turned
    /// on at run time while a consumer (a migration) holds it.
    pub(crate) dirty: Arc<DirtyLog>,
    /// The vCPUs' dirty page rate limits (a ring VM's).
    pub(crate) dirty_limits: Arc<crate::vcpu::limits::Limits>,
    unstarted: Vec<Vcpu>,
    events_tx: Sender<VmEvent>,
    events: Receiver<VmEvent>,
    /// The KVM VM fd, shared with the dirty-log service.
    // Dropped last: the VM fd outlives everything that refers to the VM.
    pub(crate) fd: Arc<VmFd>,
    _kvm: Kvm,
}

impl Vm {
    /// What the VM was built from.
    pub fn config(&self) -> &VmConfig {
        &self.config
    }

    /// The VM's stats fd, opened once at build time.
    pub fn vm_stats(&self) -> &StatsFd {
        &self.vm_stats
    }

    /// The vCPU fds' duplicates, by index, for making fresh stats fds.
    pub fn vcpu_fds(&self) -> &[std::fs::File] {
        &self.vcpu_fds
    }

    /// The VMM's handle on each vCPU thread, by index (empty until [`Vm::start`]).
    pub fn vcpus(&self) -> &[VcpuHandle] {
        &self.vcpus
    }

    /// The dirty-tracking service.
    pub fn dirty(&self) -> &Arc<DirtyLog> {
        &self.dirty
    }

    /// Builds the VM and its vCPUs, ready to [`start`](Vm::start).
    ///
    /// # Errors
    /// The step that failed.
    pub fn new(config: VmConfig) -> Result<Vm, Error> {
        kick::install().map_err(Error::Signal)?;
        let started = Instant::now();
        let kvm = open_kvm(config.vcpus)?;
        let fd = kvm.create_vm().map_err(Error::CreateVm)?;
        let created = started.elapsed();
        let mem = memory::create(config.memory, config.hugepages)?;
        let allocated = started.elapsed();
        let entry = load_image(&mem, config.guest.as_deref())?;
        boot::write_boot_structures(&mem)?;
        let loaded = started.elapsed();
        // Manual protect is for the bitmap, and must precede the slot so that
        // its bitmap starts all set rather than the slot write-protected.
        let protection = match config.dirty_log {
            Some(DirtyMode::Ring(_)) => dirty::Protection::Whole,
            _ => dirty::protect::enable(&fd, config.dirty_manual_protect),
        };
        // Only a bitmap VM logs from boot; a ring VM logs while observed.
        register_memory(&fd, &mem, config.dirty_log == Some(DirtyMode::Bitmap))?;
        let registered = started.elapsed();
        if let Some(DirtyMode::Ring(entries)) = config.dirty_log {
            // Before any vCPU exists, as KVM requires.
            dirty::enable_ring(&fd, entries)?;
        }
        let ring = started.elapsed();
        let vm_stats = StatsFd::new(kvm_stats::ioctl::get_stats_fd(&fd)?)?;
        let (events_tx, events) = channel();
        let cpuid = kvm
            .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
            .map_err(Error::Cpuid)?;
        let setup = VcpuSetup {
            vm: &fd,
            mem: &mem,
            cpuid: &cpuid,
            entry,
            memory: config.memory,
            events: &events_tx,
        };
        let cpuid_at = started.elapsed();
        let built = (0..config.vcpus)
            .map(|i| setup.build(i))
            .collect::<Result<Vec<_>, _>>()?;
        log::debug!(
            "vm: KVM VM created in {created:?}, guest RAM at {allocated:?}, guest image at {loaded:?}, memory registered at {registered:?}, dirty ring at {ring:?}, stats and CPUID at {cpuid_at:?}, vCPUs built at {:?}",
            started.elapsed()
        );
        let (mut vcpu_fds, mut parts) = (Vec::new(), Vec::new());
        for b in built {
            vcpu_fds.push(b.fd_dup);
            parts.push((b.vcpu, b.stats));
        }
        let fd = Arc::new(fd);
        let dirty = DirtyLog::new(config.dirty_log, protection, fd.clone(), &mem, &vcpu_fds)?;
        let (mut unstarted, mut vcpus, mut vcpu_stats) = (Vec::new(), Vec::new(), Vec::new());
        for (mut vcpu, stats) in parts {
            vcpu.dirty = Some(dirty.clone());
            vcpus.push(VcpuHandle {
                shared: vcpu.shared.clone(),
                thread: None,
                outcome: None,
            });
            // A second fd on the same stats, read for the guest's stall.
            if let Some(counter) = stats
                .file()
                .try_clone()
                .ok()
                .and_then(|f| StatsFd::new(f).ok())
                .and_then(crate::vcpu::faults::FaultCounter::new)
            {
                let _ = vcpu.shared.faults.set(counter);
            }
            let counter = crate::vcpu::progress::Counter::new(mem.clone(), vcpu.shared.index);
            let _ = vcpu.shared.progress.set(counter);
            vcpu_stats.push(stats);
            unstarted.push(vcpu);
        }
        let throttled = events_tx.clone();
        let dirty_limits = Arc::new(crate::vcpu::limits::Limits::new(
            vcpus.iter().map(|v| v.shared.clone()).collect(),
            dirty.clone(),
            Box::new(move || {
                let _ = throttled.send(VmEvent::Throttled);
            }),
        ));
        Ok(Vm {
            dirty,
            dirty_limits,
            backend: backend::detect(),
            config,
            mem,
            vm_stats,
            vcpu_stats,
            vcpu_fds,
            vcpus,
            unstarted,
            events_tx,
            events,
            fd,
            _kvm: kvm,
        })
    }

    /// Starts one thread per vCPU, named `vcpu<N>`.
    ///
    /// # Errors
    /// `Spawn` if a thread cannot be started (those already started keep running).
    pub fn start(&mut self) -> Result<(), Error> {
        self.start_as("vcpu")
    }

    /// [`Vm::start`], the threads named `<prefix><N>` (a VM the VMM runs for
    /// itself beside the guest's, so that tools looking for `vcpu0` under
    /// `/proc` find the guest's).
    pub(crate) fn start_as(&mut self, prefix: &str) -> Result<(), Error> {
        for vcpu in std::mem::take(&mut self.unstarted) {
            let i = vcpu.shared.index;
            let report = vcpu.report.clone();
            let shared = vcpu.shared.clone();
            let thread = std::thread::Builder::new()
                .name(format!("{prefix}{i}"))
                .spawn(move || {
                    // A bug that panics must still end the run in order, not hang it.
                    let run = std::panic::AssertUnwindSafe(|| vcpu.run());
                    let outcome = std::panic::catch_unwind(run).unwrap_or_else(|_| {
                        let outcome = Outcome::Error(VcpuError::Panicked);
                        shared.mark_finished(&outcome);
                        outcome
                    });
                    report(Report::Finished(outcome));
                })
                .map_err(|e| Error::Spawn(i, e))?;
            self.vcpus[i].thread = Some(thread);
        }
        Ok(())
    }

    /// A sender for events that do not come from vCPUs (signals, the control plane).
    pub(crate) fn event_sender(&self) -> Sender<VmEvent> {
        self.events_tx.clone()
    }

    /// Queues commands on vCPU `index`, unless that would leave more than
    /// [`crate::vcpu::MAX_QUEUED_COMMANDS`] waiting on it (then none);
    /// `None` where there is no such vCPU.
    pub fn push_commands(
        &self,
        index: usize,
        commands: Vec<Command>,
    ) -> Option<Result<u64, crate::vcpu::QueueFull>> {
        self.vcpus
            .get(index)
            .map(|v| v.shared.push_commands(commands))
    }

    /// The next event, or `None` after `timeout`. Records vCPU outcomes as they arrive.
    pub fn next_event(&mut self, timeout: Duration) -> Option<VmEvent> {
        match self.events.recv_timeout(timeout) {
            Ok(VmEvent::Finished(i, outcome)) => {
                if let Some(v) = self.vcpus.get_mut(i) {
                    v.outcome = Some(outcome.clone());
                }
                Some(VmEvent::Finished(i, outcome))
            }
            Ok(event) => Some(event),
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => None,
        }
    }

    /// Whether any vCPU is throttled (auto-converge) or dirty-limited.
    pub(crate) fn throttled(&self) -> bool {
        self.vcpus.iter().any(|v| v.shared.throttled())
    }

    /// Kicks every throttled or dirty-limited vCPU out of KVM_RUN, so that it
    /// sleeps its share or counts its pages (the main loop does this every
    /// `vcpu::throttle::TIMESLICE`); a quiet dirty-limited one only when it
    /// has dirtied half its burst or a period has passed.
    pub(crate) fn kick_throttled(&self) {
        for (i, v) in self.vcpus.iter().enumerate() {
            let s = &v.shared;
            if !s.throttled() {
                continue;
            }
            // A quiet dirty-limited vCPU (`vcpu::dirty_limit`) is counted
            // here, not kicked, until it has something to look at.
            if s.throttle.percentage() > 0
                || s.dirty_limit
                    .wake_due(|| self.dirty.try_ring_entries_now(i))
            {
                v.kick();
            }
        }
    }

    /// Tells every vCPU to pause (`Control::Pause`) or resume (`Control::Run`).
    pub fn control_all(&self, c: Control) {
        for v in &self.vcpus {
            v.control(c);
        }
    }

    /// Stops every vCPU and joins the threads, waiting at most `timeout`.
    /// Returns the indexes of vCPUs that did not stop in time (left detached).
    pub fn stop(&mut self, timeout: Duration) -> Vec<usize> {
        self.control_all(Control::Stop);
        let deadline = Instant::now() + timeout;
        while self
            .vcpus
            .iter()
            .any(|v| v.thread.is_some() && v.outcome.is_none())
        {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || self.next_event(left).is_none() && Instant::now() >= deadline {
                break;
            }
        }
        let mut stuck = Vec::new();
        for (i, v) in self.vcpus.iter_mut().enumerate() {
            match (v.thread.take(), v.outcome.is_some()) {
                (Some(t), true) => {
                    let _ = t.join();
                }
                (Some(_), false) => stuck.push(i),
                (None, _) => {}
            }
        }
        stuck
    }

    /// A duplicate of the VM fd, for opening more stats fds.
    ///
    /// # Errors
    /// `DupVm` if the fd cannot be duplicated.
    pub fn fd_file(&self) -> Result<std::fs::File, Error> {
        dup_fd(&*self.fd).map_err(Error::DupVm)
    }

    /// Dirty tracking, when the VM was started with a mode (`--dirty-log`).
    pub fn dirty_configured(&self) -> Option<&Arc<DirtyLog>> {
        self.dirty.configured().map(|_| &self.dirty)
    }

    /// Loads migrated vCPU state (`snapshots[i]` into vCPU `i`) before
    /// [`start`](Vm::start).
    ///
    /// # Errors
    /// `Restore` if the vCPUs have started or KVM refuses the state.
    pub(crate) fn restore_vcpus(&mut self, snapshots: &[Snapshot]) -> Result<(), Error> {
        if self.unstarted.len() != snapshots.len() {
            return Err(Error::Restore(format!(
                "{} snapshots for {} unstarted vCPUs",
                snapshots.len(),
                self.unstarted.len()
            )));
        }
        for (vcpu, s) in self.unstarted.iter_mut().zip(snapshots) {
            let refused = vcpu
                .restore(s)
                .map_err(|e| Error::Restore(crate::error_chain(&e)))?;
            if !refused.is_empty() {
                log::info!("vcpu{}: KVM refused MSRs {refused:x?}", s.index);
            }
        }
        Ok(())
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        if self.vcpus.iter().any(|v| v.thread.is_some()) {
            self.stop(Duration::from_secs(1));
        }
    }
}

fn register_memory(fd: &VmFd, mem: &GuestMemory, dirty_log: bool) -> Result<(), Error> {
    for (slot, region) in mem.iter().enumerate() {
        let region = dirty::slot_region(slot, region, dirty_log);
        // SAFETY: the region is a live mapping of `mem`; it is unmapped only when the
        // last `GuestMemory` clone goes, and every vCPU holds one, so no vCPU can run
        // on an unmapped slot.
        unsafe { fd.set_user_memory_region(region) }.map_err(Error::SetMemory)?;
    }
    Ok(())
}

/// Opens /dev/kvm and checks what this VMM needs of it for `vcpus` vCPUs.
fn open_kvm(vcpus: usize) -> Result<Kvm, Error> {
    let kvm = Kvm::new().map_err(Error::OpenKvm)?;
    if kvm.check_extension_raw(u64::from(kvm_bindings::KVM_CAP_BINARY_STATS_FD)) <= 0 {
        return Err(Error::NoBinaryStats);
    }
    let max = kvm
        .get_max_vcpus()
        .min(usize::try_from(abi::MAX_VCPUS).unwrap_or(usize::MAX));
    if vcpus == 0 || vcpus > max {
        return Err(Error::VcpuCount {
            requested: vcpus,
            max,
        });
    }
    Ok(kvm)
}

/// Largest guest image file read (the image itself is at most 2 MiB; the
/// rest allows for symbols and debug info).
pub(crate) const MAX_GUEST_FILE: u64 = 64 << 20;

/// Loads the guest (`path`, or the built-in one); returns its entry point.
fn load_image(mem: &GuestMemory, path: Option<&std::path::Path>) -> Result<u64, Error> {
    let image = match path {
        Some(path) => read_guest(path)?,
        None => boot::DEFAULT_GUEST.to_vec(),
    };
    Ok(boot::load_guest(mem, &image)?)
}

/// Reads a guest image file. It is opened non-blocking and checked to be a
/// regular file before anything is read, so a FIFO or a device is refused at
/// once instead of blocking (opening a FIFO waits for a writer) or reading
/// for ever.
fn read_guest(path: &std::path::Path) -> Result<Vec<u8>, Error> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let failed = |e| Error::ReadGuest(path.to_path_buf(), e);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(failed)?;
    let meta = file.metadata().map_err(failed)?;
    if !meta.is_file() {
        return Err(Error::GuestNotAFile(path.to_path_buf()));
    }
    if meta.len() > MAX_GUEST_FILE {
        return Err(Error::GuestTooLarge {
            path: path.to_path_buf(),
            size: meta.len(),
            max: MAX_GUEST_FILE,
        });
    }
    let mut image = Vec::new();
    file.take(MAX_GUEST_FILE)
        .read_to_end(&mut image)
        .map_err(failed)?;
    Ok(image)
}

/// What every vCPU is built from.
struct VcpuSetup<'a> {
    vm: &'a VmFd,
    mem: &'a GuestMemory,
    cpuid: &'a kvm_bindings::CpuId,
    entry: u64,
    memory: u64,
    events: &'a Sender<VmEvent>,
}

/// A vCPU ready to start, with its stats fd and a duplicate of its fd.
struct BuiltVcpu {
    vcpu: Vcpu,
    stats: StatsFd,
    fd_dup: std::fs::File,
}

impl VcpuSetup<'_> {
    /// Creates vCPU `i` in the state the guest ABI promises, with its mailbox
    /// and its stats fd (opened now: KVM_GET_STATS_FD on a vCPU fd waits while
    /// the vCPU runs, so it is never issued later).
    fn build(&self, i: usize) -> Result<BuiltVcpu, Error> {
        let vfd = self
            .vm
            .create_vcpu(i as u64)
            .map_err(|e| Error::CreateVcpu(i, e))?;
        regs::setup(&vfd, self.cpuid, self.entry, i as u64).map_err(|e| Error::SetupVcpu(i, e))?;
        let tsc_khz = vfd
            .get_tsc_khz()
            .map(u64::from)
            .unwrap_or_else(|_| host_tsc_khz());
        boot::write_mailbox_boot(self.mem, i as u64, tsc_khz)?;
        let stats = StatsFd::new(kvm_stats::ioctl::get_stats_fd(&vfd)?)?;
        let fd_dup = dup_fd(&vfd).map_err(|e| Error::DupVcpu(i, e))?;
        let shared = Arc::new(VcpuShared::new(i));
        let bus = Bus::new(paging::mmio_addr(self.memory));
        let events = self.events.clone();
        let report: Reporter = Arc::new(move |r| {
            // The main loop has gone only when the VM is being torn down.
            let _ = events.send(VmEvent::from_vcpu(i, r));
        });
        let vcpu = Vcpu::new(
            vfd,
            self.mem.clone(),
            bus,
            boot::arena_size(self.memory),
            shared,
            report,
        );
        Ok(BuiltVcpu {
            vcpu,
            stats,
            fd_dup,
        })
    }
}

/// A close-on-exec duplicate of `fd`.
pub(crate) fn dup_fd(fd: &impl std::os::fd::AsRawFd) -> std::io::Result<std::fs::File> {
    // SAFETY: `fd` is a live descriptor, owned by the argument for this whole call.
    let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd.as_raw_fd()) };
    Ok(std::fs::File::from(borrowed.try_clone_to_owned()?))
}

/// TSC frequency from the host, for when KVM_GET_TSC_KHZ is not available.
fn host_tsc_khz() -> u64 {
    std::fs::read_to_string("/sys/devices/system/cpu/cpu0/tsc_freq_khz")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1_000_000)
}
