//! Auto-converge, QEMU's way (`auto-converge` capability, `cpu-throttle-*`
//! parameters): at each dirty-log sync, once a second or less often, the
//! guest's dirtied bytes over the period are set against half the bytes sent;
//! at the second period over it (since the start or the last step; periods
//! under it between do not reset the count, as in QEMU), every vCPU is throttled (`vcpu::throttle`): first to
//! `cpu-throttle-initial` %, then `cpu-throttle-increment` % more each time,
//! up to `max-cpu-throttle`. The throttle is lifted when the migration ends,
//! whatever its outcome (dropping this lifts it).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::protocol::migration::{GuestStall, Parameters, VcpuStall};
use crate::vcpu::VcpuShared;

/// Shortest period between two throttle decisions (QEMU's, one second).
const PERIOD: Duration = Duration::from_secs(1);

/// The share of the sent bytes the guest may dirty over a period before it
/// counts as too fast (QEMU's `throttle-trigger-threshold` default), %.
const TRIGGER_PERCENT: u64 = 50;

/// The throttle of one migration.
pub(crate) struct AutoConverge {
    vcpus: Vec<Arc<VcpuShared>>,
    /// The period's start, and the bytes dirtied and sent in it so far.
    period: (Instant, u64, u64),
    /// Periods the guest dirtied too fast since the last step.
    high: u32,
    /// The throttle in force, %.
    pct: u32,
    /// Each vCPU's throttle sleep before the migration.
    slept_before: Vec<Duration>,
}

impl AutoConverge {
    /// No throttle yet on `vcpus`, or `cpu-throttle-initial` at once with
    /// `x-cpu-throttle-at-start` (the throttle a prediction chose).
    pub(crate) fn new(vcpus: &[Arc<VcpuShared>], p: &Parameters) -> AutoConverge {
        let c = AutoConverge {
            vcpus: vcpus.to_vec(),
            period: (Instant::now(), 0, 0),
            high: 0,
            pct: if p.x_cpu_throttle_at_start {
                next_step(0, p)
            } else {
                0
            },
            slept_before: vcpus.iter().map(|v| v.throttle.slept()).collect(),
        };
        if c.pct > 0 {
            for v in &c.vcpus {
                v.throttle.set(c.pct);
            }
            log::info!(
                "migration: auto-converge throttles every vCPU to {} % from the start",
                c.pct
            );
        }
        c
    }

    /// After a sync: the bytes dirtied since the last one and the bytes sent
    /// meanwhile; returns the throttle in force, % (0: none).
    pub(crate) fn after_sync(&mut self, dirtied: u64, sent: u64, p: &Parameters) -> u32 {
        let (start, d, s) = &mut self.period;
        *d += dirtied;
        *s += sent;
        if start.elapsed() < PERIOD {
            return self.pct;
        }
        if *d > *s * TRIGGER_PERCENT / 100 {
            self.high += 1;
            if self.high >= 2 {
                self.high = 0;
                self.pct = next_step(self.pct, p);
                for v in &self.vcpus {
                    v.throttle.set(self.pct);
                }
                log::info!(
                    "migration: auto-converge throttles every vCPU to {} %",
                    self.pct
                );
            }
        }
        self.period = (Instant::now(), 0, 0);
        self.pct
    }

    /// The throttle in force, %.
    pub(crate) fn percentage(&self) -> u32 {
        self.pct
    }

    /// Each vCPU's time asleep for the throttle since the migration started.
    pub(crate) fn throttled(&self) -> GuestStall {
        let vcpus: Vec<VcpuStall> = self
            .vcpus
            .iter()
            .zip(&self.slept_before)
            .enumerate()
            .map(|(i, (v, before))| VcpuStall {
                cpu_index: i,
                ms: v.throttle.slept().saturating_sub(*before).as_secs_f64() * 1e3,
            })
            .collect();
        GuestStall {
            total_ms: vcpus.iter().map(|v| v.ms).sum(),
            vcpus,
        }
    }
}

impl Drop for AutoConverge {
    fn drop(&mut self) {
        for v in &self.vcpus {
            v.throttle.set(0);
        }
    }
}

/// QEMU's step: the initial throttle first, then the increment, capped.
fn next_step(pct: u32, p: &Parameters) -> u32 {
    let cap = |v: u64| u32::try_from(v.min(99)).unwrap_or(99);
    if pct == 0 {
        cap(p.cpu_throttle_initial.min(p.max_cpu_throttle))
    } else {
        cap((u64::from(pct) + p.cpu_throttle_increment).min(p.max_cpu_throttle))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vcpus() -> Vec<Arc<VcpuShared>> {
        (0..2).map(|i| Arc::new(VcpuShared::new(i))).collect()
    }

    #[test]
    fn steps_start_at_the_initial_throttle_and_stop_at_the_maximum() {
        let p = Parameters::default();
        assert_eq!(next_step(0, &p), 20);
        assert_eq!(next_step(20, &p), 30);
        assert_eq!(next_step(95, &p), 99);
        let capped = Parameters {
            max_cpu_throttle: 50,
            ..Parameters::default()
        };
        assert_eq!(next_step(45, &capped), 50);
        assert_eq!(next_step(50, &capped), 50);
    }

    #[test]
    fn two_fast_periods_in_a_row_throttle_and_dropping_lifts_it() {
        let v = vcpus();
        let p = Parameters::default();
        let mut c = AutoConverge::new(&v, &p);
        c.period.0 -= PERIOD;
        assert_eq!(
            c.after_sync(60, 100, &p),
            0,
            "one fast period is not enough"
        );
        c.period.0 -= PERIOD;
        assert_eq!(c.after_sync(60, 100, &p), 20);
        assert!(v.iter().all(|v| v.throttle.percentage() == 20));
        // A slow period between does not reset the count (QEMU's rule).
        c.period.0 -= PERIOD;
        assert_eq!(c.after_sync(60, 100, &p), 20);
        c.period.0 -= PERIOD;
        assert_eq!(c.after_sync(10, 100, &p), 20);
        c.period.0 -= PERIOD;
        assert_eq!(c.after_sync(60, 100, &p), 30);
        // Within a period, nothing is decided.
        assert_eq!(c.after_sync(1000, 1, &p), 30);
        drop(c);
        assert!(v.iter().all(|v| v.throttle.percentage() == 0), "lifted");
        let at_start = Parameters {
            cpu_throttle_initial: 63,
            x_cpu_throttle_at_start: true,
            ..Parameters::default()
        };
        let c = AutoConverge::new(&v, &at_start);
        assert!(
            v.iter().all(|v| v.throttle.percentage() == 63),
            "from the start"
        );
        drop(c);
    }
}
