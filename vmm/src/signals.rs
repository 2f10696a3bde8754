//! SIGINT, SIGTERM and SIGHUP become `VmEvent::Signal` on the main loop's
//! channel: each stops the VMM in order, as QEMU's termination signals do
//! (a closed terminal or a dropped ssh session sends SIGHUP: before
//! 2026-12-08 it killed the process outright, its socket file left, no
//! `SHUTDOWN` said, and `kvmscope migrate` died with its migration left
//! running).
//!
//! [`take_termination`] runs first thing in `main`, before any other thread
//! exists: it blocks both signals in the main thread (so in every thread
//! started afterwards) and starts one `signals` thread, the only one that
//! leaves them unblocked, where signal-hook's handler runs and its iterator
//! hands each signal over. So no work happens in a signal handler and no
//! other thread (a vCPU inside `KVM_RUN`, a `poll`) is ever interrupted.
//!
//! A run stopped this way is an orderly stop and exits 0, as QEMU does on
//! SIGTERM (a service manager stopping a VM is not a failure); the summary
//! says `stopped by signal N`. The exception is a destination whose guest is
//! still arriving (`run --incoming`): the signal stops the incoming migration,
//! which fails (exit 1), and the source keeps its guest. `kvmscope run --help`
//! and the README list the exit codes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Condvar, Mutex};

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use vmm_sys_util::signal::{block_signal, unblock_signal, Error as MaskError};

use crate::messages::VmEvent;

/// The signals that stop kvmscope.
const TERMINATION: [i32; 3] = [SIGINT, SIGTERM, SIGHUP];

/// What the `signals` thread took, and where it forwards it.
struct Taken {
    /// The first termination signal taken, if any.
    first: Option<i32>,
    /// The main loop's channel, once the VM exists.
    forward: Option<Sender<VmEvent>>,
}

static TAKEN: Mutex<Taken> = Mutex::new(Taken {
    first: None,
    forward: None,
});
static ARRIVED: Condvar = Condvar::new();

/// Whether the next SIGINT/SIGTERM/SIGHUP ends the process at once (status
/// 128 + the signal, as the default action would show) instead of only
/// being recorded: for a client between the moments it can act on one
/// (`kvmscope migrate` before its migration starts, and after it asked to
/// cancel, so that a VMM that never answers cannot hold it).
static EXIT_ON_NEXT: AtomicBool = AtomicBool::new(false);

/// What the process says on standard error as such a signal ends it.
static EXIT_NOTE: Mutex<Option<&'static str>> = Mutex::new(None);

/// From now on a termination signal ends the process at once, after
/// saying `Some(note)` on standard error ("kvmscope: signal 2: NOTE"), or is
/// recorded for the caller to act on (`None`, the default). Only where
/// [`take_termination`] runs (the binary).
pub fn exit_on_signal(note: Option<&'static str>) {
    // The note in place before the flag says to exit, and the flag down
    // before the note goes.
    if note.is_none() {
        EXIT_ON_NEXT.store(false, Ordering::SeqCst);
    }
    *crate::lock(&EXIT_NOTE) = note;
    if note.is_some() {
        EXIT_ON_NEXT.store(true, Ordering::SeqCst);
    }
}

/// What the process says as a second termination signal ends it, when one
/// should (see [`exit_on_second_signal`]).
static EXIT_ON_SECOND: Mutex<Option<&'static str>> = Mutex::new(None);

/// From now on, a termination signal taken while an earlier one is still
/// pending ends the process at once, saying `Some(note)`; `None` leaves it
/// recorded. For a client whose answer to the first signal waits on a peer
/// (`kvmscope migrate` cancelling through a VMM that does not answer): the
/// second is the user's say that it must not wait, and nothing reads it
/// while the first is unanswered. Only where [`take_termination`] runs.
pub fn exit_on_second_signal(note: Option<&'static str>) {
    *crate::lock(&EXIT_ON_SECOND) = note;
}

/// Blocks SIGINT/SIGTERM/SIGHUP in the calling thread (and so in the threads it
/// starts afterwards) and starts the `signals` thread that takes them. Call
/// first thing in `main`, before any other thread exists.
///
/// # Errors
/// The mask could not be changed, the handler installed or the thread started.
pub fn take_termination() -> std::io::Result<()> {
    for sig in TERMINATION {
        match block_signal(sig) {
            Ok(()) | Err(MaskError::SignalAlreadyBlocked(_)) => {}
            Err(e) => return Err(std::io::Error::other(format!("blocking signal {sig}: {e}"))),
        }
    }
    let mut signals = Signals::new(TERMINATION)?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for sig in TERMINATION {
                if let Err(e) = unblock_signal(sig) {
                    log::error!("signals: unblocking signal {sig}: {e}");
                }
            }
            for sig in signals.forever() {
                took(sig);
            }
        })?;
    Ok(())
}

/// Records a signal the `signals` thread took and forwards it, or ends the
/// process where [`exit_on_signal`] says so.
fn took(sig: i32) {
    if EXIT_ON_NEXT.load(Ordering::SeqCst) {
        end(sig, *crate::lock(&EXIT_NOTE));
    }
    let mut taken = crate::lock(&TAKEN);
    if taken.first.is_some() {
        if let Some(note) = *crate::lock(&EXIT_ON_SECOND) {
            end(sig, Some(note));
        }
    }
    taken.first.get_or_insert(sig);
    if let Some(events) = &taken.forward {
        if events.send(VmEvent::Signal(sig)).is_err() {
            taken.forward = None;
        }
    }
    ARRIVED.notify_all();
}

/// Ends the process as `sig`'s default action would, after saying `note`:
/// the action this thread took over, which the caller asked for (a client
/// with nothing to undo).
fn end(sig: i32, note: Option<&str>) -> ! {
    if let Some(note) = note {
        crate::say!("kvmscope: signal {sig}: {note}");
    }
    #[allow(clippy::exit)]
    std::process::exit(128 + sig);
}

/// SIGINT, SIGTERM or SIGHUP, if one was taken (for waits that happen before the
/// main loop's channel exists, and for clients that poll).
pub fn pending_termination() -> Option<i32> {
    crate::lock(&TAKEN).first
}

/// Waits for SIGINT, SIGTERM or SIGHUP ([`take_termination`] must have run) and
/// returns the first one's number.
pub fn wait_for_termination() -> i32 {
    let mut taken = crate::lock(&TAKEN);
    loop {
        if let Some(sig) = taken.first {
            return sig;
        }
        taken = crate::wait(&ARRIVED, taken, None);
    }
}

/// Forwards termination signals to `events` from now on; one taken before
/// is forwarded at once.
pub(crate) fn forward_termination(events: Sender<VmEvent>) {
    let mut taken = crate::lock(&TAKEN);
    if let Some(sig) = taken.first {
        // The receiver outlives this call; a send fails only once it is gone.
        let _ = events.send(VmEvent::Signal(sig));
    }
    taken.forward = Some(events);
}
