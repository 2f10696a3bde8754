//! The [`Migration`] handle the control socket drives: one migration at a
//! time, its parameters, its `query-migrate` record and its events. The
//! sender and the receiver update it; `Migration::start`, which spawns the
//! sender, is in mod.rs so that this file names neither.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use strum::IntoEnumIterator;
use vmm_sys_util::eventfd::EventFd;

use super::converge::Mechanism;
use super::format;
use super::transport::{self, Uri};
use crate::protocol::events::{EventKind, MigrationChange};
#[cfg(test)]
use crate::protocol::migration::VcpuSet;
use crate::protocol::migration::{Capability, CapabilityStatus, SetCapabilities};
use crate::protocol::migration::{MigrationInfo, Parameters, RamStats, SetParameters, Status};

/// Longest downtime limit accepted, ms (QEMU's limit).
pub(crate) const MAX_DOWNTIME_LIMIT: u64 = crate::protocol::MAX_DOWNTIME_LIMIT_MS;

/// Why a migration could not start or a parameter was refused.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A migration is in progress (its status given).
    #[error("a migration is already {0}")]
    Busy(&'static str),
    /// An earlier migration completed: the guest lives on the destination.
    #[error(
        "the guest has migrated away (postmigrate): `cont` runs it here again, or quit this VMM"
    )]
    Postmigrate,
    /// This VMM is loading an incoming stream and cannot send one.
    #[error("this VMM is a migration destination")]
    Incoming,
    /// `downtime-limit` is over [`MAX_DOWNTIME_LIMIT`] ms (the value given).
    #[error(
        "Parameter 'downtime-limit' expects a value from 0 to {MAX_DOWNTIME_LIMIT} ms, not {0}"
    )]
    DowntimeLimit(u64),
    /// A `cpu-throttle-*` parameter out of 1 to 99 (its name, the value).
    #[error("Parameter '{0}' expects a value from 1 to 99, not {1}")]
    Throttle(&'static str, u64),
    /// `max-cpu-throttle` below `cpu-throttle-initial`, as the parameters
    /// would be with the request's applied (QEMU refuses it the same way).
    #[error(
        "Parameter 'max-cpu-throttle' expects a value from cpu-throttle-initial ({initial}) to 99, not {max}"
    )]
    ThrottleBelowInitial {
        /// `max-cpu-throttle` as it would be.
        max: u64,
        /// `cpu-throttle-initial` as it would be.
        initial: u64,
    },
    /// `x-cpu-throttle-vcpus` or `x-vcpu-dirty-limit-vcpus` names a vCPU
    /// the VM does not have (the parameter, the index, the VM's vCPUs).
    #[error(
        "Parameter '{0}' expects the VM's vCPUs (cpu-index 0 to {last}), not {1}",
        last = .2.saturating_sub(1)
    )]
    ThrottleVcpu(&'static str, usize, usize),
    /// Capabilities cannot change while a migration runs (QEMU's words).
    #[error("There's a migration process in progress")]
    CapabilitiesBusy,
    /// `dirty-limit` on a VM without a dirty ring (QEMU's words, then ours).
    #[error("dirty-limit requires KVM with accelerator property 'dirty-ring-size' set (start the VM with --dirty-log ring)")]
    DirtyLimitNeedsRing,
    /// `dirty-limit` and `auto-converge` together (QEMU's words).
    #[error("dirty-limit conflicts with auto-converge either of then available currently")]
    DirtyLimitConflict,
    /// One of QEMU's capabilities that kvmscope does not implement, turned on.
    #[error("kvmscope does not implement the migration capability '{0}' (it stays off; query-migrate-capabilities lists the ones it has)")]
    NotImplemented(String),
    /// `events` turned off: kvmscope always sends its migration events.
    #[error("capability 'events' cannot be turned off: kvmscope always sends MIGRATION and MIGRATION_PASS (the host exporter learns from them that a VM migrated away)")]
    EventsAlwaysOn,
    /// `vcpu-dirty-limit` out of 1 MB/s to `MAX_DIRTY_RATE_MB` (the value given).
    #[error(
        "Parameter 'vcpu-dirty-limit' expects a rate from 1 to {max} MB/s, not {0}",
        max = crate::vcpu::limits::MAX_DIRTY_RATE_MB
    )]
    DirtyLimit(u64),
    /// `max-bandwidth` over the fastest link a prediction takes (the value).
    #[error(
        "Parameter 'max-bandwidth' expects bytes per second from 0 (unlimited) to {max} (80 Tbit/s), not {0}",
        max = crate::protocol::request::MAX_BANDWIDTH_BYTES
    )]
    MaxBandwidth(u64),
    /// `x-vcpu-dirty-limit-period` out of 1 to 1000 ms (the value given).
    #[error(
        "Parameter 'x-vcpu-dirty-limit-period' expects a value between 1 and 1000 ms, not {0}"
    )]
    DirtyLimitPeriod(u64),
    /// The `migration` thread could not be spawned.
    #[error("starting the migration thread")]
    Spawn(#[source] std::io::Error),
}

/// An event for the control socket's clients.
pub(crate) type Event = EventKind;

struct Inner {
    info: MigrationInfo,
    params: Parameters,
    /// `auto-converge` is on.
    auto_converge: bool,
    /// `dirty-limit` is on.
    dirty_limit: bool,
    /// Each event with the run state's change count when it was queued, so
    /// the control plane can put `STOP`/`RESUME` in order around it.
    events: VecDeque<(u64, Event)>,
    started: Option<Instant>,
    incoming: bool,
    /// A handle on the stream, to shut it down on cancel.
    conn: Option<transport::Conn>,
    /// Who told an incoming migration to stop (`signal 15`, `quit`).
    stopped_by: Option<String>,
    /// An outgoing migration is sending its trailer or past it: the
    /// destination may hold all of it, and `migrate_cancel` is not taken.
    committed: bool,
}

/// The migration of this VMM's guest: one at a time, driven by the control
/// socket (`migrate`, `query-migrate`, `migrate_cancel`, ...), or the
/// incoming side of `run --incoming`.
pub(crate) struct Migration {
    inner: Mutex<Inner>,
    cancel: AtomicBool,
    /// Written when an event is queued, so the control thread wakes.
    wake: std::sync::OnceLock<Arc<EventFd>>,
    /// The VM's run state, whose change count stamps each event.
    run_state: std::sync::OnceLock<Arc<crate::runstate::SharedRunState>>,
    /// On a destination, the pages the stream left holding data, once it
    /// has loaded (0 before).
    loaded_pages: std::sync::atomic::AtomicU64,
}

impl Default for Migration {
    fn default() -> Self {
        Migration::new()
    }
}

/// Events kept for the control plane at most (older ones are dropped).
const MAX_EVENTS: usize = 1024;

impl Migration {
    /// No migration yet, default parameters.
    pub(crate) fn new() -> Self {
        Migration {
            inner: Mutex::new(Inner {
                info: MigrationInfo::default(),
                params: Parameters::default(),
                auto_converge: false,
                dirty_limit: false,
                events: VecDeque::new(),
                started: None,
                incoming: false,
                conn: None,
                stopped_by: None,
                committed: false,
            }),
            cancel: AtomicBool::new(false),
            wake: std::sync::OnceLock::new(),
            run_state: std::sync::OnceLock::new(),
            loaded_pages: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// On a destination whose stream has loaded, the pages it left holding
    /// data (0 before, and on a source).
    pub(crate) fn loaded_pages(&self) -> u64 {
        self.loaded_pages.load(Ordering::Relaxed)
    }

    /// Sets [`Migration::loaded_pages`].
    pub(crate) fn set_loaded_pages(&self, pages: u64) {
        self.loaded_pages.store(pages, Ordering::Relaxed);
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        crate::lock(&self.inner)
    }

    /// The eventfd to write when events are queued (the control thread's watcher).
    pub(crate) fn set_wake(&self, fd: Arc<EventFd>) {
        let _ = self.wake.set(fd);
    }

    /// The run state whose change count stamps each event from now on.
    pub(crate) fn set_run_state(&self, run_state: Arc<crate::runstate::SharedRunState>) {
        let _ = self.run_state.set(run_state);
    }

    /// Resets the record for a new outgoing migration of `total` bytes to
    /// `uri`, in `setup`, with its `MIGRATION` event; the caller then starts
    /// the thread that sends (`Migration::start` in mod.rs).
    ///
    /// # Errors
    /// One is running or done, or this is a destination still loading.
    pub(super) fn begin(&self, uri: &Uri, total: u64) -> Result<(), Error> {
        {
            let mut inner = self.lock();
            if inner.incoming {
                // A destination may send its guest on once it has it.
                if inner.info.status != Some(Status::Completed) {
                    return Err(Error::Incoming);
                }
                inner.incoming = false;
                inner.info.status = None;
            }
            // A source whose guest left refuses; one that a `cont` brought
            // back may send it again, as QEMU's.
            match inner.info.status {
                Some(Status::Completed) if !self.here_again() => return Err(Error::Postmigrate),
                Some(s) if !s.is_final() => return Err(Error::Busy(s.name())),
                _ => {}
            }
            inner.info = MigrationInfo {
                status: Some(Status::Setup),
                ram: Some(RamStats {
                    total,
                    remaining: total,
                    page_size: format::PAGE_SIZE,
                    ..RamStats::default()
                }),
                x_uri: Some(uri.to_string()),
                ..MigrationInfo::default()
            };
            inner.started = Some(Instant::now());
            inner.committed = false;
            self.cancel.store(false, Ordering::Release);
        }
        self.event_status(Status::Setup);
        Ok(())
    }

    /// `query-migrate`.
    pub(crate) fn status(&self) -> MigrationInfo {
        let inner = self.lock();
        let mut info = inner.info.clone();
        if let (Some(s), Some(t)) = (info.status, inner.started) {
            if !s.is_final() {
                info.total_time = Some(crate::units::millis(t.elapsed()));
            }
        }
        if self.here_again() {
            info.x_vm_state = None;
        }
        info
    }

    /// Whether a guest that migrated away runs (or is paused) here again:
    /// a `cont` brought it back, so the run state is no longer `postmigrate`.
    fn here_again(&self) -> bool {
        self.run_state
            .get()
            .is_some_and(|r| r.get() != crate::runstate::RunState::Postmigrate)
    }

    /// `query-migrate-parameters`.
    pub(crate) fn parameters(&self) -> Parameters {
        self.lock().params
    }

    /// `migrate-set-parameters` on a VM of `vcpus` vCPUs; a running
    /// migration picks them up at its next batch.
    ///
    /// # Errors
    /// A value out of range (nothing is changed then).
    pub(crate) fn set_parameters(&self, p: SetParameters, vcpus: usize) -> Result<(), Error> {
        if let Some(d) = p.downtime_limit.filter(|&d| d > MAX_DOWNTIME_LIMIT) {
            return Err(Error::DowntimeLimit(d));
        }
        if let Some(b) = p
            .max_bandwidth
            .filter(|&b| b > crate::protocol::request::MAX_BANDWIDTH_BYTES)
        {
            return Err(Error::MaxBandwidth(b));
        }
        for (name, v) in [
            ("cpu-throttle-initial", p.cpu_throttle_initial),
            ("cpu-throttle-increment", p.cpu_throttle_increment),
            ("max-cpu-throttle", p.max_cpu_throttle),
        ] {
            if let Some(v) = v.filter(|v| !(1..=99).contains(v)) {
                return Err(Error::Throttle(name, v));
            }
        }
        if let Some(v) = p
            .vcpu_dirty_limit
            .filter(|&v| v == 0 || v > crate::vcpu::limits::MAX_DIRTY_RATE_MB)
        {
            return Err(Error::DirtyLimit(v));
        }
        if let Some(v) = p
            .x_vcpu_dirty_limit_period
            .filter(|v| !(1..=1000).contains(v))
        {
            return Err(Error::DirtyLimitPeriod(v));
        }
        for (name, set) in [
            ("x-cpu-throttle-vcpus", p.x_cpu_throttle_vcpus),
            ("x-vcpu-dirty-limit-vcpus", p.x_vcpu_dirty_limit_vcpus),
        ] {
            if let Some(i) = set.and_then(|set| set.iter().find(|&i| i >= vcpus)) {
                return Err(Error::ThrottleVcpu(name, i, vcpus));
            }
        }
        let mut inner = self.lock();
        let mut params = inner.params;
        p.apply_to(&mut params);
        if params.max_cpu_throttle < params.cpu_throttle_initial {
            return Err(Error::ThrottleBelowInitial {
                max: params.max_cpu_throttle,
                initial: params.cpu_throttle_initial,
            });
        }
        inner.params = params;
        Ok(())
    }

    /// `query-migrate-capabilities`.
    pub(crate) fn capabilities(&self) -> Vec<CapabilityStatus> {
        let inner = self.lock();
        Capability::iter()
            .filter(|c| c.implemented())
            .map(|capability| CapabilityStatus {
                capability,
                state: match capability {
                    Capability::AutoConverge => inner.auto_converge,
                    Capability::DirtyLimit => inner.dirty_limit,
                    Capability::Events => true,
                    _ => false,
                },
            })
            .collect()
    }

    /// The mechanism that makes the migration converge, if a capability asks for one.
    pub(crate) fn mechanism(&self) -> Option<Mechanism> {
        let inner = self.lock();
        if inner.dirty_limit {
            Some(Mechanism::DirtyLimit)
        } else {
            inner.auto_converge.then_some(Mechanism::AutoConverge)
        }
    }

    /// Whether this migration owns the VM's dirty limits (`dirty-limit` on).
    pub(crate) fn owns_limits(&self) -> bool {
        self.mechanism() == Some(Mechanism::DirtyLimit)
    }

    /// `migrate-set-capabilities`: all or nothing, not while a migration
    /// runs; `ring`: whether the VM has a dirty ring (`dirty-limit` needs one).
    ///
    /// # Errors
    /// A migration runs, `dirty-limit` without a ring or with `auto-converge`.
    pub(crate) fn set_capabilities(&self, caps: &SetCapabilities, ring: bool) -> Result<(), Error> {
        let mut inner = self.lock();
        if inner.info.status.is_some_and(|s| !s.is_final()) {
            return Err(Error::CapabilitiesBusy);
        }
        let (mut auto_converge, mut dirty_limit) = (inner.auto_converge, inner.dirty_limit);
        for c in &caps.capabilities {
            match c.capability {
                Capability::AutoConverge => auto_converge = c.state,
                Capability::DirtyLimit => dirty_limit = c.state,
                Capability::Events if !c.state => return Err(Error::EventsAlwaysOn),
                Capability::Events => {}
                // QEMU's others: off, as they are; on, refused.
                _ if !c.state => {}
                other => return Err(Error::NotImplemented(other.name())),
            }
        }
        if dirty_limit && !ring {
            return Err(Error::DirtyLimitNeedsRing);
        }
        if dirty_limit && auto_converge {
            return Err(Error::DirtyLimitConflict);
        }
        (inner.auto_converge, inner.dirty_limit) = (auto_converge, dirty_limit);
        Ok(())
    }

    /// `migrate_cancel`: the migration stops at its next step (a blocked
    /// send is woken by shutting the connection) and the guest runs on.
    pub(crate) fn cancel(&self) {
        self.cancel_with(&self.lock());
    }

    /// Sets the cancel flag and shuts the stream, with the handle locked.
    fn cancel_with(&self, inner: &Inner) {
        self.cancel.store(true, Ordering::Release);
        if let Some(c) = &inner.conn {
            c.shutdown();
        }
    }

    /// `migrate_cancel`: cancels, unless the migration is committed (its
    /// trailer sent or being sent, [`Migration::commit`]): the destination may
    /// then hold all of it and run the guest, and a cancel that resumed the
    /// source would leave two guests running. Returns whether it was taken.
    pub(crate) fn cancel_unless_committed(&self) -> bool {
        let inner = self.lock();
        if inner.committed {
            return false;
        }
        self.cancel_with(&inner);
        true
    }

    /// The sender is about to send its trailer, after which the destination
    /// may complete: from now on `migrate_cancel` is not taken. False when a
    /// cancel came first (the trailer must then not go).
    pub(crate) fn commit(&self) -> bool {
        let mut inner = self.lock();
        if self.cancelled() {
            return false;
        }
        inner.committed = true;
        true
    }

    /// Whether the trailer was sent or is being sent ([`Migration::commit`]):
    /// the destination may hold the whole stream and run the guest.
    pub(crate) fn committed(&self) -> bool {
        self.lock().committed
    }

    /// Stops an incoming migration (its reads look every [`transport::TICK`]);
    /// `why` names who asked (`signal 15`, `quit`), the first one kept.
    pub(crate) fn stop_incoming(&self, why: String) {
        self.lock().stopped_by.get_or_insert(why);
        self.cancel();
    }

    /// Why an incoming migration must stop: [`stop_incoming`](Migration::stop_incoming)'s
    /// reason, or `migrate_cancel`; `None` to go on.
    pub(crate) fn incoming_stop(&self) -> Option<String> {
        if !self.cancelled() {
            return None;
        }
        Some(
            self.lock()
                .stopped_by
                .clone()
                .unwrap_or_else(|| "migrate_cancel".into()),
        )
    }

    /// Whether a cancel was asked for.
    pub(crate) fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Acquire)
    }

    /// Events queued since the last call, oldest first, each with how many
    /// times the guest had started or stopped running when it was queued.
    pub(crate) fn take_events(&self) -> Vec<(u64, Event)> {
        self.lock().events.drain(..).collect()
    }

    /// Marks this VMM as a migration destination (`run --incoming`).
    pub(crate) fn set_incoming(&self, uri: &Uri) {
        let mut inner = self.lock();
        inner.incoming = true;
        // No time yet: it counts from the source's connection (`stream_began`).
        inner.started = None;
        inner.info = MigrationInfo {
            status: Some(Status::Setup),
            x_uri: Some(uri.to_string()),
            ..MigrationInfo::default()
        };
    }

    /// A destination's source has connected: its `total-time` counts from
    /// now, as the source's does from its `migrate`, not from the wait.
    pub(crate) fn stream_began(&self) {
        self.lock().started = Some(Instant::now());
    }

    pub(crate) fn update(&self, f: impl FnOnce(&mut MigrationInfo)) {
        f(&mut self.lock().info);
    }

    /// Ends the migration's connection and says how many bytes of the
    /// stream its destination never took, where that is known
    /// ([`transport::Conn::shut_with_unread`]).
    pub(crate) fn shut_with_unread(&self) -> Option<u64> {
        self.lock()
            .conn
            .as_ref()
            .and_then(transport::Conn::shut_with_unread)
    }

    pub(crate) fn set_conn(&self, conn: Option<transport::Conn>) {
        self.lock().conn = conn;
    }

    pub(crate) fn elapsed_ms(&self) -> u64 {
        self.lock()
            .started
            .map_or(0, |t| crate::units::millis(t.elapsed()))
    }

    /// Moves to `status`, with the `MIGRATION` event.
    pub(crate) fn set_status(&self, status: Status) {
        let mut inner = self.lock();
        inner.info.status = Some(status);
        let stamp = self.changes();
        Self::queue(
            &mut inner,
            stamp,
            EventKind::Migration(MigrationChange { status }),
        );
        drop(inner);
        self.wake();
    }

    /// The run state's change count now (0 before the control plane set it).
    fn changes(&self) -> u64 {
        self.run_state.get().map_or(0, |r| r.get_with_changes().1)
    }

    fn queue(inner: &mut Inner, stamp: u64, event: Event) {
        if inner.events.len() == MAX_EVENTS {
            inner.events.pop_front();
        }
        inner.events.push_back((stamp, event));
    }

    fn wake(&self) {
        if let Some(w) = self.wake.get() {
            let _ = w.write(1);
        }
    }

    fn event_status(&self, status: Status) {
        self.event(EventKind::Migration(MigrationChange { status }));
    }

    pub(crate) fn event(&self, event: Event) {
        let stamp = self.changes();
        Self::queue(&mut self.lock(), stamp, event);
        self.wake();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_refuse_a_downtime_limit_over_qemus() {
        let m = Migration::new();
        let bad = SetParameters {
            downtime_limit: Some(MAX_DOWNTIME_LIMIT + 1),
            max_bandwidth: Some(5),
            ..SetParameters::default()
        };
        assert!(matches!(
            m.set_parameters(bad, 1),
            Err(Error::DowntimeLimit(_))
        ));
        assert_eq!(m.parameters(), Parameters::default(), "nothing changed");
        m.set_parameters(
            SetParameters {
                max_bandwidth: Some(125_000_000),
                ..SetParameters::default()
            },
            1,
        )
        .unwrap();
        assert_eq!(m.parameters().max_bandwidth, 125_000_000);
        assert_eq!(m.parameters().downtime_limit, 300);
        // A bandwidth past 80 Tbit/s (2^64-1 included) is refused naming
        // it, where it was taken and predicted over; 80 Tbit/s is taken.
        for b in [10_000_000_000_001, u64::MAX] {
            let e = m
                .set_parameters(
                    SetParameters {
                        max_bandwidth: Some(b),
                        ..SetParameters::default()
                    },
                    1,
                )
                .unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("Parameter 'max-bandwidth' expects bytes per second from 0 (unlimited) to 10000000000000 (80 Tbit/s), not {b}")
            );
        }
        assert_eq!(m.parameters().max_bandwidth, 125_000_000);
        m.set_parameters(
            SetParameters {
                max_bandwidth: Some(10_000_000_000_000),
                ..SetParameters::default()
            },
            1,
        )
        .unwrap();
    }

    #[test]
    fn throttled_vcpus_must_be_the_vms_own() {
        let m = Migration::new();
        let set = |indices: Vec<usize>| SetParameters {
            x_cpu_throttle_vcpus: Some(indices.try_into().unwrap()),
            ..SetParameters::default()
        };
        let e = m.set_parameters(set(vec![0, 2]), 2).unwrap_err();
        assert!(
            matches!(e, Error::ThrottleVcpu("x-cpu-throttle-vcpus", 2, 2)),
            "{e}"
        );
        // The dirty limit's vCPUs alike.
        let limited = SetParameters {
            x_vcpu_dirty_limit_vcpus: Some(vec![3].try_into().unwrap()),
            ..SetParameters::default()
        };
        let e = m.set_parameters(limited, 2).unwrap_err();
        assert_eq!(
            e.to_string(),
            "Parameter 'x-vcpu-dirty-limit-vcpus' expects the VM's vCPUs (cpu-index 0 to 1), not 3"
        );
        assert!(m.parameters().x_cpu_throttle_vcpus.is_empty(), "unchanged");
        m.set_parameters(set(vec![1]), 2).unwrap();
        let p = m.parameters().x_cpu_throttle_vcpus;
        assert_eq!(Vec::from(p), vec![1]);
        // On the wire: a list of indices, ascending; one past the most a VM
        // can have is refused as it is read.
        let json = serde_json::to_value(m.parameters()).unwrap();
        assert_eq!(json["x-cpu-throttle-vcpus"], serde_json::json!([1]));
        let bad: Result<SetParameters, _> =
            serde_json::from_value(serde_json::json!({"x-cpu-throttle-vcpus": [3, 256]}));
        let e = bad.unwrap_err().to_string();
        assert!(
            e.contains("expects cpu-indices below 256 (the most vCPUs a VM has), not 256"),
            "{e}"
        );
        let set: VcpuSet = serde_json::from_value(serde_json::json!([5, 0, 5])).unwrap();
        assert_eq!(Vec::from(set), vec![0, 5]);
        // In words, as reports and logs name them.
        assert_eq!(set.to_string(), "vCPUs 0, 5");
        assert_eq!(p.to_string(), "vCPU 1");
        assert_eq!(VcpuSet::default().to_string(), "every vCPU");
    }
}
