//! Exit dispatch: a plain function from a vCPU exit to what the VMM must do,
//! with the guest's ports and MMIO page reached through a small bus, and
//! lock-free per-reason and per-device counters.
//!
//! Kept free of KVM handles so that tests can feed it fabricated exits.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::abi;

/// A vCPU exit, copied out of `kvm_run` (kvm-ioctls' `VcpuExit` borrows the vCPU).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Exit {
    /// `out` to `port` (the value zero-extended from the access size).
    IoOut {
        /// The I/O port.
        port: u16,
        /// The value written.
        value: u32,
    },
    /// `in` from `port` (answered with all ones; no device of ours reads).
    IoIn {
        /// The I/O port.
        port: u16,
    },
    /// A read of a guest address with no memory (answered with zeros).
    MmioRead {
        /// The guest physical address.
        addr: u64,
    },
    /// A write to a guest address with no memory.
    MmioWrite {
        /// The guest physical address.
        addr: u64,
    },
    /// `hlt` with no in-kernel irqchip.
    Hlt,
    /// A triple fault.
    Shutdown,
    /// KVM could not handle an exit itself (e.g. emulation failed).
    InternalError {
        /// KVM's `KVM_INTERNAL_ERROR_*` code ([`internal_error_name`]).
        suberror: u32,
    },
    /// VM entry failed: the hardware reason and the host CPU.
    FailEntry {
        /// The hardware's entry-failure reason (VMX or SVM specific).
        reason: u64,
        /// The host CPU the entry was tried on.
        cpu: u32,
    },
    /// KVM_RUN returned EINTR: a kick (or another signal) arrived.
    Interrupted,
    /// KVM_EXIT_SYSTEM_EVENT (reset, shutdown...) of this kind.
    SystemEvent {
        /// KVM's `KVM_SYSTEM_EVENT_*` type.
        kind: u32,
    },
    /// KVM_EXIT_DIRTY_RING_FULL: the vCPU's dirty ring must be harvested.
    DirtyRingFull,
    /// Any other exit, as kvm-ioctls prints it.
    Other(String),
}

macro_rules! counted_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $variant:ident => $label:literal),* $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum $name { $($(#[$vm])* $variant),* }
        impl $name {
            /// Every value, in counter order.
            pub(crate) const ALL: &'static [$name] = &[$($name::$variant),*];
            /// The name used in summaries, JSON and metrics.
            pub(crate) fn label(self) -> &'static str {
                match self { $($name::$variant => $label),* }
            }
        }
    };
}

counted_enum!(
    /// Why a vCPU exited, as our own counters file it.
    Reason {
        /// [`Exit::IoOut`]: the guest's normal way to talk to the VMM.
        IoOut => "io_out",
        /// [`Exit::IoIn`].
        IoIn => "io_in",
        /// [`Exit::MmioRead`].
        MmioRead => "mmio_read",
        /// [`Exit::MmioWrite`].
        MmioWrite => "mmio_write",
        /// [`Exit::Hlt`].
        Hlt => "hlt",
        /// [`Exit::Shutdown`]: a triple fault.
        Shutdown => "shutdown",
        /// [`Exit::InternalError`].
        InternalError => "internal_error",
        /// [`Exit::FailEntry`].
        FailEntry => "fail_entry",
        /// [`Exit::Interrupted`]: KVM_RUN ended by a kick or other signal.
        Interrupted => "interrupted",
        /// [`Exit::SystemEvent`].
        SystemEvent => "system_event",
        /// [`Exit::DirtyRingFull`].
        DirtyRingFull => "dirty_ring_full",
        /// [`Exit::Other`].
        Other => "other",
    }
);

counted_enum!(
    /// The device an I/O exit reached.
    Device {
        /// Port 0x510, CONSOLE: the guest prints the mailbox text.
        Console => "console",
        /// Port 0x511, READY: the guest's first request for a command.
        Ready => "ready",
        /// Port 0x512, DONE: a result, and the request for the next command.
        Done => "done",
        /// Port 0x513, PHASE: the guest's latest phase marker.
        Phase => "phase",
        /// Port 0x514, PANIC: the guest panicked.
        Panic => "panic",
        /// Port 0x515, EXIT_TEST: does nothing (the `exits` workload's port).
        ExitTestPort => "exit_test_port",
        /// The MMIO test page (the `exits` workload's MMIO exits).
        MmioTest => "mmio_test",
        /// Any other port or address: a guest fault.
        Unhandled => "unhandled",
    }
);

/// What went wrong with the guest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Fault {
    /// A shutdown exit: the guest triple-faulted (it has no IDT).
    #[error("triple fault (shutdown exit)")]
    TripleFault,
    /// KVM could not handle an exit itself.
    #[error("KVM internal error, suberror {suberror} ({})", internal_error_name(*.suberror))]
    InternalError {
        /// KVM's `KVM_INTERNAL_ERROR_*` code.
        suberror: u32,
    },
    /// The hardware refused to enter the guest.
    #[error("VM entry failed, hardware reason {reason:#x} on host CPU {cpu}")]
    FailedEntry {
        /// The hardware's entry-failure reason.
        reason: u64,
        /// The host CPU the entry was tried on.
        cpu: u32,
    },
    /// A port access no device handles (any `in`, or an `out` to an unknown port).
    #[error("{} of port {port:#x}, which nothing handles", if *.write { "write" } else { "read" })]
    UnhandledPort {
        /// The I/O port.
        port: u16,
        /// True for `out`, false for `in`.
        write: bool,
    },
    /// An access to a guest address without memory, outside the MMIO test page.
    #[error("{} of guest address {addr:#x}, which nothing handles", if *.write { "write" } else { "read" })]
    UnhandledMmio {
        /// The guest physical address.
        addr: u64,
        /// True for a write.
        write: bool,
    },
    /// A `hlt` exit; the guest never halts, so it means something went wrong.
    #[error("the guest halted, which it never does")]
    Halted,
    /// Any other exit the VMM does not expect (as kvm-ioctls prints it).
    #[error("unexpected exit: {0}")]
    Unexpected(String),
}

/// What a KVM_EXIT_INTERNAL_ERROR suberror means (the kernel's
/// `KVM_INTERNAL_ERROR_*` values).
pub(crate) fn internal_error_name(suberror: u32) -> &'static str {
    match suberror {
        kvm_bindings::KVM_INTERNAL_ERROR_EMULATION => "emulation failure",
        kvm_bindings::KVM_INTERNAL_ERROR_SIMUL_EX => "simultaneous exceptions",
        kvm_bindings::KVM_INTERNAL_ERROR_DELIVERY_EV => "an exit during event delivery",
        kvm_bindings::KVM_INTERNAL_ERROR_UNEXPECTED_EXIT_REASON => "unexpected exit reason",
        _ => "unknown suberror",
    }
}

/// What the vCPU loop must do after an exit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// Re-enter the guest.
    Resume,
    /// Check for kicks, then re-enter.
    Interrupted,
    /// The guest booted and wants its first command.
    Ready,
    /// The guest finished a command and wants the next.
    Done,
    /// The guest wrote `len` bytes of console text to its mailbox.
    Console(u32),
    /// The guest started a phase (`(seq << 8) | command code`).
    Phase(u32),
    /// The guest panicked, `len` bytes of message in its mailbox.
    Panic(u32),
    /// Harvest this vCPU's dirty ring, then re-enter.
    HarvestDirtyRing,
    /// The guest cannot go on.
    Fault(Fault),
}

/// Maps ports and guest addresses to devices.
#[derive(Debug, Clone)]
pub(crate) struct Bus {
    mmio_page: u64,
}

impl Bus {
    /// A bus for a guest whose MMIO test page is at `mmio_page`.
    pub(crate) fn new(mmio_page: u64) -> Self {
        Bus { mmio_page }
    }

    /// The device at `port`.
    pub(crate) fn port(&self, port: u16) -> Device {
        match port {
            abi::PORT_CONSOLE => Device::Console,
            abi::PORT_READY => Device::Ready,
            abi::PORT_DONE => Device::Done,
            abi::PORT_PHASE => Device::Phase,
            abi::PORT_PANIC => Device::Panic,
            abi::PORT_EXIT_TEST => Device::ExitTestPort,
            _ => Device::Unhandled,
        }
    }

    /// The device at guest address `addr`.
    pub(crate) fn mmio(&self, addr: u64) -> Device {
        if addr.wrapping_sub(self.mmio_page) < abi::PAGE_SIZE {
            Device::MmioTest
        } else {
            Device::Unhandled
        }
    }
}

/// Counters by label, as a migration carries them.
pub(crate) type Labeled = Vec<(String, u64)>;

/// One vCPU's exit counters. Only the vCPU's own thread writes them, so a
/// relaxed load and store is enough (no locked add on the hot path); any thread
/// may read them.
#[derive(Debug, Default)]
pub struct ExitCounters {
    reasons: [AtomicU64; Reason::ALL.len()],
    devices: [AtomicU64; Device::ALL.len()],
}

fn bump(c: &AtomicU64) {
    c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
}

impl ExitCounters {
    /// Exits counted for `r`.
    pub fn reason(&self, r: Reason) -> u64 {
        self.reasons[r as usize].load(Ordering::Relaxed)
    }

    /// I/O exits counted for device `d`.
    pub(crate) fn device(&self, d: Device) -> u64 {
        self.devices[d as usize].load(Ordering::Relaxed)
    }

    /// All exits counted.
    pub fn total(&self) -> u64 {
        Reason::ALL.iter().map(|&r| self.reason(r)).sum()
    }

    /// Every counter by label: reasons, then devices (for a migration's stream).
    pub(crate) fn labeled(&self) -> (Labeled, Labeled) {
        let reasons = Reason::ALL
            .iter()
            .map(|&r| (r.label().to_string(), self.reason(r)))
            .collect();
        let devices = Device::ALL
            .iter()
            .map(|&d| (d.label().to_string(), self.device(d)))
            .collect();
        (reasons, devices)
    }

    /// Sets counters from labels (a migration's destination goes on from the
    /// source's values); unknown labels are ignored. Call before the vCPU runs.
    pub(crate) fn restore(&self, reasons: &[(String, u64)], devices: &[(String, u64)]) {
        for (label, v) in reasons {
            if let Some(&r) = Reason::ALL.iter().find(|r| r.label() == label) {
                self.reasons[r as usize].store(*v, Ordering::Relaxed);
            }
        }
        for (label, v) in devices {
            if let Some(&d) = Device::ALL.iter().find(|d| d.label() == label) {
                self.devices[d as usize].store(*v, Ordering::Relaxed);
            }
        }
    }

    /// The counters as JSON: `{"reasons": {...}, "devices": {...}, "total": n}`.
    pub(crate) fn to_json(&self) -> serde_json::Value {
        let reasons: serde_json::Map<_, _> = Reason::ALL
            .iter()
            .map(|&r| (r.label().to_string(), self.reason(r).into()))
            .collect();
        let devices: serde_json::Map<_, _> = Device::ALL
            .iter()
            .map(|&d| (d.label().to_string(), self.device(d).into()))
            .collect();
        serde_json::json!({ "reasons": reasons, "devices": devices, "total": self.total() })
    }
}

/// Decides what an exit means, counting it.
pub(crate) fn dispatch(exit: &Exit, bus: &Bus, counters: &ExitCounters) -> Action {
    let reason = match exit {
        Exit::IoOut { .. } => Reason::IoOut,
        Exit::IoIn { .. } => Reason::IoIn,
        Exit::MmioRead { .. } => Reason::MmioRead,
        Exit::MmioWrite { .. } => Reason::MmioWrite,
        Exit::Hlt => Reason::Hlt,
        Exit::Shutdown => Reason::Shutdown,
        Exit::InternalError { .. } => Reason::InternalError,
        Exit::FailEntry { .. } => Reason::FailEntry,
        Exit::Interrupted => Reason::Interrupted,
        Exit::SystemEvent { .. } => Reason::SystemEvent,
        Exit::DirtyRingFull => Reason::DirtyRingFull,
        Exit::Other(_) => Reason::Other,
    };
    bump(&counters.reasons[reason as usize]);
    let device = match exit {
        Exit::IoOut { port, .. } | Exit::IoIn { port } => Some(bus.port(*port)),
        Exit::MmioRead { addr } | Exit::MmioWrite { addr } => Some(bus.mmio(*addr)),
        _ => None,
    };
    if let Some(d) = device {
        bump(&counters.devices[d as usize]);
    }
    match (exit, device) {
        (Exit::IoOut { port, value }, Some(d)) => port_write(d, *port, *value),
        (Exit::IoIn { port }, _) => Action::Fault(Fault::UnhandledPort {
            port: *port,
            write: false,
        }),
        (Exit::MmioRead { .. } | Exit::MmioWrite { .. }, Some(Device::MmioTest)) => Action::Resume,
        (Exit::MmioRead { addr }, _) => Action::Fault(Fault::UnhandledMmio {
            addr: *addr,
            write: false,
        }),
        (Exit::MmioWrite { addr }, _) => Action::Fault(Fault::UnhandledMmio {
            addr: *addr,
            write: true,
        }),
        (Exit::Interrupted, _) => Action::Interrupted,
        (Exit::DirtyRingFull, _) => Action::HarvestDirtyRing,
        (Exit::Hlt, _) => Action::Fault(Fault::Halted),
        (Exit::Shutdown, _) => Action::Fault(Fault::TripleFault),
        (Exit::InternalError { suberror }, _) => Action::Fault(Fault::InternalError {
            suberror: *suberror,
        }),
        (Exit::FailEntry { reason, cpu }, _) => Action::Fault(Fault::FailedEntry {
            reason: *reason,
            cpu: *cpu,
        }),
        (Exit::SystemEvent { kind }, _) => {
            Action::Fault(Fault::Unexpected(format!("system event {kind}")))
        }
        (Exit::Other(what), _) => Action::Fault(Fault::Unexpected(what.clone())),
        (Exit::IoOut { port, .. }, None) => Action::Fault(Fault::UnhandledPort {
            port: *port,
            write: true,
        }),
    }
}

fn port_write(device: Device, port: u16, value: u32) -> Action {
    match device {
        Device::Console => Action::Console(value),
        Device::Ready => Action::Ready,
        Device::Done => Action::Done,
        Device::Phase => Action::Phase(value),
        Device::Panic => Action::Panic(value),
        Device::ExitTestPort | Device::MmioTest => Action::Resume,
        Device::Unhandled => Action::Fault(Fault::UnhandledPort { port, write: true }),
    }
}

#[cfg(test)]
#[path = "exits_tests.rs"]
mod tests;
