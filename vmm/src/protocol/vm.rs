//! `query-vm`'s reply, shared by the server (`control/commands.rs`) and the
//! clients (`Client::query_vm`, the demo).

use serde::{Deserialize, Serialize};

pub use crate::backend::BackendInfo;

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
}

impl VmInfo {
    /// The region called `name`, if the map has one.
    pub fn region(&self, name: &str) -> Option<&RegionInfo> {
        self.memory.layout.iter().find(|r| r.name == name)
    }
}
