//! Port I/O: the guest's only way to talk to the VMM (IOPL=3 allows it at CPL3).

/// Writes a 32-bit value to `port`; the VMM sees a port-I/O exit.
#[inline(always)]
pub fn out(port: u16, value: u32) {
    // SAFETY: port writes have no memory effects in the guest; IOPL=3 permits them.
    unsafe {
        core::arch::asm!("out dx, eax", in("dx") port, in("eax") value, options(nostack, preserves_flags))
    };
}
