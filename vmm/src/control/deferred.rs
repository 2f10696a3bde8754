//! Commands whose reply comes later: `guest-command` with `wait`, and
//! `query-readiness`, which runs on a worker thread (its dirty-rate window
//! and scan take seconds, and the control thread must keep serving).
//!
//! Both wake the control thread through the vCPUs' result watcher eventfd,
//! so nothing polls.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::time::Duration;

use kvm_stats::StatsFd;
use vmm_sys_util::eventfd::EventFd;

use super::context::{Context, Periodic};
use super::outcome::{Abandon, Outcome, Pending, Progress, WorkerMsg};
use crate::messages::{RunRequest, RunStateError, VmEvent};
use crate::protocol::events::{EventKind, ScanProgress};
use crate::protocol::request::ReadinessArgs;
use crate::protocol::{ErrorClass, Event};
use crate::readiness::{self, Guest, Options};
use crate::vcpu::VcpuShared;

/// How long a readiness worker waits for the main loop to pause or resume.
const RUN_STATE_LIMIT: Duration = Duration::from_secs(5);

/// Drains a readiness worker's messages.
pub(crate) fn poll_worker(rx: &Receiver<WorkerMsg>) -> Progress {
    let mut events = Vec::new();
    loop {
        match rx.try_recv() {
            Ok(WorkerMsg::Progress(done, total)) => {
                events.push(Event::of(&EventKind::ReadinessProgress(ScanProgress {
                    done,
                    total,
                })))
            }
            Ok(WorkerMsg::Done(result)) => {
                let outcome = match *result {
                    Ok(report) => Outcome::ret(report.to_reply()),
                    Err(e) => Outcome::Error(ErrorClass::GenericError, crate::error_chain(&e)),
                };
                return Progress {
                    events,
                    done: Some(outcome),
                };
            }
            Err(TryRecvError::Empty) => return Progress { events, done: None },
            Err(TryRecvError::Disconnected) => {
                let failed = Outcome::Error(
                    ErrorClass::GenericError,
                    "the readiness measurement ended without a result".into(),
                );
                return Progress {
                    events,
                    done: Some(failed),
                };
            }
        }
    }
}

/// Everything a readiness worker needs, taken from the control context.
struct Job {
    vm_stats: StatsFd,
    mapped_peak: Arc<crate::readiness::MappedPeak>,
    mem: crate::memory::GuestMemory,
    dirty: Option<Arc<crate::dirty::DirtyLog>>,
    vcpus: Vec<Arc<VcpuShared>>,
    main: Sender<VmEvent>,
    /// Where the figures go once measured (the `kvmscope` stats provider).
    vmm_stats: Arc<crate::vmmstats::VmmStats>,
    options: Options,
    tx: Sender<WorkerMsg>,
    wake: Option<Arc<EventFd>>,
    /// Set when the client that asked went away before its reply.
    abandoned: Arc<AtomicBool>,
}

/// A prediction's input from the request, else the VMM's migration
/// parameters, else the default, with where it came from (the report's
/// `link.from`, `link.downtime-limit-from`).
fn pick<T>(asked: Option<T>, vmm: Option<T>, default: T) -> (T, &'static str) {
    match (asked, vmm) {
        (Some(v), _) => (v, "request"),
        (None, Some(v)) => (v, "migration-parameters"),
        (None, None) => (default, "default"),
    }
}

/// The link, downtime limit and round limit to predict for: the request's,
/// else the migration parameters' (`max-bandwidth`, 0 = unlimited, as a
/// migration started now would run; `downtime-limit`; `x-max-rounds`), else
/// (a VMM without a migration handle) 10 Gbit/s and 300 ms.
fn link_options(ctx: &Context, args: ReadinessArgs) -> Options {
    let params = ctx.migration.as_ref().map(|(m, _)| m.parameters());
    let (bandwidth, from) = pick(
        args.bandwidth,
        params.map(|p| p.max_bandwidth),
        1_250_000_000,
    );
    let (max_downtime, downtime_from) = pick(
        args.max_downtime,
        params.map(|p| Duration::from_millis(p.downtime_limit)),
        Duration::from_millis(crate::protocol::migration::Parameters::DEFAULT_DOWNTIME_LIMIT_MS),
    );
    let p = params.unwrap_or_default();
    Options {
        bandwidth: (bandwidth > 0).then_some(bandwidth as f64),
        max_downtime,
        link_from: from,
        downtime_from,
        vcpus: ctx.vcpus.len() as u64,
        state_extra: ctx.vcpus.iter().map(|v| v.state_extra_bytes()).sum(),
        max_rounds: p.x_max_rounds,
        dirty_limit_period: Duration::from_millis(p.x_vcpu_dirty_limit_period),
        ..Options::default()
    }
}

/// Starts the periodic measurement when it is due and none is running (a
/// client's `query-readiness` publishes its figures too, so one running now
/// counts); returns the flag that stops it (a client's request does).
pub(crate) fn periodic_readiness(
    ctx: &Context,
    periodic: Periodic,
    busy: &Arc<AtomicBool>,
) -> Option<Arc<AtomicBool>> {
    let args = ReadinessArgs {
        scan: false,
        calc_time: Some(periodic.window),
        bandwidth: None,
        max_downtime: None,
    };
    // Nobody waits for its reply: dropping the receiver leaves the worker to
    // publish and end (disarmed, its dropping does not stop the window).
    match start_readiness(ctx, args, busy) {
        Outcome::Error(_, why) => {
            log::debug!("control: periodic readiness not started: {why}");
            None
        }
        Outcome::Wait(Pending::Readiness(_, abandon)) => abandon.disarm(),
        _ => None,
    }
}

/// When the periodic measurement due at `due`, started at `now`, is next
/// due: a period after `due`, not after `now`, so that the sweep it waits
/// for (up to a second apart) delays one start, not every later one (the
/// measurements came every period plus a second); a period after `now`
/// when that is already past (a host that stalled the control thread).
pub(crate) fn next_due(
    due: std::time::Instant,
    now: std::time::Instant,
    period: Duration,
) -> std::time::Instant {
    Some(due + period)
        .filter(|&next| next > now)
        .unwrap_or(now + period)
}

/// Starts a readiness measurement on its own thread. `busy` guards against
/// two at once (they would share the dirty window).
pub(crate) fn start_readiness(
    ctx: &Context,
    args: ReadinessArgs,
    busy: &Arc<AtomicBool>,
) -> Outcome {
    if busy.swap(true, Ordering::AcqRel) {
        return Outcome::Error(
            ErrorClass::GenericError,
            "a readiness measurement is already running; try again when it is done".into(),
        );
    }
    let vm_stats = match ctx.open_vm_stats() {
        Ok(s) => s,
        Err(e) => {
            busy.store(false, Ordering::Release);
            return Outcome::Error(
                ErrorClass::GenericError,
                format!("opening a VM stats fd: {e}"),
            );
        }
    };
    let calc_time = match (args.calc_time, &ctx.dirty) {
        (Some(t), None) if !t.is_zero() => {
            busy.store(false, Ordering::Release);
            let desc = "calc-time needs dirty logging: start the VMM with --dirty-log bitmap or --dirty-log ring";
            return Outcome::Error(ErrorClass::GenericError, desc.into());
        }
        (Some(t), _) => t,
        (None, Some(_)) => Duration::from_secs(1),
        (None, None) => Duration::ZERO,
    };
    let (tx, rx) = channel();
    let abandoned = Arc::new(AtomicBool::new(false));
    let options = Options {
        calc_time,
        scan: args.scan,
        ..link_options(ctx, args)
    };
    let wake = ctx.vcpus.first().and_then(|v| v.watcher.get().cloned());
    let job = Job {
        vm_stats,
        mapped_peak: ctx.mapped_peak.clone(),
        mem: ctx.mem.clone(),
        dirty: ctx.dirty.clone(),
        vcpus: ctx.vcpus.clone(),
        main: ctx.main.clone(),
        vmm_stats: ctx.vmm_stats.clone(),
        options,
        tx,
        wake,
        abandoned: abandoned.clone(),
    };
    let worker_busy = busy.clone();
    let spawned = std::thread::Builder::new()
        .name("readiness".into())
        .spawn(move || {
            job.run(&worker_busy);
        });
    match spawned {
        Ok(_) => Outcome::Wait(Pending::Readiness(rx, Abandon::on_drop(abandoned))),
        Err(e) => {
            busy.store(false, Ordering::Release);
            Outcome::Error(
                ErrorClass::GenericError,
                format!("starting the readiness thread: {e}"),
            )
        }
    }
}

impl Job {
    /// Tells the control thread; false when nobody waits for this
    /// measurement (the periodic one, or a client that went).
    fn send(&self, msg: WorkerMsg) -> bool {
        let sent = self.tx.send(msg).is_ok();
        if let Some(w) = &self.wake {
            let _ = w.write(1);
        }
        sent
    }

    /// Measures, then frees the readiness slot *before* replying, so a client
    /// that asks again as soon as it has its reply is not told "already running".
    fn run(self, busy: &AtomicBool) {
        let result = self.measure();
        if let Ok(report) = &result {
            if !report.publish(&self.vmm_stats, super::publish::now_ns()) {
                log::debug!("readiness: measured without a dirty-rate window; the published figures stay those of the last window");
            }
        }
        busy.store(false, Ordering::Release);
        let failed = match &result {
            Err(readiness::Error::Abandoned(_)) => None,
            Ok(_) => Some(None),
            Err(e) => Some(Some(e.to_string())),
        };
        if !self.send(WorkerMsg::Done(Box::new(result))) {
            if let Some(outcome) = failed {
                warn_unawaited(outcome);
            }
        }
    }

    fn measure(&self) -> Result<readiness::Report, readiness::Error> {
        let ram = crate::memory::region(&self.mem).ok_or(readiness::Error::NoMemory)?;

        let main = self.main.clone();
        // A hold, not a user pause: a user's `resume` cannot release the guest
        // mid-scan, and the scan's release does not resume a guest a user paused.
        let mut pause = move |on: bool| {
            let request = if on {
                RunRequest::Hold
            } else {
                RunRequest::Release
            };
            run_state(&main, request)
        };
        let abandoned = || self.abandoned.load(Ordering::Acquire);
        let mut guest = Guest {
            vm_stats: &self.vm_stats,
            ram,
            dirty: self.dirty.as_ref(),
            vcpus: &self.vcpus,
            pause: &mut pause,
            arena: crate::abi::ARENA_BASE / 4096..(ram.size() / 4096) as u64,
            abandoned: &abandoned,
            mapped_peak: Some(&self.mapped_peak),
        };
        let tx = self.tx.clone();
        let wake = self.wake.clone();
        let progress = move |done, total| {
            let _ = tx.send(WorkerMsg::Progress(done, total));
            if let Some(w) = &wake {
                let _ = w.write(1);
            }
        };
        readiness::measure(&mut guest, &self.options, progress)
    }
}

/// Says why a measurement nobody waited for (the periodic one, `run
/// --readiness-every`, or one whose client left) failed (`Some(why)`; `None`:
/// it succeeded), once per reason in a row: it would otherwise fail each
/// period unseen, its figures never published (a `downtime-limit` the model
/// refused did so).
fn warn_unawaited(failed: Option<String>) {
    static LAST: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);
    let mut last = LAST
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(why) = failed.as_ref().filter(|why| last.as_ref() != Some(*why)) {
        log::warn!(
            "readiness: a measurement nobody waited for (the periodic one, or one whose client left) failed, its figures not published: {why}"
        );
    }
    *last = failed;
}

/// Asks the main loop to pause or resume, and waits for its answer.
fn run_state(main: &Sender<VmEvent>, request: RunRequest) -> Result<(), RunStateError> {
    let (tx, rx) = channel();
    main.send(VmEvent::Control(request, tx))
        .map_err(|_| RunStateError::ShuttingDown)?;
    match rx.recv_timeout(RUN_STATE_LIMIT) {
        Ok(result) => result,
        Err(_) => Err(RunStateError::NoAnswer {
            request,
            limit: RUN_STATE_LIMIT,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn the_next_periodic_measurement_keeps_the_cadence_of_the_last_due_one() {
        let period = Duration::from_secs(3);
        let due = Instant::now();
        // Started up to a sweep late: the next is still a period after `due`.
        let late = due + Duration::from_millis(900);
        assert_eq!(next_due(due, late, period), due + period);
        // Started more than a period late: a period from now.
        let stalled = due + Duration::from_secs(7);
        assert_eq!(next_due(due, stalled, period), stalled + period);
    }
}
