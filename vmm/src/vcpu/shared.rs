//! The part of a vCPU that other threads share: its inbox of commands and
//! control requests, its state and results, its exit counters and phase.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use vmm_sys_util::eventfd::EventFd;

use super::registers::Registers;
use crate::exits::{ExitCounters, Fault};
use crate::workload::Command;

/// Results kept per vCPU for `query-guest` and summaries.
pub(crate) const RESULTS_KEPT: usize = 256;

/// A queued command's JSON beyond its spec: its quotes and comma.
const QUEUED_JSON_BYTES: usize = 3;

/// A kept result's JSON beyond its command and status: the field names,
/// sequence number, values and host time (measured on typical results;
/// `parked`'s test holds it to the encoded section).
const RESULT_JSON_BYTES: usize = 96;

/// Commands that may wait on one vCPU, however they came (control clients
/// together, `--workload`, a migration's stream): about 64 bytes each in
/// memory, 2 MiB a vCPU. A client sending commands faster than the guest
/// runs them would otherwise grow the VMM's memory without end. A full
/// queue of the longest commands still fits a migration's vCPU section
/// (`migration::format::MAX_VCPU_SECTION`, 4 MiB: the queue travels as
/// text), which the destination would otherwise refuse at the stop.
pub const MAX_QUEUED_COMMANDS: usize = 32_768;

/// Commands refused because the vCPU's queue would pass
/// [`MAX_QUEUED_COMMANDS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("vCPU {vcpu} has {queued} commands queued and at most {MAX_QUEUED_COMMANDS} may wait: send more as these finish")]
pub struct QueueFull {
    /// The vCPU.
    pub vcpu: usize,
    /// Commands waiting on it.
    pub queued: usize,
}

/// What the VMM asks of a vCPU thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// Run the guest (the default, and what `resume` asks for).
    Run,
    /// Park in the VMM at the next chance; the guest does not run.
    Pause,
    /// End the thread; final (a later `Run` or `Pause` does not undo it).
    Stop,
}

/// What a vCPU is doing, as others see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VcpuState {
    /// Started, before the guest asked for its first command.
    Booting,
    /// Running command `seq`, shown as a spec.
    Running {
        /// The command's sequence number on this vCPU.
        seq: u64,
        /// The command, as a workload spec.
        command: String,
    },
    /// In the VMM, waiting for a command (or in a `wait`); no guest code runs.
    Waiting,
    /// Parked by a pause; no guest code runs.
    Paused,
    /// The thread ended, and how.
    Finished(Outcome),
}

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandResult {
    /// The command's sequence number on this vCPU (what `guest-command` returned).
    pub(crate) seq: u64,
    /// The command, as a spec.
    pub command: String,
    /// `ok`, or what went wrong.
    pub status: String,
    /// The guest's result words (meaning per command, see docs/GUEST_ABI.md).
    pub values: [u64; 3],
    /// Host time from handing the command over to its completion.
    pub host_time: Duration,
}

/// How a vCPU thread ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Told to stop.
    Stopped,
    /// The guest reported a panic.
    GuestPanic {
        /// The guest's panic message.
        message: String,
        /// The vCPU's registers when it panicked.
        registers: Registers,
    },
    /// The guest cannot go on.
    Fault {
        /// What the guest did.
        fault: Fault,
        /// The vCPU's registers at the fault.
        registers: Registers,
    },
    /// The VMM failed the vCPU.
    Error(VcpuError),
}

/// The short form, without registers: `stopped`, `guest panic: MESSAGE`,
/// `fault: FAULT`, `error: WHAT: WHY`.
impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Stopped => f.write_str("stopped"),
            Outcome::GuestPanic { message, .. } => write!(f, "guest panic: {message}"),
            Outcome::Fault { fault, .. } => write!(f, "fault: {fault}"),
            Outcome::Error(e) => write!(f, "error: {}", crate::error_chain(e)),
        }
    }
}

/// What went wrong on the VMM's side of a vCPU thread. Sources are shared
/// (`Arc`) so that the outcome can be cloned to everyone who asks for it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum VcpuError {
    /// `KVM_RUN` returned an error other than EINTR.
    #[error("KVM_RUN failed")]
    Run(#[source] kvm_ioctls::Error),
    /// Collecting the vCPU's dirty ring after a ring-full exit failed.
    #[error("harvesting the dirty ring")]
    HarvestDirtyRing(#[source] Arc<crate::dirty::Error>),
    /// KVM reported a full dirty ring on a VM without one.
    #[error("the dirty ring is full, but no dirty ring is set up")]
    NoDirtyRing,
    /// Writing the next command into the guest's mailbox failed.
    #[error("writing the command to the mailbox")]
    WriteMailbox(#[source] Arc<vm_memory::GuestMemoryError>),
    /// The thread panicked (caught by `catch_unwind` around its run loop).
    #[error("the vCPU thread panicked")]
    Panicked,
}

/// The same failure: the same variant with the same message chain (the
/// sources themselves compare by nothing).
impl PartialEq for VcpuError {
    fn eq(&self, other: &Self) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(other)
            && crate::error_chain(self) == crate::error_chain(other)
    }
}

impl Eq for VcpuError {}

pub(super) struct Inbox {
    /// Commands queued and not started, each with its spec's length; change
    /// it through `Inbox`'s methods, which keep `queued_text`.
    queue: VecDeque<(Command, usize)>,
    /// The queued commands' specs' bytes together.
    queued_text: usize,
    pub(super) control: Control,
    pub(super) state: VcpuState,
    pub(super) results: VecDeque<CommandResult>,
    pub(super) next_seq: u64,
    /// A migration asks the parked thread for its state.
    pub(super) snapshot: Option<super::snapshot::SnapshotRequest>,
}

impl Inbox {
    /// The commands queued and not started, oldest first.
    pub(super) fn queue(&self) -> impl ExactSizeIterator<Item = &Command> {
        self.queue.iter().map(|(c, _)| c)
    }

    /// Whether a command waits.
    pub(super) fn has_queued(&self) -> bool {
        !self.queue.is_empty()
    }

    /// Takes the oldest queued command.
    pub(super) fn pop_command(&mut self) -> Option<Command> {
        let (c, len) = self.queue.pop_front()?;
        self.queued_text -= len;
        Some(c)
    }

    /// Queues commands with their specs' lengths ([`with_spec_lens`]).
    fn push(&mut self, commands: Vec<(Command, usize)>) {
        self.queued_text += commands.iter().map(|(_, len)| len).sum::<usize>();
        self.queue.extend(commands);
    }

    /// Replaces the queue (a migrated vCPU's), with its specs' lengths.
    pub(super) fn set_queue(&mut self, queue: VecDeque<(Command, usize)>) {
        self.queued_text = queue.iter().map(|(_, len)| len).sum();
        self.queue = queue;
    }
}

/// Each command with the length of its spec, formatted once per run of
/// equal commands ([`map_runs`]).
pub(super) fn with_spec_lens(commands: Vec<Command>) -> Vec<(Command, usize)> {
    let lens = map_runs(commands.iter(), |c| Ok::<_, Infallible>(c.spec_len()))
        .unwrap_or_else(|e| match e {});
    commands.into_iter().zip(lens).collect()
}

/// `items` mapped by `f`, each run of equal items mapped once and cloned:
/// a queue is often thousands of copies of one command, and formatting or
/// parsing each (in a migration's stop, on both sides) added about 9 ms of
/// downtime per vCPU for 20,000 of them.
pub(super) fn map_runs<T: PartialEq, U: Clone, E>(
    items: impl Iterator<Item = T>,
    mut f: impl FnMut(&T) -> Result<U, E>,
) -> Result<Vec<U>, E> {
    let mut out: Vec<U> = Vec::with_capacity(items.size_hint().0);
    let mut last: Option<T> = None;
    for item in items {
        match (&last, out.last()) {
            (Some(prev), Some(done)) if *prev == item => out.push(done.clone()),
            _ => {
                out.push(f(&item)?);
                last = Some(item);
            }
        }
    }
    Ok(out)
}

/// The part of a vCPU other threads may touch.
pub struct VcpuShared {
    /// The vCPU's index.
    pub(crate) index: usize,
    /// Our own exit counters.
    pub counters: ExitCounters,
    /// Latest phase marker the guest reported.
    pub(crate) phase: AtomicU64,
    /// The kernel thread id of the vCPU's thread, once it runs (for /proc lookups).
    pub tid: OnceLock<i32>,
    /// When the guest first wrote to a port (it checked in: `--boot-timeout`).
    pub(crate) first_exit: OnceLock<Instant>,
    /// The registers of a vCPU stopped before its guest checked in (no first
    /// exit), as its thread read them on the way out: for boot-timeout reports.
    pub(crate) boot_registers: OnceLock<Registers>,
    /// The command the vCPU was running when its thread ended (sequence
    /// number and spec), for the run's summary.
    pub(crate) interrupted: OnceLock<(u64, String)>,
    /// Written when a result is recorded and when the thread ends, so that the
    /// control plane can wait for results in its event loop (set by it).
    pub(crate) watcher: OnceLock<Arc<EventFd>>,
    pub(super) inbox: Mutex<Inbox>,
    pub(super) wake: Condvar,
    /// A control request (pause/stop) waits in the inbox.
    pub(super) pending: AtomicBool,
    /// The vCPU's `pf_taken`, read for the guest's stall ([`super::stall`]);
    /// set by the VM once its stats fd is open.
    pub(crate) faults: OnceLock<super::faults::FaultCounter>,
    /// Nanoseconds the vCPU thread has spent harvesting its full dirty ring
    /// while the guest waited.
    /// Time the vCPU thread has spent parked by a pause (a user's `stop`,
    /// a migration's stop, a scan's hold), ns: time its guest did not run,
    /// which the guest's stall does not take its usual rates over.
    pub(crate) parked_ns: AtomicU64,
    pub(crate) ring_full_ns: AtomicU64,
    /// The guest's stall over every observation that has ended, ns.
    pub(crate) stall_ns: AtomicU64,
    /// The most `stall::shown_ns` has shown.
    pub(crate) stall_shown_ns: AtomicU64,
    /// Where the observations still open started on this vCPU (kept by
    /// `stall`, so that a stall so far can be read at any moment).
    pub(crate) open_stalls: Mutex<Vec<OpenObservation>>,
    /// When the last observation of the guest (a window, a migration) ended.
    pub(crate) observed_until: Mutex<Option<Instant>>,
    /// The vCPU's counts, read every 100 ms over the last seconds
    /// (`stall::note_usual`): its usual rates, for an observation that takes
    /// no baseline of its own (a readiness window, a standalone dirty limit).
    pub(crate) usual: Mutex<VecDeque<Reading>>,
    /// The usual rates last taken from those readings with nothing observed
    /// (`stall::note_usual`): for an observation too soon after another to
    /// have readings of its own.
    pub(crate) last_usual: Mutex<Option<Rates>>,
    /// Its CPU throttle (auto-converge), 0 % unless a migration sets one.
    /// Its time slept counts the dirty limit's sleeps too.
    pub throttle: super::throttle::Throttle,
    /// Its dirty page rate limit (`set-vcpu-dirty-limit`, `dirty-limit`).
    pub dirty_limit: super::dirty_limit::DirtyLimit,
    /// Where its guest counts its own work ([`super::progress`]); set by the VM.
    pub(crate) progress: OnceLock<super::progress::Counter>,
    /// That count's rate over the last second, units/s as `f64` bits (NaN:
    /// not known yet); kept by the `vmm-stats` thread.
    progress_rate: AtomicU64,
}

/// A vCPU's counts at a moment, as `stall` reads them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reading {
    pub(super) at: Instant,
    /// `pf_taken`.
    pub(super) faults: u64,
    /// Time spent in ring-full exits, ns.
    pub(super) ring_ns: u64,
    /// The vCPU thread's system time, ns (`None`: `/proc` unreadable).
    pub(super) system_ns: Option<u64>,
    /// The time the vCPU thread has waited for a CPU while runnable
    /// (schedstat's run delay), ns (`None`: `/proc` unreadable).
    pub(super) wait_ns: Option<u64>,
    /// The time the vCPU thread has run on a CPU (schedstat's first
    /// field), ns (`None`: `/proc` unreadable).
    pub(super) on_cpu_ns: Option<u64>,
    /// Time asleep for a throttle or a dirty limit and parked by a pause
    /// so far, ns: time the guest did not run.
    pub(super) asleep_ns: u64,
    /// The cost per fault in force then, ns: what the faults counted up to
    /// this reading are priced at. A calibration that ends during an
    /// observation reprices all of its faults (the default, 2.6 us, was a
    /// tenth of a 2-core Intel host's cost: a migration started in a VMM's
    /// first seconds reported 0.17 s of a 2 s loss); a running figure then
    /// jumps once, and never falls (`shown_ns`).
    pub(super) fault_ns: u64,
}

/// A vCPU's rates before an observation: what it would have done anyway.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Rates {
    /// `pf_taken` per second.
    pub(super) faults: f64,
    /// System time, ns per second.
    pub(super) system_ns: f64,
    /// Time waiting for a CPU as a share of the time the thread could run
    /// (on a CPU or waiting for one; not a share of the time that passed:
    /// a vCPU whose guest had nothing to do waited for nothing, and would
    /// have read as never waiting before it began to work); `None` without
    /// a baseline or without enough time runnable in it (unlike faults and
    /// system time, a vCPU may wait much of its time whether or not it is
    /// observed, so no rate is not a rate of zero).
    pub(super) wait_share: Option<f64>,
}

/// Where an observation still open (a readiness window, a migration) started
/// on a vCPU: its counts then and their rates before.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OpenObservation {
    /// The observation's number.
    pub(super) period: u64,
    pub(super) start: Reading,
    pub(super) rates: Rates,
    /// `None` while the observation runs; once it ended, until when its
    /// aftermath is counted (the pages it left protected fault once more
    /// when the guest next writes them).
    pub(super) until: Option<Instant>,
}

impl VcpuShared {
    /// The shared part of vCPU `index`: empty inbox, `Run`, `Booting`.
    pub(crate) fn new(index: usize) -> Self {
        let inbox = Inbox {
            queue: VecDeque::new(),
            queued_text: 0,
            control: Control::Run,
            state: VcpuState::Booting,
            results: VecDeque::new(),
            next_seq: 1,
            snapshot: None,
        };
        VcpuShared {
            index,
            counters: ExitCounters::default(),
            phase: AtomicU64::new(0),
            first_exit: OnceLock::new(),
            boot_registers: OnceLock::new(),
            interrupted: OnceLock::new(),
            tid: OnceLock::new(),
            faults: OnceLock::new(),
            ring_full_ns: AtomicU64::new(0),
            parked_ns: AtomicU64::new(0),
            observed_until: Mutex::new(None),
            usual: Mutex::new(VecDeque::new()),
            last_usual: Mutex::new(None),
            stall_ns: AtomicU64::new(0),
            stall_shown_ns: AtomicU64::new(0),
            open_stalls: Mutex::new(Vec::new()),
            throttle: super::throttle::Throttle::default(),
            dirty_limit: super::dirty_limit::DirtyLimit::default(),
            progress: OnceLock::new(),
            progress_rate: AtomicU64::new(f64::NAN.to_bits()),
            watcher: OnceLock::new(),
            inbox: Mutex::new(inbox),
            wake: Condvar::new(),
            pending: AtomicBool::new(false),
        }
    }

    /// KVM's `pf_taken` for this vCPU now, one `pread` (`None`: no counter,
    /// or the read failed): the page faults the guest's stall counts.
    pub(crate) fn page_faults(&self) -> Option<u64> {
        self.faults.get()?.read()
    }

    /// The guest's own count of its work so far (`None`: no counter, or
    /// the guest has not run yet: on a migration's destination the count
    /// is the source's only once the vCPU's state is restored, and a rate
    /// taken across its arrival would be the guest's whole count at once).
    pub(crate) fn guest_progress(&self) -> Option<u64> {
        self.first_exit.get()?;
        self.progress.get()?.read()
    }

    /// That count's rate over the last second, units/s (`None`: not known).
    pub(crate) fn progress_per_second(&self) -> Option<f64> {
        Some(f64::from_bits(self.progress_rate.load(Ordering::Relaxed))).filter(|r| !r.is_nan())
    }

    /// Sets [`VcpuShared::progress_per_second`].
    pub(crate) fn set_progress_per_second(&self, rate: Option<f64>) {
        let bits = rate.unwrap_or(f64::NAN).to_bits();
        self.progress_rate.store(bits, Ordering::Relaxed);
    }

    /// Whether the vCPU must be kicked out of `KVM_RUN` every timeslice: it
    /// is throttled, or its dirty rate limited.
    pub(crate) fn throttled(&self) -> bool {
        self.throttle.percentage() > 0 || self.dirty_limit.limit_mb() > 0
    }

    /// Tells the watcher, if any, that results or the state changed.
    pub(super) fn notify_watcher(&self) {
        if let Some(w) = self.watcher.get() {
            // Fails only when the counter would overflow, which means it is already set.
            let _ = w.write(1);
        }
    }

    /// Records how the vCPU's thread ended and tells whoever waits on it.
    pub(crate) fn mark_finished(&self, outcome: &Outcome) {
        self.lock().state = VcpuState::Finished(outcome.clone());
        self.wake.notify_all();
        self.notify_watcher();
    }

    /// Parks the calling vCPU thread while its control says `Pause`. The state
    /// reads `Paused` exactly while the thread is parked (and `wait_parked` is
    /// told); it gets its old value back, under the same lock, before the thread
    /// does anything else. While parked it hands snapshot requests to `serve`
    /// (without the lock). Returns when the control is `Run` or `Stop`.
    pub(super) fn park<'a>(
        &'a self,
        mut inbox: MutexGuard<'a, Inbox>,
        serve: &mut dyn FnMut(super::snapshot::SnapshotRequest),
    ) -> MutexGuard<'a, Inbox> {
        if inbox.control != Control::Pause {
            return inbox;
        }
        let before = std::mem::replace(&mut inbox.state, VcpuState::Paused);
        let parked = Instant::now();
        self.wake.notify_all();
        while inbox.control == Control::Pause {
            if let Some(request) = inbox.snapshot.take() {
                drop(inbox);
                serve(request);
                inbox = self.lock();
                continue;
            }
            inbox = crate::wait(&self.wake, inbox, None);
        }
        inbox.state = before;
        let ns = crate::units::nanos(parked.elapsed());
        self.parked_ns.fetch_add(ns, Ordering::Relaxed);
        inbox
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Inbox> {
        // A panic elsewhere while holding the lock leaves the inbox consistent
        // (every update is a single assignment), so poisoning is not fatal.
        crate::lock(&self.inbox)
    }

    /// Queues commands unless the queue would then hold more than
    /// [`MAX_QUEUED_COMMANDS`] (then none is queued); the sequence number
    /// the first will get.
    pub(crate) fn push_commands(&self, commands: Vec<Command>) -> Result<u64, QueueFull> {
        // Sized before the lock: the vCPU's next pop does not wait for it.
        let commands = with_spec_lens(commands);
        let mut inbox = self.lock();
        let queued = inbox.queue.len();
        if queued.saturating_add(commands.len()) > MAX_QUEUED_COMMANDS {
            return Err(QueueFull {
                vcpu: self.index,
                queued,
            });
        }
        let first = inbox.next_seq + queued as u64;
        inbox.push(commands);
        self.wake.notify_all();
        Ok(first)
    }

    /// Records a control request. The caller must then kick the thread.
    pub(crate) fn set_control(&self, c: Control) {
        let mut inbox = self.lock();
        if inbox.control != Control::Stop {
            inbox.control = c;
        }
        self.pending.store(true, Ordering::Release);
        self.wake.notify_all();
    }

    /// Asks the vCPU thread for its state; it answers on `request.reply`
    /// while parked (pause it first). A request already waiting is replaced.
    pub(crate) fn request_snapshot(&self, request: super::snapshot::SnapshotRequest) {
        self.lock().snapshot = Some(request);
        self.wake.notify_all();
    }

    /// The vCPU's state.
    pub fn state(&self) -> VcpuState {
        self.lock().state.clone()
    }

    /// Commands queued and not yet started.
    pub(crate) fn queued(&self) -> usize {
        self.lock().queue.len()
    }

    /// What its state section carries beyond an idle vCPU's
    /// (`wire::VCPU_BYTES`), bytes: its queued commands and
    /// kept results as the section's JSON has them, estimated from their
    /// lengths (nothing is formatted; the inbox is held for a walk of at
    /// most [`RESULTS_KEPT`] results).
    pub(crate) fn state_extra_bytes(&self) -> u64 {
        let inbox = self.lock();
        let results: usize = inbox
            .results
            .iter()
            .map(|r| r.command.len() + r.status.len() + RESULT_JSON_BYTES)
            .sum();
        (inbox.queued_text + QUEUED_JSON_BYTES * inbox.queue.len() + results) as u64
    }

    /// The most recent results, oldest first.
    pub fn results(&self) -> Vec<CommandResult> {
        self.lock().results.iter().cloned().collect()
    }
}

/// Waits until no vCPU runs guest code (each paused or finished), for at most
/// `timeout`; true if they all are. Request the pause first.
pub(crate) fn wait_parked(vcpus: &[Arc<VcpuShared>], timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    for v in vcpus {
        let mut inbox = v.lock();
        while !matches!(inbox.state, VcpuState::Paused | VcpuState::Finished(_)) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            inbox = crate::wait(&v.wake, inbox, Some(left));
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registers() -> Registers {
        Registers {
            general: Ok(Default::default()),
            control: Ok(Default::default()),
        }
    }

    #[test]
    fn an_outcome_displays_its_short_form_without_registers() {
        let panic = Outcome::GuestPanic {
            message: "oops".into(),
            registers: registers(),
        };
        assert_eq!(panic.to_string(), "guest panic: oops");
        let fault = Outcome::Fault {
            fault: Fault::TripleFault,
            registers: registers(),
        };
        assert_eq!(fault.to_string(), "fault: triple fault (shutdown exit)");
        let error = Outcome::Error(VcpuError::Run(kvm_ioctls::Error::new(libc::EFAULT)));
        assert!(
            error.to_string().starts_with("error: KVM_RUN failed: "),
            "{error}"
        );
    }

    #[test]
    fn vcpu_errors_are_equal_when_variant_and_message_are() {
        let run = |errno| VcpuError::Run(kvm_ioctls::Error::new(errno));
        assert_eq!(run(libc::EFAULT), run(libc::EFAULT));
        assert_ne!(run(libc::EFAULT), run(libc::EINVAL));
        assert_ne!(VcpuError::Panicked, VcpuError::NoDirtyRing);
    }

    #[test]
    fn a_finished_state_carries_the_outcome() {
        let shared = VcpuShared::new(0);
        let outcome = Outcome::Error(VcpuError::Panicked);
        shared.mark_finished(&outcome);
        assert_eq!(shared.state(), VcpuState::Finished(outcome));
    }
}
