//! A vCPU's registers as its own thread read them, for fault, panic and
//! boot-timeout reports. Only the thread that runs a vCPU may issue ioctls on
//! its fd while it could be in KVM_RUN, so reports never read them from elsewhere.

use std::fmt;

use kvm_ioctls::VcpuFd;

/// The general registers a report shows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GeneralRegisters {
    /// Instruction pointer: the guest code at fault (guest virtual address).
    pub rip: u64,
    /// Stack pointer (guest virtual address).
    pub(crate) rsp: u64,
    /// Flags register.
    pub(crate) rflags: u64,
    /// RAX; the guest passes a port exit's value in it.
    pub(crate) rax: u64,
    /// RBX.
    pub(crate) rbx: u64,
    /// RCX.
    pub(crate) rcx: u64,
    /// RDX.
    pub(crate) rdx: u64,
    /// RSI.
    pub(crate) rsi: u64,
    /// RDI.
    pub(crate) rdi: u64,
}

/// The control registers, EFER and the code segment selector.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ControlRegisters {
    /// CR0: protection and paging enables.
    pub(crate) cr0: u64,
    /// CR2: the linear address of the last page fault.
    pub(crate) cr2: u64,
    /// CR3: the page-table root (guest physical address).
    pub(crate) cr3: u64,
    /// CR4: extension enables (PAE, OSFXSR, ...).
    pub(crate) cr4: u64,
    /// The EFER MSR (long mode enable and active, NX).
    pub(crate) efer: u64,
    /// The code segment selector; its low two bits are the privilege level.
    pub(crate) cs: u16,
}

/// What a vCPU's thread read of its registers; each half may have failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registers {
    /// KVM_GET_REGS.
    pub general: Result<GeneralRegisters, kvm_ioctls::Error>,
    /// KVM_GET_SREGS.
    pub(crate) control: Result<ControlRegisters, kvm_ioctls::Error>,
}

impl Registers {
    /// Reads them; call on the thread that runs `fd`.
    pub(crate) fn read(fd: &VcpuFd) -> Registers {
        let general = fd.get_regs().map(|r| GeneralRegisters {
            rip: r.rip,
            rsp: r.rsp,
            rflags: r.rflags,
            rax: r.rax,
            rbx: r.rbx,
            rcx: r.rcx,
            rdx: r.rdx,
            rsi: r.rsi,
            rdi: r.rdi,
        });
        let control = fd.get_sregs().map(|s| ControlRegisters {
            cr0: s.cr0,
            cr2: s.cr2,
            cr3: s.cr3,
            cr4: s.cr4,
            efer: s.efer,
            cs: s.cs.selector,
        });
        Registers { general, control }
    }
}

/// One line: `rip=0x… rsp=0x… … cr3=0x… efer=0x… cs=0x1b`.
impl fmt::Display for Registers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.general {
            Ok(r) => write!(
                f,
                "rip={:#x} rsp={:#x} rflags={:#x} rax={:#x} rbx={:#x} rcx={:#x} rdx={:#x} rsi={:#x} rdi={:#x}",
                r.rip, r.rsp, r.rflags, r.rax, r.rbx, r.rcx, r.rdx, r.rsi, r.rdi
            )?,
            Err(e) => write!(f, "general registers unreadable ({e})")?,
        }
        match &self.control {
            Ok(s) => write!(
                f,
                " cr0={:#x} cr2={:#x} cr3={:#x} cr4={:#x} efer={:#x} cs={:#x}",
                s.cr0, s.cr2, s.cr3, s.cr4, s.efer, s.cs
            ),
            Err(e) => write!(f, " control registers unreadable ({e})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registers_print_on_one_line_in_hex() {
        let r = Registers {
            general: Ok(GeneralRegisters {
                rip: 0x200010,
                rsp: 0x404000,
                rflags: 0x3002,
                ..GeneralRegisters::default()
            }),
            control: Ok(ControlRegisters {
                cr3: 0x3000,
                cs: 0x1b,
                ..ControlRegisters::default()
            }),
        };
        let text = r.to_string();
        assert!(
            text.starts_with("rip=0x200010 rsp=0x404000 rflags=0x3002 "),
            "{text}"
        );
        assert!(
            text.contains(" cr3=0x3000 ") && text.ends_with(" cs=0x1b"),
            "{text}"
        );
        assert!(!text.contains('\n'));
    }

    #[test]
    fn unreadable_halves_say_so_with_the_error() {
        let e = kvm_ioctls::Error::new(libc::EBADF);
        let r = Registers {
            general: Err(e),
            control: Err(e),
        };
        let text = r.to_string();
        assert!(text.contains("general registers unreadable ("), "{text}");
        assert!(text.contains("control registers unreadable ("), "{text}");
    }
}
