//! The `vmm-stats` thread: every [`PUBLISH_PERIOD`] it copies what the VMM
//! counts (exits per reason, the guest's stall, ring-full time, the
//! auto-converge throttle, dirty limits, a migration's progress) into the VMM's own stats files (`crate::vmmstats`), the one
//! writer of those values. Readiness figures are written by whoever measured
//! them (`deferred`). A reader `pread`s the files whenever it likes: no
//! request, no lock shared with it.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::exits::Reason;
use crate::migration::Migration;
use crate::protocol::migration::Status;
use crate::readiness::MappedPeak;
use crate::vcpu::progress::Meter;
use crate::vcpu::{VcpuShared, VcpuState};
use crate::vmmstats::{VcpuStat, VmStat, VmmStats, PUBLISH_PERIOD};

/// The running publisher; dropping it stops the thread (at once, not at the
/// end of its period).
pub(crate) struct Publisher {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Publisher {
    fn drop(&mut self) {
        let (stopped, wake) = &*self.stop;
        *crate::lock(stopped) = true;
        wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What the publisher reads.
pub(crate) struct Sources {
    pub(crate) stats: Arc<VmmStats>,
    pub(crate) vcpus: Vec<Arc<VcpuShared>>,
    pub(crate) migration: Option<Arc<Migration>>,
    /// The VM's stats, read for what KVM maps, and the most it has mapped.
    pub(crate) mapped: (kvm_stats::StatsFd, Arc<MappedPeak>),
    /// The VM's run state (`query-status`).
    pub(crate) run_state: Arc<crate::runstate::SharedRunState>,
}

/// Starts the `vmm-stats` thread.
///
/// # Errors
/// The thread could not be spawned.
pub(crate) fn start(sources: Sources) -> std::io::Result<Publisher> {
    let stop = Arc::new((Mutex::new(false), Condvar::new()));
    let theirs = stop.clone();
    let thread = std::thread::Builder::new()
        .name("vmm-stats".into())
        .spawn(move || {
            let (stopped, wake) = &*theirs;
            let mut meter = Meter::default();
            let (stats, peak) = &sources.mapped;
            let mut sample = stats.new_sample();
            let mut done = crate::lock(stopped);
            while !*done {
                drop(done);
                publish(&sources, &mut meter);
                // One `pread`; a failure now is one the next period may not have.
                let _ = peak.read(stats, &mut sample);
                done = crate::lock(stopped);
                done = match wake.wait_timeout(done, PUBLISH_PERIOD) {
                    Ok((guard, _)) => guard,
                    Err(poisoned) => poisoned.into_inner().0,
                };
            }
            // One last time, so that a reader after the end sees the final counts.
            publish(&sources, &mut meter);
        })?;
    Ok(Publisher {
        stop,
        thread: Some(thread),
    })
}

/// Nanoseconds since the epoch, wall clock (0 if the clock is before it).
pub(crate) fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, crate::units::nanos)
}

/// One copy of every value; the guest's progress rates are kept over
/// `meter`'s readings (and stored in each vCPU's shared part, where a
/// migration takes its rate before).
pub(crate) fn publish(s: &Sources, meter: &mut Meter) {
    let progress: Vec<Option<u64>> = s.vcpus.iter().map(|v| v.guest_progress()).collect();
    let (running, paused): (Vec<Option<u64>>, Vec<bool>) = s
        .vcpus
        .iter()
        .map(|v| match v.state() {
            VcpuState::Running { seq, .. } => (Some(seq), false),
            VcpuState::Paused => (None, true),
            _ => (None, false),
        })
        .unzip();
    let rates = meter.add(Instant::now(), progress.clone(), &running, &paused);
    let mut stall = 0u64;
    for (i, v) in s.vcpus.iter().enumerate() {
        v.set_progress_per_second(rates[i]);
        s.stats
            .set_vcpu(i, VcpuStat::GuestProgress, progress[i].unwrap_or(0));
        // Rounded to whole units/s: what an Instant stat holds.
        let rate = rates[i].map_or(0, |r| crate::units::saturating_u64(r.round()));
        s.stats.set_vcpu(i, VcpuStat::GuestProgressPerSecond, rate);
        for &r in Reason::ALL {
            s.stats.set_exits(i, r, v.counters.reason(r));
        }
        crate::vcpu::stall::note_usual(v);
        // So far, observations still open and their aftermaths included.
        let own = crate::vcpu::stall::shown_ns(v);
        stall = stall.saturating_add(own);
        s.stats.set_vcpu(i, VcpuStat::GuestStallNs, own);
        s.stats.set_vcpu(
            i,
            VcpuStat::DirtyRingFullNs,
            v.ring_full_ns.load(Ordering::Relaxed),
        );
        let slept = v.throttle.slept_ns();
        s.stats.set_vcpu(i, VcpuStat::ThrottledNs, slept);
        s.stats.set_vcpu(
            i,
            VcpuStat::ThrottlePercentage,
            u64::from(v.throttle.percentage()),
        );
        let limit = v.dirty_limit.limit_mb() * crate::vcpu::dirty_limit::MB;
        s.stats
            .set_vcpu(i, VcpuStat::DirtyLimitBytesPerSecond, limit);
        s.stats.set_vcpu(
            i,
            VcpuStat::DirtyLimitRateBytesPerSecond,
            if limit > 0 {
                v.dirty_limit.current_bytes()
            } else {
                0
            },
        );
    }
    s.stats.set_vm(VmStat::GuestStallNs, stall);
    s.stats.set_vm(VmStat::RunState, s.run_state.get() as u64);
    if let Some(m) = &s.migration {
        let info = m.status();
        s.stats
            .set_vm(VmStat::MigrationStatus, status_code(info.status));
        let ram = info.ram.unwrap_or_default();
        s.stats
            .set_vm(VmStat::MigrationTransferred, ram.transferred);
        s.stats.set_vm(VmStat::MigrationRemaining, ram.remaining);
        s.stats.set_vm(VmStat::MigrationTotal, ram.total);
        s.stats
            .set_vm(VmStat::MigrationDirtySyncs, ram.dirty_sync_count);
        s.stats
            .set_vm(VmStat::MigrationDirtyPagesRate, ram.dirty_pages_rate);
    }
    s.stats.set_vm(VmStat::PublishedAtNs, now_ns());
}

/// `migration_status`'s code (docs/PROTOCOL.md).
fn status_code(status: Option<Status>) -> u64 {
    match status {
        None | Some(Status::None) => 0,
        Some(Status::Setup) => 1,
        Some(Status::Active) => 2,
        Some(Status::Device) => 3,
        Some(Status::Completed) => 4,
        Some(Status::Failed) => 5,
        Some(Status::Cancelled) => 6,
    }
}
