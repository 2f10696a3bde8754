//! x86_64 boot state: descriptor tables, page tables and vCPU registers that put
//! the guest straight into 64-bit mode at CPL3.

// Values here come from the kernel, a peer or the user: casts must not lose,
// wrap or sign-flip them silently; and every public item says what it is.
#![warn(
    missing_docs,
    clippy::cast_lossless,
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap,
    clippy::cast_sign_loss
)]

pub mod gdt;
pub mod paging;
pub mod regs;
