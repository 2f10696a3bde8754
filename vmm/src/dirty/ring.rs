//! One vCPU's dirty ring (KVM_CAP_DIRTY_LOG_RING_ACQ_REL), mapped from its fd
//! and harvested entry by entry.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU32, Ordering};

use kvm_bindings::{kvm_enable_cap, KVM_CAP_DIRTY_LOG_RING_ACQ_REL, KVM_DIRTY_LOG_PAGE_OFFSET};
use kvm_ioctls::VmFd;

use super::Error;

/// Smallest ring KVM takes: one page of entries.
pub const MIN_RING_ENTRIES: u32 = 256;
/// Largest ring this library asks for (KVM caps the ring at 1 MiB here).
pub const MAX_RING_ENTRIES: u32 = 65536;
const GFN_DIRTY: u32 = 1;
const GFN_RESET: u32 = 2;
/// Bytes of one `struct kvm_dirty_gfn { u32 flags; u32 slot; u64 offset; }`.
const GFN_BYTES: usize = 16;

/// Enables the dirty ring on a VM; call before creating vCPUs.
///
/// # Errors
/// A bad size, or KVM refuses.
pub fn enable(vm: &VmFd, entries: u32) -> Result<(), Error> {
    if !entries.is_power_of_two() || !(MIN_RING_ENTRIES..=MAX_RING_ENTRIES).contains(&entries) {
        return Err(Error::RingSize(entries));
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
pub struct Ring {
    /// The index of the vCPU whose ring this is.
    pub vcpu: usize,
    base: *mut u8,
    entries: u32,
    fetch: u32,
}

// SAFETY: the mapping is process-wide; all access goes through `&mut self`
// under the dirty log's mutex, and the kernel's side is synchronised through
// the entries' flags with acquire/release.
unsafe impl Send for Ring {}

impl Ring {
    /// Maps vCPU `vcpu`'s ring of `entries` entries from its fd.
    ///
    /// # Errors
    /// `MapRing` if the mmap fails.
    pub fn map(vcpu: usize, fd: &File, entries: u32) -> Result<Ring, Error> {
        let len = entries as usize * GFN_BYTES;
        let offset = i64::from(KVM_DIRTY_LOG_PAGE_OFFSET) * 4096;
        // SAFETY: maps `len` bytes of the vCPU fd's dirty-ring area; the result is checked.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                offset,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(Error::MapRing(vcpu, std::io::Error::last_os_error()));
        }
        Ok(Ring {
            vcpu,
            base: base.cast(),
            entries,
            fetch: 0,
        })
    }

    /// Hands every published entry's page (its offset in slot 0) to `record`,
    /// marking the entry for reset; returns how many there were.
    pub fn harvest(&mut self, mut record: impl FnMut(u64)) -> u64 {
        let mut n = 0;
        loop {
            let slot = (self.fetch & (self.entries - 1)) as usize;
            // SAFETY: `slot` < entries, so the entry lies inside the mapping; the
            // flags word is 4-byte aligned and only accessed atomically.
            let flags = unsafe { &*(self.base.add(slot * GFN_BYTES) as *const AtomicU32) };
            if flags.load(Ordering::Acquire) & GFN_DIRTY == 0 {
                return n;
            }
            // SAFETY: the entry is published (DIRTY seen with acquire); offset 8 is its u64 gfn offset.
            let page = unsafe {
                std::ptr::read_volatile(self.base.add(slot * GFN_BYTES + 8) as *const u64)
            };
            record(page);
            flags.store(GFN_RESET, Ordering::Release);
            self.fetch = self.fetch.wrapping_add(1);
            n += 1;
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`.
        unsafe { libc::munmap(self.base.cast(), self.entries as usize * GFN_BYTES) };
    }
}
