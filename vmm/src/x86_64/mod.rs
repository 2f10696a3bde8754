//! x86_64 boot state: descriptor tables, page tables and vCPU registers that put
//! the guest straight into 64-bit mode at CPL3.

pub(crate) mod gdt;
pub(crate) mod paging;
pub mod regs;
