//! The main loop's messages: what vCPU threads, the control plane, migration
//! and the signal thread send to the main thread (`VmEvent`), the run-state
//! changes only the main loop may make (`RunRequest`), and why it refused one
//! (`RunStateError`).
//!
//! The main loop (`run.rs`) owns the vCPU threads; everyone else asks it
//! through these messages, so nothing but the main loop changes run state.

use std::sync::mpsc::Sender;
use std::time::Duration;

use crate::vcpu::{CommandResult, Outcome, Report};

/// Why the main loop refused or never answered a run-state change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunStateError {
    /// A resume came while a hold (readiness scan or migration) is on.
    #[error("a readiness scan holds the guest paused; it resumes when the scan ends")]
    HeldByScan,
    /// The main loop has stopped taking requests.
    #[error("the VMM is shutting down")]
    ShuttingDown,
    /// The guest is still arriving (`inmigrate`): it has no run state to change yet.
    #[error("the guest is still arriving (inmigrate); only quit and migrate_cancel are taken until it has")]
    Inmigrate,
    /// The asker gave up waiting for the main loop's answer.
    #[error("the main loop did not answer {request:?} within {limit:?}")]
    NoAnswer {
        /// What was asked.
        request: RunRequest,
        /// How long the asker waited.
        limit: Duration,
    },
}

/// What vCPU threads tell the VMM's main loop.
#[derive(Debug)]
pub enum VmEvent {
    /// vCPU `0` ran out of commands and is waiting.
    Idle(usize),
    /// A command finished.
    CommandDone(usize, CommandResult),
    /// vCPU `0`'s thread ended.
    Finished(usize, Outcome),
    /// The process received a termination signal.
    Signal(i32),
    /// The control plane asks the main loop to change the VM's run state.
    Control(RunRequest, Sender<Result<(), RunStateError>>),
    /// The `migration-in` thread has ended (a source found or the stream
    /// loaded, failed or stopped).
    Loaded,
    /// A vCPU was throttled or dirty-limited: kick it at once, then every timeslice.
    Throttled,
}

impl VmEvent {
    /// vCPU `index`'s report as the main loop's message.
    pub(crate) fn from_vcpu(index: usize, report: Report) -> VmEvent {
        match report {
            Report::Idle => VmEvent::Idle(index),
            Report::CommandDone(result) => VmEvent::CommandDone(index, result),
            Report::Finished(outcome) => VmEvent::Finished(index, outcome),
        }
    }
}

/// Run-state changes only the main loop (which owns the vCPU threads) may make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunRequest {
    /// A user's pause (`pause` on the control socket).
    Pause,
    /// A user's resume; refused while a hold is on.
    Resume,
    /// Keep the guest paused until the matching `Release` (a readiness scan),
    /// whatever users ask meanwhile.
    Hold,
    /// Ends one `Hold`; the guest runs again when no hold is left and no
    /// user's pause is on.
    Release,
    /// The guest has migrated away: it stays paused whatever is asked, until quit.
    Postmigrate,
    /// Stop the VMM (`quit` on the control socket): the main loop answers, then ends.
    Quit,
}
