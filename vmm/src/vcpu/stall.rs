//! The guest's stall: the vCPU time the guest loses to dirty tracking while
//! something observes it (a readiness window, a migration, a standalone dirty
//! limit, which holds logging on while any is set).
//!
//! Dirty logging costs a vCPU time in which its guest does not run: a write
//! to a page that logging protected faults into KVM, which logs it and makes
//! the page writable again; with the dirty ring, a full ring exits to the
//! VMM, whose vCPU thread harvests and resets it. Two measures of it, per
//! vCPU, each beyond the vCPU's own rate just before the period:
//! - **measured**: the system time of the vCPU thread (`/proc/self/task/TID/
//!   stat`'s `stime`, in clock ticks): the host kernel's time handling the
//!   faults and resets, which the guest cannot run in. On this `kvm_pvm` host
//!   the guest's own time is all `utime`, so outside an observation a
//!   write-heavy vCPU's `stime` does not move at all, and inside one it took
//!   0.86-0.94 s of a 2 s ring window (docs/READINESS.md);
//! - **counted**: the excess `pf_taken` (KVM's binary stats, one `pread`) at
//!   [`fault_cost()`] each (the host's, measured once per VMM), plus the
//!   VMM-timed ring-full harvests ([`super::VcpuShared::ring_full_ns`]):
//!   exact counts at the host's cost, the only measure that sees the faults
//!   where the host accounts them to the guest's own time (pvm on Intel).
//!
//! The stall is the larger of the two: the measured one is tick-grained
//! (10 ms) and counts any extra kernel time; the counted one is there where
//! `/proc` cannot be read. To it is added the time the vCPU thread waited
//! for a CPU while it could have run, beyond its usual share of the time it
//! could run (`/proc/self/task/TID/schedstat`'s run delay against its time
//! on a CPU, ns): where vCPUs and the
//! VMM's threads share too few cores, the harvests, the migration's sender
//! and the other vCPUs' extra kernel time take turns from every vCPU, one
//! that dirties nothing included (a reader beside a tracked writer on two
//! cores lost up to 0.22 s of a 2 s window that way, of which its system
//! time showed 0.04 s; docs/EXPERIMENTS.md). A readiness window (or a
//! standalone dirty limit) takes no baseline of its own: its usual system
//! time and waiting come from readings taken every 100 ms over the last
//! seconds ([`note_usual`]), so that a guest whose own exits cost system
//! time (an I/O loop) is not read as stalled by the log; its faults count
//! from zero (untracked, a vCPU takes none but first touches, which come in
//! bursts). Anything else that
//! starts to load the host during an observation counts too: the figure is
//! what the guest lost while it was observed, beyond its usual.
//!
//! An observation's cost does not end with it: a page it protected and
//! the guest did not write while it ran faults once when the guest next
//! writes it (KVM does not give write access back when logging stops). So
//! after an observation ends, each vCPU goes on counting its faults beyond
//! its usual (at the cost per fault: nothing else of tracking is left) for
//! [`AFTERMATH`] and adds them to its running total (the metrics page, the
//! VMM's own stats, the samples series); the observation's own figure (a
//! window's reply, `query-migrate`) is what it cost while it ran. The log's
//! last look leaves the pages written during an observation writable
//! (`dirty::Consumer::finish`), so for a guest that wrote its pages during
//! the observation there is little aftermath left (before that, a full-speed
//! writer lost about twice what its window reported, in the faults after it;
//! docs/READINESS.md). A sleeping vCPU (an idle guest, a vCPU held paused)
//! reports no stall; a migration's downtime is reported apart.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::shared::{OpenObservation, Rates, Reading, VcpuShared};

/// What one write-protection fault taken for dirty logging costs the guest
/// until the host's own cost is measured (`readiness::calibrate`, at the
/// start of a VMM that serves): 2.6 µs, measured on the `kvm_pvm` host of
/// the experiments (a sweep over 16,384 re-protected pages took 44 ms
/// against 2.2 ms untracked; docs/READINESS.md). Hardware with EPT/NPT takes
/// a shorter exit; with PML, logging takes no fault at all. Nanoseconds.
const DEFAULT_FAULT_NS: u64 = 2_600;

/// The cost per fault in force, ns (the default until measured).
static FAULT_COST_NS: AtomicU64 = AtomicU64::new(DEFAULT_FAULT_NS);
/// Where [`FAULT_COST_NS`] came from ([`FaultCostSource`] as a byte).
static FAULT_COST_SOURCE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Where the cost per fault in force came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "lowercase")]
pub enum FaultCostSource {
    /// [`DEFAULT_FAULT_NS`]: not measured on this host (no calibration,
    /// or it failed); the stall may be several times off (docs/READINESS.md).
    Default,
    /// Measured on this host at the VMM's start (`readiness::calibrate`).
    Measured,
    /// Given (`kvmscope run --fault-cost`).
    Given,
}

/// Where the cost per fault in force came from.
pub fn fault_cost_source() -> FaultCostSource {
    match FAULT_COST_SOURCE.load(Ordering::Relaxed) {
        1 => FaultCostSource::Measured,
        2 => FaultCostSource::Given,
        _ => FaultCostSource::Default,
    }
}

/// What one fault for dirty logging costs the guest on this host: measured
/// (`readiness::calibrate`) or [`DEFAULT_FAULT_NS`].
pub fn fault_cost() -> Duration {
    Duration::from_nanos(FAULT_COST_NS.load(Ordering::Relaxed))
}

/// How many calibrations of the cost per fault run (one per VMM that
/// serves; several where VMMs share the process, as the tests');
/// [`CALIBRATED`] is signalled when one ends.
static CALIBRATIONS: std::sync::Mutex<usize> = std::sync::Mutex::new(0);
static CALIBRATED: std::sync::Condvar = std::sync::Condvar::new();

/// A calibration under way (`readiness::calibrate`), for whoever waits for
/// its cost; it ends when dropped, however its thread ends.
pub(crate) struct Calibrating(());

impl Calibrating {
    /// A calibration starts.
    pub(crate) fn start() -> Calibrating {
        *crate::lock(&CALIBRATIONS) += 1;
        Calibrating(())
    }
}

impl Drop for Calibrating {
    fn drop(&mut self) {
        let mut running = crate::lock(&CALIBRATIONS);
        *running = running.saturating_sub(1);
        drop(running);
        CALIBRATED.notify_all();
    }
}

/// Waits for the calibrations under way to end, at most `limit`, looking
/// every 50 ms whether `go_on` still holds; how long it waited. A
/// migration started in a VMM's first seconds waits so that its faults are
/// priced at this host's cost, not the default (a ring migration read 0.17
/// s of a 2 s loss, priced at 2.6 us where faults cost 30-40 us), and so
/// that the calibration VM's sweeps are not taken for its contention. A
/// readiness window does not wait (it starts when asked; its reply says
/// where its cost came from, `fault_cost_source`).
pub(crate) fn wait_for_calibration(limit: Duration, go_on: &dyn Fn() -> bool) -> Duration {
    let started = Instant::now();
    let mut running = crate::lock(&CALIBRATIONS);
    while *running > 0 && go_on() {
        let Some(left) = limit.checked_sub(started.elapsed()) else {
            break;
        };
        let step = left.min(Duration::from_millis(50));
        running = crate::wait(&CALIBRATED, running, Some(step));
    }
    started.elapsed()
}

/// Sets the cost per fault the stall counts from now on, and where it
/// came from.
pub(crate) fn set_fault_cost(cost: Duration, source: FaultCostSource) {
    let ns = crate::units::nanos(cost).max(1);
    FAULT_COST_NS.store(ns, Ordering::Relaxed);
    FAULT_COST_SOURCE.store(source as u8, Ordering::Relaxed);
}

/// Shortest baseline a rate before the period is taken from; over a
/// shorter one (or none), the rate before counts as zero.
const MIN_BASELINE: Duration = Duration::from_millis(50);

/// How long after an observation ends its faults are still counted as its
/// cost: the pages it left protected fault once more when the guest next
/// writes them (with logging off too: KVM does not give write access back
/// when logging stops). A baseline that starts sooner than this after the
/// last observation would count those faults as the guest's own, so it is
/// not used.
const AFTERMATH: Duration = Duration::from_secs(2);

fn read(v: &VcpuShared) -> Option<Reading> {
    let at = Instant::now();
    let faults = v.page_faults()?;
    let (on_cpu_ns, wait_ns) = v.tid.get().and_then(|&tid| schedstat_times(tid)).unzip();
    Some(Reading {
        at,
        faults,
        ring_ns: v.ring_full_ns.load(Ordering::Relaxed),
        system_ns: v.tid.get().and_then(|&tid| system_time_ns(tid)),
        wait_ns,
        on_cpu_ns,
        asleep_ns: v
            .throttle
            .slept_ns()
            .saturating_add(v.parked_ns.load(Ordering::Relaxed)),
        fault_ns: FAULT_COST_NS.load(Ordering::Relaxed),
    })
}

/// The time a thread of this process has run on a CPU, ns (schedstat's
/// first field): what it did, whatever it waited for a CPU.
pub(crate) fn on_cpu_ns(tid: i32) -> Option<u64> {
    schedstat_times(tid).map(|(on_cpu, _)| on_cpu)
}

/// A thread of this process's time on a CPU and time waiting for one while
/// runnable (run delay), ns: `/proc/self/task/TID/schedstat`'s first two
/// fields (then timeslices), read at once.
fn schedstat_times(tid: i32) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok()?;
    let mut fields = text.split_whitespace().map(str::parse::<u64>);
    Some((fields.next()?.ok()?, fields.next()?.ok()?))
}

/// A thread of this process's system time so far, ns, from
/// `/proc/self/task/TID/stat` (field 15, `stime`, in clock ticks).
fn system_time_ns(tid: i32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields follow the last ')'.
    let (_, rest) = text.rsplit_once(')')?;
    let ticks: u64 = rest.split_whitespace().nth(12)?.parse().ok()?;
    let per_second = rustix::param::clock_ticks_per_second().max(1);
    Some(ticks.saturating_mul(1_000_000_000 / per_second))
}

/// The stall of each vCPU over a period, and in total.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stall {
    /// How long the period has lasted.
    pub period: Duration,
    /// Each vCPU's stall, by index (zero for a vCPU whose counts could not be read).
    pub vcpus: Vec<Duration>,
    /// Each vCPU's faults beyond its rate before the period.
    pub faults: Vec<u64>,
    /// Each vCPU thread's system time beyond its rate before the period
    /// (`None` where `/proc` could not be read).
    pub system: Vec<Option<Duration>>,
    /// Each vCPU thread's time waiting for a CPU beyond its usual share of
    /// the time it could run (`None` where `/proc` could not be read or there was no rate
    /// before: not counted then).
    pub waited: Vec<Option<Duration>>,
}

impl Stall {
    /// All vCPUs' stall added up.
    pub fn total(&self) -> Duration {
        self.vcpus.iter().sum()
    }

    /// Of vCPU `i`'s stall, the time it waited for a CPU beyond its usual
    /// (`None` where that was not measured): the host's contention, which
    /// a guest that paces itself may catch up on, rather than time in the
    /// faults and harvests themselves.
    pub fn waited(&self, i: usize) -> Option<Duration> {
        let lost = *self.vcpus.get(i)?;
        self.waited.get(i).copied().flatten().map(|w| w.min(lost))
    }

    /// The [`Stall::waited`] of the vCPUs where it was measured, added up
    /// (`None` where no vCPU's was).
    pub fn total_waited(&self) -> Option<Duration> {
        (0..self.vcpus.len())
            .filter_map(|i| self.waited(i))
            .reduce(|a, b| a + b)
    }
}

/// Numbers the periods, to find a period's entries among the vCPUs' open
/// observations again.
static PERIODS: AtomicU64 = AtomicU64::new(0);

/// The vCPU's stall so far: over every observation that ended (with the
/// aftermaths that are over), and so far in those still open and in the
/// aftermaths still counting (the samples series takes it, so that a window's
/// stall shows while it runs, not all at once at its end). Reads the vCPU's
/// counts only while an observation is open. Unlike the ended ones' total,
/// it may go down (a period's excess over its rate before falls again when
/// the guest stops writing).
fn stall_so_far(v: &VcpuShared) -> Duration {
    settle(v);
    let ended = Duration::from_nanos(v.stall_ns.load(Ordering::Relaxed));
    let open: Vec<OpenObservation> = crate::lock(&v.open_stalls).clone();
    if open.is_empty() {
        return ended;
    }
    let Some(now) = read(v) else { return ended };
    ended + open.iter().map(|o| cost_so_far(o, &now)).sum::<Duration>()
}

/// What an observation has cost the vCPU from its start (or, once it ended,
/// from its end) to `now`: while it runs, its excess over the usual; in its
/// aftermath, the faults beyond the usual alone. Then nothing of tracking is
/// left but the faults on the pages it left protected, which `pf_taken`
/// counts exactly; the thread's system time beyond the usual is tick-grained
/// (one 10 ms tick read as 5.7 ms lost in 100 ms with no fault at all, drawn
/// as a spike by `kvmscope plot` at a moment with no tracking), and its
/// waiting for a CPU is the host's.
fn cost_so_far(o: &OpenObservation, now: &Reading) -> Duration {
    let e = excess(&o.start, &o.rates, now);
    if o.until.is_some() {
        e.counted
    } else {
        e.lost
    }
}

/// The vCPU's stall as shown to readers (the VMM's own stats, the metrics
/// page, the samples series), ns: [`stall_so_far`], never less than shown
/// before, so that it reads as a counter while an observation runs (an open
/// observation's excess over its rate before may fall back a little; the
/// total catches up when it ends).
pub(crate) fn shown_ns(v: &VcpuShared) -> u64 {
    let now = crate::units::nanos(stall_so_far(v));
    let before = v.stall_shown_ns.fetch_max(now, Ordering::Relaxed);
    before.max(now)
}

/// Adds the aftermaths that are over to the vCPU's running total (their
/// excess until now: a little past their end, at the rate before, which
/// the excess leaves out). Every read of the stall so far calls it (the
/// VMM's stats thread: every 100 ms); reads the counts only when one is over.
fn settle(v: &VcpuShared) {
    settle_until(v, Instant::now());
}

/// Adds the aftermaths over by `now` (all of them, given a time past
/// every end) to the running total.
fn settle_until(v: &VcpuShared, now: Instant) {
    let due = |o: &OpenObservation| o.until.is_some_and(|u| u <= now);
    if !crate::lock(&v.open_stalls).iter().any(due) {
        return;
    }
    // Read without the lock held (a `pread` and a `/proc` read).
    let Some(reading) = read(v) else { return };
    let mut added = Duration::ZERO;
    let mut open = crate::lock(&v.open_stalls);
    open.retain(|o| {
        let over = due(o);
        if over {
            added += cost_so_far(o, &reading);
        }
        !over
    });
    drop(open);
    let ns = crate::units::nanos(added);
    v.stall_ns.fetch_add(ns, Ordering::Relaxed);
}

/// How far back [`note_usual`]'s readings go.
const USUAL_KEPT: Duration = Duration::from_secs(3);
/// Shortest span of those readings usual rates are taken from.
const USUAL_MIN_SPAN: Duration = Duration::from_millis(500);
/// How far back of those readings the usual waiting goes: the host's
/// contention changes with what runs beside the vCPU (its own VM's other
/// vCPUs starting to work), so the latest is the best guess of what it
/// would be now. Over the whole [`USUAL_KEPT`], a reader that started a
/// second before a window, beside two vCPUs that started with it on two
/// cores, read 0.96 s of its 2 s window as waiting beyond its usual (the
/// two seconds before, when it had a core to itself, in the usual); 0.14 s
/// when it had been running for 5 s.
const USUAL_WAIT_SPAN: Duration = Duration::from_secs(1);
/// Least time runnable (on a CPU or waiting) a share of waiting is taken
/// over: below it, the vCPU mostly slept, and how much it waited says
/// little about how much it would wait at work.
const MIN_RUNNABLE: Duration = Duration::from_millis(50);
/// Least time between two of them.
const USUAL_STEP: Duration = Duration::from_millis(90);

/// Notes the vCPU's counts (faults, system time, waiting for a CPU; the
/// VMM's stats thread, every 100 ms), keeping the last [`USUAL_KEPT`]: what
/// the vCPU usually does, for an observation with no baseline of its own.
pub(crate) fn note_usual(v: &VcpuShared) {
    // Not before its thread runs: a reading without its /proc figures
    // would leave them out of every rate taken from it.
    if v.tid.get().is_none() {
        return;
    }
    let last = crate::lock(&v.usual).back().map(|r| r.at);
    if last.is_some_and(|at| at.elapsed() < USUAL_STEP) {
        return;
    }
    // Read without the lock held.
    let Some(reading) = read(v) else { return };
    let mut usual = crate::lock(&v.usual);
    usual.push_back(reading);
    while usual
        .front()
        .is_some_and(|r| reading.at.saturating_duration_since(r.at) > USUAL_KEPT)
    {
        usual.pop_front();
    }
    drop(usual);
    // Nothing observed now or lately: these are the rates an observation
    // that comes too soon after another for readings of its own takes.
    if crate::lock(&v.open_stalls).is_empty() {
        if let Some(rates) = usual_rates(v, quiet_since(v)) {
            *crate::lock(&v.last_usual) = Some(rates);
        }
    }
}

/// When readings are the vCPU's usual again: [`AFTERMATH`] after the last
/// observation ended (`None`: always).
fn quiet_since(v: &VcpuShared) -> Option<Instant> {
    crate::lock(&v.observed_until).map(|t| t + AFTERMATH)
}

/// The vCPU's usual rates, from [`note_usual`]'s readings since `since`
/// (none taken during or just after an observation that ended: what it
/// cost is not the usual), over at least [`USUAL_MIN_SPAN`]. Readings
/// taken while another observation runs (a window during a standalone
/// dirty limit) carry its cost: that one's, and counted there.
/// Faults and system time come from the whole span; waiting from its last
/// [`USUAL_WAIT_SPAN`].
fn usual_rates(v: &VcpuShared, since: Option<Instant>) -> Option<Rates> {
    let usual = crate::lock(&v.usual);
    let first = usual.iter().find(|r| since.is_none_or(|s| r.at >= s))?;
    let last = usual.back()?;
    if last.at.saturating_duration_since(first.at) < USUAL_MIN_SPAN {
        return None;
    }
    let recent = usual
        .iter()
        .find(|r| r.at >= first.at && last.at.saturating_duration_since(r.at) <= USUAL_WAIT_SPAN)
        .unwrap_or(first);
    Some(Rates {
        wait_share: wait_share(recent, last).or_else(|| wait_share(first, last)),
        ..rates_between(first, last)
    })
}

/// A vCPU's rates from reading `b` to reading `n`.
fn rates_between(b: &Reading, n: &Reading) -> Rates {
    let seconds = n.at.saturating_duration_since(b.at).as_secs_f64().max(1e-9);
    let per_second = |n: Option<u64>, b: Option<u64>| Some(n?.saturating_sub(b?) as f64 / seconds);
    Rates {
        faults: n.faults.saturating_sub(b.faults) as f64 / seconds,
        system_ns: per_second(n.system_ns, b.system_ns).unwrap_or(0.0),
        wait_share: wait_share(b, n),
    }
}

/// The time the vCPU thread waited for a CPU and the time it ran on one,
/// ns, from reading `b` to reading `n` (`None`: `/proc` unreadable at
/// either).
fn waited_and_ran(b: &Reading, n: &Reading) -> Option<(u64, u64)> {
    Some((
        n.wait_ns?.saturating_sub(b.wait_ns?),
        n.on_cpu_ns?.saturating_sub(b.on_cpu_ns?),
    ))
}

/// Of the time the vCPU thread could run from `b` to `n`, the share it
/// waited for a CPU (`None`: unreadable, or under [`MIN_RUNNABLE`]).
fn wait_share(b: &Reading, n: &Reading) -> Option<f64> {
    let (waited, ran) = waited_and_ran(b, n)?;
    let runnable = waited.saturating_add(ran);
    (runnable >= crate::units::nanos(MIN_RUNNABLE)).then(|| waited as f64 / runnable as f64)
}

/// The readings a period's rate before is taken from: taken before the
/// observer starts (a migration: when it starts to connect; a readiness
/// window: a moment before it subscribes).
pub(crate) struct Baseline {
    vcpus: Vec<Arc<VcpuShared>>,
    readings: Vec<Option<Reading>>,
}

impl Baseline {
    /// Reads every vCPU's counts now.
    pub(crate) fn start(vcpus: &[Arc<VcpuShared>]) -> Baseline {
        Baseline {
            vcpus: vcpus.to_vec(),
            readings: vcpus.iter().map(|v| read(v)).collect(),
        }
    }

    /// Starts the period: each vCPU's fault rate since the baseline is what
    /// it would have taken anyway.
    pub(crate) fn begin(self) -> Period {
        let id = PERIODS.fetch_add(1, Ordering::Relaxed);
        // An aftermath still counting ends here: from now on this period
        // counts the vCPU's faults (none is counted twice).
        let far = Instant::now() + AFTERMATH;
        for v in &self.vcpus {
            settle_until(v, far);
        }
        let start: Vec<Option<(Reading, Rates)>> = self
            .vcpus
            .iter()
            .zip(&self.readings)
            .map(|(v, before)| {
                let now = read(v)?;
                let quiet_since = quiet_since(v);
                let rate = before
                    .filter(|b| now.at.saturating_duration_since(b.at) >= MIN_BASELINE)
                    .filter(|b| quiet_since.is_none_or(|q| q <= b.at))
                    .map(|b| rates_between(&b, &now))
                    // Without a baseline of its own: the vCPU's usual system
                    // time and waiting, from the last seconds' readings (or,
                    // too soon after another observation for those, the
                    // rates last seen with nothing observed); faults count
                    // from zero, since a vCPU takes none untracked but for
                    // first touches, which come in bursts (boot, a guest's
                    // first sweep) that seconds of history read as a rate.
                    // With no readings at all, system time counts from zero
                    // too, but waiting does not: a vCPU on a busy host may
                    // wait much of its time, observed or not.
                    .or_else(|| {
                        usual_rates(v, quiet_since)
                            .or_else(|| *crate::lock(&v.last_usual))
                            .map(|usual| Rates {
                                faults: 0.0,
                                ..usual
                            })
                    })
                    .unwrap_or_default();
                Some((now, rate))
            })
            .collect();
        for (v, s) in self.vcpus.iter().zip(&start) {
            if let Some((start, rates)) = *s {
                crate::lock(&v.open_stalls).push(OpenObservation {
                    period: id,
                    start,
                    rates,
                    until: None,
                });
            }
        }
        let shown = vec![Excess::default(); start.len()];
        Period {
            id,
            vcpus: self.vcpus,
            start,
            shown,
            started: Instant::now(),
            ended: false,
        }
    }
}

/// A period during which something observes the guest; its stall so far
/// from [`Period::stall`].
pub(crate) struct Period {
    /// Its number, in the vCPUs' open observations.
    id: u64,
    vcpus: Vec<Arc<VcpuShared>>,
    /// Per vCPU: the reading at the start and the rates before it.
    start: Vec<Option<(Reading, Rates)>>,
    /// Per vCPU: the figure last given, which the next is never below.
    shown: Vec<Excess>,
    started: Instant,
    /// [`Period::end`] ran.
    ended: bool,
}

impl Drop for Period {
    fn drop(&mut self) {
        if !self.ended {
            self.close();
        }
    }
}

impl Period {
    /// Ends the observation: its stall, which each vCPU also adds to its
    /// running total (the metrics page's `kvmscope_guest_stall_seconds_total`;
    /// observations that overlap count twice), remembering when, for the next
    /// baseline. A period dropped without `end` ends the same way.
    pub(crate) fn end(mut self) -> Stall {
        self.close()
    }

    /// Measures the stall and ends the period: each vCPU's aftermath starts
    /// from the very reading the stall ended at.
    fn close(&mut self) -> Stall {
        self.ended = true;
        let (stall, readings) = self.measure();
        let now = Instant::now();
        for (((v, d), start), end) in self
            .vcpus
            .iter()
            .zip(&stall.vcpus)
            .zip(&self.start)
            .zip(readings)
        {
            let ns = crate::units::nanos(*d);
            v.stall_ns.fetch_add(ns, Ordering::Relaxed);
            let aftermath = start.zip(end).map(|((_, rates), r)| OpenObservation {
                period: self.id,
                start: r,
                rates,
                until: Some(r.at + AFTERMATH),
            });
            let mut open = crate::lock(&v.open_stalls);
            open.retain(|o| o.period != self.id);
            open.extend(aftermath);
            drop(open);
            *crate::lock(&v.observed_until) = Some(now);
        }
        stall
    }

    /// The stall from the start until now: per vCPU, its faults beyond its
    /// rate before at [`fault_cost()`] each, and its time in ring-full exits.
    /// One difference from the start (summed spans drift up: each span's
    /// excess is at least zero, so their noise adds; a paced vCPU that kept
    /// all its progress read 553-625 ms over a migration of 30 passes), the
    /// usual taken over the time the vCPU could run only (see `excess`),
    /// and never below what it last gave.
    pub(crate) fn stall(&mut self) -> Stall {
        self.measure().0
    }

    /// [`Period::stall`], with each vCPU's reading it was taken from.
    fn measure(&mut self) -> (Stall, Vec<Option<Reading>>) {
        let mut stall = Stall {
            period: self.started.elapsed(),
            ..Stall::default()
        };
        let mut readings = Vec::with_capacity(self.vcpus.len());
        for ((v, start), shown) in self.vcpus.iter().zip(&self.start).zip(&mut self.shown) {
            let now = read(v);
            if let (Some((s, rates)), Some(n)) = (start, &now) {
                let e = excess(s, rates, n);
                if e.lost >= shown.lost {
                    *shown = e;
                }
            }
            let e = *shown;
            stall.vcpus.push(e.lost);
            stall.faults.push(e.faults);
            stall.system.push(e.system);
            stall.waited.push(e.waited);
            readings.push(now);
        }
        (stall, readings)
    }
}

/// What one vCPU did beyond its rates before, from one reading to another.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Excess {
    /// Its stall: the larger of the measured system time and the counted
    /// faults and ring-full exits, plus the time it waited for a CPU, at
    /// most the time that passed.
    lost: Duration,
    /// The counted part alone (faults at the cost per fault, ring-full
    /// exits), at most the time that passed.
    counted: Duration,
    /// Faults beyond its rate.
    faults: u64,
    /// System time beyond its rate (`None`: `/proc` unreadable).
    system: Option<Duration>,
    /// Time waiting for a CPU beyond its rate (`None`: `/proc` unreadable,
    /// or no rate before to measure it against).
    waited: Option<Duration>,
}

/// One vCPU's excess from `s` (with the rates before it) to `n`.
fn excess(s: &Reading, rates: &Rates, n: &Reading) -> Excess {
    // The time the guest could run: a vCPU asleep for a throttle or a
    // dirty limit, or parked by a pause, does nothing usual meanwhile (the
    // usual taken over that time took back what it had lost: a vCPU's
    // stall read 276 ms at one pass of a migration and 78 at the next).
    let asleep = Duration::from_nanos(n.asleep_ns.saturating_sub(s.asleep_ns));
    let elapsed = n.at.saturating_duration_since(s.at).saturating_sub(asleep);
    let seconds = elapsed.as_secs_f64();
    let usual = crate::units::saturating_u64((seconds * rates.faults).round());
    let faults = n.faults.saturating_sub(s.faults).saturating_sub(usual);
    let ring = Duration::from_nanos(n.ring_ns.saturating_sub(s.ring_ns));
    let counted = Duration::from_nanos(n.fault_ns.saturating_mul(faults)) + ring;
    let beyond = |s: Option<u64>, n: Option<u64>, rate: f64| {
        let usual = crate::units::saturating_u64(seconds * rate);
        Some(Duration::from_nanos(
            n?.saturating_sub(s?).saturating_sub(usual),
        ))
    };
    let system = beyond(s.system_ns, n.system_ns, rates.system_ns);
    // Waiting beyond its usual share of the time it could run: a vCPU
    // that works now and slept before waits no more than usual for it.
    let waited = rates
        .wait_share
        .zip(waited_and_ran(s, n))
        .map(|(share, (waited, ran))| {
            let usual = crate::units::saturating_u64(share * waited.saturating_add(ran) as f64);
            Duration::from_nanos(waited.saturating_sub(usual))
        });
    // A vCPU cannot lose more than the time that passed: the counted
    // measure at a fixed cost per fault could say so when faults come
    // cheaper than that (389,416 in 1.004 s: 1.04 s at 2.6 us).
    let lost = (counted.max(system.unwrap_or_default()) + waited.unwrap_or_default()).min(elapsed);
    Excess {
        lost,
        counted: counted.min(elapsed),
        faults,
        system,
        waited,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(at: Instant, faults: u64, system_ms: Option<u64>) -> Reading {
        Reading {
            at,
            faults,
            ring_ns: 0,
            system_ns: system_ms.map(|ms| ms * 1_000_000),
            wait_ns: None,
            on_cpu_ns: None,
            asleep_ns: 0,
            fault_ns: DEFAULT_FAULT_NS,
        }
    }

    /// The usual is taken over the time the vCPU could run: a second
    /// asleep (a throttle, a dirty limit) or parked (a migration's stop)
    /// after a stalled one leaves what the first lost, where the usual
    /// taken over both seconds took the second's off it.
    #[test]
    fn time_asleep_or_parked_does_not_take_back_what_was_lost() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let before = Rates {
            faults: 0.0,
            system_ns: 50_000_000.0,
            wait_share: Some(0.0),
        };
        let r0 = reading(t0, 0, Some(0));
        // 250 ms of system time in the first second: 200 beyond the usual 50.
        let r1 = reading(at(1000), 0, Some(250));
        assert_eq!(excess(&r0, &before, &r1).lost, Duration::from_millis(200));
        // Then a second in which nothing moved.
        let quiet = reading(at(2000), 0, Some(250));
        assert_eq!(
            excess(&r0, &before, &quiet).lost,
            Duration::from_millis(150),
            "running, the usual over both seconds"
        );
        let asleep = Reading {
            asleep_ns: 1_000_000_000,
            ..quiet
        };
        assert_eq!(
            excess(&r0, &before, &asleep).lost,
            Duration::from_millis(200)
        );
    }

    #[test]
    fn a_stall_is_the_larger_measure_beyond_the_rate_before_and_at_most_the_time_passed() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(1);
        let before = Rates {
            faults: 1_000.0,
            system_ns: 10_000_000.0,
            wait_share: Some(0.0),
        };
        // 11,000 faults, 1,000 of them usual: 26 ms counted; 60 ms of system
        // time, 10 usual: 50 ms measured, the larger.
        let e = excess(
            &reading(t0, 0, Some(0)),
            &before,
            &reading(t1, 11_000, Some(60)),
        );
        assert_eq!(e.faults, 10_000);
        assert_eq!(e.system, Some(Duration::from_millis(50)));
        assert_eq!(e.lost, Duration::from_millis(50));
        // Faults at 2.6 us each that would add up to more than the second.
        let e = excess(
            &reading(t0, 0, None),
            &Rates::default(),
            &reading(t1, 500_000, None),
        );
        assert_eq!(e.lost, Duration::from_secs(1));
    }

    #[test]
    fn faults_are_priced_at_the_cost_in_force_at_the_reading_and_never_capped() {
        let t0 = Instant::now();
        // The host's cost measured (9 us) while a period begun at the
        // default 2.6 us runs: all its faults are priced at the host's.
        let end = Reading {
            fault_ns: 9_000,
            ..reading(t0 + Duration::from_secs(1), 10_000, None)
        };
        let e = excess(&reading(t0, 0, None), &Rates::default(), &end);
        assert_eq!(e.lost, Duration::from_millis(90));
        // A standalone dirty limit held for hours: past 2^32 faults the
        // count goes on (5e9 at 100 ns: 500 s, not 429).
        let later = Reading {
            fault_ns: 100,
            ..reading(t0 + Duration::from_secs(3600), 5_000_000_000, None)
        };
        let start = reading(t0, 0, None);
        let e = excess(&start, &Rates::default(), &later);
        assert_eq!(e.lost, Duration::from_secs(500));
    }

    /// A reading `system_ms` of system time, `wait_ms` waiting for a CPU
    /// and `on_cpu_ms` on one, at `at`.
    fn runnable(at: Instant, system_ms: u64, wait_ms: u64, on_cpu_ms: u64) -> Reading {
        Reading {
            wait_ns: Some(wait_ms * 1_000_000),
            on_cpu_ns: Some(on_cpu_ms * 1_000_000),
            ..reading(at, 0, Some(system_ms))
        }
    }

    #[test]
    fn waiting_for_a_cpu_beyond_its_usual_share_adds_to_the_stall() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(1);
        let start = runnable(t0, 0, 0, 0);
        // Before: a tenth of the time it could run spent waiting. Over a
        // second runnable throughout: 40 ms of system time (no excess
        // faults) and 250 ms of waiting, 150 beyond the usual 100: 190 ms
        // lost. A vCPU that writes nothing (no system time, no faults)
        // loses its extra waiting alone.
        let before = Rates {
            faults: 0.0,
            system_ns: 0.0,
            wait_share: Some(0.1),
        };
        let e = excess(&start, &before, &runnable(t1, 40, 250, 750));
        assert_eq!(e.waited, Some(Duration::from_millis(150)));
        assert_eq!(e.lost, Duration::from_millis(190));
        let e = excess(&start, &before, &runnable(t1, 0, 180, 820));
        assert_eq!(e.lost, Duration::from_millis(80));
        // Less waiting than usual takes nothing away.
        let e = excess(&start, &before, &runnable(t1, 40, 20, 980));
        assert_eq!(e.waited, Some(Duration::ZERO));
        assert_eq!(e.lost, Duration::from_millis(40));
        // The usual share of the time it could run: runnable for half the
        // second (its guest idle the rest), 50 ms of waiting is its usual;
        // at a third (three busy vCPUs on two cores), 333 of a second.
        let e = excess(&start, &before, &runnable(t1, 0, 50, 450));
        assert_eq!(e.waited, Some(Duration::ZERO));
        let third = Rates {
            wait_share: Some(1.0 / 3.0),
            ..before
        };
        let e = excess(&start, &third, &runnable(t1, 0, 500, 500));
        assert_eq!(e.waited, Some(Duration::from_nanos(166_666_667)));
        // Unreadable at either end, or no share before (the vCPU may wait
        // that much as a rule): no waiting counted.
        let e = excess(
            &reading(t0, 0, Some(0)),
            &before,
            &runnable(t1, 40, 250, 750),
        );
        assert_eq!(e.waited, None);
        assert_eq!(e.lost, Duration::from_millis(40));
        let e = excess(&start, &Rates::default(), &runnable(t1, 40, 250, 750));
        assert_eq!(e.waited, None);
        assert_eq!(e.lost, Duration::from_millis(40));
    }

    #[test]
    fn an_aftermath_costs_its_faults_alone() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_millis(100);
        let open = |until| OpenObservation {
            period: 1,
            start: reading(t0, 0, Some(0)),
            rates: Rates::default(),
            until,
        };
        // One tick of system time (10 ms) and no fault: lost while the
        // observation runs, nothing in its aftermath.
        let tick = reading(t1, 0, Some(10));
        assert_eq!(cost_so_far(&open(None), &tick), Duration::from_millis(10));
        assert_eq!(cost_so_far(&open(Some(t1)), &tick), Duration::ZERO);
        // 1,000 faults on pages it left protected: those, at the cost each.
        let faults = reading(t1, 1_000, Some(10));
        assert_eq!(
            cost_so_far(&open(Some(t1)), &faults),
            Duration::from_nanos(1_000 * DEFAULT_FAULT_NS)
        );
    }

    #[test]
    fn the_waiting_in_a_stall_is_given_apart_and_never_more_than_the_stall() {
        let ms = Duration::from_millis;
        let stall = Stall {
            period: ms(1_000),
            // vCPU 0: 190 ms, 150 of them waiting; vCPU 1: waiting cut at
            // the time that passed; vCPU 2: not measured.
            vcpus: vec![ms(190), ms(1_000), ms(40)],
            faults: vec![0, 0, 0],
            system: vec![Some(ms(40)), Some(ms(0)), None],
            waited: vec![Some(ms(150)), Some(ms(1_200)), None],
        };
        assert_eq!(stall.waited(0), Some(ms(150)));
        assert_eq!(stall.waited(1), Some(ms(1_000)));
        assert_eq!(stall.waited(2), None);
        assert_eq!(stall.waited(3), None);
        assert_eq!(stall.total_waited(), Some(ms(1_150)));
        let unmeasured = Stall {
            waited: vec![None; 3],
            ..stall
        };
        assert_eq!(unmeasured.total_waited(), None);
    }

    #[test]
    fn the_usual_rates_come_from_the_readings_since_the_last_observation() {
        let v = VcpuShared::new(0);
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let usual = |ms, faults, system_ms, wait_ms: u64, on_cpu_ms: u64| Reading {
            faults,
            ..runnable(at(ms), system_ms, wait_ms, on_cpu_ms)
        };
        // For a second: 20 ms of system time and 100 faults a second, and
        // runnable a fifth of the time, a fifth of that waiting; then 200
        // ms of waiting, 300 on a CPU and 2,000 faults a second (an
        // observation's aftermath, say) over the next half.
        crate::lock(&v.usual).extend([
            usual(0, 0, 0, 0, 0),
            usual(500, 50, 10, 20, 80),
            usual(1_000, 100, 20, 40, 160),
            usual(1_500, 1_100, 20, 240, 460),
        ]);
        let r = usual_rates(&v, None).unwrap();
        assert!((r.faults - 1_100.0 / 1.5).abs() < 1e-6, "{r:?}");
        assert!((r.system_ns - 20_000_000.0 / 1.5).abs() < 1.0, "{r:?}");
        // Waiting over the last second alone: 220 of 600 ms runnable.
        assert!(
            (r.wait_share.unwrap() - 220.0 / 600.0).abs() < 1e-9,
            "{r:?}"
        );
        // Since the first second only: 1,000 faults over 0.5 s; 200 of
        // 500 ms runnable waiting.
        let r = usual_rates(&v, Some(at(1_000))).unwrap();
        assert!((r.wait_share.unwrap() - 0.4).abs() < 1e-9, "{r:?}");
        assert!((r.faults - 2_000.0).abs() < 1e-6, "{r:?}");
        assert!(r.system_ns.abs() < 1.0, "{r:?}");
        // Runnable under 50 ms in the last second (its guest idle): the
        // share over all the readings; none where it was never runnable
        // that long.
        let idle = VcpuShared::new(2);
        crate::lock(&idle.usual).extend([
            usual(0, 0, 0, 0, 0),
            usual(500, 0, 0, 100, 100),
            usual(1_000, 0, 0, 100, 110),
            usual(1_500, 0, 0, 101, 120),
        ]);
        let r = usual_rates(&idle, None).unwrap();
        assert!(
            (r.wait_share.unwrap() - 101.0 / 221.0).abs() < 1e-9,
            "{r:?}"
        );
        let r = usual_rates(&idle, Some(at(500))).unwrap();
        assert_eq!(r.wait_share, None);
        // Readings over less than half a second say nothing.
        assert!(usual_rates(&v, Some(at(1_200))).is_none());
        assert!(usual_rates(&VcpuShared::new(1), None).is_none());
    }
}
