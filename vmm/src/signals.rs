//! SIGINT and SIGTERM become `VmEvent::Signal` on the main loop's channel: the
//! signals are blocked in every thread and taken by one thread with `sigwait`,
//! so no work happens in a signal handler and no thread is interrupted.
//!
//! A run stopped this way is an orderly stop and exits 0, as QEMU does on
//! SIGTERM (a service manager stopping a VM is not a failure); the summary
//! says `stopped by signal N`. The exception is a destination whose guest is
//! still arriving (`run --incoming`): the signal stops the incoming migration,
//! which fails (exit 1), and the source keeps its guest. `kvmscope run --help`
//! and the README list the exit codes.

use std::sync::mpsc::Sender;

use crate::messages::VmEvent;

fn termination_set() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset only write the set we own.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        set
    }
}

/// Blocks SIGINT/SIGTERM in the calling thread (and so in threads it starts
/// afterwards). Call first thing in `main`, before any thread exists.
pub fn block_termination() {
    let set = termination_set();
    // SAFETY: changes only this thread's signal mask.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
}

/// SIGINT or SIGTERM, if one is pending (blocked and not yet taken), for
/// waits that happen before the forwarding thread exists.
pub(crate) fn pending_termination() -> Option<i32> {
    // SAFETY: sigpending writes only the set we own; sigismember reads it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        if libc::sigpending(&mut set) != 0 {
            return None;
        }
        [libc::SIGTERM, libc::SIGINT]
            .into_iter()
            .find(|&sig| libc::sigismember(&set, sig) == 1)
    }
}

/// Waits in the calling thread for SIGINT or SIGTERM (blocked beforehand with
/// [`block_termination`]) and returns its number.
pub fn wait_for_termination() -> i32 {
    let set = termination_set();
    let mut sig = 0;
    // SAFETY: sigwait writes the signal number into `sig`.
    while unsafe { libc::sigwait(&set, &mut sig) } != 0 {}
    sig
}

/// Starts the thread that forwards termination signals to `events`.
///
/// # Errors
/// The thread could not be started.
pub(crate) fn forward_termination(events: Sender<VmEvent>) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || loop {
            let set = termination_set();
            let mut sig = 0;
            // SAFETY: sigwait writes the signal number into `sig`.
            let rc = unsafe { libc::sigwait(&set, &mut sig) };
            if rc == 0 && events.send(VmEvent::Signal(sig)).is_err() {
                return;
            }
        })?;
    Ok(())
}
