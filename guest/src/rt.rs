//! The little runtime a `no_std` program needs: memory intrinsics and a panic handler.

use crate::abi::PORT_PANIC;

// The compiler emits calls to these; written with string instructions so that
// they cannot be "optimised" into calls to themselves.

/// # Safety
/// Standard `memcpy` contract: `n` bytes valid at both pointers, not overlapping.
#[no_mangle]
pub unsafe extern "C" fn memcpy(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    // SAFETY: the caller upholds memcpy's contract.
    unsafe {
        core::arch::asm!("rep movsb", inout("rcx") n => _, inout("rdi") dst => _, inout("rsi") src => _, options(nostack, preserves_flags));
    }
    dst
}

/// # Safety
/// Standard `memmove` contract.
#[no_mangle]
pub unsafe extern "C" fn memmove(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    if (dst as usize) <= (src as usize) || (dst as usize) >= (src as usize) + n {
        // SAFETY: forward copy is safe when dst does not start inside src.
        return unsafe { memcpy(dst, src, n) };
    }
    // SAFETY: backward copy with the direction flag set, restored after.
    unsafe {
        core::arch::asm!("std", "rep movsb", "cld", inout("rcx") n => _, inout("rdi") dst.add(n - 1) => _, inout("rsi") src.add(n - 1) => _, options(nostack));
    }
    dst
}

/// # Safety
/// Standard `memset` contract.
#[no_mangle]
pub unsafe extern "C" fn memset(dst: *mut u8, c: i32, n: usize) -> *mut u8 {
    // SAFETY: the caller upholds memset's contract.
    unsafe {
        core::arch::asm!("rep stosb", inout("rcx") n => _, inout("rdi") dst => _, in("al") c as u8, options(nostack, preserves_flags));
    }
    dst
}

/// # Safety
/// Standard `memcmp` contract.
#[no_mangle]
pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    let mut i = 0;
    while i < n {
        // SAFETY: i < n, within both buffers.
        let (x, y) = unsafe {
            (
                core::ptr::read_volatile(a.add(i)),
                core::ptr::read_volatile(b.add(i)),
            )
        };
        if x != y {
            return x as i32 - y as i32;
        }
        i += 1;
    }
    0
}

/// # Safety
/// Standard `bcmp` contract.
#[no_mangle]
pub unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: same contract as memcmp.
    unsafe { memcmp(a, b, n) }
}

/// Formats into a fixed buffer, truncating when full.
struct TextBuf {
    buf: [u8; crate::abi::TEXT_MAX],
    len: usize,
}

impl core::fmt::Write for TextBuf {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        let room = self.buf.len() - self.len;
        let n = s.len().min(room);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo) -> ! {
    use core::fmt::Write;
    let mut text = TextBuf {
        buf: [0; crate::abi::TEXT_MAX],
        len: 0,
    };
    let _ = write!(text, "{info}");
    let mb = crate::my_mailbox();
    let n = mb.put_text(&text.buf[..text.len]);
    loop {
        // The VMM stops this vCPU on a panic report; never return if it does not.
        crate::port::out(PORT_PANIC, n as u32);
    }
}

/// The prebuilt `core` was compiled for unwinding and refers to this symbol; with
/// `panic=abort` nothing ever calls it.
#[no_mangle]
pub extern "C" fn rust_eh_personality() {}
