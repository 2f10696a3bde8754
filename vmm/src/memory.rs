//! Guest RAM: one anonymous private mapping at guest address 0, through vm-memory.

use vm_memory::{
    GuestAddress, GuestMemoryBackend as _, GuestMemoryMmap, GuestMemoryRegion as _,
    GuestRegionMmap, MmapRegion,
};

use crate::abi;
use crate::x86_64::paging;

/// Guest RAM as the VMM sees it.
pub(crate) type GuestMemory = GuestMemoryMmap<()>;

/// Why guest RAM could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The size is under the guest ABI's minimum.
    #[error("guest memory of {size} bytes is too small: the guest ABI needs at least {min} bytes")]
    TooSmall {
        /// The size asked for, in bytes.
        size: u64,
        /// The guest ABI's minimum, in bytes.
        min: u64,
    },
    /// The size is not a whole number of 2 MiB pages (bytes given).
    #[error("guest memory of {0} bytes is not a multiple of 2 MiB")]
    Unaligned(u64),
    /// The size is over [`MAX_MEMORY`] (or over what this host can address).
    #[error("guest memory of {} is over the maximum of {} MiB ({} GiB, which the guest's page tables cover, less the 2 MiB MMIO page)", crate::units::format_bytes(*.size), .max >> 20, (.max + paging::PAGE_2M) >> 30)]
    TooLarge {
        /// The size asked for, in bytes.
        size: u64,
        /// [`MAX_MEMORY`], in bytes.
        max: u64,
    },
    /// The anonymous mapping failed (bytes given).
    #[error("mapping {0} bytes of guest memory")]
    Map(u64, #[source] vm_memory::mmap::FromRangesError),
    /// `madvise` (huge pages on or off) failed.
    #[error("madvise on guest memory")]
    Madvise(#[source] std::io::Error),
}

/// Largest guest RAM: the page directories reserved cover RAM plus the 2 MiB MMIO page.
pub(crate) const MAX_MEMORY: u64 = (abi::MAX_PD_PAGES << 30) - paging::PAGE_2M;

/// Checks a RAM size against the guest ABI.
///
/// # Errors
/// `TooSmall`, `Unaligned` or `TooLarge`.
pub fn check_size(size: u64) -> Result<(), Error> {
    if size < abi::MIN_MEMORY {
        return Err(Error::TooSmall {
            size,
            min: abi::MIN_MEMORY,
        });
    }
    if size % paging::PAGE_2M != 0 {
        return Err(Error::Unaligned(size));
    }
    if size > MAX_MEMORY {
        return Err(Error::TooLarge {
            size,
            max: MAX_MEMORY,
        });
    }
    Ok(())
}

/// Maps `size` bytes of guest RAM. With `hugepages` the mapping is madvised
/// MADV_HUGEPAGE (transparent huge pages, so the MMU can map 2 MiB at a time);
/// without, MADV_NOHUGEPAGE, so that results do not depend on the host's THP default.
///
/// # Errors
/// A bad size, or the mmap/madvise that failed.
pub fn create(size: u64, hugepages: bool) -> Result<GuestMemory, Error> {
    check_size(size)?;
    let len = usize::try_from(size).map_err(|_| Error::TooLarge {
        size,
        max: MAX_MEMORY,
    })?;
    let mem =
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), len)]).map_err(|e| Error::Map(size, e))?;
    let advice = if hugepages {
        libc::MADV_HUGEPAGE
    } else {
        libc::MADV_NOHUGEPAGE
    };
    for region in mem.iter() {
        // SAFETY: the range is exactly one mapping vm-memory made and still owns;
        // madvise only changes how the kernel backs it.
        let rc = unsafe { libc::madvise(region.as_ptr().cast(), region.size(), advice) };
        if rc != 0 {
            return Err(Error::Madvise(std::io::Error::last_os_error()));
        }
    }
    Ok(mem)
}

/// Guest RAM's one region (see [`create`]): the host mapping that the
/// readiness scan, `mincore` and the page map read.
pub(crate) fn region(mem: &GuestMemory) -> Option<&GuestRegionMmap<()>> {
    mem.iter().next()
}

/// Which pages of `region` the host backs with memory (`mincore`: one byte
/// per 4 KiB page, bit 0 set when resident), and how many. A page never
/// backed reads as zero without being read.
///
/// # Errors
/// The mincore call failed.
pub(crate) fn resident(region: &MmapRegion<()>) -> std::io::Result<(Vec<u8>, u64)> {
    const PAGE: usize = 4096;
    let len = region.size();
    let mut map = vec![0u8; len.div_ceil(PAGE)];
    // SAFETY: mincore only reads the process's page tables for the mapping and
    // writes one byte per page into `map`, which has exactly that many bytes.
    let rc = unsafe { libc::mincore(region.as_ptr().cast(), len, map.as_mut_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let count = map.iter().filter(|b| *b & 1 != 0).count() as u64;
    Ok((map, count))
}

/// Total bytes of guest RAM.
pub(crate) fn size(mem: &GuestMemory) -> u64 {
    mem.iter().map(|r| r.len()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_checks_name_the_problem() {
        assert!(matches!(check_size(4 << 20), Err(Error::TooSmall { .. })));
        assert!(matches!(
            check_size((64 << 20) + 4096),
            Err(Error::Unaligned(_))
        ));
        assert!(matches!(
            check_size(MAX_MEMORY + paging::PAGE_2M),
            Err(Error::TooLarge { .. })
        ));
        assert!(check_size(64 << 20).is_ok());
    }

    #[test]
    fn the_largest_guest_is_64_gib_less_2_mib_and_the_error_names_it() {
        assert_eq!(MAX_MEMORY, (64 << 30) - (2 << 20));
        assert!(check_size(MAX_MEMORY).is_ok());
        assert!(check_size(63 << 30).is_ok());
        let err = check_size(64 << 30).unwrap_err().to_string();
        assert!(
            err.contains("64 GiB is over the maximum of 65534 MiB"),
            "{err}"
        );
    }

    #[test]
    fn creates_zeroed_memory_of_the_requested_size() {
        let mem = create(32 << 20, false).unwrap();
        assert_eq!(size(&mem), 32 << 20);
        let v: u64 = vm_memory::Bytes::read_obj(&mem, GuestAddress(abi::ARENA_BASE)).unwrap();
        assert_eq!(v, 0);
    }

    #[test]
    fn resident_sees_touched_pages_of_a_fresh_mapping() {
        use vm_memory::{Bytes, VolatileMemory};
        let len = 16 * 4096;
        let region = vm_memory::MmapRegion::<()>::new(len).unwrap();
        let (_, before) = resident(&region).unwrap();
        region.as_volatile_slice().write_obj(1u8, 3 * 4096).unwrap();
        let (map, after) = resident(&region).unwrap();
        assert_eq!(before, 0);
        assert_eq!(after, 1);
        assert_eq!(map[3] & 1, 1);
    }
}
