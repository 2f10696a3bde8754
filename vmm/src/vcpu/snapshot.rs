//! A vCPU's state for migration: what KVM holds (registers, FPU/XSAVE, XCRs,
//! the MSRs KVM lists to save, debug registers, events, TSC frequency) and
//! what the VMM holds (where the vCPU stands in its command loop, the command
//! it runs, its queue, results, phase and exit counters).
//!
//! KVM state is read and written only by the thread that owns the vCPU fd:
//! on the source while the thread is parked (it serves a [`SnapshotRequest`]),
//! on the destination before the thread starts.

use std::sync::mpsc::Sender;
use std::time::Duration;

use kvm_bindings::{
    kvm_debugregs, kvm_msr_entry, kvm_regs, kvm_sregs, kvm_vcpu_events, kvm_xcrs, kvm_xsave, Msrs,
};
use kvm_ioctls::VcpuFd;
use serde::{Deserialize, Serialize};

/// Why a vCPU's state could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A KVM ioctl failed (its name, the vCPU index).
    #[error("{0} on vCPU {1}")]
    Kvm(&'static str, usize, #[source] kvm_ioctls::Error),
    /// The MSR list is longer than one `KVM_GET_MSRS` call takes (vCPU index, count).
    #[error("vCPU {0}: {1} MSRs do not fit one KVM_GET_MSRS call")]
    TooManyMsrs(usize, usize),
    /// A migrated VMM-side value no source sends (vCPU index, what is wrong).
    #[error("vCPU {0}'s state: {1}")]
    State(usize, String),
    /// A migrated queue entry is not a valid workload spec (vCPU index, spec, why).
    #[error("vCPU {0}'s queued command '{1}' does not parse: {2}")]
    Queue(usize, String, String),
}

/// MSR_IA32_TSC: written last on restore, so the guest's clock goes on from
/// where it stopped.
pub(crate) const MSR_IA32_TSC: u32 = 0x10;

/// What KVM holds of one vCPU.
pub(crate) struct KvmState {
    /// General registers (`KVM_GET_REGS`).
    pub(crate) regs: kvm_regs,
    /// Segment, control and descriptor-table registers (`KVM_GET_SREGS`).
    pub(crate) sregs: kvm_sregs,
    /// FPU, SSE and AVX state (`KVM_GET_XSAVE`).
    pub(crate) xsave: kvm_xsave,
    /// Extended control registers (`KVM_GET_XCRS`).
    pub(crate) xcrs: kvm_xcrs,
    /// Debug registers (`KVM_GET_DEBUGREGS`).
    pub(crate) debug: kvm_debugregs,
    /// Pending exceptions, interrupt shadow, NMI state (`KVM_GET_VCPU_EVENTS`).
    pub(crate) events: kvm_vcpu_events,
    /// `(index, value)` of every listed MSR KVM would read for this vCPU.
    pub(crate) msrs: Vec<(u32, u64)>,
    /// The vCPU's TSC frequency in kHz (0 when KVM cannot tell).
    pub(crate) tsc_khz: u32,
}

impl std::fmt::Debug for KvmState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "KvmState {{ rip: {:#x}, msrs: {}, tsc_khz: {} }}",
            self.regs.rip,
            self.msrs.len(),
            self.tsc_khz
        )
    }
}

/// Where a vCPU stands in the VMM's command loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Site {
    /// Guest code is running (or booting): enter the guest.
    Guest,
    /// The guest waits at a READY/DONE port exit for its next command.
    NextCommand,
    /// In a VMM-side `wait`: `remaining_us` left of it (none: until a command comes).
    Wait {
        /// Microseconds of the `wait` left; `None`: until a command comes.
        remaining_us: Option<u64>,
    },
}

/// A command in progress: its sequence number, spec and time spent so far.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Current {
    /// The command's sequence number on its vCPU (what `guest-command` returned).
    pub(crate) seq: u64,
    /// The command, as a workload spec.
    pub(crate) command: String,
    /// Microseconds of host time it has run so far, on the source.
    pub(crate) elapsed_us: u64,
}

/// A recorded result, as it travels.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ResultRecord {
    /// The command's sequence number on its vCPU.
    pub(crate) seq: u64,
    /// The command, as a workload spec.
    pub(crate) command: String,
    /// `ok`, or what went wrong.
    pub(crate) status: String,
    /// The guest's result words (meaning per command: docs/GUEST_ABI.md).
    pub(crate) values: [u64; 3],
    /// Host time from handing the command over to its completion, microseconds.
    pub(crate) host_time_us: u64,
}

/// What the VMM holds of one vCPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct VmmState {
    /// Where the thread stood when it parked.
    pub(crate) site: Site,
    /// The command the guest (or the VMM, for `wait`) is running.
    pub(crate) current: Option<Current>,
    /// Commands queued and not started, as specs.
    pub(crate) queue: Vec<String>,
    /// The sequence number the next queued command gets.
    pub(crate) next_seq: u64,
    /// Recent results, oldest first (at most `RESULTS_KEPT`).
    pub(crate) results: Vec<ResultRecord>,
    /// The last phase marker the guest reported.
    pub(crate) phase: u64,
    /// The guest has asked for its first command.
    pub(crate) booted: bool,
    /// Our exit counters by label: reasons, then devices.
    pub(crate) reasons: Vec<(String, u64)>,
    /// Exit counts per device on the bus, by label.
    pub(crate) devices: Vec<(String, u64)>,
}

/// One vCPU's whole state.
#[derive(Debug)]
pub(crate) struct Snapshot {
    /// The vCPU's index.
    pub(crate) index: usize,
    /// What KVM holds.
    pub(crate) kvm: KvmState,
    /// What the VMM holds; travels as JSON.
    pub(crate) vmm: VmmState,
}

/// A request a parked vCPU thread serves: read its state and answer.
pub(crate) struct SnapshotRequest {
    /// MSR indexes to read (`KVM_GET_MSR_INDEX_LIST`).
    pub(crate) msr_list: std::sync::Arc<Vec<u32>>,
    /// Where the thread sends its state, or why it could not read it.
    pub(crate) reply: Sender<Result<Snapshot, Error>>,
}

/// Reads what KVM holds of vCPU `index`. Call on its thread, outside KVM_RUN,
/// after any pending I/O was completed (see `Vcpu::complete_io`).
///
/// # Errors
/// The KVM call that failed.
pub(crate) fn capture(fd: &VcpuFd, index: usize, msr_list: &[u32]) -> Result<KvmState, Error> {
    let kvm = |what| move |e| Error::Kvm(what, index, e);
    Ok(KvmState {
        regs: fd.get_regs().map_err(kvm("KVM_GET_REGS"))?,
        sregs: fd.get_sregs().map_err(kvm("KVM_GET_SREGS"))?,
        xsave: fd.get_xsave().map_err(kvm("KVM_GET_XSAVE"))?,
        xcrs: fd.get_xcrs().map_err(kvm("KVM_GET_XCRS"))?,
        debug: fd.get_debug_regs().map_err(kvm("KVM_GET_DEBUGREGS"))?,
        events: fd.get_vcpu_events().map_err(kvm("KVM_GET_VCPU_EVENTS"))?,
        msrs: read_msrs(fd, index, msr_list)?,
        tsc_khz: fd.get_tsc_khz().unwrap_or(0),
    })
}

/// Reads every MSR of `list` that KVM will read for this vCPU. KVM stops a
/// batch at the first MSR it refuses; that one is skipped and the rest read.
fn read_msrs(fd: &VcpuFd, index: usize, list: &[u32]) -> Result<Vec<(u32, u64)>, Error> {
    let mut out = Vec::with_capacity(list.len());
    let mut rest = list;
    let mut calls = 0;
    while !rest.is_empty() {
        calls += 1;
        let entries: Vec<kvm_msr_entry> = rest
            .iter()
            .map(|&i| kvm_msr_entry {
                index: i,
                ..Default::default()
            })
            .collect();
        let mut msrs =
            Msrs::from_entries(&entries).map_err(|_| Error::TooManyMsrs(index, entries.len()))?;
        let n = fd
            .get_msrs(&mut msrs)
            .map_err(|e| Error::Kvm("KVM_GET_MSRS", index, e))?;
        out.extend(msrs.as_slice()[..n].iter().map(|e| (e.index, e.data)));
        rest = rest.get(n + 1..).unwrap_or(&[]);
    }
    log::debug!(
        "vcpu{index}: read {} of {} MSRs in {calls} KVM_GET_MSRS",
        out.len(),
        list.len()
    );
    Ok(out)
}

/// Writes KVM state into a vCPU that has not run. The TSC MSR goes last, so
/// the guest's TSC resumes from the value it had when the source stopped.
/// Returns the MSRs KVM refused (logged by the caller).
///
/// # Errors
/// The KVM call that failed.
pub(crate) fn restore(fd: &VcpuFd, index: usize, s: &KvmState) -> Result<Vec<u32>, Error> {
    let kvm = |what| move |e| Error::Kvm(what, index, e);
    if s.tsc_khz != 0 && fd.get_tsc_khz().ok() != Some(s.tsc_khz) {
        fd.set_tsc_khz(s.tsc_khz).map_err(kvm("KVM_SET_TSC_KHZ"))?;
    }
    fd.set_sregs(&s.sregs).map_err(kvm("KVM_SET_SREGS"))?;
    fd.set_regs(&s.regs).map_err(kvm("KVM_SET_REGS"))?;
    // SAFETY: `xsave` is a whole `kvm_xsave` read by KVM_GET_XSAVE on a vCPU
    // of the same kind; KVM reads only that struct.
    unsafe { fd.set_xsave(&s.xsave) }.map_err(kvm("KVM_SET_XSAVE"))?;
    fd.set_xcrs(&s.xcrs).map_err(kvm("KVM_SET_XCRS"))?;
    fd.set_debug_regs(&s.debug)
        .map_err(kvm("KVM_SET_DEBUGREGS"))?;
    let (tsc, others): (Vec<_>, Vec<_>) = s.msrs.iter().partition(|(i, _)| *i == MSR_IA32_TSC);
    let mut refused = write_msrs(fd, index, &others)?;
    fd.set_vcpu_events(&s.events)
        .map_err(kvm("KVM_SET_VCPU_EVENTS"))?;
    refused.extend(write_msrs(fd, index, &tsc)?);
    Ok(refused)
}

fn write_msrs(fd: &VcpuFd, index: usize, list: &[&(u32, u64)]) -> Result<Vec<u32>, Error> {
    let mut refused = Vec::new();
    let mut rest = list;
    while !rest.is_empty() {
        let entries: Vec<kvm_msr_entry> = rest
            .iter()
            .map(|&&(i, data)| kvm_msr_entry {
                index: i,
                data,
                ..Default::default()
            })
            .collect();
        let msrs =
            Msrs::from_entries(&entries).map_err(|_| Error::TooManyMsrs(index, entries.len()))?;
        let n = fd
            .set_msrs(&msrs)
            .map_err(|e| Error::Kvm("KVM_SET_MSRS", index, e))?;
        if let Some(&&(bad, _)) = rest.get(n) {
            refused.push(bad);
        }
        rest = rest.get(n + 1..).unwrap_or(&[]);
    }
    Ok(refused)
}

/// Microseconds of a duration, saturating.
pub(crate) fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}
