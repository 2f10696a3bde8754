//! The guest ABI: the contract between the VMM and the guest it boots.
//!
//! This `no_std` crate is a dependency of both the guest (`guest/`) and the VMM
//! (`kvmscope::abi`), so the two can never disagree. It holds only constants and
//! plain-data layouts; `docs/GUEST_ABI.md` explains them in prose.
#![no_std]
#![warn(missing_docs)]

/// Bumped whenever anything below changes meaning.
pub const ABI_VERSION: u32 = 3;

/// Guest page size used throughout the ABI.
pub const PAGE_SIZE: u64 = 4096;

// ---- Guest physical memory map -------------------------------------------

/// Global descriptor table (one page).
pub const GDT_ADDR: u64 = 0x1000;
/// Task-state segment (one page; x86 requires a usable TR to enter the guest).
/// It carries an all-zero I/O permission bitmap for ports below `TSS_IO_PORTS`,
/// so port I/O is allowed at CPL3 even where IOPL=3 is not honoured (the PVM
/// backend emulates CPL3 port I/O and checks the bitmap); higher ports fault.
pub const TSS_ADDR: u64 = 0x2000;
/// Ports the TSS I/O bitmap allows.
pub const TSS_IO_PORTS: u64 = 0x800;
/// Top-level page table (PML4).
pub const PML4_ADDR: u64 = 0x3000;
/// The single PDPT (covers 512 GiB).
pub const PDPT_ADDR: u64 = 0x4000;
/// First page directory; one page directory per GiB follows it.
pub const PD_ADDR: u64 = 0x5000;
/// Number of page directories reserved: guest RAM plus the MMIO page may span at most this many GiB.
pub const MAX_PD_PAGES: u64 = 64;
/// Per-vCPU mailboxes: vCPU `i` owns the page at `MAILBOX_BASE + i * PAGE_SIZE`.
pub const MAILBOX_BASE: u64 = 0x10_0000;
/// Most vCPUs the memory map has room for (mailboxes and stacks).
pub const MAX_VCPUS: u64 = 256;
/// Where the guest image is linked (see `guest/link.ld`); it may use up to `IMAGE_MAX` bytes.
pub const IMAGE_BASE: u64 = 0x20_0000;
/// Largest guest image.
pub const IMAGE_MAX: u64 = 0x20_0000;
/// Per-vCPU stacks: vCPU `i`'s stack grows down from `STACK_BASE + (i + 1) * STACK_SIZE`.
pub const STACK_BASE: u64 = 0x40_0000;
/// Bytes of stack per vCPU.
pub const STACK_SIZE: u64 = 0x4000;
/// Start of the workload arena: from here to the end of guest RAM belongs to workloads.
pub const ARENA_BASE: u64 = 0x80_0000;
/// Smallest guest RAM that leaves a non-empty arena.
pub const MIN_MEMORY: u64 = ARENA_BASE + 0x80_0000;

// ---- Ports (all `out` with a 32-bit value in eax) ---------------------------

/// Console text: `text_len` bytes of the mailbox `text` are a message; eax = length.
pub const PORT_CONSOLE: u16 = 0x510;
/// The vCPU has booted and asks for its first command; eax = vCPU index.
pub const PORT_READY: u16 = 0x511;
/// The current command is done, its result is in the mailbox; the next command is
/// in the mailbox when the `out` instruction retires.
pub const PORT_DONE: u16 = 0x512;
/// Phase marker: eax = `(sequence << 8) | command code` of the command starting now.
pub const PORT_PHASE: u16 = 0x513;
/// Guest panic: the mailbox `text` holds the message; eax = length.
pub const PORT_PANIC: u16 = 0x514;
/// Target of the `exits` workload's port writes; the VMM ignores the value.
pub const PORT_EXIT_TEST: u16 = 0x515;

// ---- Commands ---------------------------------------------------------------

/// Write a non-zero pattern into every `stride`th page of a range.
/// args: [offset into arena, bytes, stride in pages, pattern]. result: [pages written, tsc ticks, 0].
pub const CMD_TOUCH: u64 = 1;
/// Write zeros into every `stride`th page of a range. args/result as `CMD_TOUCH`.
pub const CMD_TOUCH_ZERO: u64 = 2;
/// Read one word from every `stride`th page of a range.
/// args: [offset, bytes, stride, 0]. result: [pages read, tsc ticks, xor of the words read].
pub const CMD_READ: u64 = 3;
/// Rewrite pages picked by a seeded PRNG in a working set, paced by the TSC.
/// args: [offset, working-set bytes, pages per second (0 = unpaced), duration in µs, seed].
/// result: [page writes done, tsc ticks, distinct pages written].
pub const CMD_DIRTY: u64 = 4;
/// args: [port exits, MMIO exits]. result: [port exits done, tsc ticks, MMIO exits done].
pub const CMD_EXITS: u64 = 5;
/// Test aid: panic with a message (the VMM reports a guest panic).
pub const CMD_PANIC: u64 = 6;
/// Test aid: execute `ud2` with no IDT, which ends in a triple fault (shutdown exit).
pub const CMD_FAULT: u64 = 7;
/// Check that every `stride`th page of a range holds what `touch` with `pattern`
/// wrote there (`(pattern | 1) ^ page address` in every word), or zeros when
/// `pattern` is 0 (what `touch-zero` wrote).
/// args: [offset, bytes, stride, pattern]. result: [pages checked, tsc ticks, pages that differ].
pub const CMD_VERIFY: u64 = 8;

/// The name a guest command has in workload specs.
pub fn command_name(code: u64) -> Option<&'static str> {
    Some(match code {
        CMD_TOUCH => "touch",
        CMD_TOUCH_ZERO => "touch-zero",
        CMD_READ => "read",
        CMD_DIRTY => "dirty",
        CMD_EXITS => "exits",
        CMD_PANIC => "panic",
        CMD_FAULT => "fault",
        CMD_VERIFY => "verify",
        _ => return None,
    })
}

/// Splits a phase marker (`(seq << 8) | command code`) into its command's
/// sequence number and code.
pub fn phase_parts(marker: u64) -> (u64, u64) {
    (marker >> 8, marker & 0xff)
}

/// Result status: the command ran.
pub const STATUS_OK: u64 = 0;
/// Result status: the arguments were out of range (e.g. a range outside the arena).
pub const STATUS_BAD_ARGS: u64 = 1;
/// Result status: the command code is unknown to this guest.
pub const STATUS_UNKNOWN_COMMAND: u64 = 2;

/// Bytes of console/panic text a mailbox holds.
pub const TEXT_MAX: usize = 2048;

/// One vCPU's mailbox, at `MAILBOX_BASE + index * PAGE_SIZE`. All fields are
/// little-endian; the VMM writes the "in" fields only while the vCPU is stopped
/// in a `PORT_READY` / `PORT_DONE` exit, and reads the "out" fields then.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Mailbox {
    // Boot facts, written once by the VMM before the vCPU starts.
    /// `ABI_VERSION` of the VMM.
    pub abi_version: u64,
    /// This vCPU's index.
    pub vcpu_index: u64,
    /// Guest-physical start of the arena (`ARENA_BASE`).
    pub arena_base: u64,
    /// Bytes in the arena.
    pub arena_size: u64,
    /// A guest-physical page with no memory behind it: accesses exit as MMIO.
    pub mmio_addr: u64,
    /// TSC frequency in kHz, for pacing.
    pub tsc_khz: u64,
    // In: the command.
    /// Command code (`CMD_*`).
    pub cmd: u64,
    /// Sequence number of the command, echoed in phase markers and results.
    pub seq: u64,
    /// Command arguments (meaning per command).
    pub args: [u64; 6],
    // Out: the result.
    /// Sequence number of the command this result is for.
    pub result_seq: u64,
    /// `STATUS_*`.
    pub status: u64,
    /// Result values (meaning per command).
    pub result: [u64; 3],
    /// Console or panic text; its length travels in eax.
    pub text: [u8; TEXT_MAX],
    /// The guest's own count of the work its commands have done since boot
    /// (pages touched, read or verified, page writes of `dirty`, exits of
    /// `exits`), stored as it goes, never only at a command's end. The VMM
    /// reads it whenever it likes, without an exit: how much the guest got
    /// done while something (a migration, a throttle) slowed it. It lives in
    /// guest RAM, so a migration carries it over.
    pub progress: u64,
}

/// Byte offsets of the mailbox fields, for the VMM's guest-memory accessors.
/// Each is the offset of the [`Mailbox`] field of the same name (checked below).
pub mod mailbox_offset {
    /// Offset of [`Mailbox::abi_version`](super::Mailbox::abi_version).
    pub const ABI_VERSION: u64 = 0;
    /// Offset of [`Mailbox::vcpu_index`](super::Mailbox::vcpu_index).
    pub const VCPU_INDEX: u64 = 8;
    /// Offset of [`Mailbox::arena_base`](super::Mailbox::arena_base).
    pub const ARENA_BASE: u64 = 16;
    /// Offset of [`Mailbox::arena_size`](super::Mailbox::arena_size).
    pub const ARENA_SIZE: u64 = 24;
    /// Offset of [`Mailbox::mmio_addr`](super::Mailbox::mmio_addr).
    pub const MMIO_ADDR: u64 = 32;
    /// Offset of [`Mailbox::tsc_khz`](super::Mailbox::tsc_khz).
    pub const TSC_KHZ: u64 = 40;
    /// Offset of [`Mailbox::cmd`](super::Mailbox::cmd).
    pub const CMD: u64 = 48;
    /// Offset of [`Mailbox::seq`](super::Mailbox::seq).
    pub const SEQ: u64 = 56;
    /// Offset of [`Mailbox::args`](super::Mailbox::args).
    pub const ARGS: u64 = 64;
    /// Offset of [`Mailbox::result_seq`](super::Mailbox::result_seq).
    pub const RESULT_SEQ: u64 = 112;
    /// Offset of [`Mailbox::status`](super::Mailbox::status).
    pub const STATUS: u64 = 120;
    /// Offset of [`Mailbox::result`](super::Mailbox::result).
    pub const RESULT: u64 = 128;
    /// Offset of [`Mailbox::text`](super::Mailbox::text).
    pub const TEXT: u64 = 152;
    /// Offset of [`Mailbox::progress`](super::Mailbox::progress).
    pub const PROGRESS: u64 = 2200;
}

const _: () = assert!(core::mem::size_of::<Mailbox>() as u64 <= PAGE_SIZE);
const _: () = assert!(core::mem::offset_of!(Mailbox, cmd) as u64 == mailbox_offset::CMD);
const _: () = assert!(core::mem::offset_of!(Mailbox, args) as u64 == mailbox_offset::ARGS);
const _: () =
    assert!(core::mem::offset_of!(Mailbox, result_seq) as u64 == mailbox_offset::RESULT_SEQ);
const _: () = assert!(core::mem::offset_of!(Mailbox, result) as u64 == mailbox_offset::RESULT);
const _: () = assert!(core::mem::offset_of!(Mailbox, text) as u64 == mailbox_offset::TEXT);
const _: () = assert!(core::mem::offset_of!(Mailbox, progress) as u64 == mailbox_offset::PROGRESS);
const _: () = assert!(MAILBOX_BASE + MAX_VCPUS * PAGE_SIZE <= IMAGE_BASE);
const _: () = assert!(PD_ADDR + MAX_PD_PAGES * PAGE_SIZE <= MAILBOX_BASE);
const _: () = assert!(STACK_BASE + MAX_VCPUS * STACK_SIZE <= ARENA_BASE);
