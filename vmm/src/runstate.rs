//! The VM's run state as the main loop sets it and the control plane reports
//! it (`query-status`, and `STOP`/`RESUME` events when the guest stops or starts
//! running), named as QEMU names its `RunState`s.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};
use vmm_sys_util::eventfd::EventFd;

/// Where the VM stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[repr(u8)]
pub(crate) enum RunState {
    /// Built, before the guest first runs.
    Prelaunch,
    /// The guest runs (QMP's `running: true`).
    Running,
    /// Paused by a user (`stop`/`pause`) or held by the VMM (a scan).
    Paused,
    /// Waiting for or loading an incoming migration.
    Inmigrate,
    /// Migrated away: stays paused until `quit`, so nothing runs twice.
    Postmigrate,
    /// The guest failed (a vCPU stopped on an error).
    InternalError,
    /// The VMM is stopping.
    Shutdown,
}

impl RunState {
    const ALL: [RunState; 7] = [
        RunState::Prelaunch,
        RunState::Running,
        RunState::Paused,
        RunState::Inmigrate,
        RunState::Postmigrate,
        RunState::InternalError,
        RunState::Shutdown,
    ];

    /// True when guest code may run.
    pub(crate) fn is_running(self) -> bool {
        self == RunState::Running
    }
}

/// A run state shared between the main loop (which sets it) and readers.
#[derive(Debug)]
pub(crate) struct SharedRunState {
    /// The state (low 8 bits) and how many times the guest has started or
    /// stopped running (the rest): one word, so a reader sees both at once.
    word: AtomicU64,
    /// Written when the guest starts or stops running (the control thread's
    /// watcher, which then sends `STOP`/`RESUME`).
    wake: OnceLock<Arc<EventFd>>,
}

impl Default for SharedRunState {
    fn default() -> Self {
        SharedRunState {
            word: AtomicU64::new(RunState::Prelaunch as u64),
            wake: OnceLock::new(),
        }
    }
}

/// The state in a packed word.
/// The word: the change count above this shift, [`SHUTDOWN_STOP`], then
/// the state in the low byte.
const CHANGES_SHIFT: u32 = 9;
/// Set where the last change was the guest stopping as the VMM shut down.
const SHUTDOWN_STOP: u64 = 1 << 8;

fn state_of(word: u64) -> RunState {
    RunState::ALL
        .into_iter()
        .find(|s| *s as u64 == word & 0xff)
        .unwrap_or(RunState::InternalError)
}

impl SharedRunState {
    /// The current state.
    pub(crate) fn get(&self) -> RunState {
        state_of(self.word.load(Ordering::Acquire))
    }

    /// The current state and how many times the guest has started or stopped
    /// running since the VMM began (each such change is one `STOP` or `RESUME`).
    pub(crate) fn get_with_changes(&self) -> (RunState, u64) {
        let (state, changes, _) = self.get_with_changes_and_shutdown_stop();
        (state, changes)
    }

    /// As [`get_with_changes`](Self::get_with_changes), and whether the
    /// last change was the guest stopping as the VMM shut down (a running
    /// guest's `quit` or signal: QEMU says SHUTDOWN alone for it, no STOP),
    /// read at the same instant.
    pub(crate) fn get_with_changes_and_shutdown_stop(&self) -> (RunState, u64, bool) {
        let word = self.word.load(Ordering::Acquire);
        (
            state_of(word),
            word >> CHANGES_SHIFT,
            word & SHUTDOWN_STOP != 0,
        )
    }

    /// Sets the state; if the guest starts or stops running, counts the change
    /// and writes the wake eventfd.
    pub(crate) fn set(&self, state: RunState) {
        let mut changed = false;
        let _ = self
            .word
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| {
                changed = state_of(word).is_running() != state.is_running();
                let changes = (word >> CHANGES_SHIFT) + u64::from(changed);
                // Set by the change into Shutdown, kept while it stays there.
                let shutdown_stop =
                    state == RunState::Shutdown && (changed || word & SHUTDOWN_STOP != 0);
                let flag = if shutdown_stop { SHUTDOWN_STOP } else { 0 };
                Some(changes << CHANGES_SHIFT | flag | state as u64)
            });
        if changed {
            if let Some(w) = self.wake.get() {
                let _ = w.write(1);
            }
        }
    }

    /// The eventfd [`set`](Self::set) writes when the guest starts or stops
    /// running (the first one given is kept).
    pub(crate) fn set_wake(&self, wake: Arc<EventFd>) {
        let _ = self.wake.set(wake);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The codes the VMM's own stats publish (`run_state`, documented in
    /// docs/PROTOCOL.md and read by the exporter's queries) stay put.
    #[test]
    fn run_state_codes_are_the_documented_ones() {
        let codes: Vec<String> = RunState::ALL
            .iter()
            .map(|&s| format!("{} {}", s as u8, serde_json::to_value(s).unwrap()))
            .collect();
        assert_eq!(
            codes,
            [
                "0 \"prelaunch\"",
                "1 \"running\"",
                "2 \"paused\"",
                "3 \"inmigrate\"",
                "4 \"postmigrate\"",
                "5 \"internal-error\"",
                "6 \"shutdown\""
            ]
        );
    }

    #[test]
    fn only_a_stop_into_shutdown_is_marked_as_the_shutdowns() {
        let s = SharedRunState::default();
        s.set(RunState::Running);
        s.set(RunState::Shutdown);
        assert_eq!(
            s.get_with_changes_and_shutdown_stop(),
            (RunState::Shutdown, 2, true)
        );
        s.set(RunState::Shutdown);
        assert_eq!(
            s.get_with_changes_and_shutdown_stop(),
            (RunState::Shutdown, 2, true),
            "kept while it stays there"
        );
        // Paused first (a user's `stop`), then shut down: that stop was the
        // user's, not the shutdown's.
        let s = SharedRunState::default();
        s.set(RunState::Running);
        s.set(RunState::Paused);
        s.set(RunState::Shutdown);
        assert_eq!(
            s.get_with_changes_and_shutdown_stop(),
            (RunState::Shutdown, 2, false)
        );
    }

    #[test]
    fn every_state_reads_back_as_set() {
        let s = SharedRunState::default();
        assert_eq!(s.get(), RunState::Prelaunch);
        for state in RunState::ALL {
            s.set(state);
            assert_eq!(s.get(), state);
        }
    }

    #[test]
    fn only_starting_or_stopping_to_run_counts_as_a_change() {
        let s = SharedRunState::default();
        let wake = Arc::new(EventFd::new(libc::EFD_NONBLOCK).unwrap());
        s.set_wake(wake.clone());
        s.set(RunState::Running);
        s.set(RunState::Paused);
        s.set(RunState::Postmigrate);
        s.set(RunState::Shutdown);
        assert_eq!(s.get_with_changes(), (RunState::Shutdown, 2));
        assert_eq!(wake.read().unwrap(), 2, "one wake per change");
        s.set(RunState::Running);
        assert_eq!(s.get_with_changes(), (RunState::Running, 3));
        s.set(RunState::Running);
        assert_eq!(s.get_with_changes().1, 3, "running again is no change");
    }

    #[test]
    fn states_have_qemus_names() {
        assert_eq!(
            serde_json::to_value(RunState::InternalError).unwrap(),
            "internal-error"
        );
        assert_eq!(
            serde_json::to_value(RunState::Postmigrate).unwrap(),
            "postmigrate"
        );
    }
}
