//! vCPU register state at entry: long mode with paging, CPL3 segments, IOPL=3,
//! SSE enabled, and the guest ABI's entry registers.

use kvm_bindings::{kvm_fpu, kvm_regs, kvm_sregs, CpuId};
use kvm_ioctls::VcpuFd;

use super::gdt;
use crate::abi;

const CR0_PE: u64 = 1;
const CR0_MP: u64 = 1 << 1;
const CR0_ET: u64 = 1 << 4;
const CR0_NE: u64 = 1 << 5;
const CR0_WP: u64 = 1 << 16;
const CR0_PG: u64 = 1 << 31;
const CR4_PAE: u64 = 1 << 5;
const CR4_OSFXSR: u64 = 1 << 9;
const CR4_OSXMMEXCPT: u64 = 1 << 10;
const EFER_LME: u64 = 1 << 8;
const EFER_LMA: u64 = 1 << 10;
/// Bit 1 of RFLAGS is always set.
const RFLAGS_FIXED: u64 = 1 << 1;
/// IOPL=3: port I/O is allowed at CPL3 (and exits to the VMM).
const RFLAGS_IOPL3: u64 = 3 << 12;

/// Why a vCPU could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// KVM_SET_CPUID2 failed.
    #[error("setting CPUID")]
    SetCpuid(#[source] kvm_ioctls::Error),
    /// KVM_GET_SREGS failed.
    #[error("reading special registers")]
    GetSregs(#[source] kvm_ioctls::Error),
    /// KVM_SET_SREGS failed.
    #[error("setting special registers")]
    SetSregs(#[source] kvm_ioctls::Error),
    /// KVM_SET_REGS failed.
    #[error("setting general registers")]
    SetRegs(#[source] kvm_ioctls::Error),
    /// KVM_SET_FPU failed.
    #[error("setting FPU state")]
    SetFpu(#[source] kvm_ioctls::Error),
}

/// Special registers for 64-bit mode at CPL3, starting from KVM's reset state.
pub(crate) fn long_mode_sregs(mut s: kvm_sregs) -> kvm_sregs {
    let cs = gdt::code(3).kvm(gdt::USER_CODE, 3);
    let ds = gdt::data(3).kvm(gdt::USER_DATA, 3);
    s.cs = cs;
    (s.ds, s.es, s.fs, s.gs, s.ss) = (ds, ds, ds, ds, ds);
    s.tr = gdt::tss(abi::TSS_ADDR).kvm(gdt::TSS, 0);
    s.gdt.base = abi::GDT_ADDR;
    s.gdt.limit = gdt::TABLE_LIMIT;
    // An empty IDT: any exception escalates to a triple fault, which the VMM reports.
    s.idt.base = 0;
    s.idt.limit = 0;
    s.cr3 = abi::PML4_ADDR;
    s.cr4 = CR4_PAE | CR4_OSFXSR | CR4_OSXMMEXCPT;
    s.cr0 = CR0_PE | CR0_MP | CR0_ET | CR0_NE | CR0_WP | CR0_PG;
    s.efer = EFER_LME | EFER_LMA;
    s
}

/// General registers at entry: `rdi` = vCPU index, `rsi` = its mailbox, `rsp` = its stack.
pub(crate) fn entry_regs(entry: u64, index: u64) -> kvm_regs {
    kvm_regs {
        rip: entry,
        rdi: index,
        rsi: abi::MAILBOX_BASE + index * abi::PAGE_SIZE,
        rsp: abi::STACK_BASE + (index + 1) * abi::STACK_SIZE,
        rflags: RFLAGS_FIXED | RFLAGS_IOPL3,
        ..Default::default()
    }
}

/// Puts a fresh vCPU into the state the guest ABI promises.
///
/// # Errors
/// The ioctl that failed.
pub fn setup(vcpu: &VcpuFd, cpuid: &CpuId, entry: u64, index: u64) -> Result<(), Error> {
    vcpu.set_cpuid2(cpuid).map_err(Error::SetCpuid)?;
    let sregs = vcpu.get_sregs().map_err(Error::GetSregs)?;
    vcpu.set_sregs(&long_mode_sregs(sregs))
        .map_err(Error::SetSregs)?;
    vcpu.set_regs(&entry_regs(entry, index))
        .map_err(Error::SetRegs)?;
    let fpu = kvm_fpu {
        fcw: 0x37f,
        mxcsr: 0x1f80,
        ..Default::default()
    };
    vcpu.set_fpu(&fpu).map_err(Error::SetFpu)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sregs_enter_long_mode_at_cpl3() {
        let s = long_mode_sregs(kvm_sregs::default());
        assert_eq!(s.cs.dpl, 3);
        assert_eq!(s.ss.dpl, 3);
        assert_eq!(s.cs.selector & 3, 3);
        assert_eq!(s.cs.l, 1);
        assert_eq!(s.efer & (EFER_LME | EFER_LMA), EFER_LME | EFER_LMA);
        assert_ne!(s.cr0 & CR0_PG, 0);
        assert_ne!(s.cr4 & CR4_OSFXSR, 0, "SSE needs OSFXSR");
        assert_eq!(s.cr3, abi::PML4_ADDR);
    }

    #[test]
    fn entry_regs_give_each_vcpu_its_own_stack_and_mailbox() {
        let r0 = entry_regs(0x20_0000, 0);
        let r3 = entry_regs(0x20_0000, 3);
        assert_eq!(r3.rdi, 3);
        assert_eq!(r3.rsi - r0.rsi, 3 * abi::PAGE_SIZE);
        assert_eq!(r3.rsp - r0.rsp, 3 * abi::STACK_SIZE);
        assert_eq!(r0.rflags & RFLAGS_IOPL3, RFLAGS_IOPL3);
    }
}
