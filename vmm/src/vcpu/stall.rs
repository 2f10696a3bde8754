//! The guest's stall: the vCPU time the guest loses to dirty tracking while
//! something observes it (a readiness window, a migration).
//!
//! Dirty logging costs a vCPU in two ways, both counted exactly:
//! - a write to a page that logging protected faults into KVM, which logs
//!   it and makes the page writable again: each such fault moves the vCPU's
//!   `pf_taken` in KVM's binary stats (one `pread` of the vCPU's stats fd);
//!   the faults beyond the vCPU's rate just before the period are
//!   tracking's, and each costs the guest [`FAULT_COST`];
//! - with the dirty ring, a full ring exits to the VMM, whose vCPU thread
//!   harvests it before the guest goes on: the VMM times each of those
//!   exits ([`super::VcpuShared::ring_full_ns`]).
//!
//! Why not the thread's CPU time outside its guest (`/proc`'s `guest_time`
//! against its run time): on this backend the kernel accounts guest time in
//! bursts, so over a one-second window it was off by ±100 ms and more,
//! against a true cost of tens of ms. A sleeping vCPU (an idle guest, a vCPU
//! held paused) takes no fault and reports no stall; a migration's downtime
//! is reported apart.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::shared::VcpuShared;

/// What one write-protection fault taken for dirty logging costs the guest:
/// 2.6 µs, measured on this `kvm_pvm` host (a sweep over 16,384 re-protected
/// pages took 44 ms against 2.2 ms untracked; docs/READINESS.md). Hardware
/// with EPT/NPT takes a shorter exit; with PML, logging takes no fault at all.
pub const FAULT_COST: Duration = Duration::from_nanos(2_600);

/// Shortest baseline a rate before the period is taken from; over a
/// shorter one (or none), the rate before counts as zero.
const MIN_BASELINE: Duration = Duration::from_millis(50);

/// How long after an observation ends its faults go on: the pages it left
/// protected fault once more when the guest next writes them (with logging
/// off too: KVM does not give write access back when logging stops). A
/// baseline that starts sooner than this after the last observation would
/// count those tracking faults as the guest's own, so it is not used.
const AFTERMATH: Duration = Duration::from_secs(2);

/// A vCPU's counts at a moment.
#[derive(Debug, Clone, Copy)]
struct Reading {
    at: Instant,
    /// `pf_taken`.
    faults: u64,
    /// Time spent in ring-full exits, ns.
    ring_ns: u64,
}

fn read(v: &VcpuShared) -> Option<Reading> {
    let at = Instant::now();
    let faults = v.faults.get()?.read()?;
    Some(Reading {
        at,
        faults,
        ring_ns: v.ring_full_ns.load(Ordering::Relaxed),
    })
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
}

impl Stall {
    /// All vCPUs' stall added up.
    pub fn total(&self) -> Duration {
        self.vcpus.iter().sum()
    }
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
        let start = self
            .vcpus
            .iter()
            .zip(&self.readings)
            .map(|(v, before)| {
                let now = read(v)?;
                let quiet_since = crate::lock(&v.observed_until).map(|t| t + AFTERMATH);
                let rate = before
                    .filter(|b| now.at.saturating_duration_since(b.at) >= MIN_BASELINE)
                    .filter(|b| quiet_since.is_none_or(|q| q <= b.at))
                    .map_or(0.0, |b| {
                        let faults = now.faults.saturating_sub(b.faults) as f64;
                        faults / now.at.saturating_duration_since(b.at).as_secs_f64()
                    });
                Some((now, rate))
            })
            .collect();
        Period {
            vcpus: self.vcpus,
            start,
            started: Instant::now(),
            ended: false,
        }
    }
}

/// A period during which something observes the guest; its stall so far
/// from [`Period::stall`].
pub(crate) struct Period {
    vcpus: Vec<Arc<VcpuShared>>,
    /// Per vCPU: the reading at the start and the fault rate before it.
    start: Vec<Option<(Reading, f64)>>,
    started: Instant,
    /// [`Period::end`] ran.
    ended: bool,
}

impl Drop for Period {
    fn drop(&mut self) {
        if !self.ended {
            let stall = self.stall();
            self.close(&stall);
        }
    }
}

impl Period {
    /// Ends the observation: its stall, which each vCPU also adds to its
    /// running total (the metrics page's `kvmscope_guest_stall_seconds_total`;
    /// observations that overlap count twice), remembering when, for the next
    /// baseline. A period dropped without `end` ends the same way.
    pub(crate) fn end(mut self) -> Stall {
        let stall = self.stall();
        self.close(&stall);
        stall
    }

    fn close(&mut self, stall: &Stall) {
        self.ended = true;
        let now = Instant::now();
        for (v, d) in self.vcpus.iter().zip(&stall.vcpus) {
            let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
            v.stall_ns.fetch_add(ns, Ordering::Relaxed);
            *crate::lock(&v.observed_until) = Some(now);
        }
    }

    /// The stall from the start until now: per vCPU, its faults beyond its
    /// rate before at [`FAULT_COST`] each, and its time in ring-full exits.
    pub(crate) fn stall(&self) -> Stall {
        let (vcpus, faults) = self
            .vcpus
            .iter()
            .zip(&self.start)
            .map(|(v, start)| match (start, read(v)) {
                (Some((s, rate)), Some(n)) => excess(s, *rate, &n),
                _ => (Duration::ZERO, 0),
            })
            .unzip();
        Stall {
            period: self.started.elapsed(),
            vcpus,
            faults,
        }
    }
}

/// One vCPU's stall and excess faults from `s` (with the rate before it) to `n`.
fn excess(s: &Reading, rate: f64, n: &Reading) -> (Duration, u64) {
    let usual = n.at.saturating_duration_since(s.at).as_secs_f64() * rate;
    let usual = crate::units::saturating_u64(usual.round());
    let faults = n.faults.saturating_sub(s.faults).saturating_sub(usual);
    let ring = Duration::from_nanos(n.ring_ns.saturating_sub(s.ring_ns));
    (
        FAULT_COST.saturating_mul(u32::try_from(faults).unwrap_or(u32::MAX)) + ring,
        faults,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base: Instant, ms: u64, faults: u64, ring_ns: u64) -> Reading {
        Reading {
            at: base + Duration::from_millis(ms),
            faults,
            ring_ns,
        }
    }

    #[test]
    fn faults_beyond_the_rate_before_cost_the_fault_cost_each_and_ring_time_adds() {
        let t = Instant::now();
        // 100 faults/s before; over 1 s, 1,100 faults and 3 ms in ring-full exits.
        let (stall, faults) = excess(&at(t, 0, 500, 0), 100.0, &at(t, 1000, 1600, 3_000_000));
        assert_eq!(faults, 1000);
        assert_eq!(stall, FAULT_COST * 1000 + Duration::from_millis(3));
    }

    #[test]
    fn fewer_faults_than_before_is_no_stall_not_a_negative_one() {
        let t = Instant::now();
        let (stall, faults) = excess(&at(t, 0, 500, 7), 1000.0, &at(t, 1000, 600, 7));
        assert_eq!((stall, faults), (Duration::ZERO, 0));
    }
}
