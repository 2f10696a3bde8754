//! Manual dirty-log protection (`KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2`): what
//! the kernel offers, enabling it on a VM, and `KVM_CLEAR_DIRTY_LOG` in
//! bounded chunks.
//!
//! Without it, `KVM_GET_DIRTY_LOG` clears the bitmap and write-protects every
//! page it reports in one call, and turning logging on write-protects the
//! whole slot in one call, holding KVM's MMU lock throughout (several ms per
//! GiB): the guest stalls on its next fault. With it, the read only copies the
//! bitmap and the VMM hands back, chunk by chunk, the bits it has folded; with
//! `KVM_DIRTY_LOG_INITIALLY_SET`, turning logging on protects nothing and sets
//! every bit instead, which the VMM clears the same way. No single ioctl
//! covers more than [`CHUNK_PAGES`] pages of guest memory.

use kvm_bindings::{
    kvm_clear_dirty_log, kvm_enable_cap, KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2,
    KVM_DIRTY_LOG_INITIALLY_SET, KVM_DIRTY_LOG_MANUAL_PROTECT_ENABLE,
};
use kvm_ioctls::VmFd;
use vmm_sys_util::ioctl::ioctl_with_ref;

use super::error::Error;

/// Pages of guest memory one `KVM_CLEAR_DIRTY_LOG` covers at most: 64 MiB,
/// so that no call holds KVM's MMU lock for long (QEMU clears 1 GiB at a
/// time by default; smaller chunks cost more calls, each cheap).
pub(crate) const CHUNK_PAGES: u64 = 16384;
const CHUNK_WORDS: usize = (CHUNK_PAGES / 64) as usize;

/// The macro makes a `pub fn`; this module keeps the ioctl number out of the
/// crate's API.
mod nr {
    vmm_sys_util::ioctl_iowr_nr!(
        KVM_CLEAR_DIRTY_LOG,
        kvm_bindings::KVMIO,
        0xc0,
        kvm_bindings::kvm_clear_dirty_log
    );
}
use nr::KVM_CLEAR_DIRTY_LOG;

/// How the bitmap's pages are write-protected again after a read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protection {
    /// `KVM_GET_DIRTY_LOG` clears and re-protects (one call for the slot),
    /// and turning logging on protects the whole slot at once: the fallback,
    /// for kernels without the capability or when it is turned off.
    Whole,
    /// `KVM_CLEAR_DIRTY_LOG` in chunks after each read.
    Manual {
        /// `KVM_DIRTY_LOG_INITIALLY_SET`: turning logging on protects
        /// nothing; every bit starts set and is cleared in chunks.
        initially_set: bool,
    },
}

impl Protection {
    /// Manual protection with initially-set bits.
    pub const INITIALLY_SET: Protection = Protection::Manual {
        initially_set: true,
    };
}

impl std::fmt::Display for Protection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Protection::Whole => write!(f, "whole-slot protect (KVM_GET_DIRTY_LOG clears)"),
            Protection::Manual {
                initially_set: true,
            } => write!(
                f,
                "manual protect, initially set (KVM_CLEAR_DIRTY_LOG in 64 MiB chunks)"
            ),
            Protection::Manual {
                initially_set: false,
            } => write!(f, "manual protect (KVM_CLEAR_DIRTY_LOG in 64 MiB chunks)"),
        }
    }
}

/// The `KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2` flags the kernel offers on `vm`
/// (0: none).
pub fn offered(vm: &VmFd) -> u32 {
    let flags = vm.check_extension_raw(u64::from(KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2));
    u32::try_from(flags).unwrap_or(0)
}

/// Enables manual protection on `vm` where the kernel offers it and `wanted`;
/// call before registering memory, so that `INITIALLY_SET` applies to the
/// slot's first bitmap. A kernel that offers it but refuses it gets the
/// fallback (with a warning): nothing is lost but speed.
pub(crate) fn enable(vm: &VmFd, wanted: bool) -> Protection {
    let flags = offered(vm) & (KVM_DIRTY_LOG_MANUAL_PROTECT_ENABLE | KVM_DIRTY_LOG_INITIALLY_SET);
    if !wanted || flags & KVM_DIRTY_LOG_MANUAL_PROTECT_ENABLE == 0 {
        return Protection::Whole;
    }
    let mut cap = kvm_enable_cap {
        cap: KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2,
        ..Default::default()
    };
    cap.args[0] = u64::from(flags);
    match vm.enable_cap(&cap) {
        Ok(()) => Protection::Manual {
            initially_set: flags & KVM_DIRTY_LOG_INITIALLY_SET != 0,
        },
        Err(e) => {
            log::warn!("dirty log: KVM refused manual protect (flags {flags:#x}): {e}; clearing whole slots");
            Protection::Whole
        }
    }
}

/// Clears the bits set in `words` (slot `slot`'s bitmap as read, `pages`
/// pages) and write-protects those pages again, one ioctl per chunk of
/// [`CHUNK_PAGES`] that has a bit set; returns how many ioctls it took.
///
/// # Errors
/// `ClearLog` naming the first page of the chunk KVM refused.
pub(crate) fn clear(vm: &VmFd, slot: u32, words: &[u64], pages: u64) -> Result<u32, Error> {
    let mut calls = 0;
    for (i, chunk) in words.chunks(CHUNK_WORDS).enumerate() {
        if chunk.iter().all(|&w| w == 0) {
            continue;
        }
        clear_chunk(vm, slot, i as u64 * CHUNK_PAGES, pages, chunk)?;
        calls += 1;
    }
    Ok(calls)
}

/// Clears every bit of slot `slot` (`pages` pages), chunk by chunk: what
/// `INITIALLY_SET` set when logging was turned on; returns the ioctl count.
///
/// # Errors
/// `ClearLog` naming the first page of the chunk KVM refused.
pub(crate) fn clear_all(vm: &VmFd, slot: u32, pages: u64) -> Result<u32, Error> {
    let ones = [u64::MAX; CHUNK_WORDS];
    let mut calls = 0;
    let mut first = 0;
    while first < pages {
        clear_chunk(vm, slot, first, pages, &ones)?;
        first += CHUNK_PAGES;
        calls += 1;
    }
    Ok(calls)
}

/// One `KVM_CLEAR_DIRTY_LOG` of the pages from `first` (a multiple of 64)
/// whose bits are set in `bits`, up to [`CHUNK_PAGES`] and the slot's end.
///
/// # Errors
/// `ClearLog` naming `first`.
pub(crate) fn clear_chunk(
    vm: &VmFd,
    slot: u32,
    first: u64,
    pages: u64,
    bits: &[u64],
) -> Result<(), Error> {
    // KVM wants a multiple of 64 pages unless the range ends the slot.
    let n = CHUNK_PAGES
        .min(pages.saturating_sub(first))
        .min(bits.len() as u64 * 64);
    if n == 0 {
        return Ok(());
    }
    let mut arg = kvm_clear_dirty_log {
        slot,
        num_pages: u32::try_from(n).unwrap_or(u32::MAX),
        first_page: first,
        ..Default::default()
    };
    // KVM reads n.div_ceil(64) words from here; `bits` holds at least that many.
    arg.__bindgen_anon_1.dirty_bitmap = bits.as_ptr().cast_mut().cast();
    // SAFETY: the VM fd is valid; `arg` points at `bits`, which outlives the
    // call and holds every word KVM reads (it never writes to the bitmap).
    let rc = unsafe { ioctl_with_ref(vm, KVM_CLEAR_DIRTY_LOG(), &arg) };
    if rc < 0 {
        return Err(Error::ClearLog(first, std::io::Error::last_os_error()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protections_say_what_they_do() {
        assert!(Protection::Whole.to_string().contains("whole"));
        let manual = Protection::Manual {
            initially_set: true,
        };
        assert!(manual.to_string().contains("initially set"));
    }

    #[test]
    fn a_chunk_is_a_whole_number_of_bitmap_words() {
        assert_eq!(CHUNK_PAGES % 64, 0);
        assert_eq!(CHUNK_PAGES * 4096, 64 << 20);
    }
}
