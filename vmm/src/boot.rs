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
    /// linux-loader refused the image or could not copy a segment. Its
    /// message already holds its cause's, so it is not given as a source
    /// (which would print the cause twice).
    #[error("loading the guest ELF: {0}")]
    LoadElf(linux_loader::loader::Error),
    #[error("the guest ELF is {}; kvmscope boots 64-bit x86-64 executables (ELFCLASS64)", class_name(*.0))]
    /// The ELF class byte is not ELFCLASS64 (value given).
    ElfClass(u8),
    /// `e_machine` is not EM_X86_64 (value given).
    #[error("the guest ELF is for {}; kvmscope boots x86-64 executables (EM_X86_64)", machine_name(*.0))]
    ElfMachine(u16),
    /// `e_type` is not ET_EXEC (value given).
    #[error("the guest ELF is {}, not an executable (ET_EXEC)", type_name(*.0))]
    ElfType(u16),
    /// The program header table reaches past the end of the file.
    #[error(
        "the guest ELF's program headers ({count} at offset {offset:#x}) lie outside the file"
    )]
    ProgramHeaders {
        /// `e_phoff`: the table's file offset in bytes.
        offset: u64,
        /// `e_phnum`: the number of entries.
        count: u16,
    },
    /// No program header loads anything (none at all, or none `PT_LOAD` with bytes).
    #[error("the guest ELF has nothing to load: none of its {count} program headers is a PT_LOAD segment with bytes")]
    NothingToLoad {
        /// `e_phnum`.
        count: u16,
    },
    /// A loadable segment lies (partly) outside the image area.
    #[error("guest ELF segment {index} ({start:#x}..{end:#x}) overlaps {area}; segments must lie in the image area {:#x}..{:#x}", abi::IMAGE_BASE, abi::IMAGE_BASE + abi::IMAGE_MAX)]
    SegmentPlacement {
        /// The program header's index.
        index: usize,
        /// The segment's first guest physical address.
        start: u64,
        /// One past its last guest physical address.
        end: u64,
        /// The first reserved area it overlaps, or `the end of guest RAM`.
        area: &'static str,
    },
    /// A loadable segment's bytes reach past the end of the file.
    #[error("guest ELF segment {index} takes {size} bytes from offset {offset:#x} of the file, which has {file} (cut short?)")]
    SegmentData {
        /// The program header's index.
        index: usize,
        /// `p_offset`.
        offset: u64,
        /// `p_filesz`.
        size: u64,
        /// The file's length in bytes.
        file: usize,
    },
    /// A loadable segment has more bytes in the file than in memory.
    #[error("guest ELF segment {index} has {filesz} bytes in the file but {memsz} in memory; an ELF segment's file size is at most its memory size")]
    SegmentSizes {
        /// The program header's index.
        index: usize,
        /// `p_filesz`.
        filesz: u64,
        /// `p_memsz`.
        memsz: u64,
    },
    /// A loadable segment's address plus size overflows 64 bits.
    #[error("guest ELF segment {index} has a size that wraps around the address space")]
    SegmentOverflow {
        /// The program header's index.
        index: usize,
    },
    /// The entry point is not inside the image area.
    #[error("the guest ELF's entry point {entry:#x} is outside the image area {:#x}..{:#x}", abi::IMAGE_BASE, abi::IMAGE_BASE + abi::IMAGE_MAX)]
    EntryPlacement {
        /// `e_entry`, a guest address.
        entry: u64,
    },
    /// The guest's page tables could not be built for this RAM size.
    #[error("building page tables")]
    PageTables(#[from] paging::Error),
    /// Writing the GDT, TSS, page tables or a mailbox failed (guest address given).
    #[error("writing boot structures to guest memory at {0:#x}")]
    Write(u64, #[source] vm_memory::GuestMemoryError),
}

/// ELF identification and header values this loader checks.
mod elf_consts {
    pub(crate) const MAGIC: &[u8; 4] = b"\x7fELF";
    pub(crate) const EI_CLASS: usize = 4;
    pub(crate) const ELFCLASS32: u8 = 1;
    pub(crate) const ELFCLASS64: u8 = 2;
    pub(crate) const EM_386: u16 = 3;
    pub(crate) const EM_X86_64: u16 = 62;
    pub(crate) const EM_AARCH64: u16 = 183;
    pub(crate) const EM_RISCV: u16 = 243;
    pub(crate) const ET_REL: u16 = 1;
    pub(crate) const ET_EXEC: u16 = 2;
    pub(crate) const ET_DYN: u16 = 3;
    pub(crate) const ET_CORE: u16 = 4;
    pub(crate) const PT_LOAD: u32 = 1;
    /// Bytes of an ELF64 header and of one ELF64 program header.
    pub(crate) const EHDR_SIZE: usize = 64;
    pub(crate) const PHDR_SIZE: usize = 56;
}
use elf_consts as ec;

fn class_name(class: u8) -> String {
    match class {
        ec::ELFCLASS32 => "32-bit (ELFCLASS32)".into(),
        other => format!("of ELF class {other}"),
    }
}

fn machine_name(machine: u16) -> String {
    let name = match machine {
        ec::EM_386 => "i386 (EM_386)",
        ec::EM_AARCH64 => "AArch64 (EM_AARCH64)",
        ec::EM_RISCV => "RISC-V (EM_RISCV)",
        _ => return format!("machine {machine}"),
    };
    name.into()
}

fn type_name(kind: u16) -> String {
    let name = match kind {
        ec::ET_REL => "a relocatable object (ET_REL)",
        ec::ET_DYN => "a shared object or position-independent executable (ET_DYN)",
        ec::ET_CORE => "a core dump (ET_CORE)",
        _ => return format!("of type {kind}"),
    };
    name.into()
}

/// The guest memory map outside the image area, for naming what a segment
/// overlaps: `(start, end, name)`, in address order.
fn reserved_areas(ram: u64) -> [(u64, u64, &'static str); 8] {
    let pd_end = abi::PD_ADDR + abi::MAX_PD_PAGES * abi::PAGE_SIZE;
    [
        (0, abi::GDT_ADDR, "the first page (kept empty)"),
        (abi::GDT_ADDR, abi::TSS_ADDR, "the GDT"),
        (abi::TSS_ADDR, abi::PML4_ADDR, "the TSS"),
        (abi::PML4_ADDR, pd_end, "the page tables"),
        (pd_end, abi::MAILBOX_BASE, "reserved low memory"),
        (abi::MAILBOX_BASE, abi::IMAGE_BASE, "the vCPU mailboxes"),
        (abi::STACK_BASE, abi::ARENA_BASE, "the vCPU stacks"),
        (abi::ARENA_BASE, ram, "the workload arena"),
    ]
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// Checks what the loader does not: an x86-64 ELF64 executable whose loaded
/// segments and entry point lie in the image area of a guest of `ram` bytes.
/// An image too short or without the ELF magic is left to the loader, which
/// names what is wrong with it.
///
/// # Errors
/// `ElfClass`, `ElfMachine`, `ElfType`, `ProgramHeaders`, `NothingToLoad`,
/// `SegmentSizes`, `SegmentData`, `SegmentPlacement`, `SegmentOverflow` or
/// `EntryPlacement`.
pub(crate) fn check_elf(image: &[u8], ram: u64) -> Result<(), Error> {
    if image.len() < ec::EHDR_SIZE || !image.starts_with(ec::MAGIC) {
        return Ok(());
    }
    if image[ec::EI_CLASS] != ec::ELFCLASS64 {
        return Err(Error::ElfClass(image[ec::EI_CLASS]));
    }
    let machine = u16_at(image, 18);
    if machine != ec::EM_X86_64 {
        return Err(Error::ElfMachine(machine));
    }
    let kind = u16_at(image, 16);
    if kind != ec::ET_EXEC {
        return Err(Error::ElfType(kind));
    }
    let (entry, phoff, phnum) = (u64_at(image, 24), u64_at(image, 32), u16_at(image, 56));
    let table = usize::try_from(phoff)
        .ok()
        .and_then(|start| Some(start..start.checked_add(usize::from(phnum) * ec::PHDR_SIZE)?))
        .filter(|r| r.end <= image.len())
        .ok_or(Error::ProgramHeaders {
            offset: phoff,
            count: phnum,
        })?;
    for (index, ph) in image[table.clone()].chunks_exact(ec::PHDR_SIZE).enumerate() {
        let (filesz, memsz) = (u64_at(ph, 32), u64_at(ph, 40));
        if u32_at(ph, 0) != ec::PT_LOAD || filesz.max(memsz) == 0 {
            continue;
        }
        if filesz > memsz {
            return Err(Error::SegmentSizes {
                index,
                filesz,
                memsz,
            });
        }
        // A segment of no file bytes (all bss) reads nothing from the file.
        let offset = u64_at(ph, 8);
        if filesz > 0
            && offset
                .checked_add(filesz)
                .is_none_or(|end| end > image.len() as u64)
        {
            return Err(Error::SegmentData {
                index,
                offset,
                size: filesz,
                file: image.len(),
            });
        }
        let start = u64_at(ph, 24);
        let end = start
            .checked_add(filesz.max(memsz))
            .ok_or(Error::SegmentOverflow { index })?;
        check_placement(index, start, end, ram)?;
    }
    let loads = image[table.clone()]
        .chunks_exact(ec::PHDR_SIZE)
        .filter(|ph| u32_at(ph, 0) == ec::PT_LOAD && u64_at(ph, 32).max(u64_at(ph, 40)) > 0)
        .count();
    if loads == 0 {
        return Err(Error::NothingToLoad { count: phnum });
    }
    let image_area = abi::IMAGE_BASE..abi::IMAGE_BASE + abi::IMAGE_MAX;
    if !image_area.contains(&entry) {
        return Err(Error::EntryPlacement { entry });
    }
    Ok(())
}

/// A segment `start..end` must lie in the image area; otherwise the error
/// names the first area it overlaps.
fn check_placement(index: usize, start: u64, end: u64, ram: u64) -> Result<(), Error> {
    let limit = abi::IMAGE_BASE + abi::IMAGE_MAX;
    if start >= abi::IMAGE_BASE && end <= limit {
        return Ok(());
    }
    let area = reserved_areas(ram)
        .into_iter()
        .find(|&(a, b, _)| a < b && start < b && a < end)
        .map_or("the end of guest RAM", |(_, _, name)| name);
    Err(Error::SegmentPlacement {
        index,
        start,
        end,
        area,
    })
}

/// Loads an ELF guest at its physical addresses; returns its entry point.
///
/// # Errors
/// `LoadElf` for a malformed ELF; the errors of [`check_elf`] for one that is
/// not an x86-64 executable or does not fit the image area.
pub fn load_guest(mem: &GuestMemory, image: &[u8]) -> Result<u64, Error> {
    check_elf(image, memory::size(mem))?;
    let loaded = Elf::load(
        mem,
        None,
        &mut Cursor::new(image),
        Some(GuestAddress(abi::IMAGE_BASE)),
    )
    .map_err(Error::LoadElf)?;
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
#[path = "../tests/common/elf.rs"]
mod test_elf;

#[cfg(test)]
mod tests {
    use super::test_elf::{self as elf, ElfImage, Segment};
    use super::*;

    const RAM: u64 = 32 << 20;

    fn spin() -> ElfImage {
        ElfImage::exec(abi::IMAGE_BASE, &elf::SPIN)
    }

    fn with_segment(paddr: u64, memsz: u64) -> Vec<u8> {
        let mut image = spin();
        image.segments.push(Segment {
            paddr,
            data: vec![0x90; 16],
            memsz,
        });
        image.bytes()
    }

    fn placement_area(image: &[u8]) -> &'static str {
        match check_elf(image, RAM) {
            Err(Error::SegmentPlacement { area, .. }) => area,
            other => panic!("expected a placement error, got {other:?}"),
        }
    }

    #[test]
    fn a_hand_made_x86_64_executable_passes_and_loads() {
        let image = spin().bytes();
        assert!(check_elf(&image, RAM).is_ok());
        let mem = memory::create(RAM, false).unwrap();
        assert_eq!(load_guest(&mem, &image).unwrap(), abi::IMAGE_BASE);
        let code: [u8; 2] = mem.read_obj(GuestAddress(abi::IMAGE_BASE)).unwrap();
        assert_eq!(code, elf::SPIN);
    }

    #[test]
    fn a_32_bit_elf_is_rejected_naming_its_class() {
        let mut image = spin();
        image.class = elf::CLASS32;
        let err = check_elf(&image.bytes(), RAM).unwrap_err();
        assert!(matches!(err, Error::ElfClass(1)), "{err:?}");
        assert!(err.to_string().contains("32-bit (ELFCLASS32)"), "{err}");
    }

    #[test]
    fn another_machine_is_rejected_naming_it() {
        let mut image = spin();
        image.machine = elf::I386;
        let err = check_elf(&image.bytes(), RAM).unwrap_err();
        assert!(matches!(err, Error::ElfMachine(3)), "{err:?}");
        assert!(err.to_string().contains("EM_386"), "{err}");
        image.machine = 0xbeef;
        let err = check_elf(&image.bytes(), RAM).unwrap_err();
        assert!(err.to_string().contains("machine 48879"), "{err}");
    }

    #[test]
    fn objects_and_shared_objects_are_rejected_naming_the_type() {
        for (kind, name) in [(elf::REL, "ET_REL"), (elf::DYN, "ET_DYN")] {
            let mut image = spin();
            image.kind = kind;
            let err = check_elf(&image.bytes(), RAM).unwrap_err();
            assert!(matches!(err, Error::ElfType(k) if k == kind), "{err:?}");
            assert!(err.to_string().contains(name), "{err}");
        }
    }

    #[test]
    fn segments_over_boot_structures_are_rejected_naming_what_they_overlap() {
        for (addr, area) in [
            (0, "the first page (kept empty)"),
            (abi::GDT_ADDR, "the GDT"),
            (abi::TSS_ADDR + 8, "the TSS"),
            (abi::PML4_ADDR, "the page tables"),
            (abi::PD_ADDR + 0x3000, "the page tables"),
            (abi::MAILBOX_BASE, "the vCPU mailboxes"),
            (abi::STACK_BASE, "the vCPU stacks"),
            (abi::ARENA_BASE, "the workload arena"),
            (RAM, "the end of guest RAM"),
        ] {
            assert_eq!(placement_area(&with_segment(addr, 16)), area, "{addr:#x}");
        }
    }

    #[test]
    fn a_segment_straddling_the_image_end_names_the_stacks() {
        let limit = abi::IMAGE_BASE + abi::IMAGE_MAX;
        let image = with_segment(limit - 8, 16);
        assert_eq!(placement_area(&image), "the vCPU stacks");
        let err = check_elf(&image, RAM).unwrap_err().to_string();
        assert!(err.contains("segment 1 (0x3ffff8..0x400008)"), "{err}");
    }

    #[test]
    fn a_segment_cut_short_by_the_end_of_the_file_is_named() {
        let image = with_segment(abi::IMAGE_BASE + 0x1000, 16);
        let cut = &image[..image.len() - 4];
        let err = check_elf(cut, RAM).unwrap_err();
        assert!(
            matches!(
                err,
                Error::SegmentData {
                    index: 1,
                    size: 16,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("cut short"), "{err}");
    }

    #[test]
    fn a_segment_of_no_file_bytes_may_point_past_the_end_of_the_file() {
        let mut image = spin();
        image.segments.push(Segment {
            paddr: abi::IMAGE_BASE + 0x1000,
            data: Vec::new(),
            memsz: 4096,
        });
        let mut bytes = image.bytes();
        // The second program header's p_offset (at 64 + 56 + 8), far past the end.
        bytes[128..136].copy_from_slice(&(1u64 << 40).to_le_bytes());
        check_elf(&bytes, RAM).unwrap();
    }

    #[test]
    fn a_segment_with_more_bytes_in_the_file_than_in_memory_is_refused() {
        let err = check_elf(&with_segment(abi::IMAGE_BASE + 0x1000, 8), RAM).unwrap_err();
        assert!(
            matches!(
                err,
                Error::SegmentSizes {
                    index: 1,
                    filesz: 16,
                    memsz: 8
                }
            ),
            "{err:?}"
        );
    }

    #[test]
    fn a_segment_whose_size_wraps_is_rejected() {
        let err = check_elf(&with_segment(abi::IMAGE_BASE, u64::MAX), RAM).unwrap_err();
        assert!(
            matches!(err, Error::SegmentOverflow { index: 1 }),
            "{err:?}"
        );
    }

    #[test]
    fn program_headers_past_the_end_of_the_file_are_rejected() {
        let mut image = spin().bytes();
        image[56] = 200; // e_phnum
        let err = check_elf(&image, RAM).unwrap_err();
        assert!(
            matches!(err, Error::ProgramHeaders { count: 200, .. }),
            "{err:?}"
        );
    }

    #[test]
    fn an_entry_point_outside_the_image_area_is_rejected() {
        let mut image = spin();
        image.entry = abi::IMAGE_BASE + abi::IMAGE_MAX;
        let err = check_elf(&image.bytes(), RAM).unwrap_err();
        assert!(matches!(err, Error::EntryPlacement { .. }), "{err:?}");
    }

    #[test]
    fn the_built_in_guest_passes_the_checks() {
        assert!(check_elf(DEFAULT_GUEST, RAM).is_ok());
    }

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
