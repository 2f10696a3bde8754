//! A vCPU: the part its thread owns (`Vcpu`, with the KVM fd and the run loop)
//! and the part the rest of the VMM shares (`VcpuShared`: inbox, state, counters).
//!
//! The run loop is a small state machine (Running / Paused / Finished). The
//! guest asks for work with a port write; the thread then sleeps on the inbox's
//! condition variable until a command, a pause or a stop arrives, so a waiting
//! vCPU burns no host CPU.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvm_ioctls::{VcpuExit, VcpuFd};
use vm_memory::{Bytes, GuestAddress};

use crate::abi::{self, mailbox_offset as mb};
use crate::boot::mailbox_addr;
use crate::exits::{dispatch, Action, Bus, Exit};
use crate::kick;
use crate::memory::GuestMemory;
use crate::workload::Command;

mod console;
pub mod dirty_limit;
pub(crate) mod faults;
pub(crate) mod limits;
mod parked;
pub(crate) mod progress;
mod registers;
mod shared;
pub(crate) mod snapshot;
pub(crate) mod stall;
pub mod throttle;

use parked::{Running, Waiting, Where};
pub use registers::{GeneralRegisters, Registers};
pub use shared::*;
use snapshot::{Site, Snapshot, SnapshotRequest};

/// The part of a vCPU its thread owns.
pub(crate) struct Vcpu {
    /// The KVM vCPU fd; only this thread issues ioctls on it.
    pub(crate) fd: VcpuFd,
    /// Guest RAM, for the vCPU's mailbox.
    pub(crate) mem: GuestMemory,
    /// The port and MMIO devices the vCPU's exits go to.
    pub(crate) bus: Bus,
    /// Bytes of the guest's workload arena; commands are checked against it.
    pub(crate) arena_size: u64,
    /// The part other threads share.
    pub(crate) shared: Arc<VcpuShared>,
    /// Where its reports go (the VM turns them into main-loop messages).
    pub(crate) report: Reporter,
    /// Dirty tracking (the ring needs harvesting on ring-full exits).
    pub(crate) dirty: Option<Arc<crate::dirty::DirtyLog>>,
    /// The command the guest is running: sequence, spec, start time.
    current: Option<Running>,
    /// A VMM-side `wait` in progress: sequence, spec, start, deadline.
    waiting: Option<Waiting>,
    /// Where a restored vCPU picks up (set on a migration's destination).
    resume: Option<Site>,
    /// While throttled: when the running timeslice began (its last sleep
    /// ended, or it started or resumed).
    slice_start: Option<Instant>,
    /// While its dirty rate is limited: its token bucket.
    bucket: Option<dirty_limit::Bucket>,
    /// The thread's own kick timer for its limit's looks, made the first
    /// time it is limited (`None` if that failed: the main loop's kick
    /// every timeslice then serves).
    look_timer: Option<kick::Timer>,
    /// The guest's console lines this second (a flood is not all logged).
    console: console::ConsoleLog,
}

/// Sleeps from `now` to `until` in [`throttle::STEP`]s, each counted in
/// the vCPU's time slept as it ends (current for readers), stopping at
/// once for a pause or stop, or when `go_on` (given the time and the
/// step just slept) returns false; returns when it stopped. The steps are
/// parks, which a kick ends (the VM unparks the thread it signals): a
/// plain sleep ran its step out, so pausing a throttled guest for a
/// migration's stop waited up to a step for each vCPU (1.4-1.8 ms of the
/// stop, measured, against 0.1 ms for a running one).
fn sleep_until(
    shared: &VcpuShared,
    now: Instant,
    until: Instant,
    mut go_on: impl FnMut(Instant, Duration) -> bool,
) -> Instant {
    let mut at = now;
    while at < until && !shared.pending.load(Ordering::Acquire) {
        // A park may end early (a kick, or a token left by one): the
        // loop goes on to `until` unless a request is pending.
        std::thread::park_timeout((until - at).min(throttle::STEP));
        let after = Instant::now();
        shared.throttle.add_slept(after - at);
        let step = after - at;
        at = after;
        if !go_on(at, step) {
            break;
        }
    }
    at
}

/// What a vCPU thread tells whoever runs the VM. The vCPU knows nothing of
/// the main loop: the VM gives it a [`Reporter`] that turns each report into
/// one of the main loop's messages.
#[derive(Debug)]
pub(crate) enum Report {
    /// It ran out of commands and is waiting.
    Idle,
    /// A command finished.
    CommandDone(CommandResult),
    /// Its thread ended.
    Finished(Outcome),
}

/// Where a vCPU's reports go; shared with the code that spawned its thread,
/// which reports the thread's end.
pub(crate) type Reporter = Arc<dyn Fn(Report) + Send + Sync>;

enum State {
    Running,
    Paused,
    Finished(Outcome),
}

impl Vcpu {
    /// A vCPU ready to run on its own thread: its fd (set up by `regs::setup`),
    /// guest memory, device bus, arena size, shared part and reporter.
    pub(crate) fn new(
        fd: VcpuFd,
        mem: GuestMemory,
        bus: Bus,
        arena_size: u64,
        shared: Arc<VcpuShared>,
        report: Reporter,
    ) -> Self {
        Vcpu {
            fd,
            mem,
            bus,
            arena_size,
            shared,
            report,
            dirty: None,
            current: None,
            waiting: None,
            resume: None,
            slice_start: None,
            bucket: None,
            look_timer: None,
            console: console::ConsoleLog::default(),
        }
    }

    /// Runs the vCPU until it is stopped or the guest fails; call on its own thread.
    pub(crate) fn run(mut self) -> Outcome {
        // Dropped before `self` (and so before the fd unmaps kvm_run), unwinding included.
        let _armed = kick::Armed::new(&mut self.fd.get_kvm_run().immediate_exit);
        let _ = self
            .shared
            .tid
            .set(rustix::thread::gettid().as_raw_nonzero().get());
        let mut state = self.first_state();
        let outcome = loop {
            state = match state {
                State::Running => self.running(),
                State::Paused => self.paused(),
                State::Finished(outcome) => break outcome,
            }
        };
        self.console.flush(self.shared.index);
        if outcome == Outcome::Stopped && self.shared.first_exit.get().is_none() {
            // Only this thread may read them; the boot-timeout report needs them.
            let _ = self.shared.boot_registers.set(self.registers());
        }
        if let Some((seq, command, _)) = &self.current {
            let _ = self.shared.interrupted.set((*seq, command.clone()));
        }
        self.shared.mark_finished(&outcome);
        outcome
    }

    /// Looks at a pending control request; `Some` when the loop must change state.
    fn take_control(&self) -> Option<State> {
        if !self.shared.pending.load(Ordering::Acquire) {
            return None;
        }
        let inbox = self.shared.lock();
        match inbox.control {
            Control::Stop => Some(State::Finished(Outcome::Stopped)),
            Control::Pause => Some(State::Paused),
            Control::Run => {
                self.shared.pending.store(false, Ordering::Release);
                None
            }
        }
    }

    /// Where the thread starts: in the guest, or, for a vCPU restored by a
    /// migration, where the source's thread stood.
    fn first_state(&mut self) -> State {
        let step = match self.resume.take() {
            None | Some(Site::Guest) => None,
            Some(Site::NextCommand) => self.next_command(),
            Some(Site::Wait { remaining_us }) => self.resume_wait(remaining_us),
        };
        step.unwrap_or(State::Running)
    }

    /// Answers a snapshot request while parked at `at`.
    fn serve(&mut self, request: SnapshotRequest, at: Where) {
        let index = self.shared.index;
        let result = self
            .complete_io()
            .and_then(|()| snapshot::capture(&self.fd, index, &request.msr_list))
            .map(|kvm| Snapshot {
                index,
                kvm,
                vmm: parked::vmm_state(
                    at,
                    self.current.as_ref(),
                    self.waiting.as_ref(),
                    &self.shared,
                ),
            });
        // The migration may have given up waiting; then nobody needs this.
        let _ = request.reply.send(result);
    }

    /// Completes a port or MMIO exit KVM still holds (its instruction retires
    /// on the next KVM_RUN): KVM_RUN with `immediate_exit` set finishes it and
    /// returns EINTR without entering the guest, so the registers read next
    /// are the whole state (KVM's documented way before saving state).
    /// Anything but EINTR fails the snapshot: the state read next would have
    /// the guest's `out` still to retire, and a destination would run it again
    /// (a READY there ends the command it had just been given).
    fn complete_io(&mut self) -> Result<(), snapshot::Error> {
        let index = self.shared.index;
        self.fd.set_kvm_immediate_exit(1);
        let done = match self.fd.run() {
            Err(e) if e.errno() == libc::EINTR => Ok(()),
            Err(e) => Err(snapshot::Error::Kvm(
                "KVM_RUN (to complete pending I/O)",
                index,
                e,
            )),
            Ok(exit) => Err(snapshot::Error::State(
                index,
                format!("KVM_RUN to complete pending I/O gave {exit:?}, not EINTR"),
            )),
        };
        self.fd.set_kvm_immediate_exit(0);
        done
    }

    /// Loads a snapshot into this vCPU before its thread starts (a
    /// migration's destination). Returns the MSRs KVM refused.
    ///
    /// # Errors
    /// A KVM call failed, or a queued command does not parse.
    pub(crate) fn restore(&mut self, s: &Snapshot) -> Result<Vec<u32>, snapshot::Error> {
        let resumed = parked::resume(&self.fd, &self.shared, s)?;
        self.current = resumed.current;
        self.waiting = resumed.waiting;
        self.resume = Some(resumed.site);
        Ok(resumed.refused)
    }

    /// Finishes a `wait` the source's thread was in, then takes the next command.
    fn resume_wait(&mut self, remaining_us: Option<u64>) -> Option<State> {
        let remaining = remaining_us.map(Duration::from_micros);
        if let Some(state) = self.vmm_wait(remaining) {
            return Some(state);
        }
        if let Some((seq, command, started, _)) = self.waiting.take() {
            self.record(CommandResult {
                seq,
                command,
                status: "ok".into(),
                values: [0; 3],
                host_time: started.elapsed(),
            });
        }
        self.next_command()
    }

    fn paused(&mut self) -> State {
        let shared = self.shared.clone();
        let inbox = shared.park(shared.lock(), &mut |r| self.serve(r, Where::Guest));
        match inbox.control {
            Control::Stop => State::Finished(Outcome::Stopped),
            _ => {
                self.shared.pending.store(false, Ordering::Release);
                // Parked is not running: a throttled slice starts again,
                // and a dirty limit's period is not one to save up from.
                self.slice_start = None;
                if let Some(b) = &mut self.bucket {
                    b.paused();
                }
                State::Running
            }
        }
    }

    fn running(&mut self) -> State {
        loop {
            if let Some(s) = self.take_control() {
                return s;
            }
            self.throttle_pause();
            if let Some(s) = self.dirty_limit_pause() {
                return s;
            }
            if self.shared.pending.load(Ordering::Acquire) {
                continue;
            }
            let exit = match self.enter() {
                Ok(exit) => exit,
                Err(e) => return State::Finished(Outcome::Error(VcpuError::Run(e))),
            };
            let action = dispatch(&exit, &self.bus, &self.shared.counters);
            if let Some(s) = self.act(action) {
                return s;
            }
        }
    }

    /// While throttled (`throttle`): once a timeslice has run, sleeps the
    /// share of time the guest must not run for the time it did run, in
    /// short steps, giving way at once to a pause, a stop or a throttle
    /// lowered or lifted. The slice ends at
    /// the first kick after a timeslice, so it runs 10 to 20 ms; sleeping
    /// for a nominal 10 ms would leave the guest half as much time again as
    /// the throttle allows (measured: a sweep at 96 % dirtied 1.5 times
    /// what 4 % of its time writes).
    fn throttle_pause(&mut self) {
        let pct = self.shared.throttle.percentage();
        if pct == 0 {
            self.slice_start = None;
            return;
        }
        let now = Instant::now();
        let ran = now - *self.slice_start.get_or_insert(now);
        if ran < throttle::TIMESLICE {
            return;
        }
        let until = now + throttle::sleep_after(ran, pct);
        // A lowered or lifted throttle ends the sleep (at 99 % it is up to
        // two seconds); the next slice sleeps for the new percentage.
        let throttle = &self.shared.throttle;
        let after = sleep_until(&self.shared, now, until, |_, _| {
            throttle.percentage() >= pct
        });
        self.slice_start = Some(after);
    }

    /// While its dirty rate is limited (`dirty_limit`): after a ring-full
    /// exit or at the end of each timeslice, counts the entries its ring has
    /// produced (harvesting it once a period), spends them and sleeps off any
    /// debt, in short steps, giving way to a pause, a stop or a changed limit
    /// at once.
    fn dirty_limit_pause(&mut self) -> Option<State> {
        let mb = self.shared.dirty_limit.limit_mb();
        if mb == 0 {
            if self.bucket.take().is_some() {
                self.kick_me(None);
            }
            return None;
        }
        let Some(dirty) = &self.dirty else {
            return None;
        };
        let limit = mb.saturating_mul(dirty_limit::MB);
        let index = self.shared.index;
        let period = self.shared.dirty_limit.period();
        let now = Instant::now();
        if self.bucket.is_none() && self.look_timer.is_none() {
            self.look_timer = kick::Timer::for_this_thread()
                .inspect_err(|e| {
                    log::warn!(
                        "vcpu{index}: no timer of its own for its dirty limit ({e}): it looks every timeslice"
                    );
                })
                .ok();
        }
        let bucket = match &mut self.bucket {
            // Woken from quiet by the main loop: a look, due or not.
            Some(b) if !b.due(now) && !self.shared.dirty_limit.take_woken() => return None,
            Some(b) => b,
            // What the ring held before the limit is not the limit's.
            None => self.bucket.insert(dirty_limit::Bucket::new(
                now,
                dirty.ring_entries_now(index),
                limit,
                period,
            )),
        };
        if bucket.harvest_due(now, period) {
            if let Err(e) = dirty.harvest_vcpu(index) {
                return Some(State::Finished(Outcome::Error(
                    VcpuError::HarvestDirtyRing(Arc::new(e)),
                )));
            }
        }
        self.shared.dirty_limit.wake();
        let entries = dirty.ring_entries_now(index);
        let owed = bucket.owe(now, entries, limit, period);
        let ring = u64::from(dirty.ring_size().unwrap_or(0));
        let shared = &self.shared;
        let publish = |bucket: &mut dirty_limit::Bucket, at| {
            if let Some(f) = bucket.end_period(at, period, ring, limit) {
                shared.dirty_limit.publish(f);
            }
        };
        publish(bucket, now);
        // A period that ends in a long sleep is published as it ends; the
        // sleep stops early when the limit changes.
        let at = sleep_until(shared, now, now + owed, |at, step| {
            bucket.slept(step);
            publish(bucket, at);
            shared.dirty_limit.limit_mb() == mb
        });
        let run = bucket.looked(at);
        if owed.is_zero() && bucket.slow() {
            // No timer, no kick, until its ring has grown by half a burst
            // or a period has gone by (`Vm::kick_throttled`).
            shared.dirty_limit.go_quiet(entries, at);
            self.kick_me(None);
        } else {
            self.kick_me(Some(run));
        }
        None
    }

    /// Sets this thread's look timer to kick it `after` from now (`None`:
    /// not at all). A timer that fails is dropped: the main loop's kicks
    /// every timeslice then serve, as they serve auto-converge.
    fn kick_me(&mut self, after: Option<Duration>) {
        let Some(timer) = &self.look_timer else {
            return;
        };
        let set = match after {
            Some(d) => timer.kick_after(d),
            None => timer.disarm(),
        };
        if let Err(e) = set {
            log::warn!(
                "vcpu{}: its dirty limit's timer failed ({e}): it looks every timeslice",
                self.shared.index
            );
            self.look_timer = None;
        }
    }

    /// One KVM_RUN, with the exit copied out of `kvm_run`.
    fn enter(&mut self) -> Result<Exit, kvm_ioctls::Error> {
        let exit = match self.fd.run() {
            Ok(VcpuExit::IoOut(port, data)) => {
                // The guest checks in with its first port write (`--boot-timeout`).
                if self.shared.first_exit.get().is_none() {
                    let _ = self.shared.first_exit.set(Instant::now());
                }
                let mut v = [0u8; 4];
                let n = data.len().min(4);
                v[..n].copy_from_slice(&data[..n]);
                Exit::IoOut {
                    port,
                    value: u32::from_le_bytes(v),
                }
            }
            Ok(VcpuExit::IoIn(port, data)) => {
                data.fill(0xff);
                Exit::IoIn { port }
            }
            Ok(VcpuExit::MmioRead(addr, data)) => {
                data.fill(0);
                Exit::MmioRead { addr }
            }
            Ok(VcpuExit::MmioWrite(addr, _)) => Exit::MmioWrite { addr },
            Ok(VcpuExit::Hlt) => Exit::Hlt,
            Ok(VcpuExit::Shutdown) => Exit::Shutdown,
            Ok(VcpuExit::InternalError) => {
                // SAFETY: KVM filled the `internal` member of the union for this exit reason.
                let suberror = unsafe { self.fd.get_kvm_run().__bindgen_anon_1.internal.suberror };
                Exit::InternalError { suberror }
            }
            Ok(VcpuExit::FailEntry(reason, cpu)) => Exit::FailEntry { reason, cpu },
            Ok(VcpuExit::SystemEvent(kind, _)) => Exit::SystemEvent { kind },
            Ok(VcpuExit::Intr) => Exit::Interrupted,
            Ok(VcpuExit::Unsupported(kvm_bindings::KVM_EXIT_DIRTY_RING_FULL)) => {
                Exit::DirtyRingFull
            }
            Ok(other) => Exit::Other(format!("{other:?}")),
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                self.fd.set_kvm_immediate_exit(0);
                Exit::Interrupted
            }
            Err(e) => return Err(e),
        };
        Ok(exit)
    }

    fn act(&mut self, action: Action) -> Option<State> {
        match action {
            Action::Resume | Action::Interrupted => None,
            Action::Phase(v) => {
                self.shared.phase.store(u64::from(v), Ordering::Relaxed);
                None
            }
            Action::Console(len) => {
                let index = self.shared.index;
                if log::log_enabled!(log::Level::Info) && self.console.admit(Instant::now(), index)
                {
                    log::info!("vcpu{index} console: {}", self.read_text(len));
                }
                None
            }
            Action::Ready => {
                // READY asks for a first command: one still running has
                // no result now (the guest restarted, or lost its place).
                if let Some((seq, command, started)) = self.current.take() {
                    self.record(CommandResult {
                        seq,
                        command,
                        status: "no result: the guest asked for a first command (READY) again while running this one".into(),
                        values: [0; 3],
                        host_time: started.elapsed(),
                    });
                }
                self.next_command()
            }
            Action::Done => {
                self.finish_command();
                self.next_command()
            }
            Action::Panic(len) => {
                let message = self.read_text(len);
                Some(State::Finished(Outcome::GuestPanic {
                    message,
                    registers: self.registers(),
                }))
            }
            Action::HarvestDirtyRing => self.harvest_dirty_ring(),
            Action::Fault(fault) => Some(State::Finished(Outcome::Fault {
                fault,
                registers: self.registers(),
            })),
        }
    }

    /// KVM_EXIT_DIRTY_RING_FULL: empties this vCPU's ring into the tracker
    /// (a dirty-limited vCPU then looks at its limit at once).
    fn harvest_dirty_ring(&mut self) -> Option<State> {
        let t = Instant::now();
        if let Some(b) = &mut self.bucket {
            b.next_check = t;
        }
        let harvested = self
            .dirty
            .as_ref()
            .map(|d| d.harvest_vcpu(self.shared.index));
        // The guest waits for this: its stall (`stall.rs`).
        let ns = crate::units::nanos(t.elapsed());
        self.shared.ring_full_ns.fetch_add(ns, Ordering::Relaxed);
        let error = match harvested {
            Some(Ok(_)) => return None,
            Some(Err(e)) => VcpuError::HarvestDirtyRing(Arc::new(e)),
            None => VcpuError::NoDirtyRing,
        };
        Some(State::Finished(Outcome::Error(error)))
    }

    fn read_u64(&self, offset: u64) -> u64 {
        let addr = GuestAddress(mailbox_addr(self.shared.index as u64) + offset);
        self.mem.read_obj(addr).unwrap_or(u64::MAX)
    }

    /// The mailbox's text of `len` bytes (at most its size), fit for a
    /// terminal and a log: the guest's control characters, line breaks and
    /// bidirectional overrides escaped (`\u{1b}`), as a peer's text is.
    fn read_text(&self, len: u32) -> String {
        let mut buf = vec![0u8; (len as usize).min(abi::TEXT_MAX)];
        let addr = GuestAddress(mailbox_addr(self.shared.index as u64) + mb::TEXT);
        if self.mem.read_slice(&mut buf, addr).is_err() {
            return "<unreadable mailbox>".to_string();
        }
        crate::units::peer_text(&buf, abi::TEXT_MAX)
    }

    fn record(&self, result: CommandResult) {
        let mut inbox = self.shared.lock();
        if inbox.results.len() == RESULTS_KEPT {
            inbox.results.pop_front();
        }
        inbox.results.push_back(result.clone());
        drop(inbox);
        self.shared.notify_watcher();
        (self.report)(Report::CommandDone(result));
    }

    /// Reads the guest's result for the current command.
    fn finish_command(&mut self) {
        let Some((seq, command, started)) = self.current.take() else {
            return;
        };
        let answered = self.read_u64(mb::RESULT_SEQ);
        let status = match (answered, self.read_u64(mb::STATUS)) {
            (s, _) if s != seq => format!("guest answered for command {s}, not {seq}"),
            (_, abi::STATUS_OK) => "ok".to_string(),
            (_, abi::STATUS_BAD_ARGS) => "guest rejected the arguments".to_string(),
            (_, abi::STATUS_UNKNOWN_COMMAND) => "guest does not know the command".to_string(),
            (_, other) => format!("guest status {other}"),
        };
        // Values the guest gave for another command are not this one's.
        let values = if answered == seq {
            [0, 1, 2].map(|i| self.read_u64(mb::RESULT + 8 * i))
        } else {
            [0; 3]
        };
        self.record(CommandResult {
            seq,
            command,
            status,
            values,
            host_time: started.elapsed(),
        });
    }

    /// Blocks until the guest has a command in its mailbox, or a control request
    /// makes the loop change state.
    fn next_command(&mut self) -> Option<State> {
        loop {
            let Some((seq, command)) = self.wait_for_command() else {
                return Some(State::Finished(Outcome::Stopped));
            };
            let started = Instant::now();
            match command.to_guest(self.arena_size) {
                Ok(Some(g)) => {
                    let mut words = vec![g.code, seq];
                    words.extend_from_slice(&g.args);
                    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
                    let addr = GuestAddress(mailbox_addr(self.shared.index as u64) + mb::CMD);
                    if let Err(e) = self.mem.write_slice(&bytes, addr) {
                        let error = VcpuError::WriteMailbox(Arc::new(e));
                        return Some(State::Finished(Outcome::Error(error)));
                    }
                    // KVM does not log our own writes; a migration must resend the page.
                    if let Some(d) = &self.dirty {
                        d.mark(addr.0 / abi::PAGE_SIZE);
                    }
                    self.shared.lock().state = VcpuState::Running {
                        seq,
                        command: command.to_string(),
                    };
                    self.current = Some((seq, command.to_string(), started));
                    return None;
                }
                Ok(None) => {
                    if let Command::Wait { duration } = command {
                        let deadline = duration.map(|d| started + d);
                        self.waiting = Some((seq, command.to_string(), started, deadline));
                        let state = self.vmm_wait(duration);
                        self.waiting = None;
                        if let Some(state) = state {
                            // Cut short by the stop: the summary names it,
                            // as it names a guest command cut short.
                            let _ = self.shared.interrupted.set((seq, command.to_string()));
                            return Some(state);
                        }
                    }
                    self.record(CommandResult {
                        seq,
                        command: command.to_string(),
                        status: "ok".into(),
                        values: [0; 3],
                        host_time: started.elapsed(),
                    });
                }
                Err(e) => self.record(CommandResult {
                    seq,
                    command: command.to_string(),
                    status: e.to_string(),
                    values: [0; 3],
                    host_time: Duration::ZERO,
                }),
            }
        }
    }

    /// Pops the next command, sleeping while there is none; `None` when told to stop.
    fn wait_for_command(&mut self) -> Option<(u64, Command)> {
        let shared = self.shared.clone();
        let mut inbox = shared.lock();
        let mut told_idle = false;
        loop {
            inbox = shared.park(inbox, &mut |r| self.serve(r, Where::NextCommand));
            if inbox.control == Control::Stop {
                return None;
            }
            self.shared.pending.store(false, Ordering::Release);
            if let Some(cmd) = inbox.pop_command() {
                let seq = inbox.next_seq;
                inbox.next_seq += 1;
                return Some((seq, cmd));
            }
            inbox.state = VcpuState::Waiting;
            if !told_idle {
                told_idle = true;
                (self.report)(Report::Idle);
            }
            inbox = crate::wait(&shared.wake, inbox, None);
        }
    }

    /// `wait`: sleep for `duration` (or until a command is queued when `None`),
    /// waking early for pause/stop.
    fn vmm_wait(&mut self, duration: Option<Duration>) -> Option<State> {
        let deadline = duration.map(|d| Instant::now() + d);
        let shared = self.shared.clone();
        let mut inbox = shared.lock();
        inbox.state = VcpuState::Waiting;
        if deadline.is_none() && !inbox.has_queued() {
            // Nothing else can come unless someone queues it: the vCPU is idle
            // (a run without a control socket then ends).
            (self.report)(Report::Idle);
        }
        loop {
            inbox = shared.park(inbox, &mut |r| self.serve(r, Where::Wait));
            if inbox.control == Control::Stop {
                return Some(State::Finished(Outcome::Stopped));
            }
            let done = match deadline {
                Some(d) => Instant::now() >= d,
                None => inbox.has_queued(),
            };
            if done {
                return None;
            }
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            inbox = crate::wait(&shared.wake, inbox, left);
        }
    }

    /// The registers, for fault, panic and boot-timeout reports.
    fn registers(&self) -> Registers {
        Registers::read(&self.fd)
    }
}
