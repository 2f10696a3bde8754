//! The sampler's records on the wire, shared by the server (`sampler`, which
//! writes them to `--samples-out`, `query-samples`, `subscribe-samples` and
//! `SAMPLE` events) and the clients (`client/watch.rs`, `kvmscope plot`,
//! which reads a series file back through `sampler::record`).
//!
//! A series in JSON lines is a header record (`"kind": "header"`), then one
//! sample record (`"kind": "sample"`) per tick; `query-samples` returns a
//! [`SamplesPage`] of the same records.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use super::vm::BackendInfo;

/// What a series is about; the first record of every export.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SeriesHeader {
    /// Format version of the series (1).
    pub version: u32,
    /// The VM's name (`kvmscope run --name`); empty in series written before
    /// names existed, and in CSV, which has no header record.
    #[serde(default)]
    pub name: String,
    /// The backend, as [`BackendInfo`] (null in a series read from CSV).
    pub backend: Value,
    /// Stats that do not move on this backend even when the event happens.
    pub quiet_stats: Vec<String>,
    /// vCPUs of the VM.
    pub vcpus: usize,
    /// Guest RAM, bytes.
    pub memory: u64,
    /// Time between ticks, milliseconds.
    #[serde(deserialize_with = "nullable_f64")]
    pub interval_ms: f64,
    /// Cumulative KVM vCPU stats recorded, in column order.
    pub kvm_stats: Vec<String>,
}

impl SeriesHeader {
    /// The backend, when the header holds one of this shape.
    pub fn backend_info(&self) -> Option<BackendInfo> {
        serde_json::from_value(self.backend.clone()).ok()
    }
}

/// The header as a record: `{"kind": "header", ...header, "our_counters": [...]}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename = "header")]
pub struct HeaderRecord {
    /// The header's members, inline.
    #[serde(flatten)]
    pub header: SeriesHeader,
    /// Our counters' names, in column order (informative: a reader takes
    /// counters by name from each sample).
    #[serde(default)]
    pub our_counters: Vec<String>,
}

/// One tick as a record: `{"kind": "sample", ...}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename = "sample")]
pub struct SampleRecord {
    /// Tick number.
    pub seq: u64,
    /// Seconds since the sampler started.
    #[serde(deserialize_with = "nullable_f64")]
    pub time_s: f64,
    /// The VM's `pages_4k` stat.
    pub pages_4k: u64,
    /// The VM's `pages_2m` stat.
    pub pages_2m: u64,
    /// The VM's `pages_1g` stat.
    pub pages_1g: u64,
    /// Derived from the page counts; written for readers of the file, ignored
    /// when a series is read back.
    #[serde(default)]
    pub mapped_bytes: u64,
    /// Each vCPU, by index.
    pub vcpus: Vec<VcpuRecord>,
}

/// One vCPU in one tick.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VcpuRecord {
    /// Latest phase marker: `(seq << 8) | command code`, 0 before the first.
    pub phase: u64,
    /// The header's KVM stats, by name.
    pub kvm: BTreeMap<String, u64>,
    /// Our exit counters, by name.
    pub ours: BTreeMap<String, u64>,
    /// KVM `exits` per second since the previous tick (NaN when not known).
    #[serde(deserialize_with = "nullable_f64")]
    pub exits_per_s: f64,
    /// Our exits per second since the previous tick (NaN when not known).
    #[serde(deserialize_with = "nullable_f64")]
    pub our_exits_per_s: f64,
    /// The guest's own count of its work (guest ABI `progress`); 0 in a
    /// series written before it existed.
    #[serde(default)]
    pub progress: u64,
    /// That count per second since the previous tick.
    #[serde(default, deserialize_with = "nullable_f64")]
    pub progress_per_s: f64,
    /// vCPU time lost to dirty tracking so far, ns: over the observations
    /// that ended, and so far in those still open (it may then go down a
    /// little: an open observation's excess over the rate before it).
    #[serde(default)]
    pub stall_ns: u64,
    /// Time slept for a throttle or dirty limit so far, ns.
    #[serde(default)]
    pub throttled_ns: u64,
}

/// Any record of a JSON-lines series, as read back (each record type writes
/// its own `kind`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Record {
    /// The header, first.
    Header(HeaderRecord),
    /// A tick.
    Sample(SampleRecord),
}

/// `query-samples`' return: a page of the sampler's points. The server
/// writes each point as it is serialized (`S` = a raw JSON value), so a page
/// is built once, straight into its line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SamplesPage<S = SampleRecord> {
    /// What the columns mean.
    pub header: HeaderRecord,
    /// The points, oldest first.
    pub samples: Vec<S>,
    /// Points after `since` that are not in the page and will not come.
    pub dropped: u64,
    /// More points follow this page: ask again from its last point.
    pub more: bool,
    /// The newest point's sequence number.
    #[serde(rename = "last-seq")]
    pub last_seq: u64,
}

/// `subscribe-samples`' return.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Subscribed {
    /// `SAMPLE` events start after this point.
    pub since: u64,
    /// What the columns mean.
    pub header: HeaderRecord,
}

/// JSON has no NaN: serde_json writes a non-finite number as null, read back as NaN.
fn nullable_f64<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}
