//! What a migration's source needs of its VM: guest RAM, the dirty log, the
//! vCPUs' shared parts, the main loop's channel, KVM's MSR list and the
//! config record that tells the destination what to build.

use std::sync::mpsc::Sender;
use std::sync::Arc;

use vm_memory::{Bytes, GuestAddress};

use super::format::{self, ConfigRecord};
use crate::dirty::{DirtyLog, DirtyMode};
use crate::memory::GuestMemory;
use crate::messages::VmEvent;
use crate::vcpu::VcpuShared;

/// What the source needs of its VM; cheap to clone.
#[derive(Clone)]
pub(crate) struct Source {
    /// Guest RAM, read for every page sent.
    pub(crate) mem: GuestMemory,
    /// The VM's dirty-log service, subscribed to for the later passes.
    pub(crate) dirty: Arc<DirtyLog>,
    /// Each vCPU's shared part, by index: the way to ask a parked vCPU for its state.
    pub(crate) vcpus: Vec<Arc<VcpuShared>>,
    /// To the main loop, for holding the guest paused.
    pub(crate) main: Sender<VmEvent>,
    /// The MSRs KVM lists as to-save (KVM_GET_MSR_INDEX_LIST).
    pub(crate) msr_list: Arc<Vec<u32>>,
    /// The VM as the stream's config section describes it.
    pub(crate) config: ConfigRecord,
    /// The vCPUs' dirty limits (the `dirty-limit` capability sets them).
    pub(crate) dirty_limits: Arc<crate::vcpu::limits::Limits>,
}

impl Source {
    /// The source side of a VM.
    ///
    /// # Errors
    /// KVM's MSR list cannot be read.
    pub(crate) fn from_vm(vm: &crate::vm::Vm) -> Result<Source, kvm_ioctls::Error> {
        let msr_list = kvm_ioctls::Kvm::new()
            .and_then(|k| k.get_msr_index_list())?
            .as_slice()
            .to_vec();
        let tsc_khz: u64 = vm
            .mem
            .read_obj(GuestAddress(
                crate::boot::mailbox_addr(0) + crate::abi::mailbox_offset::TSC_KHZ,
            ))
            .unwrap_or(0);
        let c = &vm.config;
        let (dirty_mode, ring_entries) = match c.dirty_log {
            None => (format::DIRTY_NONE, 0),
            Some(DirtyMode::Bitmap) => (format::DIRTY_BITMAP, 0),
            Some(DirtyMode::Ring(n)) => (format::DIRTY_RING, n),
        };
        Ok(Source {
            mem: vm.mem.clone(),
            dirty: vm.dirty.clone(),
            vcpus: vm.vcpus.iter().map(|v| v.shared.clone()).collect(),
            main: vm.event_sender(),
            msr_list: Arc::new(msr_list),
            dirty_limits: vm.dirty_limits.clone(),
            config: ConfigRecord {
                memory: c.memory,
                tsc_khz,
                // The VM was built with at most abi::MAX_VCPUS vCPUs.
                vcpus: u32::try_from(c.vcpus).unwrap_or(u32::MAX),
                hugepages: u32::from(c.hugepages),
                dirty_mode,
                ring_entries,
                page_size: format::PAGE_SIZE_FIELD,
                guest_abi: crate::abi::ABI_VERSION,
            },
        })
    }

    /// Bytes of guest RAM.
    pub(crate) fn memory(&self) -> u64 {
        self.config.memory
    }
}
