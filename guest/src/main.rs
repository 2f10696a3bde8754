//! The kvmscope guest: a bare-metal program that runs at CPL3 in 64-bit mode.
//!
//! Every vCPU enters `_start` with its index in `rdi`, its mailbox address in
//! `rsi` and its own stack in `rsp` (see the `kvmscope-guest-abi` crate in
//! `abi/` and docs/GUEST_ABI.md). The guest reports ready, then loops: run the
//! command in its mailbox, report the result with one port write, during which
//! the VMM puts the next command in place. It runs at CPL3 because on software
//! KVM backends only CPL3 code runs natively (and so moves the MMU statistics);
//! IOPL=3 lets it use port I/O.
#![no_std]
#![no_main]

// The ABI crate under its short name, so `crate::abi::...` reads as in the VMM.
use kvmscope_guest_abi as abi;
mod port;
mod rt;
mod workload;

use abi::*;
use core::ptr::{addr_of, addr_of_mut};

core::arch::global_asm!(
    ".section .text._start, \"ax\"",
    ".global _start",
    "_start:",
    "    and rsp, -16",
    "    call {main}",
    "    ud2",
    main = sym guest_main,
);

/// A handle on this vCPU's mailbox; the VMM writes it only while we are in a port exit.
pub struct Mbox(*mut Mailbox);

impl Mbox {
    fn get(&self, field: *const u64) -> u64 {
        // SAFETY: `field` points into the mailbox page, which the VMM maps for us.
        unsafe { core::ptr::read_volatile(field) }
    }
    fn set(&self, field: *mut u64, v: u64) {
        // SAFETY: as in `get`.
        unsafe { core::ptr::write_volatile(field, v) }
    }
    pub fn boot(&self) -> workload::Boot {
        let m = self.0;
        // SAFETY: addr_of! only forms field addresses of the mailbox.
        unsafe {
            workload::Boot {
                arena_base: self.get(addr_of!((*m).arena_base)),
                arena_size: self.get(addr_of!((*m).arena_size)),
                mmio_addr: self.get(addr_of!((*m).mmio_addr)),
                tsc_khz: self.get(addr_of!((*m).tsc_khz)),
            }
        }
    }
    fn command(&self) -> (u64, u64, [u64; 6]) {
        let m = self.0;
        let mut args = [0u64; 6];
        // SAFETY: as above.
        unsafe {
            for (i, a) in args.iter_mut().enumerate() {
                *a = self.get(addr_of!((*m).args[i]));
            }
            (
                self.get(addr_of!((*m).cmd)),
                self.get(addr_of!((*m).seq)),
                args,
            )
        }
    }
    fn put_result(&self, seq: u64, status: u64, result: [u64; 3]) {
        let m = self.0;
        // SAFETY: as above.
        unsafe {
            for (i, r) in result.iter().enumerate() {
                self.set(addr_of_mut!((*m).result[i]), *r);
            }
            self.set(addr_of_mut!((*m).status), status);
            self.set(addr_of_mut!((*m).result_seq), seq);
        }
    }
    /// The guest's progress counter, picked up where it stands (it may have
    /// come with a migration).
    fn progress(&self) -> workload::Progress {
        // SAFETY: addr_of_mut! only forms the field's address, inside the mailbox page.
        let at = unsafe { addr_of_mut!((*self.0).progress) };
        workload::Progress::new(at, self.get(at))
    }
    /// Copies `msg` into the mailbox text area; returns the bytes copied.
    pub fn put_text(&self, msg: &[u8]) -> usize {
        let n = msg.len().min(TEXT_MAX);
        // SAFETY: the text area is TEXT_MAX bytes inside the mailbox page.
        unsafe {
            let dst = addr_of_mut!((*self.0).text) as *mut u8;
            for (i, b) in msg[..n].iter().enumerate() {
                core::ptr::write_volatile(dst.add(i), *b);
            }
        }
        n
    }
}

/// The mailbox of the vCPU running this code, found through the stack pointer:
/// every vCPU runs the same code on its own stack, and there is no per-CPU storage.
pub fn my_mailbox() -> Mbox {
    let rsp: u64;
    // SAFETY: reading rsp has no side effects.
    unsafe { core::arch::asm!("mov {}, rsp", out(reg) rsp) };
    let index = rsp.saturating_sub(STACK_BASE) / STACK_SIZE;
    Mbox((MAILBOX_BASE + index * PAGE_SIZE) as *mut Mailbox)
}

extern "C" fn guest_main(index: u64, mailbox: u64) -> ! {
    let mb = Mbox(mailbox as *mut Mailbox);
    let boot = mb.boot();
    port::out(PORT_READY, index as u32);
    loop {
        let (cmd, seq, args) = mb.command();
        port::out(PORT_PHASE, ((seq << 8) | (cmd & 0xff)) as u32);
        let (status, result) = workload::run(&boot, cmd, &args, &mut mb.progress());
        mb.put_result(seq, status, result);
        port::out(PORT_DONE, seq as u32);
    }
}
