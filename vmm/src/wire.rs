//! A migration stream's sizes as the sender counts them, and what its stop
//! costs: the sender's stop test (`migration::sender`) and the pre-copy
//! model that predicts it (`readiness::model`) count with the same
//! arithmetic, so that the model predicts the stop the sender decides on.
//! `migration`'s tests hold the sizes to the stream's own records.

use crate::units::saturating_u64;

/// Bytes of a guest page.
pub(crate) const PAGE: u64 = 4096;
/// A run of pages on the wire: `first` u64, `count` u32, `kind` u32. A zero
/// run of any length costs only this; a normal run adds its pages' bytes.
pub(crate) const RUN_HEADER: u64 = 16;
/// A section header (`kind`, `reserved`, `len`).
pub(crate) const SECTION_HEADER: u64 = 16;
/// The sender closes a RAM section once its payload reaches this size.
pub(crate) const SECTION_TARGET: u64 = 4 << 20;
/// A dirty page in a later pass, as the sender's own estimate counts it: the
/// page and a run header (dirty pages are scattered, so most start a run).
pub(crate) const DIRTY_PAGE_WIRE: u64 = PAGE + RUN_HEADER;
/// Stream header, config section and plan section, before pass 0's pages.
pub(crate) const SETUP_BYTES: u64 = 16 + (SECTION_HEADER + 40) + (SECTION_HEADER + 16);
/// The `Pass` record that ends every pass (the stop-and-copy one too).
pub(crate) const PASS_BYTES: u64 = SECTION_HEADER + 16;
/// The trailer.
pub(crate) const END_BYTES: u64 = SECTION_HEADER + 16;
/// One vCPU's state section's payload (registers, XSAVE, MSRs, the VMM's
/// JSON), as measured on the streams (docs/EXPERIMENTS.md: `downtime-bytes`
/// of idle guests, 6,382 bytes with its header for one vCPU, 25,096 for four).
pub(crate) const VCPU_BYTES: u64 = 6_272;
/// Costs on this side of the link that the wire bytes do not show, measured
/// against real migrations (docs/EXPERIMENTS.md, migration part). The
/// defaults are this host's (2026-11-27, release build, 16 cells): setup
/// 1-11 ms, 2 ms in the median; the stop beyond its bytes 1.0 ms with one
/// idle vCPU and 2.0 ms with four (until then 10 ms, 4 ms and 0.5 ms per
/// vCPU, from before the stop stopped formatting each queued command and
/// logging began unarmed).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Costs {
    /// Fastest the sender and receiver move bytes with no bandwidth limit
    /// (reading, checking for zeros, copying through the socket), bytes/s.
    pub(crate) local_rate: f64,
    /// Setup: connecting, the destination building its VM, subscribing to
    /// the dirty log, reading the page map; seconds.
    pub(crate) setup: f64,
    /// The stop beyond its bytes: pausing the vCPUs, reading their state, the
    /// last sync, the destination loading the state and answering; seconds.
    pub(crate) stop: f64,
    /// Each vCPU's share of the stop, seconds.
    pub(crate) stop_per_vcpu: f64,
}

impl Default for Costs {
    fn default() -> Self {
        Costs {
            local_rate: 1.0e9,
            setup: 0.002,
            stop: 0.001,
            stop_per_vcpu: 0.000_25,
        }
    }
}

/// Section headers for `payload` bytes of RAM runs.
pub(crate) fn sections(payload: u64) -> u64 {
    payload.div_ceil(SECTION_TARGET).max(1) * SECTION_HEADER
}

/// A later pass's bytes for `pages` dirty pages.
pub(crate) fn dirty_pass_bytes(pages: u64) -> u64 {
    if pages == 0 {
        return PASS_BYTES;
    }
    pages * DIRTY_PAGE_WIRE + sections(pages * DIRTY_PAGE_WIRE) + PASS_BYTES
}

/// What the stop sends: `dirty` pages as a last pass, the state of `vcpus`
/// vCPUs that carry `state_extra` bytes beyond an idle vCPU's, and the
/// trailer.
pub(crate) fn stop_bytes(dirty: u64, vcpus: u64, state_extra: u64) -> u64 {
    dirty_pass_bytes(dirty) + vcpus * (SECTION_HEADER + VCPU_BYTES) + state_extra + END_BYTES
}

/// The stop's downtime, seconds: its `bytes` at `rate` bytes/s and the
/// costs beyond them (pausing, the vCPUs' state, the destination's answer).
pub(crate) fn stop_seconds(bytes: u64, rate: f64, vcpus: u64, costs: &Costs) -> f64 {
    if rate <= 0.0 {
        return f64::INFINITY;
    }
    bytes as f64 / rate + costs.stop + costs.stop_per_vcpu * vcpus as f64
}

/// The sender's stop test, which the model follows: the stop's downtime
/// fits the limit, both in whole milliseconds as `query-migrate`'s
/// `expected-downtime` and `downtime-limit` count them; or nothing is
/// dirty, when another pass cannot shorten the stop (the state, the
/// trailer and the fixed costs alone may pass a very small limit).
pub(crate) fn stop_fits(downtime_ms: u64, dirty: u64, limit_ms: u64) -> bool {
    dirty == 0 || downtime_ms <= limit_ms
}

/// Seconds as whole milliseconds, rounded up (saturating).
pub(crate) fn whole_ms(seconds: f64) -> u64 {
    saturating_u64((seconds * 1e3).ceil())
}
