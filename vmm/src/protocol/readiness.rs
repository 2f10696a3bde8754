//! `query-readiness`'s return, shared by the server (`readiness/report.rs`
//! builds it from its measurements) and the clients (`kvmscope readiness`,
//! `migrate --predict`, the demo). Member names are those of the report's
//! JSON since its first version: snake_case, except the prediction's
//! `migrate` part, which uses `query-migrate`'s names. Figures that can be
//! infinite or unknown are `null`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::migration::Status;

/// A number of guest pages and their bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pages {
    /// 4 KiB pages.
    pub pages: u64,
    /// `pages` × 4096.
    pub bytes: u64,
}

/// A page count, and how long getting it took.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TimedPages {
    /// 4 KiB pages.
    pub pages: u64,
    /// `pages` × 4096.
    pub bytes: u64,
    /// Microseconds it took.
    pub took_us: f64,
}

/// A sample of the host-resident pages read for zeros while the guest runs:
/// the non-zero pages estimated from it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SampledFigure {
    /// The estimate, 4 KiB pages: `of_pages` × `nonzero_read` / `pages_read`.
    pub pages: u64,
    /// `pages` × 4096.
    pub bytes: u64,
    /// Pages read (drawn at random with replacement, or every resident page
    /// where there are no more than a sample's).
    pub pages_read: u64,
    /// Of them, the pages holding a non-zero byte.
    pub nonzero_read: u64,
    /// The host-resident pages drawn from.
    pub of_pages: u64,
    /// Microseconds it took.
    pub took_us: f64,
}

/// The memory KVM maps, by page size (the VM's `pages_*` stats).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MappedFigure {
    /// Pages mapped with 4 KiB.
    pub pages_4k: u64,
    /// With 2 MiB.
    pub pages_2m: u64,
    /// With 1 GiB.
    pub pages_1g: u64,
    /// The bytes they map.
    pub bytes: u64,
    /// Microseconds it took.
    pub took_us: f64,
    /// The most bytes KVM has mapped at once since the VMM started, as the
    /// VMM saw it, and on a VM that migrated in at least what the stream
    /// left holding data (null where it does not keep count; absent from
    /// VMMs before it).
    #[serde(default)]
    pub peak_bytes: Option<u64>,
}

/// The dirty rate over a window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DirtyRateFigure {
    /// `dirty-bitmap` or `dirty-ring`.
    pub mode: String,
    /// Seconds watched.
    pub window_s: f64,
    /// Distinct pages dirtied in the window.
    pub pages: u64,
    /// `pages` per second.
    pub pages_per_s: f64,
    /// `pages_per_s` × 4096.
    pub bytes_per_s: f64,
    /// Ring entries harvested per vCPU (ring mode).
    pub per_vcpu: Option<Vec<u64>>,
    /// Microseconds it took.
    pub took_us: f64,
    /// Distinct pages at about half the window (0 when no count was taken there).
    pub half_window_pages: u64,
    /// Distinct pages at 1/32, 1/16, ... 1/2 of the window: how the count
    /// grew (absent from VMMs before it).
    #[serde(default)]
    pub curve: Vec<CurvePoint>,
    /// The write rate behind the window, pages per second (docs/READINESS.md).
    pub model_rate: Option<f64>,
    /// The working set the writes spread over, when the window saturated.
    pub model_working_set: Option<u64>,
    /// How the model takes distinct pages to grow with time: `linear` (no
    /// working set seen), `uniform` (random writes over the set) or
    /// `sequential` (sweeps of the set); empty from VMMs before it.
    #[serde(default)]
    pub model_growth: String,
}

/// One count of a dirty-rate window's curve.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CurvePoint {
    /// Seconds into the window.
    pub s: f64,
    /// Distinct pages dirtied by then.
    pub pages: u64,
}

/// The vCPU time the guest lost to dirty tracking over a dirty-rate window:
/// its write-protection faults beyond its rate before the window at a
/// measured cost each, and its time in ring-full exits (docs/READINESS.md,
/// "What tracking costs the guest").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StallFigure {
    /// All vCPUs' stall added up, ms.
    pub total_ms: f64,
    /// `total_ms` as a share of the window's vCPU time (window × vCPUs).
    pub share: f64,
    /// Seconds the stall was measured over.
    pub period_s: f64,
    /// What one fault costs the guest, microseconds.
    pub fault_cost_us: f64,
    /// Where that cost came from: `measured` on this host at the VMM's
    /// start, `given` (`run --fault-cost`), or `default` (not measured: the
    /// stall may be several times off; absent from VMMs before it).
    #[serde(default)]
    pub fault_cost_source: Option<String>,
    /// Pages the guest had mapped that the window left write-protected: each
    /// faults once more when the guest next writes it, after the window
    /// (null where a migration went on holding the log; absent from VMMs
    /// before it).
    #[serde(default)]
    pub left_protected_pages: Option<u64>,
    /// The most those faults can cost the guest, ms (`left_protected_pages`
    /// at the fault cost): paid only for the pages it writes again, and
    /// counted by the running total (`guest_stall_ns`) as they come.
    #[serde(default)]
    pub left_stall_ms_max: Option<f64>,
    /// What they will cost if the guest keeps to the working set the window
    /// saw, ms: the pages of that set left protected, at the fault cost
    /// (null when the window saw no working set: a guest it could not bound
    /// may write any of them).
    #[serde(default)]
    pub left_stall_ms_expected: Option<f64>,
    /// Of `total_ms`, the time the vCPU threads waited for a CPU beyond
    /// their usual: the host's contention, not the faults themselves (null
    /// where not measured; absent from VMMs before it).
    #[serde(default)]
    pub waited_ms: Option<f64>,
    /// Each vCPU's stall.
    pub vcpus: Vec<VcpuStallFigure>,
}

/// One vCPU's stall in a readiness report.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct VcpuStallFigure {
    /// The vCPU's index.
    pub cpu_index: usize,
    /// Its stall, ms.
    pub ms: f64,
    /// Its write-protection faults beyond its rate before the window.
    pub faults: u64,
    /// Of `ms`, the time its thread waited for a CPU beyond its usual (null
    /// where not measured; absent from VMMs before it).
    #[serde(default)]
    pub waited_ms: Option<f64>,
}

/// How far one estimate of non-zero pages is from the scan's count.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EstimateError {
    /// Non-zero pages the estimate counts.
    pub estimate_pages: u64,
    /// The estimate minus the scan's count.
    pub error_pages: i64,
    /// `error / truth`; null when the truth is 0 and the estimate is not.
    pub relative: Option<f64>,
}

/// The exact zero-page scan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScanFigure {
    /// Backed pages that hold only zeros, and pages never backed.
    pub zero_pages: u64,
    /// Pages holding a non-zero byte.
    pub nonzero_pages: u64,
    /// Pages that hold no data, counted as zero unread: never backed, or
    /// (where the kernel has `PAGEMAP_SCAN`) mapping the shared zero page.
    pub unbacked_pages: u64,
    /// Non-zero pages in the guest's arena.
    pub nonzero_in_arena: u64,
    /// Microseconds it took.
    pub took_us: f64,
    /// Each estimate (`mapped`, `resident`, `written`) against the scan.
    pub errors: BTreeMap<String, EstimateError>,
}

/// One pre-copy pass of the model.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RoundFigure {
    /// Pages sent.
    pub pages: u64,
    /// Bytes on the wire.
    pub bytes: u64,
    /// Seconds at the effective rate.
    pub seconds: f64,
}

/// The prediction's RAM figures, under `query-migrate`'s names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct PredictedRam {
    /// Bytes on the wire.
    pub transferred: u64,
    /// Zero pages sent.
    pub duplicate: u64,
    /// Pages sent in full.
    pub normal: u64,
    /// Their bytes.
    pub normal_bytes: u64,
    /// Passes sent while the guest runs.
    pub dirty_sync_count: u64,
}

/// The prediction as `query-migrate` would report the migration (ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct PredictedMigration {
    /// `completed` when it stops, `active` when it would run for ever.
    pub status: Status,
    /// Whether the passes converge.
    pub x_converges: bool,
    /// ms; null when it never ends.
    pub total_time: Option<u64>,
    /// ms; null when it never stops.
    pub downtime: Option<u64>,
    /// The vCPU time the guest would lose to dirty tracking, ms (its
    /// `x-guest-stall` `total-ms`); null without a measured window, or when
    /// it never stops.
    #[serde(default)]
    pub x_guest_stall_ms: Option<u64>,
    /// The RAM figures.
    pub ram: PredictedRam,
}

/// The pre-copy prediction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PredictionReply {
    /// Whether what is dirty after a pass fits the downtime limit.
    pub converges: bool,
    /// Why, in words.
    pub reason: String,
    /// The passes sent while the guest runs, pass 0 first.
    pub rounds: Vec<RoundFigure>,
    /// The stop-and-copy, when there is one.
    pub stop_and_copy: Option<RoundFigure>,
    /// Bytes of every pass, setup and stop included.
    pub total_bytes: u64,
    /// Seconds; null when it never ends.
    pub total_seconds: Option<f64>,
    /// Seconds; null when it never stops.
    pub downtime_seconds: Option<f64>,
    /// The vCPU time the guest would lose to dirty tracking, seconds; null
    /// without a measured window, or when it never stops.
    #[serde(default)]
    pub guest_stall_seconds: Option<f64>,
    /// The figures under `query-migrate`'s names.
    pub migrate: PredictedMigration,
}

/// The throttle that makes a migration converge (`query-readiness`'s `converge`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct ConvergeReply {
    /// The auto-converge throttle, % (set it as `cpu-throttle-initial`, with
    /// `x-cpu-throttle-at-start`).
    pub cpu_throttle_percentage: u64,
    /// The vCPUs to throttle (set them as `x-cpu-throttle-vcpus`): those
    /// that write, where the window told them apart; else every vCPU
    /// (absent from VMMs before it: every vCPU).
    #[serde(default)]
    pub vcpus: Vec<usize>,
    /// vCPU time the throttle would take from the guest, seconds.
    pub throttle_seconds: Option<f64>,
    /// The throttled migration's prediction.
    pub prediction: PredictionReply,
}

/// The dirty limit that makes a migration converge
/// (`query-readiness`'s `converge_dirty_limit`, a ring VM's).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct DirtyLimitReply {
    /// The limit per vCPU, MB/s (set it as `vcpu-dirty-limit`, with
    /// `x-vcpu-dirty-limit-at-start` and the `dirty-limit` capability).
    pub vcpu_dirty_limit: u64,
    /// The vCPUs it slows (the others dirty less than it).
    pub vcpus: Vec<usize>,
    /// vCPU time the limit would take from the guest, seconds.
    pub throttle_seconds: Option<f64>,
    /// The limited migration's prediction.
    pub prediction: PredictionReply,
}

/// The link a prediction is for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinkFigure {
    /// Bytes per second; null: unlimited.
    pub bandwidth: Option<f64>,
    /// The downtime limit, ms.
    #[serde(rename = "downtime-limit-ms")]
    pub downtime_limit_ms: u64,
    /// Where the bandwidth came from: `request`, `migration-parameters` or `default`.
    pub from: String,
    /// Where the downtime limit came from, the same way (absent from VMMs
    /// older than it: empty).
    #[serde(rename = "downtime-limit-from", default)]
    pub downtime_limit_from: String,
}

/// `query-readiness`' return.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReadinessReport {
    /// Guest RAM.
    pub ram: Pages,
    /// What KVM maps (the stats-only estimate).
    pub mapped: MappedFigure,
    /// Host-resident pages of guest RAM.
    pub resident: TimedPages,
    /// The non-zero pages estimated from a sample of the resident ones
    /// (absent from VMMs before it).
    #[serde(default)]
    pub sampled: Option<SampledFigure>,
    /// Pages written since boot (with dirty logging).
    pub written_since_boot: Option<TimedPages>,
    /// The dirty rate, when a window was measured.
    pub dirty_rate: Option<DirtyRateFigure>,
    /// What the window cost the guest, measured over it.
    pub guest_stall: Option<StallFigure>,
    /// The exact scan, when asked for.
    pub scan: Option<ScanFigure>,
    /// Which non-zero estimate the prediction used (`scan` or `mapped`).
    pub estimate_used: String,
    /// The prediction, when the inputs allow one.
    pub prediction: Option<PredictionReply>,
    /// When it does not converge: the smallest auto-converge throttle that
    /// would make it, and that migration's prediction (null when none would,
    /// or none is needed).
    #[serde(default)]
    pub converge: Option<ConvergeReply>,
    /// When it does not converge on a ring VM: the dirty limit per vCPU
    /// that would make it at the least cost to the guest, and that
    /// migration's prediction.
    #[serde(default)]
    pub converge_dirty_limit: Option<DirtyLimitReply>,
    /// The link and downtime limit the prediction is for.
    pub link: LinkFigure,
    /// The report for people.
    pub text: String,
}
