//! What a write-protection fault taken for dirty logging costs a guest on
//! this host, measured once per process on a small VM of the VMM's own.
//!
//! The guest's stall (`vcpu::stall`) counts each vCPU's faults beyond its
//! usual at a cost per fault. That cost is the host's: 2.6 us on the AMD
//! `kvm_pvm` host the default was measured on, about 8-10 us on an Intel
//! one (a lent 16-core machine, also `kvm_pvm`), where the guest's loss did
//! not show as system time either (pvm accounts the fault handling to the
//! guest's user time), so a fixed cost under-reported the stall there by
//! three to four times. The measurement: a 128 MiB VM with one vCPU sweeps
//! [`SWEEP`] untracked, then with logging on and every page protected, three
//! times each, each timed by its vCPU thread's time on a CPU; the cost is
//! the difference of the fastest sweeps over the pages swept. About 0.25 s
//! of one host CPU, once, on the AMD host; 2.1-2.7 s of wall clock on a
//! 2-core Intel one, where a fault cost 29.9-40.7 us. A migration started
//! meanwhile waits for it (`vcpu::stall::wait_for_calibration`). By the wall clock, sweeps of 16 MiB read 2.9-3.8
//! us on the AMD host where 64 MiB read 2.5-3.2 (five starts each): the
//! bigger sweep, whose figure matches the 2.6 us measured by hand; timed on
//! the CPU, 2.6-2.8 us, two VMMs starting at once included.

use std::time::{Duration, Instant};

use crate::dirty;
use crate::vm::{self, Vm, VmConfig};
use crate::workload::parse_sequence;

/// Bytes swept each time: 16,384 pages.
const SWEEP: u64 = 64 << 20;
/// Pages in a sweep.
const PAGES: u64 = SWEEP / 4096;
/// The longest the calibration VM may take for one sweep.
const SWEEP_LIMIT: Duration = Duration::from_secs(10);

/// Why the cost could not be measured (the default then stands).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The calibration VM could not be built or started.
    #[error("the calibration VM")]
    Vm(#[from] vm::Error),
    /// Dirty logging could not be turned on or synced.
    #[error("dirty logging on the calibration VM")]
    Dirty(#[from] dirty::Error),
    /// A sweep failed or did not finish in time.
    #[error("the calibration sweep: {0}")]
    Sweep(String),
}

/// What the calibration measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Calibration {
    /// The cost of one fault: the tracked sweep's extra time per page.
    pub fault_cost: Duration,
    /// The fastest untracked sweep.
    pub untracked: Duration,
    /// The fastest tracked sweep.
    pub tracked: Duration,
    /// The whole measurement, the VM's build included.
    pub took: Duration,
}

/// Measures the cost on a VM of its own (see the module's doc).
///
/// # Errors
/// The VM, the dirty log or a sweep failed.
pub fn measure() -> Result<Calibration, Error> {
    let started = Instant::now();
    // Its VM logs as any VM does ("dirty log: bitmap while observed" on a
    // ring VMM read as that VMM's own mode): said whose the lines are.
    log::info!(
        "calibration: a VM of its own (128 MiB, no dirty-log mode) measures what a dirty-logging fault costs; the VM lines until its result are that VM's"
    );
    let mut vm = Vm::new(VmConfig {
        memory: 128 << 20,
        ..VmConfig::default()
    })?;
    vm.start_as("calib-vcpu")?;
    let measured = sweeps(&vm);
    vm.stop(Duration::from_secs(1));
    let (untracked, tracked) = measured?;
    let extra = tracked.saturating_sub(untracked);
    Ok(Calibration {
        fault_cost: (extra / u32::try_from(PAGES).unwrap_or(u32::MAX))
            .max(Duration::from_nanos(100)),
        untracked,
        tracked,
        took: started.elapsed(),
    })
}

/// The fastest untracked and tracked sweeps (the first, which maps the
/// pages, not counted).
fn sweeps(vm: &Vm) -> Result<(Duration, Duration), Error> {
    sweep(vm)?;
    let untracked = fastest(vm, || Ok(()))?;
    let window = vm.dirty().subscribe()?;
    // Every page swept is protected again for the next sweep.
    let tracked = fastest(vm, || Ok(window.sync(|_| ())?))?;
    Ok((untracked, tracked))
}

/// The fastest of three sweeps, `between` run after each.
fn fastest(vm: &Vm, mut between: impl FnMut() -> Result<(), Error>) -> Result<Duration, Error> {
    let mut best = Duration::MAX;
    for _ in 0..3 {
        best = best.min(sweep(vm)?);
        between()?;
    }
    Ok(best)
}

/// How long after its result a sweep's vCPU thread is left to go back to
/// waiting before its time on a CPU is read (a few microseconds' work).
const SETTLE: Duration = Duration::from_millis(1);

/// One sweep on vCPU 0: its vCPU thread's time on a CPU over it (its host
/// time where `/proc` cannot tell): a VMM started beside others on a busy
/// host waits for a CPU during its sweeps, which is not what a fault costs
/// (two VMMs started at once on two cores read 2.6-4.1 us by the wall
/// clock where one alone reads 2.5-3.2).
fn sweep(vm: &Vm) -> Result<Duration, Error> {
    let commands =
        parse_sequence(&format!("touch size={SWEEP}")).map_err(|e| Error::Sweep(e.to_string()))?;
    let v = &vm.vcpus()[0].shared;
    let on_cpu = || {
        v.tid
            .get()
            .and_then(|&tid| crate::vcpu::stall::on_cpu_ns(tid))
    };
    let cpu0 = on_cpu();
    let seq = vm
        .push_commands(0, commands)
        .ok_or_else(|| Error::Sweep("no vCPU 0".into()))?
        .map_err(|e| Error::Sweep(e.to_string()))?;
    let deadline = Instant::now() + SWEEP_LIMIT;
    loop {
        // As a waiting `guest-command` does: its result by sequence number
        // (the vCPU keeps its last results, not all), or the vCPU's end.
        if let Some(r) = v.results().into_iter().find(|r| r.seq == seq) {
            if r.status != "ok" {
                return Err(Error::Sweep(format!("{}: {}", r.command, r.status)));
            }
            // The thread's time on a CPU is brought up to date when it leaves
            // the CPU (or at a tick): read once it has gone back to waiting
            // for its next command, not while it may still be running.
            std::thread::sleep(SETTLE);
            return Ok(match (cpu0, on_cpu()) {
                (Some(a), Some(b)) => Duration::from_nanos(b.saturating_sub(a)),
                _ => r.host_time,
            });
        }
        if let crate::vcpu::VcpuState::Finished(how) = v.state() {
            return Err(Error::Sweep(format!("the vCPU stopped ({how})")));
        }
        if Instant::now() > deadline {
            return Err(Error::Sweep(format!("not done within {SWEEP_LIMIT:?}")));
        }
        std::thread::sleep(Duration::from_micros(500));
    }
}

/// Measures on a thread of its own and, if that works, sets the cost the
/// stall counts (`vcpu::stall::set_fault_cost`); the default stands until
/// then, and if it fails (logged).
pub fn in_background() {
    let running = crate::vcpu::stall::Calibrating::start();
    let spawned = std::thread::Builder::new()
        .name("calibrate".into())
        .spawn(move || {
            let _running = running;
            calibrate_and_say();
        });
    // Unspawned, the closure (and with it `Calibrating`) was dropped: nobody waits.
    if let Err(e) = spawned {
        log::warn!("no thread to measure what dirty logging costs the guest: {e}");
    }
}

fn calibrate_and_say() {
    match measure() {
        Ok(c) => {
            crate::vcpu::stall::set_fault_cost(
                c.fault_cost,
                crate::vcpu::stall::FaultCostSource::Measured,
            );
            log::info!(
                "dirty logging costs the guest {:.1} us per page written on this host \
                     (a {} MiB sweep: {:?} tracked, {:?} untracked; measured in {:?})",
                c.fault_cost.as_secs_f64() * 1e6,
                SWEEP >> 20,
                c.tracked,
                c.untracked,
                c.took
            );
        }
        Err(e) => log::warn!(
            "could not measure what dirty logging costs the guest here ({}): \
                 the stall counts {:.1} us per fault",
            crate::error_chain(&e),
            crate::vcpu::stall::fault_cost().as_secs_f64() * 1e6
        ),
    }
}
