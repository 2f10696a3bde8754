//! The VM's dirty limits (`set-vcpu-dirty-limit`, the `dirty-limit`
//! capability): which vCPUs have one (each vCPU keeps its own, in
//! [`super::dirty_limit`]), and dirty logging held on while any does.

use std::sync::{Arc, Mutex};

use super::dirty_limit::{ring_full_time_us, DEFAULT_PERIOD_MS};
use super::shared::VcpuShared;
use super::stall::{Baseline, Period};
use crate::dirty::{Consumer, DirtyLog};
use crate::protocol::migration::{DirtyLimitInfo, VcpuSet};

/// The highest limit taken, MB/s (2^24: 16 TiB/s, far past any guest; the
/// limit in bytes/s then stays well inside 64 bits).
pub const MAX_DIRTY_RATE_MB: u64 = 1 << 24;

/// Why a dirty limit cannot be set (QEMU's words where QEMU has them).
#[derive(Debug, thiserror::Error)]
pub enum LimitError {
    /// The VM has no dirty ring (QEMU: the `dirty-ring-size` property).
    #[error("dirty page limit feature requires KVM with accelerator property 'dirty-ring-size' set' (start the VM with --dirty-log ring)")]
    NoRing,
    /// No vCPU of that index.
    #[error("incorrect cpu index specified")]
    CpuIndex,
    /// A limit past [`MAX_DIRTY_RATE_MB`] (the value given).
    #[error("dirty-rate must be at most {MAX_DIRTY_RATE_MB} MB/s, not {0}")]
    TooHigh(u64),
    /// A migration with the `dirty-limit` capability owns the limits
    /// (`set` or `cancel`, QEMU's words).
    #[error("can't {0} dirty page rate limit while migration is running")]
    Migrating(&'static str),
    /// Logging could not be turned on for the limit.
    #[error("turning dirty logging on for the limit")]
    Logging(#[source] crate::dirty::Error),
}

/// What the lock guards: the hold on logging and who owns the limits.
#[derive(Default)]
struct State {
    /// The hold on logging, while any limit is in force.
    hold: Option<Consumer>,
    /// The guest's stall while standalone limits hold logging on (the
    /// faults the log costs every vCPU, not only the limited ones), counted
    /// into each vCPU's running total as a readiness window's is; a
    /// migration's limits count in the migration's own period.
    observed: Option<Period>,
    /// A migration with `dirty-limit` runs: it owns the limits (standalone
    /// changes are refused, as in QEMU).
    migrating: bool,
}

/// The VM's dirty limits: which vCPUs have one, and dirty logging held on
/// while any does (a ring VM logs only while somebody holds the log). Every
/// change happens under one lock, so a migration's start and end and a
/// standalone `set` or `cancel` never interleave.
pub(crate) struct Limits {
    vcpus: Vec<Arc<VcpuShared>>,
    dirty: Arc<DirtyLog>,
    state: Mutex<State>,
    /// Tells the main loop a throttle or limit was set, so that it kicks
    /// the vCPUs at once and every timeslice from then (it may otherwise
    /// sleep up to a second first, while a writer overdraws its limit).
    wake: Wake,
}

/// The callback [`Limits::wake_main_loop`] calls (the VM's: a message to its main loop).
pub(crate) type Wake = Box<dyn Fn() + Send + Sync>;

impl Limits {
    pub(crate) fn new(vcpus: Vec<Arc<VcpuShared>>, dirty: Arc<DirtyLog>, wake: Wake) -> Limits {
        Limits {
            vcpus,
            dirty,
            state: Mutex::new(State::default()),
            wake,
        }
    }

    /// Tells the main loop that a vCPU is now throttled or limited.
    pub(crate) fn wake_main_loop(&self) {
        (self.wake)();
    }

    /// The VM's ring size in entries, if it has a ring.
    pub(crate) fn ring(&self) -> Option<u32> {
        self.dirty.ring_size()
    }

    /// `set-vcpu-dirty-limit`: limits vCPU `cpu` (every vCPU when `None`) to
    /// `mb` MB/s over periods of `period_ms`; 0 MB/s cancels, as in QEMU.
    ///
    /// # Errors
    /// No ring, no such vCPU, too high, a migration owns the limits, logging failed.
    pub(crate) fn set(
        &self,
        cpu: Option<usize>,
        mb: u64,
        period_ms: u64,
    ) -> Result<(), LimitError> {
        if mb > MAX_DIRTY_RATE_MB {
            return Err(LimitError::TooHigh(mb));
        }
        let mut state = crate::lock(&self.state);
        if state.migrating {
            return Err(LimitError::Migrating(if mb == 0 {
                "cancel"
            } else {
                "set"
            }));
        }
        self.apply(&mut state, cpu, mb, period_ms)
    }

    /// `cancel-vcpu-dirty-limit`; nothing to do on a VM without a ring (as
    /// QEMU returns).
    ///
    /// # Errors
    /// No such vCPU, a migration owns the limits.
    pub(crate) fn cancel(&self, cpu: Option<usize>) -> Result<(), LimitError> {
        if self.ring().is_none() {
            return Ok(());
        }
        self.set(cpu, 0, DEFAULT_PERIOD_MS)
    }

    fn apply(
        &self,
        state: &mut State,
        cpu: Option<usize>,
        mb: u64,
        period_ms: u64,
    ) -> Result<(), LimitError> {
        if self.ring().is_none() {
            return Err(LimitError::NoRing);
        }
        let chosen: Vec<&Arc<VcpuShared>> = match cpu {
            Some(i) => vec![self.vcpus.get(i).ok_or(LimitError::CpuIndex)?],
            None => self.vcpus.iter().collect(),
        };
        if mb > 0 && state.hold.is_none() {
            state.hold = Some(self.dirty.subscribe().map_err(LimitError::Logging)?);
            // Begun once logging is on: a limit refused leaves no observation.
            state.observed = (!state.migrating).then(|| Baseline::start(&self.vcpus).begin());
        }
        for v in chosen {
            v.dirty_limit.set(mb.min(MAX_DIRTY_RATE_MB), period_ms);
        }
        if mb > 0 {
            self.wake_main_loop();
        }
        if self.vcpus.iter().all(|v| v.dirty_limit.limit_mb() == 0) {
            // Nobody limited: logging is let go (dropping the consumer),
            // then the stall it cost ends (its aftermath counting on).
            state.hold = None;
            state.observed = None;
        }
        Ok(())
    }

    /// A migration with `dirty-limit` starts: it owns the limits from now
    /// until [`Limits::end_migration`] (standalone changes are refused).
    /// Standalone limits' stall ends here: the migration's own period
    /// counts the guest's stall from its start.
    pub(crate) fn begin_migration(&self) {
        let mut state = crate::lock(&self.state);
        state.migrating = true;
        state.observed = None;
    }

    /// The migration's `dirty-limit`: the vCPUs of `vcpus` (every vCPU
    /// when it is empty) limited to `mb` MB/s, the others not at all.
    ///
    /// # Errors
    /// Logging could not be turned on (the limits are then as before).
    pub(crate) fn for_migration(
        &self,
        mb: u64,
        period_ms: u64,
        vcpus: VcpuSet,
    ) -> Result<(), LimitError> {
        let mut state = crate::lock(&self.state);
        if vcpus.is_empty() {
            return self.apply(&mut state, None, mb, period_ms);
        }
        // The named first, so that logging stays held while the others'
        // limits go.
        let (named, others): (Vec<usize>, Vec<usize>) =
            (0..self.vcpus.len()).partition(|&i| vcpus.contains(i));
        for i in named {
            self.apply(&mut state, Some(i), mb, period_ms)?;
        }
        for i in others {
            self.apply(&mut state, Some(i), 0, period_ms)?;
        }
        Ok(())
    }

    /// The migration is over: every limit is lifted (QEMU cancels them
    /// all) and standalone limits are taken again.
    pub(crate) fn end_migration(&self) {
        let mut state = crate::lock(&self.state);
        if std::mem::take(&mut state.migrating) {
            if let Err(e) = self.apply(&mut state, None, 0, DEFAULT_PERIOD_MS) {
                log::warn!("migration: lifting the dirty limits: {e}");
            }
        }
    }

    /// `query-vcpu-dirty-limit`: the vCPUs with a limit.
    pub(crate) fn query(&self) -> Vec<DirtyLimitInfo> {
        self.vcpus
            .iter()
            .filter(|v| v.dirty_limit.limit_mb() > 0)
            .map(|v| DirtyLimitInfo {
                cpu_index: v.index,
                limit_rate: v.dirty_limit.limit_mb(),
                current_rate: v.dirty_limit.current_mb(),
            })
            .collect()
    }

    /// QEMU's `dirty-limit-throttle-time-per-round`: the longest sleep per
    /// ring's worth of pages of any vCPU over its last period, us.
    pub(crate) fn throttle_time_per_round(&self) -> u64 {
        self.vcpus
            .iter()
            .map(|v| v.dirty_limit.per_round_us())
            .max()
            .unwrap_or(0)
    }

    /// QEMU's `dirty-limit-ring-full-time`: the time a vCPU fills its ring at
    /// the vCPUs' mean dirty rate, us (0 when none dirties).
    pub(crate) fn ring_full_time(&self) -> u64 {
        let n = self.vcpus.len().max(1) as u64;
        let mean = self
            .vcpus
            .iter()
            .map(|v| v.dirty_limit.current_bytes())
            .sum::<u64>()
            / n;
        ring_full_time_us(u64::from(self.ring().unwrap_or(0)), mean)
    }
}
