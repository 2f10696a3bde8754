//! CPU throttling, as QEMU's auto-converge does it: a throttled vCPU runs its
//! guest for a [`TIMESLICE`] (until the first kick after one) and then
//! sleeps `pct / (100 - pct)` of the time it ran, so that its guest runs
//! `100 - pct` % of the time. The VM kicks throttled
//! vCPUs out of `KVM_RUN` every timeslice (a guest that never exits would
//! otherwise run on); the vCPU thread sleeps in its own loop, in short steps
//! that give way at once to a pause or a stop.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// How long a throttled vCPU runs between two sleeps (QEMU's
/// `CPU_THROTTLE_TIMESLICE_NS`).
pub const TIMESLICE: Duration = Duration::from_millis(10);

/// Longest step of a throttle sleep before a pause or stop is looked for.
pub(crate) const STEP: Duration = Duration::from_millis(2);

/// One vCPU's throttle: the percentage set, and the time slept for it.
#[derive(Debug, Default)]
pub struct Throttle {
    pct: AtomicU32,
    slept_ns: AtomicU64,
}

impl Throttle {
    /// Throttles the vCPU to `pct` % (0 lifts it; at most 99).
    pub(crate) fn set(&self, pct: u32) {
        self.pct.store(pct.min(99), Ordering::Release);
    }

    /// The percentage in force (0: none).
    pub fn percentage(&self) -> u32 {
        self.pct.load(Ordering::Acquire)
    }

    /// Time the vCPU has slept for throttling, in all.
    pub fn slept(&self) -> Duration {
        Duration::from_nanos(self.slept_ns.load(Ordering::Relaxed))
    }

    /// [`Throttle::slept`], ns.
    pub(crate) fn slept_ns(&self) -> u64 {
        self.slept_ns.load(Ordering::Relaxed)
    }

    pub(crate) fn add_slept(&self, d: Duration) {
        self.slept_ns
            .fetch_add(crate::units::nanos(d), Ordering::Relaxed);
    }
}

/// How long a vCPU throttled to `pct` % sleeps after running for `ran`
/// (a timeslice or more: it runs until the first kick after one), so that
/// it runs `100 - pct` % of the time. A slice is counted at most twice
/// [`TIMESLICE`], the most a kick every timeslice lets it run.
pub(crate) fn sleep_after(ran: Duration, pct: u32) -> Duration {
    let pct = pct.min(99);
    ran.min(2 * TIMESLICE) * pct / (100 - pct)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_throttled_vcpu_runs_100_less_pct_percent_of_the_time() {
        // Whatever the slice ran (a kick ends it 0-10 ms after a timeslice).
        for slice in [TIMESLICE, TIMESLICE * 3 / 2, TIMESLICE * 2] {
            for pct in [20, 50, 90, 96, 99] {
                let sleep = sleep_after(slice, pct).as_secs_f64();
                let ran = slice.as_secs_f64() / (slice.as_secs_f64() + sleep);
                assert!(
                    (ran - f64::from(100 - pct) / 100.0).abs() < 1e-9,
                    "{pct} % after {slice:?}: ran {ran}"
                );
            }
        }
        assert_eq!(sleep_after(TIMESLICE, 0), Duration::ZERO);
        assert_eq!(sleep_after(TIMESLICE, 150), sleep_after(TIMESLICE, 99));
        // A slice stretched past two timeslices (the thread was not
        // scheduled) sleeps as for two: a throttle never sleeps for long.
        assert_eq!(
            sleep_after(Duration::from_secs(1), 50),
            sleep_after(2 * TIMESLICE, 50)
        );
    }
}
