//! One vCPU's dirty ring (KVM_CAP_DIRTY_LOG_RING_ACQ_REL), mapped from its fd
//! and harvested entry by entry.

use std::fs::File;
use std::sync::atomic::Ordering;

use kvm_bindings::{kvm_enable_cap, KVM_CAP_DIRTY_LOG_RING_ACQ_REL, KVM_DIRTY_LOG_PAGE_OFFSET};
use kvm_ioctls::VmFd;
use vm_memory::{Bytes as _, FileOffset, MmapRegion, VolatileMemory as _};

use super::error::Error;

use crate::units::{ring_entries_valid, MAX_RING_ENTRIES, MIN_RING_ENTRIES};
const GFN_DIRTY: u32 = 1;
const GFN_RESET: u32 = 2;
/// Bytes of one `struct kvm_dirty_gfn { u32 flags; u32 slot; u64 offset; }`.
const GFN_BYTES: usize = 16;

/// Enables the dirty ring on a VM; call before creating vCPUs.
///
/// # Errors
/// A bad size, or KVM refuses.
pub(crate) fn enable(vm: &VmFd, entries: u32) -> Result<(), Error> {
    if !ring_entries_valid(entries) {
        return Err(Error::RingSize {
            entries,
            min: MIN_RING_ENTRIES,
            max: MAX_RING_ENTRIES,
        });
    }
    let mut cap = kvm_enable_cap {
        cap: KVM_CAP_DIRTY_LOG_RING_ACQ_REL,
        ..Default::default()
    };
    cap.args[0] = u64::from(entries) * GFN_BYTES as u64;
    vm.enable_cap(&cap)
        .map_err(|e| Error::EnableRing(entries, e))
}

/// One vCPU's dirty ring, mapped from its fd.
pub(crate) struct Ring {
    /// The index of the vCPU whose ring this is.
    pub(crate) vcpu: usize,
    /// The ring's entries, shared with the kernel (`MAP_SHARED`).
    map: MmapRegion<()>,
    entries: u32,
    fetch: u32,
}

impl Ring {
    /// Maps vCPU `vcpu`'s ring of `entries` entries from its fd.
    ///
    /// # Errors
    /// `MapRing` if the fd cannot be duplicated or the mmap fails.
    pub(crate) fn map(vcpu: usize, fd: &File, entries: u32) -> Result<Ring, Error> {
        let len = entries as usize * GFN_BYTES;
        let offset = u64::from(KVM_DIRTY_LOG_PAGE_OFFSET) * 4096;
        let file = fd.try_clone().map_err(|e| Error::MapRing(vcpu, e))?;
        let map = MmapRegion::from_file(FileOffset::new(file, offset), len)
            .map_err(|e| Error::MapRing(vcpu, std::io::Error::other(e)))?;
        Ok(Ring {
            vcpu,
            map,
            entries,
            fetch: 0,
        })
    }

    /// How many entries KVM has published and nobody harvested yet (read
    /// without taking them).
    pub(crate) fn pending(&self) -> u64 {
        let mut n = 0;
        self.peek(|_| n += 1);
        n
    }

    /// Hands every published entry's page to `record` without taking it:
    /// the entries stay for the next harvest, so nothing is reset and no
    /// page is protected again.
    pub(crate) fn peek(&self, mut record: impl FnMut(u64)) {
        let ring = self.map.as_volatile_slice();
        for n in 0..self.entries {
            let at = (self.fetch.wrapping_add(n) & (self.entries - 1)) as usize * GFN_BYTES;
            let flags: u32 = ring.load(at, Ordering::Acquire).unwrap_or(0);
            if flags & GFN_DIRTY == 0 {
                return;
            }
            match ring.read_obj::<u64>(at + 8) {
                Ok(page) => record(page),
                Err(_) => return,
            }
        }
    }

    /// Hands every published entry's page (its offset in slot 0) to `record`,
    /// marking the entry for reset; returns how many there were.
    pub(crate) fn harvest(&mut self, mut record: impl FnMut(u64)) -> u64 {
        let ring = self.map.as_volatile_slice();
        let mut n = 0;
        loop {
            let at = (self.fetch & (self.entries - 1)) as usize * GFN_BYTES;
            // The entry lies inside the mapping (`at` < entries * GFN_BYTES)
            // and its flags word is 4-byte aligned, so neither access fails;
            // were one to, the ring would read as empty.
            let flags: u32 = ring.load(at, Ordering::Acquire).unwrap_or(0);
            if flags & GFN_DIRTY == 0 {
                return n;
            }
            // Published (DIRTY seen with acquire): its u64 gfn offset is at +8.
            let Ok(page) = ring.read_obj::<u64>(at + 8) else {
                return n;
            };
            record(page);
            let _ = ring.store(GFN_RESET, at, Ordering::Release);
            self.fetch = self.fetch.wrapping_add(1);
            n += 1;
        }
    }
}
