//! The VM's replies, shared by the server (`control/commands.rs`) and the
//! clients: `query-vm`'s (`Client::query_vm`, the demo), `get-stats-fd`'s
//! (`kvmscope stats`, `watch`, the demo) and `query-exits`' (the demo).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use crate::backend::BackendInfo;
use crate::exits::{Device, ExitCounters, Reason};
use crate::protocol::request::StatsTarget;

/// One region of the guest's memory map (docs/GUEST_ABI.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionInfo {
    /// `gdt`, `tss`, `page-tables`, `mailboxes`, `image`, `stacks`, `arena`
    /// or `mmio-test-page`.
    pub name: String,
    /// First guest-physical byte.
    pub start: u64,
    /// Bytes.
    pub size: u64,
}

/// Guest RAM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryInfo {
    /// Bytes.
    pub size: u64,
    /// Backed by transparent huge pages (`--hugepages`).
    pub hugepages: bool,
    /// The guest's memory map.
    pub layout: Vec<RegionInfo>,
}

/// The stats fds' id strings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatsIds {
    /// The VM stats fd's.
    pub vm: String,
    /// Each vCPU stats fd's, by index.
    pub vcpus: Vec<String>,
}

/// `query-vm`'s return.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct VmInfo {
    /// The VMM's process id.
    pub pid: u32,
    /// The host's KVM backend.
    pub backend: BackendInfo,
    /// Number of vCPUs.
    pub vcpus: u64,
    /// Guest RAM and its map.
    pub memory: MemoryInfo,
    /// The guest ABI version the VMM speaks.
    pub guest_abi: u32,
    /// The stats fds' ids.
    pub stats_ids: StatsIds,
    /// What a fault for dirty logging costs the guest on this host, as the
    /// stall counts it, and where that came from (absent from VMMs before
    /// 2026-12-08).
    #[serde(default)]
    pub fault_cost: Option<FaultCostInfo>,
}

/// `query-vm`'s `fault-cost`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct FaultCostInfo {
    /// Nanoseconds per fault.
    pub ns: u64,
    /// `measured` (at the VMM's start, which takes a few seconds),
    /// `given` (`run --fault-cost`) or `default` (not measured, or not yet).
    pub source: String,
}

impl VmInfo {
    /// The region called `name`, if the map has one.
    pub fn region(&self, name: &str) -> Option<&RegionInfo> {
        self.memory.layout.iter().find(|r| r.name == name)
    }
}

/// One stats fd of a `get-stats-fd` reply, in the order the fds ride.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct StatsFdEntry {
    /// Whose stats: the VM's or a vCPU's.
    pub target: StatsTarget,
    /// The vCPU's index (vCPU target only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcpu: Option<usize>,
    /// The vCPU's QOM path (vCPU target only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qom_path: Option<String>,
    /// The stats fd's id string.
    pub id: String,
}

/// `get-stats-fd`'s return; the fds ride on the reply line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatsFds {
    /// One entry per fd, in order.
    pub fds: Vec<StatsFdEntry>,
}

/// One vCPU's exit counters, as `query-exits` returns them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VcpuExits {
    /// The vCPU's index.
    pub vcpu: usize,
    /// Exits of every reason.
    pub total: u64,
    /// Exits by reason.
    pub reasons: BTreeMap<String, u64>,
    /// Port and MMIO exits by device.
    pub devices: BTreeMap<String, u64>,
}

impl VcpuExits {
    /// vCPU `vcpu`'s counters now.
    pub(crate) fn of(vcpu: usize, c: &ExitCounters) -> VcpuExits {
        VcpuExits {
            vcpu,
            total: c.total(),
            reasons: Reason::ALL
                .iter()
                .map(|&r| (r.label().to_string(), c.reason(r)))
                .collect(),
            devices: Device::ALL
                .iter()
                .map(|&d| (d.label().to_string(), c.device(d)))
                .collect(),
        }
    }

    /// How much each counter grew since `before`: `total` first, then the
    /// reasons and devices that grew, by name.
    pub fn growth(&self, before: &VcpuExits) -> Vec<(String, u64)> {
        let grew = |now: &BTreeMap<String, u64>, then: &BTreeMap<String, u64>| {
            now.iter()
                .map(|(n, v)| {
                    (
                        n.clone(),
                        v.saturating_sub(then.get(n).copied().unwrap_or(0)),
                    )
                })
                .filter(|(_, d)| *d > 0)
                .collect::<Vec<_>>()
        };
        let mut out = vec![("total".to_string(), self.total.saturating_sub(before.total))];
        out.extend(grew(&self.reasons, &before.reasons));
        out.extend(grew(&self.devices, &before.devices));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exits_keep_the_counters_json_shape() {
        let c = ExitCounters::default();
        let mut legacy = c.to_json();
        legacy["vcpu"] = 2.into();
        assert_eq!(serde_json::to_value(VcpuExits::of(2, &c)).unwrap(), legacy);
    }

    #[test]
    fn stats_fd_entries_name_vcpus_only_for_vcpus() {
        let vm = StatsFdEntry {
            target: StatsTarget::Vm,
            vcpu: None,
            qom_path: None,
            id: "kvm-1".into(),
        };
        let wire = serde_json::to_value(&vm).unwrap();
        assert_eq!(wire, serde_json::json!({"target": "vm", "id": "kvm-1"}));
        let one = serde_json::json!({"target": "vcpu", "vcpu": 1, "qom-path": "/machine/unattached/device[1]", "id": "kvm-1-2"});
        let back: StatsFdEntry = serde_json::from_value(one.clone()).unwrap();
        assert_eq!(serde_json::to_value(back).unwrap(), one);
    }
}
