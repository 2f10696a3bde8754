//! Loads the guest image and writes the boot structures the guest ABI promises:
//! GDT, TSS, page tables and each vCPU's mailbox.

use std::io::Cursor;

use linux_loader::loader::{elf::Elf, KernelLoader};
use vm_memory::{Bytes, GuestAddress};

use crate::abi::{self, mailbox_offset as mb};
use crate::memory::{self, GuestMemory};
use crate::x86_64::{gdt, paging};

/// The guest built from `guest/` by the build script.
pub static DEFAULT_GUEST: &[u8] = include_bytes!(env!("KVMSCOPE_GUEST_ELF"));

/// Why the guest could not be booted.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("loading the guest ELF")]
    LoadElf(#[source] linux_loader::loader::Error),
    #[error("the guest ELF ends at {end:#x}, past the image area {base:#x}..{limit:#x}")]
    ImageTooLarge { end: u64, base: u64, limit: u64 },
    #[error("building page tables")]
    PageTables(#[from] paging::Error),
    #[error("writing boot structures to guest memory at {0:#x}")]
    Write(u64, #[source] vm_memory::GuestMemoryError),
}

/// Loads an ELF guest at its physical addresses; returns its entry point.
///
/// # Errors
/// `LoadElf` for a malformed ELF or one whose entry lies below the image area;
/// `ImageTooLarge` when it does not fit the image area.
pub fn load_guest(mem: &GuestMemory, image: &[u8]) -> Result<u64, Error> {
    let loaded = Elf::load(
        mem,
        None,
        &mut Cursor::new(image),
        Some(GuestAddress(abi::IMAGE_BASE)),
    )
    .map_err(Error::LoadElf)?;
    let limit = abi::IMAGE_BASE + abi::IMAGE_MAX;
    if loaded.kernel_end > limit {
        return Err(Error::ImageTooLarge {
            end: loaded.kernel_end,
            base: abi::IMAGE_BASE,
            limit,
        });
    }
    Ok(loaded.kernel_load.0)
}

fn write_words(mem: &GuestMemory, addr: u64, words: &[u64]) -> Result<(), Error> {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    mem.write_slice(&bytes, GuestAddress(addr))
        .map_err(|e| Error::Write(addr, e))
}

/// Writes the GDT, a zeroed TSS and identity page tables over all of guest RAM.
///
/// # Errors
/// Page tables that cannot cover the memory, or a failed write.
pub fn write_boot_structures(mem: &GuestMemory) -> Result<(), Error> {
    let size = memory::size(mem);
    write_words(mem, abi::GDT_ADDR, &gdt::table(abi::TSS_ADDR))?;
    mem.write_slice(&gdt::tss_image(), GuestAddress(abi::TSS_ADDR))
        .map_err(|e| Error::Write(abi::TSS_ADDR, e))?;
    let tables = paging::build(size)?;
    write_words(mem, abi::PML4_ADDR, &tables.pml4)?;
    write_words(mem, abi::PDPT_ADDR, &tables.pdpt)?;
    for (i, pd) in tables.pds.iter().enumerate() {
        write_words(mem, abi::PD_ADDR + i as u64 * abi::PAGE_SIZE, pd)?;
    }
    Ok(())
}

/// The guest-physical address of vCPU `index`'s mailbox.
pub fn mailbox_addr(index: u64) -> u64 {
    abi::MAILBOX_BASE + index * abi::PAGE_SIZE
}

/// Writes the boot facts into vCPU `index`'s mailbox.
///
/// # Errors
/// A failed write.
pub fn write_mailbox_boot(mem: &GuestMemory, index: u64, tsc_khz: u64) -> Result<(), Error> {
    let size = memory::size(mem);
    let facts = [
        u64::from(abi::ABI_VERSION),
        index,
        abi::ARENA_BASE,
        size - abi::ARENA_BASE,
        paging::mmio_addr(size),
        tsc_khz,
    ];
    debug_assert_eq!(mb::TSC_KHZ, 5 * 8);
    write_words(mem, mailbox_addr(index) + mb::ABI_VERSION, &facts)
}

/// Bytes of the arena in a guest of `mem_size` bytes.
pub fn arena_size(mem_size: u64) -> u64 {
    mem_size - abi::ARENA_BASE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_guest_loads_at_the_image_base() {
        let mem = memory::create(32 << 20, false).unwrap();
        let entry = load_guest(&mem, DEFAULT_GUEST).unwrap();
        assert_eq!(entry, abi::IMAGE_BASE);
        let first: u32 = mem.read_obj(GuestAddress(entry)).unwrap();
        assert_ne!(first, 0, "the guest's code was copied in");
    }

    #[test]
    fn rejects_garbage_as_a_guest() {
        let mem = memory::create(32 << 20, false).unwrap();
        assert!(matches!(
            load_guest(&mem, b"not an elf at all, sorry"),
            Err(Error::LoadElf(_))
        ));
    }

    #[test]
    fn boot_structures_land_at_their_abi_addresses() {
        let mem = memory::create(32 << 20, false).unwrap();
        write_boot_structures(&mem).unwrap();
        let cs: u64 = mem
            .read_obj(GuestAddress(abi::GDT_ADDR + 8 * u64::from(gdt::USER_CODE)))
            .unwrap();
        assert_eq!(cs, gdt::code(3).descriptor());
        let pml4e: u64 = mem.read_obj(GuestAddress(abi::PML4_ADDR)).unwrap();
        assert_eq!(pml4e & !0xfff, abi::PDPT_ADDR);
        write_mailbox_boot(&mem, 2, 2_000_000).unwrap();
        let arena: u64 = mem
            .read_obj(GuestAddress(mailbox_addr(2) + mb::ARENA_SIZE))
            .unwrap();
        assert_eq!(arena, (32 << 20) - abi::ARENA_BASE);
        let khz: u64 = mem
            .read_obj(GuestAddress(mailbox_addr(2) + mb::TSC_KHZ))
            .unwrap();
        assert_eq!(khz, 2_000_000);
    }
}
