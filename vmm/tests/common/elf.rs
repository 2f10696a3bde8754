//! Tiny hand-made ELF images, for tests of what the loader accepts and of
//! guests that misbehave. Shared by `vmm/src/boot.rs`'s unit tests (through
//! `#[path]`) and the integration tests (`common::elf`).

/// `ELFCLASS64`.
pub const CLASS64: u8 = 2;
/// `ELFCLASS32`.
pub const CLASS32: u8 = 1;
/// `EM_X86_64`.
pub const X86_64: u16 = 62;
/// `EM_386`.
pub const I386: u16 = 3;
/// `ET_EXEC`.
pub const EXEC: u16 = 2;
/// `ET_REL`.
pub const REL: u16 = 1;
/// `ET_DYN`.
pub const DYN: u16 = 3;

/// One `PT_LOAD` segment, loaded at its physical address.
pub struct Segment {
    pub paddr: u64,
    pub data: Vec<u8>,
    /// Bytes in memory (at least `data.len()`; the rest is zeroed).
    pub memsz: u64,
}

/// The fields of an ELF64 image that tests vary.
pub struct ElfImage {
    pub class: u8,
    pub machine: u16,
    pub kind: u16,
    pub entry: u64,
    pub segments: Vec<Segment>,
}

/// `jmp $`: a guest that spins at its entry and never checks in.
pub const SPIN: [u8; 2] = [0xeb, 0xfe];

impl ElfImage {
    /// An x86-64 executable whose one segment holds `code` at `entry`.
    pub fn exec(entry: u64, code: &[u8]) -> ElfImage {
        ElfImage {
            class: CLASS64,
            machine: X86_64,
            kind: EXEC,
            entry,
            segments: vec![Segment {
                paddr: entry,
                data: code.to_vec(),
                memsz: code.len() as u64,
            }],
        }
    }

    /// The file: ELF header, program headers, then each segment's bytes.
    pub fn bytes(&self) -> Vec<u8> {
        const EHDR: usize = 64;
        const PHDR: usize = 56;
        let mut out = Vec::new();
        out.extend_from_slice(&[0x7f, b'E', b'L', b'F', self.class, 1, 1, 0]);
        out.extend_from_slice(&[0; 8]);
        out.extend_from_slice(&self.kind.to_le_bytes());
        out.extend_from_slice(&self.machine.to_le_bytes());
        out.extend_from_slice(&1u32.to_le_bytes());
        out.extend_from_slice(&self.entry.to_le_bytes());
        out.extend_from_slice(&(EHDR as u64).to_le_bytes()); // e_phoff
        out.extend_from_slice(&0u64.to_le_bytes()); // e_shoff
        out.extend_from_slice(&0u32.to_le_bytes()); // e_flags
        for half in [EHDR, PHDR, self.segments.len(), 64, 0, 0] {
            let half = u16::try_from(half).expect("ELF header fields fit 16 bits");
            out.extend_from_slice(&half.to_le_bytes());
        }
        let mut offset = EHDR + PHDR * self.segments.len();
        for s in &self.segments {
            out.extend_from_slice(&1u32.to_le_bytes()); // PT_LOAD
            out.extend_from_slice(&7u32.to_le_bytes()); // RWX
            for word in [
                offset as u64,
                s.paddr,
                s.paddr,
                s.data.len() as u64,
                s.memsz,
                0x1000,
            ] {
                out.extend_from_slice(&word.to_le_bytes());
            }
            offset += s.data.len();
        }
        for s in &self.segments {
            out.extend_from_slice(&s.data);
        }
        out
    }
}
