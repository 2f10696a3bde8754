//! What the control thread may reach of the VM.

use std::fs::File;
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Duration;

use super::error::Error;
use crate::backend::Backend;
use crate::messages::VmEvent;
use crate::runstate::SharedRunState;
use crate::vcpu::VcpuShared;
use crate::vm::{self, Vm};

/// What the control thread may reach of the VM: read-only handles, the vCPUs'
/// shared parts, and a channel to the main loop for run-state changes.
pub(crate) struct Context {
    /// Duplicate of the VM fd, only for KVM_GET_STATS_FD.
    pub(crate) vm_fd: File,
    /// Duplicates of the vCPU stats files the VMM opened before the vCPUs first
    /// ran. The control plane hands out copies of these rather than issuing
    /// KVM_GET_STATS_FD on a vCPU fd, which takes the vCPU's mutex and so
    /// waits, for as long as the guest runs, until the vCPU leaves KVM_RUN.
    pub(crate) vcpu_stats: Vec<File>,
    /// Each vCPU's shared part, by index: queues, results, counters, state.
    pub(crate) vcpus: Vec<Arc<VcpuShared>>,
    /// The host's KVM backend, for the greeting and `query-vm`.
    pub(crate) backend: Backend,
    /// Guest RAM in bytes.
    pub(crate) memory: u64,
    /// Whether guest RAM is backed by huge pages.
    pub(crate) hugepages: bool,
    /// To the main loop: `VmEvent::Control` requests.
    pub(crate) main: Sender<VmEvent>,
    /// The sampler's ring, when it runs (for `query-samples` / `subscribe-samples`).
    pub(crate) samples: Option<Arc<crate::sampler::Shared>>,
    /// Guest RAM (a clone keeps the mapping alive while a readiness scan reads it).
    pub(crate) mem: crate::memory::GuestMemory,
    /// Dirty tracking, when the VM was started with a mode (for `query-readiness`).
    pub(crate) dirty: Option<Arc<crate::dirty::DirtyLog>>,
    /// The VM's name (`query-name`, the greeting).
    pub(crate) name: String,
    /// The run state the main loop keeps (`query-status`).
    pub(crate) run_state: Arc<SharedRunState>,
    /// The migration handle and the VM's source side (for `migrate` and friends).
    pub(crate) migration: Option<(Arc<crate::migration::Migration>, crate::migration::Source)>,
    /// The VMM's own stats files (provider `kvmscope`), kept current by the
    /// `vmm-stats` thread (`publish`).
    pub(crate) vmm_stats: Arc<crate::vmmstats::VmmStats>,
    /// `run --readiness-every`.
    pub(crate) periodic: Option<Periodic>,
    /// The vCPUs' dirty limits (`set-vcpu-dirty-limit` and friends).
    pub(crate) dirty_limits: Arc<crate::vcpu::limits::Limits>,
    /// The most KVM has mapped at once, noted by the `vmm-stats` thread and
    /// every readiness measurement.
    pub(crate) mapped_peak: Arc<crate::readiness::MappedPeak>,
    /// `calc-dirty-rate`'s last measurement, or where it stands.
    pub(crate) dirty_rate: Arc<super::dirty_rate::DirtyRateCalc>,
}

impl Context {
    /// A VM stats fd of its own, schema read.
    ///
    /// # Errors
    /// `KVM_GET_STATS_FD` failed, or the file's header or descriptors.
    pub(crate) fn open_vm_stats(&self) -> Result<kvm_stats::StatsFd, Error> {
        Ok(kvm_stats::StatsFd::new(kvm_stats::ioctl::get_stats_fd(
            &self.vm_fd,
        )?)?)
    }

    /// Gathers the control plane's handles from a VM.
    ///
    /// # Errors
    /// `Dup` if an fd cannot be duplicated.
    pub(crate) fn new(vm: &Vm) -> Result<Context, Error> {
        let vcpu_stats = vm
            .vcpu_stats
            .iter()
            .map(|s| vm::dup_fd(s.file()))
            .collect::<Result<_, _>>()
            .map_err(Error::Dup)?;
        Ok(Context {
            vm_fd: vm::dup_fd(&*vm.fd).map_err(Error::Dup)?,
            vcpu_stats,
            vcpus: vm.vcpus.iter().map(|v| v.shared.clone()).collect(),
            backend: vm.backend.clone(),
            memory: vm.config.memory,
            hugepages: vm.config.hugepages,
            main: vm.event_sender(),
            samples: None,
            mem: vm.mem.clone(),
            dirty: vm.dirty_configured().cloned(),
            name: format!("kvmscope-{}", std::process::id()),
            run_state: Arc::new(SharedRunState::default()),
            migration: None,
            vmm_stats: Arc::new(crate::vmmstats::VmmStats::new(
                std::process::id(),
                vm.vcpus.len(),
            )?),
            periodic: None,
            dirty_limits: vm.dirty_limits.clone(),
            mapped_peak: Arc::default(),
            dirty_rate: Arc::default(),
        })
    }
}

/// `run --readiness-every`: a readiness measurement every `period` with a
/// dirty-rate window of `window`, whose figures go to the VMM's own stats
/// (provider `kvmscope`) for readers that ask nothing (the exporter). The
/// guest pays for tracking during the window only (a ring VM logs only then):
/// at most `window / period` of its time is observed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Periodic {
    /// How often.
    pub period: Duration,
    /// The dirty-rate window of each measurement.
    pub window: Duration,
}
