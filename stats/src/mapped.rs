//! Guest memory the KVM MMU maps: the VM stats `pages_4k`, `pages_2m` and
//! `pages_1g` (leaf mappings of the EPT, NPT or shadow page tables), and the
//! bytes they cover.

use crate::{Sample, Schema};

/// Leaf mappings the KVM MMU holds (VM stats `pages_4k/2m/1g`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Mapped {
    /// 4 KiB mappings.
    pub pages_4k: u64,
    /// 2 MiB mappings.
    pub pages_2m: u64,
    /// 1 GiB mappings.
    pub pages_1g: u64,
}

impl Mapped {
    /// Reads the page counts out of a VM stats sample; a stat the schema
    /// lacks (a vCPU file, an older kernel) reads as 0.
    pub fn from_sample(schema: &Schema, sample: &Sample) -> Mapped {
        let get = |name| schema.find(name).map_or(0, |id| sample.u64(id));
        Mapped {
            pages_4k: get("pages_4k"),
            pages_2m: get("pages_2m"),
            pages_1g: get("pages_1g"),
        }
    }

    /// Bytes of guest memory mapped, saturating: the counts come from a
    /// stats file, which may be hostile.
    pub fn bytes(&self) -> u64 {
        let page = |n: u64, size: u64| n.saturating_mul(size);
        page(self.pages_4k, 4 << 10)
            .saturating_add(page(self.pages_2m, 2 << 20))
            .saturating_add(page(self.pages_1g, 1 << 30))
    }

    /// The counts and their bytes as a JSON object.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "pages_4k": self.pages_4k,
            "pages_2m": self.pages_2m,
            "pages_1g": self.pages_1g,
            "bytes": self.bytes(),
        })
    }
}

#[cfg(test)]
#[path = "mapped_tests.rs"]
mod tests;
