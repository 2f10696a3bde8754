//! Why a readiness measurement failed.

use std::time::Duration;

use super::model;
use crate::dirty;

/// Why a measurement failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The VM stats fd could not be read.
    #[error("reading the VM stats")]
    Stats(#[from] kvm_stats::Error),
    /// `mincore` over guest RAM failed.
    #[error("mincore over guest RAM")]
    Residency(#[source] std::io::Error),
    /// The page map (which pages hold data, for the scan) could not be read.
    #[error("reading the page map of guest RAM for the scan")]
    PageMap(#[source] crate::backing::Error),
    /// Dirty tracking could not be turned on or harvested.
    #[error(transparent)]
    Dirty(#[from] dirty::Error),
    /// The vCPUs could not be paused for the scan.
    #[error("pausing the guest for the scan")]
    Pause(#[source] crate::messages::RunStateError),
    /// The vCPUs were asked to pause but did not in time.
    #[error("the vCPUs did not pause within {0:?}")]
    PauseTimeout(Duration),
    /// The prediction could not be made from the figures.
    #[error(transparent)]
    Model(#[from] model::Error),
    /// The VM has no guest RAM to measure.
    #[error("the VM has no memory")]
    NoMemory,
    /// The client that asked went away: the window or the scan it was in
    /// stopped after this long.
    #[error("the client that asked went away: the measurement stopped after {0:?}")]
    Abandoned(Duration),
}
