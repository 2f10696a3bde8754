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

/// A one-shot timer that kicks the thread that made it, and only that
/// thread (`SIGEV_THREAD_ID`), when it expires: a vCPU thread's own alarm,
/// for looks that must not wait for another thread's clock (a dirty-limited
/// vCPU counts its pages on it). The kick lands as any other: through the
/// handler, on the vCPU's `immediate_exit` if the thread is armed.
#[derive(Debug)]
pub(crate) struct Timer(libc::timer_t);

// SAFETY: a POSIX timer id is a process-wide handle: any thread may set or
// delete it; the thread it signals was fixed when it was made.
unsafe impl Send for Timer {}

impl Timer {
    /// A disarmed timer that kicks the calling thread.
    ///
    /// # Errors
    /// `timer_create`'s failure.
    pub(crate) fn for_this_thread() -> std::io::Result<Timer> {
        // SAFETY: `sigevent` is plain data; all-zero is a valid value.
        let mut event: libc::sigevent = unsafe { std::mem::zeroed() };
        event.sigev_notify = libc::SIGEV_THREAD_ID;
        event.sigev_signo = kick_signal();
        event.sigev_notify_thread_id = rustix::thread::gettid().as_raw_nonzero().get();
        let mut id: libc::timer_t = std::ptr::null_mut();
        // SAFETY: both pointers are to live locals of the right types.
        if unsafe { libc::timer_create(libc::CLOCK_MONOTONIC, &mut event, &mut id) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Timer(id))
    }

    /// Kicks the thread once, `after` from now (a zero `after` is taken as
    /// a nanosecond: zero would disarm it); replaces any earlier setting.
    ///
    /// # Errors
    /// `timer_settime`'s failure.
    pub(crate) fn kick_after(&self, after: std::time::Duration) -> std::io::Result<()> {
        self.set(after.max(std::time::Duration::from_nanos(1)))
    }

    /// Cancels a kick not yet sent.
    ///
    /// # Errors
    /// `timer_settime`'s failure.
    pub(crate) fn disarm(&self) -> std::io::Result<()> {
        self.set(std::time::Duration::ZERO)
    }

    fn set(&self, after: std::time::Duration) -> std::io::Result<()> {
        let value = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: libc::time_t::try_from(after.as_secs()).unwrap_or(libc::time_t::MAX),
                tv_nsec: libc::c_long::from(after.subsec_nanos()),
            },
        };
        // SAFETY: `self.0` is a live timer (deleted only on drop); `value` is
        // a valid itimerspec and the old value is not asked for.
        if unsafe { libc::timer_settime(self.0, 0, &value, std::ptr::null_mut()) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        // SAFETY: `self.0` came from timer_create and is deleted only here.
        unsafe { libc::timer_delete(self.0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU8, Ordering};
    use std::time::{Duration, Instant};

    #[test]
    fn a_timer_kicks_the_thread_that_made_it_and_not_before_its_time() {
        install().unwrap();
        let flag = Box::new(AtomicU8::new(0));
        let other = std::sync::Arc::new(AtomicU8::new(0));
        // Another thread, armed too: it must not be the one kicked.
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let other2 = other.clone();
        let bystander = std::thread::spawn(move || {
            let cell = AtomicU8::new(0);
            let _armed = Armed::new(cell.as_ptr());
            let _ = rx.recv_timeout(Duration::from_secs(5));
            other2.store(cell.load(Ordering::SeqCst), Ordering::SeqCst);
        });
        let _armed = Armed::new(flag.as_ptr());
        let timer = Timer::for_this_thread().unwrap();
        let t0 = Instant::now();
        timer.kick_after(Duration::from_millis(20)).unwrap();
        while flag.load(Ordering::SeqCst) == 0 && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_micros(200));
        }
        assert_eq!(flag.load(Ordering::SeqCst), 1, "kicked within 5 s");
        assert!(
            t0.elapsed() >= Duration::from_millis(20),
            "not before its time"
        );
        // Disarmed, it sends nothing.
        flag.store(0, Ordering::SeqCst);
        timer.kick_after(Duration::from_millis(20)).unwrap();
        timer.disarm().unwrap();
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(flag.load(Ordering::SeqCst), 0, "a disarmed timer kicked");
        tx.send(()).unwrap();
        bystander.join().unwrap();
        assert_eq!(
            other.load(Ordering::SeqCst),
            0,
            "the other thread was kicked"
        );
    }
}
