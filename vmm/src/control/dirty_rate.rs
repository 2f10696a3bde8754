//! `calc-dirty-rate` and `query-dirty-rate`: QEMU's background dirty-rate
//! measurement, on a thread of its own (`dirty-rate`), one at a time.
//!
//! - `page-sampling` (QEMU's default): a CRC of `sample-pages` pages per GiB
//!   drawn at random, taken again after the window; the pages whose CRC
//!   changed, as a share of those sampled, times the guest's pages. No
//!   dirty tracking: the guest pays nothing. Pages the host does not back
//!   are not read (reading them would map the shared zero page, which the
//!   readiness estimates count); one backed during the window with data in
//!   it counts as written. A page rewritten with what it held reads as
//!   clean, as in QEMU.
//! - `dirty-ring` / `dirty-bitmap`: the VM's dirty log over the window,
//!   distinct pages written (per vCPU with the ring), the guest's stall
//!   measured as for a readiness window (`x-guest-stall-ms`).
//!
//! The VMM's stop ends a measurement at once ([`DirtyRateCalc::stop`]): its
//! thread, which holds the guest's memory and the dirty log, is woken and
//! joined, not left to sleep out a `calc-time` of up to 60 s.

use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::dirty::{DirtyLog, DirtyMode};
use crate::memory::GuestMemory;
use crate::protocol::dirty_rate::{
    CalcDirtyRateArgs, DirtyRateInfo, DirtyRateMode, DirtyRateStatus, DirtyRateVcpu,
    DEFAULT_SAMPLE_PAGES,
};
use crate::vcpu::VcpuShared;

/// What the measurements share: the last one's figures, or where it stands.
#[derive(Debug, Default)]
pub(crate) struct DirtyRateCalc {
    info: Mutex<DirtyRateInfo>,
    /// Set by [`DirtyRateCalc::stop`]; a measurement's wait ends on it.
    stopped: Mutex<bool>,
    wake: Condvar,
    /// The last measurement's thread, joined at the stop.
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// What a measurement reads.
pub(crate) struct Target {
    pub(crate) mem: GuestMemory,
    pub(crate) dirty: Option<Arc<DirtyLog>>,
    pub(crate) vcpus: Vec<Arc<VcpuShared>>,
}

/// Why a measurement cannot start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Refusal {
    /// One runs (QEMU's words).
    #[error("the dirty rate is already being measured.")]
    Busy,
    /// The mode needs a dirty log this VM does not keep (QEMU's words, then why).
    #[error("mode {0} is not enabled, use other method instead. ({1})")]
    Mode(&'static str, &'static str),
    /// No thread could be started.
    #[error("starting the dirty-rate thread: {0}")]
    Spawn(std::io::Error),
}

/// What one measurement found.
struct Found {
    mb_per_s: i64,
    vcpus: Option<Vec<DirtyRateVcpu>>,
    stall_ms: Option<f64>,
}

impl DirtyRateCalc {
    /// `query-dirty-rate`.
    pub(crate) fn query(&self) -> DirtyRateInfo {
        crate::lock(&self.info).clone()
    }

    /// `calc-dirty-rate`: starts a measurement of `target` on a thread of
    /// its own and returns at once.
    ///
    /// # Errors
    /// One runs, the mode needs a dirty log the VM lacks, or no thread.
    pub(crate) fn start(
        self: &Arc<Self>,
        args: &CalcDirtyRateArgs,
        target: Target,
    ) -> Result<(), Refusal> {
        let mode = args.mode.unwrap_or_default();
        match (mode, target.dirty.as_ref().map(|d| d.mode())) {
            (DirtyRateMode::DirtyRing, Some(DirtyMode::Ring(_)))
            | (DirtyRateMode::DirtyBitmap, Some(DirtyMode::Bitmap))
            | (DirtyRateMode::PageSampling, _) => {}
            (DirtyRateMode::DirtyRing, _) => {
                return Err(Refusal::Mode(
                    "dirty-ring",
                    "the VMM was started without --dirty-log ring",
                ))
            }
            (DirtyRateMode::DirtyBitmap, _) => {
                return Err(Refusal::Mode(
                    "dirty-bitmap",
                    "the VMM was started without --dirty-log bitmap",
                ))
            }
        }
        let calc = Duration::from_secs(u64::try_from(args.calc_time).unwrap_or(1));
        let sample_pages = args.sample_pages.unwrap_or(DEFAULT_SAMPLE_PAGES);
        let before = {
            let mut info = crate::lock(&self.info);
            if info.status == DirtyRateStatus::Measuring {
                return Err(Refusal::Busy);
            }
            std::mem::replace(
                &mut *info,
                DirtyRateInfo {
                    status: DirtyRateStatus::Measuring,
                    start_time: jiff::Timestamp::now().as_second(),
                    calc_time: args.calc_time,
                    // As QEMU 7.2 gives it: 0 for the modes that sample nothing.
                    sample_pages: if mode == DirtyRateMode::PageSampling {
                        sample_pages
                    } else {
                        0
                    },
                    mode,
                    ..DirtyRateInfo::default()
                },
            )
        };
        let ends = Ends {
            calc: self.clone(),
            found: None,
        };
        let this = self.clone();
        let spawned = std::thread::Builder::new()
            .name("dirty-rate".into())
            .spawn(move || {
                let mut ends = ends;
                let wait = |d: Duration| this.wait(d);
                ends.found = Some(measure(&target, mode, calc, sample_pages, &wait));
            });
        match spawned {
            Ok(thread) => {
                // The one before ended (its status is no longer measuring).
                let before = crate::lock(&self.thread).replace(thread);
                if let Some(t) = before {
                    // Its panic, if any, is in its figures already.
                    drop(t.join());
                }
                Ok(())
            }
            Err(e) => {
                // The thread's closure, and its `Ends`, dropped unrun: the
                // last figures stand, as they were.
                *crate::lock(&self.info) = before;
                Err(Refusal::Spawn(e))
            }
        }
    }

    /// Ends the measurement that runs, if any, and waits for its thread:
    /// the VMM stops. Its figures say so (`x-error`).
    pub(crate) fn stop(&self) {
        *crate::lock(&self.stopped) = true;
        self.wake.notify_all();
        let thread = crate::lock(&self.thread).take();
        if let Some(t) = thread {
            drop(t.join());
        }
    }

    /// Waits `d`, unless the VMM stops first.
    ///
    /// # Errors
    /// The VMM stopped.
    fn wait(&self, d: Duration) -> Result<(), String> {
        let stopped = crate::wait_while(&self.wake, crate::lock(&self.stopped), d, |s| !*s);
        if *stopped {
            return Err("the VMM stopped during the measurement".into());
        }
        Ok(())
    }
}

/// Ends a measurement whatever becomes of its thread: the figures where it
/// found them, else why not (a panic included), so that it never stays
/// `measuring` (which would refuse every later one as busy). Dropped unrun
/// (no thread), it leaves the figures to whoever put them back.
struct Ends {
    calc: Arc<DirtyRateCalc>,
    found: Option<Result<Found, String>>,
}

impl Drop for Ends {
    fn drop(&mut self) {
        let mut info = crate::lock(&self.calc.info);
        if info.status != DirtyRateStatus::Measuring {
            return;
        }
        info.status = DirtyRateStatus::Measured;
        match self.found.take() {
            Some(Ok(f)) => {
                info.dirty_rate = Some(f.mb_per_s);
                info.vcpu_dirty_rate = f.vcpus;
                info.x_guest_stall_ms = f.stall_ms;
            }
            Some(Err(e)) => {
                log::warn!("calc-dirty-rate: {e}");
                info.x_error = Some(e);
            }
            None if std::thread::panicking() => {
                info.x_error = Some("the measurement's thread panicked".into());
            }
            // Never run: `start` puts the last figures back.
            None => info.status = DirtyRateStatus::Measuring,
        }
    }
}

/// MB/s (2^20 bytes a second, whole, as QEMU gives it) for `pages` over `secs`.
fn mb_per_s(pages: f64, secs: f64) -> i64 {
    let mb = pages * 4096.0 / f64::from(1u32 << 20) / secs.max(1e-9);
    // Saturating: a rate no guest reaches stays finite.
    i64::try_from(crate::units::saturating_u64(mb.round().min(9.0e15))).unwrap_or(i64::MAX)
}

/// Waits a duration unless the VMM stops first (then the error).
type Wait<'a> = dyn Fn(Duration) -> Result<(), String> + 'a;

fn measure(
    target: &Target,
    mode: DirtyRateMode,
    calc: Duration,
    sample_pages: u64,
    wait: &Wait<'_>,
) -> Result<Found, String> {
    match (mode, &target.dirty) {
        (DirtyRateMode::PageSampling, _) => sample(&target.mem, calc, sample_pages, wait),
        (_, Some(d)) => window(d, &target.vcpus, calc, wait),
        (_, None) => Err("no dirty log".into()),
    }
}

fn window(
    d: &Arc<DirtyLog>,
    vcpus: &[Arc<VcpuShared>],
    calc: Duration,
    wait: &Wait<'_>,
) -> Result<Found, String> {
    let period = crate::vcpu::stall::Baseline::start(vcpus).begin();
    let window = d.subscribe().map_err(|e| crate::error_chain(&e))?;
    let started = Instant::now();
    // Stopped, the window is dropped: its log's last look, as ever.
    wait(calc)?;
    let (pages, per_vcpu) = window
        .finish(|w| (w.pages.count(), w.per_vcpu.clone()))
        .map_err(|e| crate::error_chain(&e))?;
    let secs = started.elapsed().as_secs_f64();
    let stall = period.end();
    let vcpus = matches!(d.mode(), DirtyMode::Ring(_)).then(|| {
        per_vcpu
            .iter()
            .enumerate()
            .map(|(id, &n)| DirtyRateVcpu {
                id,
                dirty_rate: mb_per_s(n as f64, secs),
            })
            .collect()
    });
    Ok(Found {
        mb_per_s: mb_per_s(pages as f64, secs),
        vcpus,
        stall_ms: Some(stall.total().as_secs_f64() * 1e3),
    })
}

fn sample(
    mem: &GuestMemory,
    calc: Duration,
    per_gib: u64,
    wait: &Wait<'_>,
) -> Result<Found, String> {
    let region = crate::memory::region(mem).ok_or("no guest RAM")?;
    let pages = region.size() / 4096;
    // QEMU's count: per GiB, pro rata (at least one page).
    if pages == 0 {
        return Err("no guest RAM".into());
    }
    let n = usize::try_from((per_gib * region.size() as u64) >> 30)
        .unwrap_or(usize::MAX)
        .clamp(1, pages);
    let mut rng = fastrand::Rng::new();
    let chosen: Vec<usize> = (0..n).map(|_| rng.usize(0..pages)).collect();
    // Each chosen page's CRC, where the host backs it.
    let look = |chosen: &[usize]| -> Result<Vec<Option<u32>>, String> {
        let (resident, _) = crate::memory::resident(region).map_err(|e| e.to_string())?;
        Ok(chosen
            .iter()
            .map(|&p| (resident[p] & 1 != 0).then(|| crc(region, p)))
            .collect())
    };
    let started = Instant::now();
    let before = look(&chosen)?;
    wait(calc.saturating_sub(started.elapsed()))?;
    let secs = started.elapsed().as_secs_f64();
    let after = look(&chosen)?;
    let zero = crc32fast::hash(&[0u8; 4096]);
    let dirty = before
        .iter()
        .zip(&after)
        .filter(|(was, now)| match (was, now) {
            (Some(a), Some(b)) => a != b,
            // Backed during the window: written, unless it holds zeros
            // (a read maps the zero page).
            (None, Some(b)) => *b != zero,
            _ => false,
        })
        .count();
    let share = dirty as f64 / n as f64;
    Ok(Found {
        mb_per_s: mb_per_s(share * pages as f64, secs),
        vcpus: None,
        stall_ms: None,
    })
}

/// The CRC of page `p` of `region`, copied out (the guest runs).
fn crc(region: &vm_memory::MmapRegion<()>, p: usize) -> u32 {
    let mut page = [0u8; 4096];
    crate::readiness::scan::copy_page(region, p, &mut page);
    crc32fast::hash(&page)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_measurement_whose_thread_panics_ends_measured_with_why() {
        let calc = Arc::new(DirtyRateCalc::default());
        crate::lock(&calc.info).status = DirtyRateStatus::Measuring;
        let ends = Ends {
            calc: calc.clone(),
            found: None,
        };
        let joined = std::thread::spawn(move || {
            let _ends = ends;
            panic!("a measurement's bug");
        })
        .join();
        assert!(joined.is_err());
        let info = calc.query();
        assert_eq!(info.status, DirtyRateStatus::Measured);
        assert_eq!(info.dirty_rate, None);
        assert_eq!(
            info.x_error.as_deref(),
            Some("the measurement's thread panicked")
        );
    }

    #[test]
    fn rates_are_whole_mb_per_second() {
        // 25,600 pages (100 MiB) over 2 s: 50 MB/s.
        assert_eq!(mb_per_s(25_600.0, 2.0), 50);
        assert_eq!(mb_per_s(0.0, 1.0), 0);
        assert_eq!(mb_per_s(f64::INFINITY, 1.0), 9_000_000_000_000_000);
    }
}
