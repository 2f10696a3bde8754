//! What a readiness measurement measures, and the link it predicts for.

use std::time::Duration;

use crate::protocol::migration::Parameters;

/// What to measure and the link to predict for.
#[derive(Debug, Clone)]
pub struct Options {
    /// Window for the dirty rate (zero: no dirty-rate measurement).
    pub calc_time: Duration,
    /// Run the exact scan (pauses the guest while it reads RAM).
    pub scan: bool,
    /// Link bandwidth for the prediction, bytes per second; `None`: unlimited
    /// (the sender's own pace, `wire::Costs::local_rate`).
    pub bandwidth: Option<f64>,
    /// Longest acceptable downtime for the prediction (default: the
    /// migration parameters' `downtime-limit` default).
    pub max_downtime: Duration,
    /// Where the bandwidth came from: `request`, `migration-parameters` or
    /// `default`, as the report names it.
    pub link_from: &'static str,
    /// Where the downtime limit came from: `request`, `migration-parameters`
    /// or `default`.
    pub downtime_from: &'static str,
    /// vCPUs (their state goes out in the stop).
    pub vcpus: u64,
    /// Bytes their state carries beyond an idle vCPU's: queued commands and
    /// kept results (`VcpuShared::state_extra_bytes`, summed).
    pub state_extra: u64,
    /// `x-max-rounds` (0: none).
    pub max_rounds: u64,
    /// `x-vcpu-dirty-limit-period`: a dirty limit's bucket holds one
    /// period of it.
    pub dirty_limit_period: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            calc_time: Duration::from_secs(1),
            scan: false,
            bandwidth: Some(1.25e9),
            max_downtime: Duration::from_millis(Parameters::default().downtime_limit),
            link_from: "default",
            downtime_from: "default",
            vcpus: 1,
            state_extra: 0,
            max_rounds: 0,
            dirty_limit_period: Duration::from_millis(Parameters::DEFAULT_DIRTY_LIMIT_PERIOD_MS),
        }
    }
}
