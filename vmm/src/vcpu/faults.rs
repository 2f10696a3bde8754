//! A vCPU's page-fault counter (`pf_taken` in KVM's binary stats), read for
//! the guest's stall (`stall.rs`).

use kvm_stats::{StatId, StatsFd};

/// A vCPU's page-fault counter: its stats fd and the `pf_taken` stat in it.
pub(crate) struct FaultCounter {
    stats: StatsFd,
    id: StatId,
}

impl FaultCounter {
    /// The counter of a vCPU stats fd; `None` when KVM does not have `pf_taken`.
    pub(crate) fn new(stats: StatsFd) -> Option<FaultCounter> {
        let id = stats.schema().find("pf_taken")?;
        Some(FaultCounter { stats, id })
    }

    /// `pf_taken` now (one `pread`); `None` when the read fails.
    pub(crate) fn read(&self) -> Option<u64> {
        let mut sample = self.stats.new_sample();
        self.stats.read_sample(&mut sample).ok()?;
        Some(sample.u64(self.id))
    }
}
