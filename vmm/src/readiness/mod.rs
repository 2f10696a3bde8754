//! Migration readiness: how much guest RAM is non-zero and how fast the guest
//! dirties it, estimated cheaply from stats and checked against ground truth,
//! and what a pre-copy migration would do with it (docs/READINESS.md).

pub mod calibrate;
mod converge;
mod error;
pub(crate) mod model;
mod options;
pub(crate) mod report;
pub mod scan;

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvm_stats::{Sample, StatsFd};
use vm_memory::MmapRegion;

use crate::memory::resident;

use crate::dirty::{DirtyLog, DirtyMode};
use crate::vcpu::stall::Baseline;
use crate::vcpu::VcpuShared;
pub use error::Error;
use kvm_stats::Mapped;
pub use options::Options;
pub use report::{DirtyRate, Figure, Report, ScanFigures};

/// Pauses (`true`) or resumes (`false`) every vCPU.
pub(crate) type PauseFn<'a> = dyn FnMut(bool) -> Result<(), crate::messages::RunStateError> + 'a;

/// The guest being measured.
pub(crate) struct Guest<'a> {
    pub(crate) vm_stats: &'a StatsFd,
    /// Guest RAM's one region.
    pub(crate) ram: &'a MmapRegion<()>,
    /// Dirty tracking, for a VM started with a mode (`--dirty-log`).
    pub(crate) dirty: Option<&'a Arc<DirtyLog>>,
    pub(crate) vcpus: &'a [Arc<VcpuShared>],
    pub(crate) pause: &'a mut PauseFn<'a>,
    /// Guest pages of the workload arena (for the arena's own counts).
    pub(crate) arena: std::ops::Range<u64>,
    /// Whether whoever asked has gone: a window then stops at once (it
    /// would track the guest, at its cost, for nobody).
    pub(crate) abandoned: &'a dyn Fn() -> bool,
    /// The most KVM has mapped, kept by a VMM that serves (`None`: not kept).
    pub(crate) mapped_peak: Option<&'a MappedPeak>,
}

/// The most guest pages KVM has mapped at once since the VMM started, noted
/// by the VMM's stats thread at each publishing period and by every
/// readiness measurement; on a VM that migrated in, at least the pages the
/// stream left holding data (`run`, once the load ends), which KVM maps
/// only as the guest touches them again. KVM lets
/// mappings go that still hold the guest's data: on a VM with huge pages,
/// letting dirty logging go unmaps the 4 KiB pieces it split 2 MiB pages
/// into (on this `kvm_pvm` backend; KVM maps them whole again only as the
/// guest touches them), and a host that reclaims or moves pages unmaps them
/// too. Guest RAM is never given back here (no balloon, no discard), so
/// what was mapped once still holds whatever the guest wrote. The most
/// mapped at once detects that (and bounds what was swapped out); it may
/// stand above the truth where the host unmapped pages of zeros (KSM's
/// zero pages, the huge-page shrinker), as any mapped count does for
/// zero-filled pages.
#[derive(Debug, Default)]
pub(crate) struct MappedPeak {
    most: AtomicU64,
    /// The pages a migration in left holding data (0: none).
    loaded: AtomicU64,
}

impl MappedPeak {
    /// Notes `pages` mapped now; returns the most so far.
    pub(crate) fn note(&self, pages: u64) -> u64 {
        self.most.fetch_max(pages, Ordering::Relaxed).max(pages)
    }

    /// Notes the pages a migration in left holding data.
    pub(crate) fn note_loaded(&self, pages: u64) {
        self.loaded.store(pages, Ordering::Relaxed);
        self.note(pages);
    }

    /// The pages a migration in left holding data (0: none).
    pub(crate) fn loaded(&self) -> u64 {
        self.loaded.load(Ordering::Relaxed)
    }

    /// Reads what KVM maps now from the VM's stats (one `pread` into
    /// `sample`) and notes it.
    ///
    /// # Errors
    /// The stats could not be read.
    pub(crate) fn read(
        &self,
        vm_stats: &StatsFd,
        sample: &mut Sample,
    ) -> Result<(), kvm_stats::Error> {
        self.note(mapped_into(vm_stats, sample)?.bytes() / 4096);
        Ok(())
    }
}

fn timed<T>(f: impl FnOnce() -> Result<T, Error>) -> Result<Figure<T>, Error> {
    let t = Instant::now();
    let value = f()?;
    Ok(Figure {
        value,
        took: t.elapsed(),
    })
}

/// Measures everything `options` asks for, then predicts the migration.
/// `progress(done, total)` reports the scan's progress.
///
/// # Errors
/// The first measurement that failed; the guest is resumed if it was paused.
pub(crate) fn measure(
    g: &mut Guest<'_>,
    options: &Options,
    progress: impl FnMut(u64, u64),
) -> Result<Report, Error> {
    let ram_pages = (g.ram.size() / 4096) as u64;
    let mapped = timed(|| mapped_now(g.vm_stats))?;
    let peak = g.mapped_peak;
    // The most KVM had mapped as this measurement starts, its own first
    // reading included: what its estimates are set against (a guest that
    // maps more during the window is growing, not letting go).
    let peak_then = peak.map(|p| p.note(mapped.value.bytes() / 4096));
    let started = Instant::now();
    let (resident_map, resident_pages) = resident(g.ram).map_err(Error::Residency)?;
    let resident = Figure {
        value: resident_pages,
        took: started.elapsed(),
    };
    // The window first: syncing the log for "written since boot" protects
    // again what it harvests, and the faults that follow would fall in the
    // rate before the window that its stall is measured against.
    let dirty_rate = match g.dirty {
        Some(d) if !options.calc_time.is_zero() => Some(timed(|| {
            dirty_rate(d, g.vm_stats, g.vcpus, options.calc_time, g.abandoned)
        })?),
        _ => None,
    };
    if let (Some(p), Some(Figure { value: rate, .. })) = (peak, &dirty_rate) {
        // Read while the log was held, for later measurements: letting it
        // go may have unmapped what it had split (huge pages).
        p.note(rate.mapped_held);
    }
    // Known only where the slot is logged from boot (a bitmap VM): a ring VM
    // logs only while observed, so that nobody pays for it otherwise.
    let written = match g.dirty {
        Some(d) if d.logs_from_boot() => Some(timed(|| Ok(d.written_since_boot()?.unwrap_or(0)))?),
        _ => None,
    };
    // A sample of the resident pages read for zeros while the guest runs
    // (after the window, which starts as asked): what KVM maps and the host
    // backs count memory written with zeros too.
    let sampled = timed(|| {
        Ok(scan::sample(
            g.ram,
            &resident_map,
            resident.value,
            scan::SAMPLE_PAGES,
        ))
    })?;
    drop(resident_map);
    let scan = if options.scan {
        Some(timed(|| exact_scan(g, progress))?)
    } else {
        None
    };
    let mut report = Report {
        ram_pages,
        mapped,
        mapped_peak: peak_then,
        loaded_pages: peak.map_or(0, MappedPeak::loaded),
        resident,
        sampled: Some(sampled),
        written,
        dirty_rate,
        dirty_logged: g.dirty.is_some(),
        scan,
        prediction: None,
        converge: None,
        converge_dirty_limit: None,
        estimate_used: "",
        link: report::Link::default(),
    };
    report.predict(options)?;
    Ok(report)
}

/// Measures a VM this thread holds (in-process use: tests, benchmarks), pausing
/// it directly for the scan. The control socket's `query-readiness` goes
/// through the main loop instead (`control::deferred`).
///
/// # Errors
/// As [`measure`].
pub fn measure_vm(
    vm: &crate::vm::Vm,
    options: &Options,
    progress: impl FnMut(u64, u64),
) -> Result<Report, Error> {
    let vcpus: Vec<Arc<VcpuShared>> = vm.vcpus.iter().map(|v| v.shared.clone()).collect();
    let mut pause = |on: bool| {
        vm.control_all(if on {
            crate::vcpu::Control::Pause
        } else {
            crate::vcpu::Control::Run
        });
        Ok(())
    };
    let ram = crate::memory::region(&vm.mem).ok_or(Error::NoMemory)?;
    let len = ram.size();
    let mut guest = Guest {
        vm_stats: &vm.vm_stats,
        ram,
        dirty: vm.dirty_configured(),
        vcpus: &vcpus,
        pause: &mut pause,
        arena: crate::abi::ARENA_BASE / 4096..(len / 4096) as u64,
        abandoned: &|| false,
        mapped_peak: None,
    };
    measure(&mut guest, options, progress)
}

/// Counts taken before a window's end: at 1/2, 1/4, ... 1/32 of it.
const CURVE_POINTS: u32 = 5;
/// No count is taken sooner than this into a window (a count that early
/// says more about scheduling than about the guest).
pub(crate) const CURVE_STEP_MIN: Duration = Duration::from_millis(5);

fn mapped_now(vm_stats: &StatsFd) -> Result<Mapped, Error> {
    Ok(mapped_into(vm_stats, &mut vm_stats.new_sample())?)
}

/// What KVM maps now, read into `sample` (one `pread`).
fn mapped_into(vm_stats: &StatsFd, sample: &mut Sample) -> Result<Mapped, kvm_stats::Error> {
    vm_stats.read_sample(sample)?;
    Ok(Mapped::from_sample(vm_stats.schema(), sample))
}

/// Distinct pages written during a window of `calc_time`, what the window
/// cost the guest (from before the log is taken until it is let go), and
/// what it left write-protected.
fn dirty_rate(
    d: &Arc<DirtyLog>,
    vm_stats: &StatsFd,
    vcpus: &[Arc<VcpuShared>],
    calc_time: Duration,
    abandoned: &dyn Fn() -> bool,
) -> Result<DirtyRate, Error> {
    // No rate before is taken for a window: measuring one would start the
    // window later than asked (a run the caller timed to fall inside it
    // would not), so every fault in the window counts.
    let period = Baseline::start(vcpus).begin();
    let window = d.subscribe()?;
    let started = Instant::now();
    // Distinct pages at 1/32, 1/16, ... 1/2 of the window too, counted in
    // place (the window keeps accumulating, and nothing is protected again
    // where the log allows it): how the count grew tells a rate from a
    // working set it saturates, and a sweep from random writes.
    let mut curve = Vec::with_capacity(CURVE_POINTS as usize);
    for k in (1..=CURVE_POINTS).rev() {
        let at = calc_time / (1 << k);
        if at < CURVE_STEP_MIN {
            continue;
        }
        sleep_unless(at, started, abandoned)?;
        curve.push((window.peek_count()?, started.elapsed()));
    }
    sleep_unless(calc_time, started, abandoned)?;
    // Mapped while the log is still held: letting it go may change the
    // mappings (with huge pages, KVM restores the 2 MiB ones it split).
    let mapped = mapped_now(vm_stats)?.bytes() / 4096;
    // The last look leaves the pages written in the window writable: they
    // do not fault once more after it.
    let (pages, per_vcpu, writable) =
        window.finish(|w| (w.pages.count(), w.per_vcpu.clone(), w.left_writable))?;
    let stall = period.end();
    let window = started.elapsed();
    // Every page the guest has mapped was protected when the log was taken
    // or at a harvest since; those the last look left writable were written
    // after. The rest fault once more when next written (not counted here:
    // the running total counts them as they come).
    let left = writable.map(|writable| report::Left {
        protected: mapped.saturating_sub(writable),
        writable,
    });
    let mode = match d.mode() {
        DirtyMode::Bitmap => "dirty-bitmap",
        DirtyMode::Ring(_) => "dirty-ring",
    };
    let per_vcpu = matches!(d.mode(), DirtyMode::Ring(_)).then_some(per_vcpu);
    Ok(DirtyRate {
        mode,
        window,
        mapped_held: mapped,
        pages,
        pages_per_s: pages as f64 / window.as_secs_f64(),
        per_vcpu,
        curve,
        stall,
        left,
    })
}

/// How often a window looks whether whoever asked is still there.
const ABANDON_CHECK: Duration = Duration::from_millis(50);

/// Sleeps until `at` after `started`, unless whoever asked goes first
/// ([`Error::Abandoned`]: the caller's window is dropped, and with it the
/// dirty log it held, as any window's last look would).
fn sleep_unless(at: Duration, started: Instant, abandoned: &dyn Fn() -> bool) -> Result<(), Error> {
    loop {
        if abandoned() {
            return Err(Error::Abandoned(started.elapsed()));
        }
        let left = at.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Ok(());
        }
        std::thread::sleep(left.min(ABANDON_CHECK));
    }
}

/// Pauses the guest, counts zero and non-zero pages, resumes it. Whoever
/// asked going stops the scan within a progress step (about 20 ms of
/// reading), and the guest is resumed then ([`Error::Abandoned`]).
fn exact_scan(g: &mut Guest<'_>, mut progress: impl FnMut(u64, u64)) -> Result<scan::Scan, Error> {
    const PAUSE_LIMIT: Duration = Duration::from_secs(5);
    let started = Instant::now();
    let abandoned = g.abandoned;
    if abandoned() {
        return Err(Error::Abandoned(started.elapsed()));
    }
    if let Err(e) = (g.pause)(true) {
        // Unanswered, the hold may still be taken later (requests are
        // taken in order): its release goes after it, so that the guest
        // is not left held by nobody. A refusal took nothing to release.
        if matches!(e, crate::messages::RunStateError::NoAnswer { .. }) {
            let _ = (g.pause)(false);
        }
        return Err(Error::Pause(e));
    }
    let result = (|| {
        if !crate::vcpu::wait_parked(g.vcpus, PAUSE_LIMIT) {
            return Err(Error::PauseTimeout(PAUSE_LIMIT));
        }
        let go_on = || {
            if abandoned() {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        };
        let to_read = scan::pages_to_read(g.ram, go_on)
            .map_err(Error::PageMap)?
            .ok_or_else(|| Error::Abandoned(started.elapsed()))?;
        // SAFETY: every vCPU is parked (checked just above) and stays so until
        // the resume below.
        let ram = unsafe { scan::Ram::paused(g.ram) };
        let step = |done, total| {
            progress(done, total);
            go_on()
        };
        scan::scan(&ram, Some(&to_read), g.arena.clone(), step)
            .ok_or_else(|| Error::Abandoned(started.elapsed()))
    })();
    let resumed = (g.pause)(false).map_err(Error::Pause);
    let scan = result?;
    resumed?;
    Ok(scan)
}
