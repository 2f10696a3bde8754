//! Identity page tables over guest RAM and the MMIO page after it, in 2 MiB
//! pages, user-accessible so that the CPL3 guest can touch all of it.

use crate::abi;

const PRESENT: u64 = 1;
const WRITABLE: u64 = 1 << 1;
const USER: u64 = 1 << 2;
const HUGE: u64 = 1 << 7;
const TABLE: u64 = PRESENT | WRITABLE | USER;
/// Bytes one 2 MiB page maps.
pub(crate) const PAGE_2M: u64 = 2 << 20;
const GIB: u64 = 1 << 30;

/// Why page tables could not be built.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// Guest RAM is not a whole number of 2 MiB pages.
    #[error("guest memory of {0:#x} bytes is not a multiple of 2 MiB")]
    Unaligned(u64),
    /// Guest RAM needs more page directories than the ABI reserves.
    #[error(
        "guest memory of {bytes:#x} bytes needs more than the {max} GiB the page tables cover"
    )]
    TooLarge {
        /// Guest RAM, bytes.
        bytes: u64,
        /// GiB the reserved page directories cover.
        max: u64,
    },
}

/// The page tables: one PML4, one PDPT and one page directory per GiB mapped.
pub(crate) struct PageTables {
    /// The top level; entry 0 points at the PDPT.
    pub(crate) pml4: [u64; 512],
    /// One entry per GiB, each pointing at a page directory.
    pub(crate) pdpt: [u64; 512],
    /// Page directories of 2 MiB leaf entries, one per GiB.
    pub(crate) pds: Vec<[u64; 512]>,
}

/// Where the MMIO test page lies for `mem_size` bytes of RAM: the first 2 MiB after it.
pub(crate) fn mmio_addr(mem_size: u64) -> u64 {
    mem_size
}

/// Builds identity tables for `[0, mem_size + 2 MiB)`, the extra 2 MiB holding the
/// MMIO page (mapped, but with no memory behind it, so accesses exit).
///
/// # Errors
/// `Unaligned` unless `mem_size` is a multiple of 2 MiB; `TooLarge` past the
/// reserved page directories.
pub(crate) fn build(mem_size: u64) -> Result<PageTables, Error> {
    if mem_size % PAGE_2M != 0 {
        return Err(Error::Unaligned(mem_size));
    }
    let covered = mem_size + PAGE_2M;
    let pd_count = covered.div_ceil(GIB);
    if pd_count > abi::MAX_PD_PAGES {
        return Err(Error::TooLarge {
            bytes: mem_size,
            max: abi::MAX_PD_PAGES,
        });
    }
    let mut pml4 = [0u64; 512];
    let mut pdpt = [0u64; 512];
    pml4[0] = abi::PDPT_ADDR | TABLE;
    // One PDPT entry and one page directory per GiB, at most MAX_PD_PAGES (checked above).
    let mut pds = Vec::new();
    for (gib, pdpte) in (0..pd_count).zip(pdpt.iter_mut()) {
        *pdpte = (abi::PD_ADDR + gib * abi::PAGE_SIZE) | TABLE;
        let mut pd = [0u64; 512];
        for (i, entry) in (0u64..).zip(pd.iter_mut()) {
            let addr = gib * GIB + i * PAGE_2M;
            if addr < covered {
                *entry = addr | TABLE | HUGE;
            }
        }
        pds.push(pd);
    }
    Ok(PageTables { pml4, pdpt, pds })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Walks the tables like the MMU for a 2 MiB-mapped address.
    fn translate(t: &PageTables, va: u64) -> Option<(u64, u64)> {
        let pml4e = t.pml4[(va >> 39) as usize & 511];
        if pml4e & PRESENT == 0 || pml4e & !0xfff != abi::PDPT_ADDR {
            return None;
        }
        let pdpte = t.pdpt[(va >> 30) as usize & 511];
        if pdpte & PRESENT == 0 {
            return None;
        }
        let pd_index = usize::try_from(((pdpte & !0xfff) - abi::PD_ADDR) / abi::PAGE_SIZE).ok()?;
        let pd = &t.pds[pd_index];
        let pde = pd[(va >> 21) as usize & 511];
        (pde & PRESENT != 0).then_some((pde & !0x1f_ffff | (va & 0x1f_ffff), pde & 0xfff))
    }

    #[test]
    fn maps_ram_and_mmio_page_identically_user_writable_2m() {
        let t = build(512 << 20).unwrap();
        for va in [
            0,
            0x20_1234,
            abi::ARENA_BASE,
            (512 << 20) - 8,
            mmio_addr(512 << 20),
        ] {
            let (pa, flags) = translate(&t, va).unwrap();
            assert_eq!(pa, va);
            assert_eq!(
                flags & (PRESENT | WRITABLE | USER | HUGE),
                PRESENT | WRITABLE | USER | HUGE
            );
        }
        assert_eq!(translate(&t, (512 << 20) + PAGE_2M), None);
    }

    #[test]
    fn uses_one_page_directory_per_gib() {
        assert_eq!(
            build(1 << 30).unwrap().pds.len(),
            2,
            "1 GiB plus the MMIO page spills into a second GiB"
        );
        assert_eq!(build((1 << 30) - PAGE_2M).unwrap().pds.len(), 1);
        let t = build(3 << 30).unwrap();
        assert_eq!(translate(&t, (3 << 30) - 4096).unwrap().0, (3 << 30) - 4096);
    }

    #[test]
    fn rejects_unaligned_and_oversized_memory() {
        assert_eq!(
            build((16 << 20) + 4096).err(),
            Some(Error::Unaligned((16 << 20) + 4096))
        );
        assert!(matches!(
            build(abi::MAX_PD_PAGES << 30),
            Err(Error::TooLarge { .. })
        ));
    }
}
