//! The VM's run state as the main loop sets it and the control plane reports
//! it (`query-status`), named as QEMU names its `RunState`s.

use std::sync::atomic::{AtomicU8, Ordering};

use serde::{Deserialize, Serialize};

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
pub(crate) struct SharedRunState(AtomicU8);

impl Default for SharedRunState {
    fn default() -> Self {
        SharedRunState(AtomicU8::new(RunState::Prelaunch as u8))
    }
}

impl SharedRunState {
    /// The current state.
    pub(crate) fn get(&self) -> RunState {
        let v = self.0.load(Ordering::Acquire);
        RunState::ALL
            .into_iter()
            .find(|s| *s as u8 == v)
            .unwrap_or(RunState::InternalError)
    }

    /// Sets the state.
    pub(crate) fn set(&self, state: RunState) {
        self.0.store(state as u8, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
