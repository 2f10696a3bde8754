//! What running a command gives the control plane: a reply now, an error, or
//! a reply that comes later. Shared by `commands` (which produces them) and
//! `deferred` (which finishes the later ones), so neither imports the other.

use std::fs::File;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;

use serde_json::Value;

use crate::protocol::ErrorClass;

/// A `guest-command` whose reply waits for its commands to finish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GuestWait {
    /// The vCPU whose queue took the commands.
    pub(crate) vcpu: usize,
    /// Sequence number of the first command queued.
    pub(crate) first: u64,
    /// Sequence number of the last; the reply goes once its result is in.
    pub(crate) last: u64,
}

/// What a readiness worker tells the control thread.
#[derive(Debug)]
pub(crate) enum WorkerMsg {
    /// Scan progress, in pages.
    Progress(u64, u64),
    /// The report, or why there is none; the worker is finished. The
    /// control thread turns it into the reply.
    Done(Box<Result<crate::readiness::Report, crate::readiness::Error>>),
}

/// A reply that is not ready yet.
#[derive(Debug)]
pub(crate) enum Pending {
    /// `guest-command` with `wait`: until the last command's result is in.
    Guest(GuestWait),
    /// `query-readiness`: until its worker sends `Done`. Dropped unanswered
    /// (its client went), it tells the worker to stop ([`Abandon`]).
    Readiness(Receiver<WorkerMsg>, Abandon),
    /// `query-readiness` that came while the periodic measurement ran: that
    /// one was told to stop, and this starts once the slot is free (within
    /// a window's look, 50 ms), unless it is still taken at `until`.
    ReadinessQueued {
        args: crate::protocol::request::ReadinessArgs,
        until: std::time::Instant,
    },
}

/// Set when dropped: the reply a readiness worker works for is no longer
/// awaited (dropped after the reply, when the worker is done, it changes
/// nothing), so that a window nobody waits for stops rather than tracking
/// the guest, and holding the one readiness slot, for the rest of its span.
#[derive(Debug)]
pub(crate) struct Abandon(Option<Arc<AtomicBool>>);

impl Abandon {
    /// Sets `flag` when dropped.
    pub(crate) fn on_drop(flag: Arc<AtomicBool>) -> Abandon {
        Abandon(Some(flag))
    }

    /// Dropped without setting its flag: for a measurement nobody awaits
    /// from the start (the periodic one), which runs to its end unless the
    /// flag returned is set.
    pub(crate) fn disarm(mut self) -> Option<Arc<AtomicBool>> {
        self.0.take()
    }
}

impl Drop for Abandon {
    fn drop(&mut self) {
        if let Some(flag) = &self.0 {
            flag.store(true, Ordering::Release);
        }
    }
}

/// What a pending reply has now: event lines to send, and the reply when ready.
pub(crate) struct Progress {
    /// Events to send to this client first (such as `READINESS_PROGRESS`).
    pub(crate) events: Vec<crate::protocol::Event>,
    /// The reply, once ready; `None`: keep waiting.
    pub(crate) done: Option<Outcome>,
}

/// What a command produced.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// `{"return": value}`, with fds riding on the line.
    Return(Value, Vec<File>),
    /// `{"return": value}` for a value serialized as it was built (a page of
    /// samples: one pass, no JSON tree of it in memory).
    ReturnRaw(Box<serde_json::value::RawValue>),
    /// `{"error": {"class", "desc"}}`.
    Error(ErrorClass, String),
    /// The reply waits until the handler's `check_wait` gives it.
    Wait(Pending),
    /// Start streaming `SAMPLE` events after point `since`; `reply` is the return value.
    Subscribe {
        /// The sampler point after which events start.
        since: u64,
        /// The command's return value.
        reply: Value,
    },
    /// Stop streaming.
    Unsubscribe,
    /// Leave capability negotiation mode (`qmp_capabilities`).
    Negotiated,
}

impl Outcome {
    /// A plain return value without fds.
    pub(crate) fn ret(value: impl serde::Serialize) -> Outcome {
        match serde_json::to_value(value) {
            Ok(v) => Outcome::Return(v, Vec::new()),
            Err(e) => Outcome::Error(ErrorClass::GenericError, format!("encoding the reply: {e}")),
        }
    }

    /// A `GenericError`.
    pub(crate) fn generic(desc: impl Into<String>) -> Outcome {
        Outcome::Error(ErrorClass::GenericError, desc.into())
    }
}
