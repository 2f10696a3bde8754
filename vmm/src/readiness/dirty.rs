//! Dirty-page tracking: KVM's dirty bitmap (KVM_GET_DIRTY_LOG) or dirty ring
//! (KVM_CAP_DIRTY_LOG_RING, per vCPU), folded into one tracker that knows the
//! pages written since boot and the pages written in the current window.
//!
//! A VM uses one mode, chosen at start: KVM refuses the bitmap once the ring
//! is on (this kernel has no KVM_CAP_DIRTY_LOG_RING_WITH_BITMAP).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use kvm_bindings::{
    kvm_dirty_log, kvm_enable_cap, KVM_CAP_DIRTY_LOG_RING_ACQ_REL, KVM_DIRTY_LOG_PAGE_OFFSET,
};
use kvm_ioctls::VmFd;
use vmm_sys_util::ioctl::{ioctl, ioctl_with_mut_ref};
use vmm_sys_util::{ioctl_io_nr, ioctl_iow_nr};

/// Which dirty tracking a VM uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirtyMode {
    /// KVM_MEM_LOG_DIRTY_PAGES and KVM_GET_DIRTY_LOG (one bitmap per VM).
    Bitmap,
    /// The dirty ring with this many entries per vCPU (a power of two).
    Ring(u32),
}

/// Why dirty tracking failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the dirty ring needs a power-of-two entry count from {min} to {max}, not {0}", min = MIN_RING_ENTRIES, max = MAX_RING_ENTRIES)]
    RingSize(u32),
    #[error("enabling the dirty ring ({0} entries) on the VM")]
    EnableRing(u32, #[source] kvm_ioctls::Error),
    #[error("mapping vCPU {0}'s dirty ring")]
    MapRing(usize, #[source] std::io::Error),
    #[error("KVM_GET_DIRTY_LOG")]
    GetLog(#[source] std::io::Error),
    #[error("KVM_RESET_DIRTY_RINGS")]
    ResetRings(#[source] std::io::Error),
    #[error("this VM has no dirty tracking: start it with --dirty-log bitmap or --dirty-log ring")]
    Off,
}

/// Smallest ring KVM takes: one page of entries.
pub const MIN_RING_ENTRIES: u32 = 256;
/// Largest ring this library asks for (KVM caps the ring at 1 MiB here).
pub const MAX_RING_ENTRIES: u32 = 65536;
const GFN_DIRTY: u32 = 1;
const GFN_RESET: u32 = 2;
/// Bytes of one `struct kvm_dirty_gfn { u32 flags; u32 slot; u64 offset; }`.
const GFN_BYTES: usize = 16;

ioctl_io_nr!(KVM_RESET_DIRTY_RINGS, kvm_bindings::KVMIO, 0xc7);
ioctl_iow_nr!(KVM_GET_DIRTY_LOG, kvm_bindings::KVMIO, 0x42, kvm_dirty_log);

/// A set of guest pages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bitmap {
    words: Vec<u64>,
    count: u64,
}

impl Bitmap {
    /// An empty set for `pages` pages.
    pub fn new(pages: u64) -> Self {
        Bitmap {
            words: vec![0; pages.div_ceil(64) as usize],
            count: 0,
        }
    }

    /// Adds a page; pages past the end are ignored.
    pub fn set(&mut self, page: u64) {
        if let Some(w) = self.words.get_mut((page / 64) as usize) {
            let bit = 1u64 << (page % 64);
            if *w & bit == 0 {
                *w |= bit;
                self.count += 1;
            }
        }
    }

    /// Adds every page set in `other` (a KVM bitmap, 64 pages a word).
    pub fn or_words(&mut self, other: &[u64]) {
        for (w, o) in self.words.iter_mut().zip(other) {
            self.count += u64::from((o & !*w).count_ones());
            *w |= o;
        }
    }

    /// Whether `page` is in the set.
    pub fn contains(&self, page: u64) -> bool {
        self.words
            .get((page / 64) as usize)
            .is_some_and(|w| w & (1 << (page % 64)) != 0)
    }

    /// Pages in the set.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Pages in the set within `[first, first + n)`.
    pub fn count_range(&self, first: u64, n: u64) -> u64 {
        (first..first + n).filter(|&p| self.contains(p)).count() as u64
    }

    fn clear(&mut self) {
        self.words.iter_mut().for_each(|w| *w = 0);
        self.count = 0;
    }
}

/// Pages written since boot and in the current window.
#[derive(Debug)]
pub struct Tracker {
    pub since_boot: Bitmap,
    pub window: Bitmap,
    /// Ring entries harvested per vCPU in the current window (ring mode).
    pub window_per_vcpu: Vec<u64>,
}

impl Tracker {
    fn new(pages: u64, vcpus: usize) -> Self {
        Tracker {
            since_boot: Bitmap::new(pages),
            window: Bitmap::new(pages),
            window_per_vcpu: vec![0; vcpus],
        }
    }

    fn record(&mut self, vcpu: usize, page: u64) {
        self.since_boot.set(page);
        self.window.set(page);
        if let Some(c) = self.window_per_vcpu.get_mut(vcpu) {
            *c += 1;
        }
    }

    /// Starts a new window.
    pub fn reset_window(&mut self) {
        self.window.clear();
        self.window_per_vcpu.iter_mut().for_each(|c| *c = 0);
    }
}

/// One vCPU's dirty ring, mapped from its fd.
pub struct Ring {
    vcpu: usize,
    base: *mut u8,
    entries: u32,
    fetch: u32,
}

// SAFETY: the mapping is process-wide; all access goes through `&mut self`
// under the `Dirty` mutex, and the kernel's side is synchronised through the
// entries' flags with acquire/release.
unsafe impl Send for Ring {}

impl Ring {
    fn map(vcpu: usize, fd: &File, entries: u32) -> Result<Ring, Error> {
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

    /// Moves every published entry into `tracker`, marking it for reset.
    fn harvest(&mut self, tracker: &mut Tracker) -> u64 {
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
            tracker.record(self.vcpu, page);
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

struct State {
    tracker: Tracker,
    rings: Vec<Ring>,
}

/// A VM's dirty tracking, shared by the vCPU threads (ring-full exits) and readers.
pub struct Dirty {
    pub mode: DirtyMode,
    vm: File,
    slot_size: u64,
    state: Mutex<State>,
}

/// Enables the dirty ring on a VM; call before creating vCPUs.
///
/// # Errors
/// A bad size, or KVM refuses.
pub fn enable_ring(vm: &VmFd, entries: u32) -> Result<(), Error> {
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

impl Dirty {
    /// Tracking for a VM of `mem_size` bytes in one slot; `vcpu_fds` are needed in ring mode.
    ///
    /// # Errors
    /// A ring cannot be mapped.
    pub fn new(
        mode: DirtyMode,
        vm: File,
        mem_size: u64,
        vcpu_fds: &[File],
    ) -> Result<Arc<Dirty>, Error> {
        let rings = match mode {
            DirtyMode::Bitmap => Vec::new(),
            DirtyMode::Ring(entries) => vcpu_fds
                .iter()
                .enumerate()
                .map(|(i, fd)| Ring::map(i, fd, entries))
                .collect::<Result<_, _>>()?,
        };
        let tracker = Tracker::new(mem_size / 4096, vcpu_fds.len());
        Ok(Arc::new(Dirty {
            mode,
            vm,
            slot_size: mem_size,
            state: Mutex::new(State { tracker, rings }),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Folds what KVM has logged since the last sync into the tracker, and
    /// gives the tracker to `f`.
    ///
    /// # Errors
    /// The KVM call failed.
    pub fn sync<T>(&self, f: impl FnOnce(&mut Tracker) -> T) -> Result<T, Error> {
        let mut state = self.lock();
        let State { tracker, rings } = &mut *state;
        match self.mode {
            DirtyMode::Bitmap => {
                let words = self.get_dirty_log()?;
                tracker.since_boot.or_words(&words);
                tracker.window.or_words(&words);
            }
            DirtyMode::Ring(_) => {
                for ring in rings.iter_mut() {
                    ring.harvest(tracker);
                }
                self.reset_rings()?;
            }
        }
        Ok(f(tracker))
    }

    /// Harvests one vCPU's full ring (its KVM_EXIT_DIRTY_RING_FULL exit).
    ///
    /// # Errors
    /// The reset ioctl failed.
    pub fn harvest_vcpu(&self, vcpu: usize) -> Result<u64, Error> {
        let mut state = self.lock();
        let State { tracker, rings } = &mut *state;
        let n = rings.get_mut(vcpu).map_or(0, |r| r.harvest(tracker));
        self.reset_rings()?;
        Ok(n)
    }

    /// KVM_GET_DIRTY_LOG on slot 0: the pages written since the previous call.
    fn get_dirty_log(&self) -> Result<Vec<u64>, Error> {
        let mut words = vec![0u64; (self.slot_size / 4096).div_ceil(64) as usize];
        let mut log = kvm_dirty_log {
            slot: 0,
            ..Default::default()
        };
        log.__bindgen_anon_1.dirty_bitmap = words.as_mut_ptr().cast();
        // SAFETY: `log` points KVM at `words`, which holds one bit per page of slot 0.
        let rc = unsafe { ioctl_with_mut_ref(&self.vm, KVM_GET_DIRTY_LOG(), &mut log) };
        if rc < 0 {
            return Err(Error::GetLog(std::io::Error::last_os_error()));
        }
        Ok(words)
    }

    fn reset_rings(&self) -> Result<(), Error> {
        // SAFETY: KVM_RESET_DIRTY_RINGS takes no argument; the VM fd is valid.
        let rc = unsafe { ioctl(&self.vm, KVM_RESET_DIRTY_RINGS()) };
        if rc < 0 {
            return Err(Error::ResetRings(std::io::Error::last_os_error()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitmap_counts_distinct_pages() {
        let mut b = Bitmap::new(200);
        for p in [0, 5, 5, 63, 64, 199, 500] {
            b.set(p);
        }
        assert_eq!(b.count(), 5);
        assert!(b.contains(64) && !b.contains(65) && !b.contains(500));
        assert_eq!(b.count_range(0, 64), 3);
    }

    #[test]
    fn bitmap_or_counts_only_new_pages() {
        let mut b = Bitmap::new(128);
        b.set(1);
        b.or_words(&[0b11, 1 << 63]);
        assert_eq!(b.count(), 3);
        assert!(b.contains(0) && b.contains(1) && b.contains(127));
    }

    #[test]
    fn tracker_window_resets_but_since_boot_keeps() {
        let mut t = Tracker::new(64, 2);
        t.record(1, 3);
        t.record(1, 3);
        t.reset_window();
        t.record(0, 4);
        assert_eq!((t.since_boot.count(), t.window.count()), (2, 1));
        assert_eq!(t.window_per_vcpu, vec![1, 0]);
    }
}
