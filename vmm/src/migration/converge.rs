//! Making a migration converge, QEMU's ways: `auto-converge` (the
//! `cpu-throttle-*` parameters) and `dirty-limit` (`vcpu-dirty-limit`,
//! `x-vcpu-dirty-limit-period`). At each dirty-log sync, once a second or
//! less often, the guest's dirtied bytes over the period are set against
//! half the bytes sent; at the second period over it (since the start or the
//! last step; periods under it between do not reset the count, as in QEMU):
//! - auto-converge throttles every vCPU (`vcpu::throttle`; kvmscope's
//!   `x-cpu-throttle-vcpus` names fewer, until they reach the maximum, the
//!   guest still dirties too fast and the others take a tenth of the write
//!   faults: then every vCPU), first to
//!   `cpu-throttle-initial` %, then `cpu-throttle-increment` % more each
//!   time (with `cpu-throttle-tailslow`, no more than what would bring the
//!   dirty bytes to the trigger, as QEMU), up to `max-cpu-throttle`;
//! - dirty-limit limits every vCPU's dirty rate to `vcpu-dirty-limit` MB/s
//!   (`vcpu::dirty_limit`), once: a vCPU that does not dirty memory runs on.
//!
//! Either starts at once with `x-cpu-throttle-at-start` /
//! `x-vcpu-dirty-limit-at-start` (what a prediction chose). The throttle and
//! the limits are lifted when the migration ends, whatever its outcome
//! (dropping [`Converge`] lifts the throttle; the limits, which the migration
//! owns from its start, are let go with it by `sender::run`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::protocol::migration::{GuestStall, MigrationInfo, Parameters, VcpuSet, VcpuStall};
use crate::vcpu::limits::Limits;
use crate::vcpu::VcpuShared;

/// Shortest period between two throttle decisions (QEMU's, one second).
const PERIOD: Duration = Duration::from_secs(1);

/// The share of the sent bytes the guest may dirty over a period before it
/// counts as too fast, %.
const TRIGGER_PERCENT: u64 = Parameters::THROTTLE_TRIGGER_PERCENT;

/// Which capability makes the migration converge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mechanism {
    /// Every vCPU throttled in steps.
    AutoConverge,
    /// Every vCPU's dirty rate limited.
    DirtyLimit,
}

/// The throttle of one migration.
pub(crate) struct Converge {
    mechanism: Mechanism,
    vcpus: Vec<Arc<VcpuShared>>,
    /// The VM's dirty limits (`None` where there are none to set: tests).
    limits: Option<Arc<Limits>>,
    /// The period's start, and the bytes dirtied and sent in it so far.
    period: (Instant, u64, u64),
    /// Periods the guest dirtied too fast since the last step.
    high: u32,
    /// The auto-converge throttle in force, %.
    pct: u32,
    /// The dirty limit set, MB/s (0: none yet).
    limited: u64,
    /// The vCPUs the auto-converge throttle is on (empty: every vCPU).
    applied: VcpuSet,
    /// The vCPUs named reached `max-cpu-throttle` and the guest still
    /// dirtied too fast: every vCPU is throttled from then on.
    widened: bool,
    /// Each vCPU's throttle sleep before the migration.
    slept_before: Vec<Duration>,
    /// Each vCPU's page faults before the migration (`None`: not readable).
    faults_before: Vec<Option<u64>>,
}

impl Converge {
    /// No throttle yet on `vcpus`, or one at once when the parameters ask
    /// for it from the start.
    pub(crate) fn new(
        mechanism: Mechanism,
        vcpus: &[Arc<VcpuShared>],
        limits: Option<Arc<Limits>>,
        p: &Parameters,
    ) -> Converge {
        let mut c = Converge {
            mechanism,
            vcpus: vcpus.to_vec(),
            limits,
            period: (Instant::now(), 0, 0),
            high: 0,
            pct: 0,
            limited: 0,
            applied: VcpuSet::default(),
            widened: false,
            slept_before: vcpus.iter().map(|v| v.throttle.slept()).collect(),
            faults_before: vcpus.iter().map(|v| v.page_faults()).collect(),
        };
        let at_start = match mechanism {
            Mechanism::AutoConverge => p.x_cpu_throttle_at_start,
            Mechanism::DirtyLimit => p.x_vcpu_dirty_limit_at_start,
        };
        if at_start {
            c.step(p, " from the start", None);
        }
        c
    }

    /// The next step: a higher throttle, or the dirty limits; `period`: the
    /// bytes dirtied and sent over the period that triggered it.
    fn step(&mut self, p: &Parameters, when: &str, period: Option<(u64, u64)>) {
        match self.mechanism {
            Mechanism::AutoConverge => {
                let next = next_step(self.pct, p, period);
                let named = p.x_cpu_throttle_vcpus;
                if next == self.pct && !named.is_empty() && self.others_write(&named) {
                    // The vCPUs named are at their most, the guest still
                    // dirties too fast, and the others took a good share of
                    // the write faults: they began to write. Every vCPU from
                    // now on, as QEMU's. Too fast alone is not enough: the
                    // model may choose the most knowing the guest stays
                    // over the trigger while its passes shrink.
                    self.widened = true;
                }
                self.pct = next;
                self.apply(p);
                log::info!(
                    "migration: auto-converge throttles {} to {} %{when}",
                    self.applied,
                    self.pct
                );
            }
            Mechanism::DirtyLimit if self.limited == 0 => self.limit(p, when),
            Mechanism::DirtyLimit => {}
        }
    }

    /// Puts the throttle in force on the vCPUs it is for (`x-cpu-throttle-vcpus`,
    /// or every vCPU once widened) and lifts it from the others.
    fn apply(&mut self, p: &Parameters) {
        let set = if self.widened {
            VcpuSet::default()
        } else {
            p.x_cpu_throttle_vcpus
        };
        for (i, v) in self.vcpus.iter().enumerate() {
            let on = set.is_empty() || set.contains(i);
            v.throttle.set(if on { self.pct } else { 0 });
        }
        self.applied = set;
        if let Some(limits) = &self.limits {
            limits.wake_main_loop();
        }
    }

    /// Whether the vCPUs outside `named` took at least a tenth of the
    /// guest's faults since the migration began (KVM's `pf_taken`, as the
    /// stall counts them; a page's first write after each protection
    /// faults on the vCPU that writes it). No: where a count is missing.
    fn others_write(&self, named: &VcpuSet) -> bool {
        let mut faults = (0u64, 0u64);
        for (i, (v, before)) in self.vcpus.iter().zip(&self.faults_before).enumerate() {
            let (Some(before), Some(now)) = (before, v.page_faults()) else {
                return false;
            };
            let n = now.saturating_sub(*before);
            faults.0 += n;
            if !named.contains(i) {
                faults.1 += n;
            }
        }
        faults.0 > 0 && faults.1 * 10 >= faults.0
    }

    /// Limits the vCPUs of `x-vcpu-dirty-limit-vcpus` (every vCPU when it
    /// names none) to `vcpu-dirty-limit`.
    fn limit(&mut self, p: &Parameters, when: &str) {
        let Some(limits) = &self.limits else {
            return;
        };
        let vcpus = p.x_vcpu_dirty_limit_vcpus;
        match limits.for_migration(p.vcpu_dirty_limit, p.x_vcpu_dirty_limit_period, vcpus) {
            Ok(()) => {
                self.limited = p.vcpu_dirty_limit;
                log::info!(
                    "migration: dirty-limit limits {vcpus} to {} MB/s{when}",
                    p.vcpu_dirty_limit
                );
            }
            Err(e) => log::warn!("migration: dirty-limit: {e}"),
        }
    }

    /// After a sync: the bytes dirtied since the last one and the bytes sent
    /// meanwhile.
    pub(crate) fn after_sync(&mut self, dirtied: u64, sent: u64, p: &Parameters) {
        if self.limited != 0 && self.limited != p.vcpu_dirty_limit {
            // `vcpu-dirty-limit` changed under way: in force at once, as in QEMU.
            self.limit(p, " (changed)");
        }
        if self.pct > 0 && !self.widened && p.x_cpu_throttle_vcpus != self.applied {
            // `x-cpu-throttle-vcpus` changed under way: in force at once too.
            self.apply(p);
            log::info!(
                "migration: auto-converge throttles {} to {} % (changed)",
                self.applied,
                self.pct
            );
        }
        let (start, d, s) = &mut self.period;
        *d += dirtied;
        *s += sent;
        if start.elapsed() < PERIOD {
            return;
        }
        if *d > *s * TRIGGER_PERCENT / 100 {
            self.high += 1;
            if self.high >= 2 {
                self.high = 0;
                let period = (*d, *s);
                self.step(p, "", Some(period));
            }
        }
        self.period = (Instant::now(), 0, 0);
    }

    /// The auto-converge throttle in force, % (0: none).
    #[cfg(test)]
    fn percentage(&self) -> u32 {
        self.pct
    }

    /// Puts what the throttle has done in `query-migrate`'s record: the
    /// percentage once auto-converge has throttled, the dirty-limit figures
    /// once the limits are set (QEMU's fields; kept in the final record,
    /// where QEMU drops them with the limits); kvmscope's `x-cpu-throttled`
    /// with either.
    pub(crate) fn report(&self, info: &mut MigrationInfo) {
        if self.pct > 0 {
            info.cpu_throttle_percentage = Some(u64::from(self.pct));
        } else if let Some(limits) = self.limits.as_ref().filter(|_| self.limited != 0) {
            info.dirty_limit_throttle_time_per_round = Some(limits.throttle_time_per_round());
            info.dirty_limit_ring_full_time = Some(limits.ring_full_time());
        } else {
            return;
        }
        info.x_cpu_throttled = Some(self.throttled());
    }

    /// Each vCPU's time asleep for the throttle since the migration started.
    fn throttled(&self) -> GuestStall {
        let vcpus: Vec<VcpuStall> = self
            .vcpus
            .iter()
            .zip(&self.slept_before)
            .enumerate()
            .map(|(i, (v, before))| VcpuStall {
                cpu_index: i,
                ms: v.throttle.slept().saturating_sub(*before).as_secs_f64() * 1e3,
                waited_ms: None,
            })
            .collect();
        GuestStall {
            total_ms: vcpus.iter().map(|v| v.ms).sum(),
            waited_ms: None,
            vcpus,
        }
    }
}

impl Drop for Converge {
    fn drop(&mut self) {
        for v in &self.vcpus {
            v.throttle.set(0);
        }
    }
}

/// QEMU's step: the initial throttle first, then the increment, capped.
/// With `cpu-throttle-tailslow`, the increment is at most what would bring
/// the bytes dirtied over the triggering `period` (dirtied, sent) down to
/// the trigger's share of the bytes sent, the guest's CPU share scaled by
/// that ratio (QEMU's "ideal CPU percentage").
fn next_step(pct: u32, p: &Parameters, period: Option<(u64, u64)>) -> u32 {
    let cap = |v: u64| u32::try_from(v.min(99)).unwrap_or(99);
    if pct == 0 {
        return cap(p.cpu_throttle_initial.min(p.max_cpu_throttle));
    }
    let mut increment = p.cpu_throttle_increment;
    if let (true, Some((dirtied, sent))) = (p.cpu_throttle_tailslow, period) {
        let cpu_now = 100 - u64::from(pct);
        let cpu_ideal = crate::units::saturating_u64(
            cpu_now as f64 * (sent * TRIGGER_PERCENT / 100) as f64 / dirtied.max(1) as f64,
        );
        increment = increment.min(cpu_now.saturating_sub(cpu_ideal));
    }
    cap((u64::from(pct) + increment).min(p.max_cpu_throttle))
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
        assert_eq!(next_step(0, &p, None), 20);
        assert_eq!(next_step(20, &p, None), 30);
        assert_eq!(next_step(95, &p, None), 99);
        let capped = Parameters {
            max_cpu_throttle: 50,
            ..Parameters::default()
        };
        assert_eq!(next_step(45, &capped, None), 50);
        assert_eq!(next_step(50, &capped, None), 50);
        // Tailslow: at 60 % the guest runs 40 %; dirtying 55 for 100 sent
        // (the trigger: 50), the ideal share is 40 * 50 / 55 = 36 %, so the
        // step is 4, not 10.
        let tailslow = Parameters {
            cpu_throttle_tailslow: true,
            ..Parameters::default()
        };
        assert_eq!(next_step(60, &tailslow, Some((55, 100))), 64);
        assert_eq!(
            next_step(60, &tailslow, Some((500, 100))),
            70,
            "far off: the full increment"
        );
        assert_eq!(next_step(60, &p, Some((55, 100))), 70, "without tailslow");
    }

    #[test]
    fn two_fast_periods_in_a_row_throttle_and_dropping_lifts_it() {
        let v = vcpus();
        let p = Parameters::default();
        let mut c = Converge::new(Mechanism::AutoConverge, &v, None, &p);
        c.period.0 -= PERIOD;
        c.after_sync(60, 100, &p);
        assert_eq!(c.percentage(), 0, "one fast period is not enough");
        c.period.0 -= PERIOD;
        c.after_sync(60, 100, &p);
        assert_eq!(c.percentage(), 20);
        assert!(v.iter().all(|v| v.throttle.percentage() == 20));
        // A slow period between does not reset the count (QEMU's rule).
        c.period.0 -= PERIOD;
        c.after_sync(60, 100, &p);
        assert_eq!(c.percentage(), 20);
        c.period.0 -= PERIOD;
        c.after_sync(10, 100, &p);
        assert_eq!(c.percentage(), 20);
        c.period.0 -= PERIOD;
        c.after_sync(60, 100, &p);
        assert_eq!(c.percentage(), 30);
        // Within a period, nothing is decided.
        c.after_sync(1000, 1, &p);
        assert_eq!(c.percentage(), 30);
        drop(c);
        assert!(v.iter().all(|v| v.throttle.percentage() == 0), "lifted");
        let at_start = Parameters {
            cpu_throttle_initial: 63,
            x_cpu_throttle_at_start: true,
            ..Parameters::default()
        };
        let c = Converge::new(Mechanism::AutoConverge, &v, None, &at_start);
        assert!(
            v.iter().all(|v| v.throttle.percentage() == 63),
            "from the start"
        );
        drop(c);
    }

    #[test]
    fn only_the_vcpus_named_are_throttled_and_all_are_lifted() {
        let v = vcpus();
        let p = Parameters {
            cpu_throttle_initial: 50,
            x_cpu_throttle_at_start: true,
            x_cpu_throttle_vcpus: vec![1].try_into().unwrap(),
            ..Parameters::default()
        };
        let mut c = Converge::new(Mechanism::AutoConverge, &v, None, &p);
        let pcts = || {
            v.iter()
                .map(|v| v.throttle.percentage())
                .collect::<Vec<_>>()
        };
        assert_eq!(pcts(), vec![0, 50]);
        // Steps keep to them too.
        for _ in 0..2 {
            c.period.0 -= PERIOD;
            c.after_sync(60, 100, &p);
        }
        assert_eq!(pcts(), vec![0, 60]);
        // The set changed under way: in force at the next sync, the vCPU
        // left out lifted.
        let moved = Parameters {
            x_cpu_throttle_vcpus: vec![0].try_into().unwrap(),
            ..p
        };
        c.after_sync(0, 100, &moved);
        assert_eq!(pcts(), vec![60, 0]);
        // At its most on the vCPU named and still too fast: every vCPU.
        let most = Parameters {
            max_cpu_throttle: 70,
            ..moved
        };
        for _ in 0..3 {
            c.period.0 -= PERIOD;
            c.after_sync(60, 100, &most);
        }
        assert_eq!(pcts(), vec![70, 0], "stepped on the vCPU named");
        for _ in 0..2 {
            c.period.0 -= PERIOD;
            c.after_sync(60, 100, &most);
        }
        assert_eq!(pcts(), vec![70, 0], "kept to the vCPU named");
        // No fault counts to say the other vCPU writes (these have no stats
        // fd): kept, however fast. (Widening on real KVM: the integration
        // tests.)
        for _ in 0..2 {
            c.period.0 -= PERIOD;
            c.after_sync(120, 100, &most);
        }
        assert_eq!(pcts(), vec![70, 0], "no counts, not widened");
        drop(c);
        assert_eq!(pcts(), vec![0, 0], "lifted");
    }
}
