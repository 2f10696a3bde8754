//! Kicking a vCPU out of KVM_RUN without lost wakeups.
//!
//! The protocol, in one place:
//! 1. The requester records its request in the vCPU's inbox (under its mutex)
//!    and raises the vCPU's `pending` flag.
//! 2. It sends `KICK_SIGNAL` to the vCPU thread.
//! 3. The signal handler runs *on the vCPU thread* and sets
//!    `kvm_run.immediate_exit = 1` through a thread-local pointer.
//! 4. The vCPU thread checks `pending` before every KVM_RUN, and on EINTR
//!    clears `immediate_exit` and checks again.
//!
//! Whatever the vCPU is doing when the signal lands, the request is seen:
//! before its `pending` check, it sees the flag; between the check and the
//! ioctl, `immediate_exit` makes KVM_RUN return EINTR at once; inside KVM_RUN,
//! the signal itself makes it return EINTR. Setting `immediate_exit` from the
//! handler (as Firecracker does) rather than from the requesting thread means
//! no other thread ever holds a pointer into the vCPU's `kvm_run` mapping,
//! which the vCPU thread owns and unmaps when it ends. A stale
//! `immediate_exit` only costs one extra EINTR round trip.

use std::cell::Cell;
use std::os::raw::{c_int, c_void};
use std::sync::Once;

use vmm_sys_util::signal::{register_signal_handler, SIGRTMIN};

thread_local! {
    /// `&kvm_run.immediate_exit` of the vCPU this thread runs, or null.
    static IMMEDIATE_EXIT: Cell<*mut u8> = const { Cell::new(std::ptr::null_mut()) };
}

/// The real-time signal used for kicks (the C runtime uses none of them).
pub(crate) fn kick_signal() -> c_int {
    SIGRTMIN()
}

extern "C" fn on_kick(_num: c_int, _info: *mut libc::siginfo_t, _ctx: *mut c_void) {
    // `try_with`: never panic in a signal handler, even during thread teardown.
    let _ = IMMEDIATE_EXIT.try_with(|p| {
        let p = p.get();
        if !p.is_null() {
            // SAFETY: `p` was set by this thread from its own live kvm_run mapping
            // (see `arm`) and is cleared before that mapping goes away.
            unsafe { std::ptr::write_volatile(p, 1) };
        }
    });
}

/// Installs the kick handler for the process (once).
///
/// # Errors
/// The sigaction failure.
pub(crate) fn install() -> Result<(), vmm_sys_util::errno::Error> {
    static ONCE: Once = Once::new();
    let mut result = Ok(());
    ONCE.call_once(|| result = register_signal_handler(kick_signal(), on_kick));
    result
}

/// This thread's kick handler pointed at a vCPU's `immediate_exit`, until the
/// guard drops (unwinding included). Create it on the vCPU thread from its own
/// kvm_run mapping, after the vCPU fd, so that it drops before the fd unmaps it.
pub(crate) struct Armed(());

impl Armed {
    /// Points this thread's kick handler at `immediate_exit`.
    pub(crate) fn new(immediate_exit: *mut u8) -> Armed {
        IMMEDIATE_EXIT.with(|p| p.set(immediate_exit));
        Armed(())
    }
}

impl Drop for Armed {
    fn drop(&mut self) {
        // `try_with`: the thread-local may already be gone during thread exit.
        let _ = IMMEDIATE_EXIT.try_with(|p| p.set(std::ptr::null_mut()));
    }
}
