//! The migration commands' wire types, with QEMU's names and shapes
//! (`qapi/migration.json`): `query-migrate`'s `MigrationInfo`, the parameters
//! of `migrate-set-parameters` / `query-migrate-parameters`, and `migrate`'s
//! arguments. Members QEMU does not have start with `x-`.

use serde::{Deserialize, Serialize};

/// `migrate`'s arguments.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigrateArgs {
    /// `unix:PATH` or `tcp:HOST:PORT`.
    pub(crate) uri: String,
    /// QEMU's; a migration always runs detached here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) detach: Option<bool>,
    /// QEMU 7.2's block migration (deprecated there): only `false` is taken
    /// (libvirt sends it so); kvmscope moves RAM and vCPU state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) blk: Option<bool>,
    /// QEMU 7.2's incremental block migration: only `false` is taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) inc: Option<bool>,
    /// QEMU's resume of a paused postcopy migration: only `false` is taken
    /// (kvmscope has no postcopy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) resume: Option<bool>,
}

impl MigrateArgs {
    /// Why these arguments ask for what kvmscope cannot do, in QEMU's words
    /// where QEMU has them; `None` when they can be done.
    pub(crate) fn refused(&self) -> Option<&'static str> {
        if self.resume == Some(true) {
            // QEMU's text for a resume with no paused (postcopy) migration.
            return Some("Cannot resume if there is no paused migration");
        }
        if self.blk == Some(true) || self.inc == Some(true) {
            return Some("block migration ('blk', 'inc') is not supported: kvmscope migrates RAM and vCPU state, and its guest has no disk");
        }
        None
    }
}

/// A migration's state, as QEMU's `MigrationStatus` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// Never started.
    None,
    /// Connecting and agreeing on the VM.
    Setup,
    /// Pre-copy rounds while the guest runs.
    Active,
    /// The guest is stopped; the last pages and the device state are sent.
    Device,
    /// The destination has the guest (the source stays in `postmigrate`).
    Completed,
    /// It failed; the source's guest runs on.
    Failed,
    /// A user cancelled it; the source's guest runs on.
    Cancelled,
}

impl Status {
    /// Whether the migration has ended.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            Status::None | Status::Completed | Status::Failed | Status::Cancelled
        )
    }

    /// The name on the wire.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Status::None => "none",
            Status::Setup => "setup",
            Status::Active => "active",
            Status::Device => "device",
            Status::Completed => "completed",
            Status::Failed => "failed",
            Status::Cancelled => "cancelled",
        }
    }
}

/// QEMU's `MigrationStats`: the RAM part of `query-migrate`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct RamStats {
    /// Bytes put on the wire.
    pub(crate) transferred: u64,
    /// Bytes of RAM still to send (dirty at the last sync and not sent yet).
    pub(crate) remaining: u64,
    /// Bytes of guest RAM.
    pub(crate) total: u64,
    /// Zero pages, sent as a header only.
    pub(crate) duplicate: u64,
    /// Pages sent in full.
    pub(crate) normal: u64,
    /// Bytes of the pages sent in full (`normal` × page size).
    pub(crate) normal_bytes: u64,
    /// Dirty-log syncs (one per pass).
    pub dirty_sync_count: u64,
    /// Pages dirtied per second over the last pass.
    pub(crate) dirty_pages_rate: u64,
    /// Send rate over the last pass, megabits per second.
    pub(crate) mbps: f64,
    /// Pages sent per second over the last pass, zero and normal together.
    pub(crate) pages_per_second: u64,
    /// Bytes sent while the guest ran.
    pub(crate) precopy_bytes: u64,
    /// Bytes sent while it was stopped.
    pub(crate) downtime_bytes: u64,
    /// Bytes per page on the wire, 4096.
    pub(crate) page_size: u64,
    /// QEMU 7.2's members for what kvmscope does not do, always 0, so that
    /// a client decoding `MigrationStats` as QEMU's schema has it finds
    /// every member it requires: pages skipped (unused since QEMU 2.x)...
    #[serde(default)]
    pub(crate) skipped: u64,
    /// ...postcopy page requests from the destination...
    #[serde(default)]
    pub(crate) postcopy_requests: u64,
    /// ...bytes sent over multifd channels...
    #[serde(default)]
    pub(crate) multifd_bytes: u64,
    /// ...bytes sent during postcopy...
    #[serde(default)]
    pub(crate) postcopy_bytes: u64,
    /// ...and syncs that missed zero-copy sends.
    #[serde(default)]
    pub(crate) dirty_sync_missed_zero_copy: u64,
}

/// QEMU's `MigrationInfo`, as `query-migrate` returns it (times in ms).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct MigrationInfo {
    /// Where the migration stands; absent before the first one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    /// RAM counters; present from the start of a migration, updated as sections go out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ram: Option<RamStats>,
    /// ms since the migration started; frozen at its end.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) total_time: Option<u64>,
    /// ms from the start until pre-copy began (connect, the destination's
    /// config check, the dirty-log subscription).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) setup_time: Option<u64>,
    /// ms the guest was held paused, from the hold request to the destination's reply.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) downtime: Option<u64>,
    /// ms the dirty pages left at the last sync would take on the wire at the
    /// last pass's rate (16 header bytes per page counted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) expected_downtime: Option<u64>,
    /// Why it failed, as an error chain, with `status` `failed`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_desc: Option<String>,
    /// kvmscope: why the rounds are not converging, while they are not; in
    /// a completed migration's record, that the round limit forced its
    /// stop over the downtime limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) x_not_converging: Option<String>,
    /// kvmscope: `postmigrate` on a source whose guest has left.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub x_vm_state: Option<String>,
    /// kvmscope: CRC-32 of all guest RAM at the stop (source) or after
    /// loading (destination), with `x-check-ram`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub x_ram_crc32: Option<u32>,
    /// kvmscope: where the stream goes (source) or comes from (destination).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) x_uri: Option<String>,
    /// kvmscope: the vCPU time the guest has lost to dirty tracking since
    /// the migration started, measured (docs/MIGRATION.md); on a source.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub x_guest_stall: Option<GuestStall>,
    /// kvmscope: each vCPU's work as its guest counts it (guest ABI
    /// `progress`) from the start of pre-copy to the stop, against its rate
    /// over the second before the migration; on a source.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub x_guest_progress: Option<GuestProgress>,
    /// QEMU's: the auto-converge throttle in force (or last in force), %.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_throttle_percentage: Option<u64>,
    /// kvmscope: the time each vCPU slept for auto-converge or its dirty
    /// limit since the migration started (its guest did not run).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub x_cpu_throttled: Option<GuestStall>,
    /// QEMU's, with dirty-limit once it limits: the longest time a vCPU
    /// slept per ring's worth of pages over its last period, us.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dirty_limit_throttle_time_per_round: Option<u64>,
    /// QEMU's, with dirty-limit once it limits: the time a vCPU fills its
    /// ring at the vCPUs' mean dirty rate, us.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dirty_limit_ring_full_time: Option<u64>,
}

/// The vCPU time a guest lost to dirty tracking over a period, as
/// `query-migrate` reports it (`x-guest-stall`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct GuestStall {
    /// All vCPUs' stall added up, ms.
    pub total_ms: f64,
    /// `x-guest-stall` only: of `total-ms`, the time the vCPU threads
    /// waited for a CPU beyond their usual (absent where not measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waited_ms: Option<f64>,
    /// Each vCPU's.
    pub vcpus: Vec<VcpuStall>,
}

/// What a stall's text says of the part of it that was waiting for a CPU
/// (`waited-ms`; nothing where that is under a millisecond or was not
/// measured), for `kvmscope migrate`'s and `kvmscope readiness`'s reports.
pub fn waited_note(waited_ms: Option<f64>) -> String {
    waited_ms
        .filter(|&w| w >= 0.5)
        .map_or_else(String::new, |w| {
            format!("; of it, {w:.0} ms waiting for a CPU beyond the usual (the host's contention)")
        })
}

/// One vCPU's stall.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct VcpuStall {
    /// The vCPU's index, as `query-cpus-fast` names it.
    pub cpu_index: usize,
    /// Its stall, ms.
    pub ms: f64,
    /// `x-guest-stall` only: of `ms`, the time its thread waited for a CPU
    /// beyond its usual (absent where not measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waited_ms: Option<f64>,
}

/// The guest's own progress over a migration (`x-guest-progress`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct GuestProgress {
    /// Each vCPU's.
    pub vcpus: Vec<VcpuProgress>,
}

/// One vCPU's progress: units are its guest's (pages touched or read, page
/// writes), comparable only while it runs the same kind of command.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct VcpuProgress {
    /// The vCPU's index.
    pub cpu_index: usize,
    /// Units done since pre-copy started (until the stop, once stopped).
    pub units: u64,
    /// Units per second over that time.
    pub per_second: f64,
    /// Units per second over the second before the migration (absent when
    /// not known: no second of readings yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before_per_second: Option<f64>,
}

impl VcpuProgress {
    /// Its rate during the migration as a share of the rate before, % (absent
    /// without a rate before, or when the vCPU did nothing before).
    pub fn percent_of_before(&self) -> Option<f64> {
        self.before_per_second
            .filter(|b| *b > 0.0)
            .map(|b| 100.0 * self.per_second / b)
    }
}

/// QEMU's `DirtyLimitInfo` (`query-vcpu-dirty-limit`), rates in MB/s (2^20 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct DirtyLimitInfo {
    /// The vCPU's index.
    pub cpu_index: usize,
    /// Its limit.
    pub limit_rate: u64,
    /// Its dirty rate over the last period of its limit.
    pub current_rate: u64,
}

/// `set-vcpu-dirty-limit`'s arguments (QEMU's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct SetDirtyLimitArgs {
    /// One vCPU; every vCPU when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_index: Option<usize>,
    /// The limit, MB/s; 0 cancels it.
    pub dirty_rate: u64,
}

/// `cancel-vcpu-dirty-limit`'s arguments (QEMU's).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct CancelDirtyLimitArgs {
    /// One vCPU; every vCPU when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_index: Option<usize>,
}

/// The longest `downtime-limit`, ms (QEMU's): also the longest
/// `max-downtime` a `query-readiness` may predict for.
pub const MAX_DOWNTIME_LIMIT_MS: u64 = 2_000_000;

/// QEMU's `MigrationParameters`, the part kvmscope uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Parameters {
    /// Bytes per second; 0 sends as fast as the link goes.
    pub(crate) max_bandwidth: u64,
    /// Longest acceptable downtime, ms.
    pub(crate) downtime_limit: u64,
    /// kvmscope: stop and copy after this many passes whatever is left; 0: no limit.
    pub(crate) x_max_rounds: u64,
    /// kvmscope: send a CRC-32 of all RAM at the stop for the destination to
    /// check against its own (costs a read of all RAM on both sides, in the downtime).
    pub(crate) x_check_ram: bool,
    /// Auto-converge's first throttle, % (QEMU's default 20).
    pub(crate) cpu_throttle_initial: u64,
    /// What each later step adds, % (QEMU's default 10).
    pub(crate) cpu_throttle_increment: u64,
    /// The most it throttles, % (QEMU's default 99).
    pub(crate) max_cpu_throttle: u64,
    /// At the tail, step by no more than what brings the dirty rate to the
    /// trigger threshold (QEMU's default false).
    pub(crate) cpu_throttle_tailslow: bool,
    /// kvmscope: with auto-converge, throttle to `cpu-throttle-initial` as
    /// pre-copy starts instead of after two periods of dirtying too fast (the
    /// throttle `query-readiness` predicts is needed: `converge`).
    pub(crate) x_cpu_throttle_at_start: bool,
    /// kvmscope: the vCPUs auto-converge throttles; empty (the default):
    /// every vCPU, as QEMU's. `query-readiness`'s `converge` names the
    /// vCPUs that dirty memory where the window could tell them apart.
    pub(crate) x_cpu_throttle_vcpus: VcpuSet,
    /// The dirty limit the `dirty-limit` capability sets on every vCPU, MB/s
    /// (QEMU's default 1).
    pub(crate) vcpu_dirty_limit: u64,
    /// The period a vCPU's dirty rate is measured and limited over, ms
    /// (QEMU's default 1000).
    pub(crate) x_vcpu_dirty_limit_period: u64,
    /// kvmscope: with dirty-limit, set the limit as pre-copy starts instead
    /// of after two periods of dirtying too fast (the limit
    /// `query-readiness` predicts is needed: `converge`).
    pub(crate) x_vcpu_dirty_limit_at_start: bool,
    /// kvmscope: the vCPUs dirty-limit limits; empty (the default): every
    /// vCPU, as QEMU's. `query-readiness`'s `converge_dirty_limit` names
    /// the vCPUs that dirty faster than its limit.
    pub(crate) x_vcpu_dirty_limit_vcpus: VcpuSet,
}

impl Parameters {
    /// The default `downtime-limit`, ms (QEMU's): the one place it is
    /// written; [`Parameters::default`] and every other default take it.
    pub(crate) const DEFAULT_DOWNTIME_LIMIT_MS: u64 = 300;

    /// The default `x-vcpu-dirty-limit-period`, ms (QEMU's).
    pub(crate) const DEFAULT_DIRTY_LIMIT_PERIOD_MS: u64 = 1000;

    /// The share of the sent bytes the guest may dirty over a period before
    /// auto-converge counts it as too fast and steps (QEMU's
    /// `throttle-trigger-threshold` default, which kvmscope does not let
    /// change), %.
    pub(crate) const THROTTLE_TRIGGER_PERCENT: u64 = 50;
}

impl Default for Parameters {
    /// QEMU's defaults: no bandwidth limit, a 300 ms downtime limit, no
    /// round limit, no RAM check.
    fn default() -> Self {
        Parameters {
            max_bandwidth: 0,
            downtime_limit: Parameters::DEFAULT_DOWNTIME_LIMIT_MS,
            x_max_rounds: 0,
            x_check_ram: false,
            cpu_throttle_initial: 20,
            cpu_throttle_increment: 10,
            max_cpu_throttle: 99,
            cpu_throttle_tailslow: false,
            x_cpu_throttle_at_start: false,
            x_cpu_throttle_vcpus: VcpuSet::default(),
            vcpu_dirty_limit: 1,
            x_vcpu_dirty_limit_period: Parameters::DEFAULT_DIRTY_LIMIT_PERIOD_MS,
            x_vcpu_dirty_limit_at_start: false,
            x_vcpu_dirty_limit_vcpus: VcpuSet::default(),
        }
    }
}

/// A `migrate-set-parameters` request: the members given.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct SetParameters {
    /// New [`Parameters::max_bandwidth`], bytes per second (0: unlimited).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) max_bandwidth: Option<u64>,
    /// New [`Parameters::downtime_limit`], ms, at most 2,000,000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) downtime_limit: Option<u64>,
    /// New [`Parameters::x_max_rounds`] (0: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) x_max_rounds: Option<u64>,
    /// New [`Parameters::x_check_ram`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) x_check_ram: Option<bool>,
    /// New [`Parameters::cpu_throttle_initial`], 1 to 99.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) cpu_throttle_initial: Option<u64>,
    /// New [`Parameters::cpu_throttle_increment`], 1 to 99.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) cpu_throttle_increment: Option<u64>,
    /// New [`Parameters::max_cpu_throttle`], 1 to 99.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) max_cpu_throttle: Option<u64>,
    /// New [`Parameters::cpu_throttle_tailslow`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) cpu_throttle_tailslow: Option<bool>,
    /// New [`Parameters::x_cpu_throttle_at_start`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) x_cpu_throttle_at_start: Option<bool>,
    /// New [`Parameters::x_cpu_throttle_vcpus`] (`[]`: every vCPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) x_cpu_throttle_vcpus: Option<VcpuSet>,
    /// New [`Parameters::vcpu_dirty_limit`], MB/s, at least 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) vcpu_dirty_limit: Option<u64>,
    /// New [`Parameters::x_vcpu_dirty_limit_period`], 1 to 1000 ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) x_vcpu_dirty_limit_period: Option<u64>,
    /// New [`Parameters::x_vcpu_dirty_limit_at_start`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) x_vcpu_dirty_limit_at_start: Option<bool>,
    /// New [`Parameters::x_vcpu_dirty_limit_vcpus`] (`[]`: every vCPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) x_vcpu_dirty_limit_vcpus: Option<VcpuSet>,
}

impl SetParameters {
    /// Puts the members given in `params`, the others left as they are.
    pub(crate) fn apply_to(self, params: &mut Parameters) {
        macro_rules! given {
            ($($member:ident),*) => {
                $(if let Some(v) = self.$member {
                    params.$member = v;
                })*
            };
        }
        given!(
            max_bandwidth,
            downtime_limit,
            x_max_rounds,
            x_check_ram,
            cpu_throttle_initial,
            cpu_throttle_increment,
            max_cpu_throttle,
            cpu_throttle_tailslow,
            x_cpu_throttle_at_start,
            x_cpu_throttle_vcpus,
            vcpu_dirty_limit,
            x_vcpu_dirty_limit_period,
            x_vcpu_dirty_limit_at_start,
            x_vcpu_dirty_limit_vcpus
        );
    }
}

/// A set of vCPUs by `cpu-index` (`x-cpu-throttle-vcpus`); on the wire a
/// list of indices, ascending. Fixed-size (a VM has at most
/// [`VcpuSet::CAPACITY`] vCPUs), so that [`Parameters`] stays `Copy`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Vec<usize>", into = "Vec<usize>")]
pub struct VcpuSet([u64; VcpuSet::WORDS]);

impl VcpuSet {
    const WORDS: usize = 4;

    /// One more than the highest index a set holds: kvmscope's most vCPUs.
    pub const CAPACITY: usize = 64 * VcpuSet::WORDS;

    /// Whether the set holds no vCPU.
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|&w| w == 0)
    }

    /// Whether vCPU `i` is in the set.
    pub fn contains(&self, i: usize) -> bool {
        i < Self::CAPACITY && self.0[i / 64] & (1 << (i % 64)) != 0
    }

    /// The indices in the set, ascending.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        (0..Self::CAPACITY).filter(|&i| self.contains(i))
    }
}

const _: () = assert!(VcpuSet::CAPACITY as u64 >= crate::abi::MAX_VCPUS);

impl TryFrom<Vec<usize>> for VcpuSet {
    type Error = String;

    fn try_from(indices: Vec<usize>) -> Result<VcpuSet, String> {
        let mut set = VcpuSet::default();
        for i in indices {
            if i >= Self::CAPACITY {
                return Err(format!(
                    "expects cpu-indices below {} (the most vCPUs a VM has), not {i}",
                    Self::CAPACITY
                ));
            }
            set.0[i / 64] |= 1 << (i % 64);
        }
        Ok(set)
    }
}

/// In words: "every vCPU" for the empty set (what it means to
/// auto-converge), "vCPU 0", "vCPUs 0, 2".
impl std::fmt::Display for VcpuSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let indices: Vec<String> = self.iter().map(|i| i.to_string()).collect();
        match indices.len() {
            0 => f.write_str("every vCPU"),
            1 => write!(f, "vCPU {}", indices[0]),
            _ => write!(f, "vCPUs {}", indices.join(", ")),
        }
    }
}

impl From<VcpuSet> for Vec<usize> {
    fn from(set: VcpuSet) -> Vec<usize> {
        set.iter().collect()
    }
}

/// A migration capability (QEMU's `MigrationCapability`, the ones kvmscope knows).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, strum::EnumIter)]
#[serde(rename_all = "kebab-case")]
pub enum Capability {
    /// Throttle every vCPU in steps while the guest dirties memory faster
    /// than half the rate it is sent (`cpu-throttle-*` parameters).
    AutoConverge,
    /// Limit each vCPU's dirty rate to `vcpu-dirty-limit` through the dirty
    /// ring once the guest dirties too fast (QEMU 8.1+); a ring VM only, not
    /// with auto-converge.
    DirtyLimit,
    /// Send the `MIGRATION` and `MIGRATION_PASS` events. Always on here
    /// (QEMU's is off until set): the host exporter learns from them that a
    /// VM migrated away. Setting it on is taken (libvirt does); off is refused.
    Events,
    // QEMU's others (7.2 to 9.x), which kvmscope does not implement: off is
    // taken (they are), on is refused naming the capability, and
    // `query-migrate-capabilities` does not list them (libvirt sets only
    // what it lists). A script that turns them off works unchanged.
    /// QEMU's `xbzrle`: not implemented ([`Capability::implemented`]).
    Xbzrle,
    /// QEMU's `rdma-pin-all`: not implemented ([`Capability::implemented`]).
    RdmaPinAll,
    /// QEMU's `zero-blocks`: not implemented ([`Capability::implemented`]).
    ZeroBlocks,
    /// QEMU's `compress`: not implemented ([`Capability::implemented`]).
    Compress,
    /// QEMU's `postcopy-ram`: not implemented ([`Capability::implemented`]).
    PostcopyRam,
    /// QEMU's `x-colo`: not implemented ([`Capability::implemented`]).
    XColo,
    /// QEMU's `release-ram`: not implemented ([`Capability::implemented`]).
    ReleaseRam,
    /// QEMU's `block`: not implemented ([`Capability::implemented`]).
    Block,
    /// QEMU's `return-path`: not implemented ([`Capability::implemented`]).
    ReturnPath,
    /// QEMU's `pause-before-switchover`: not implemented ([`Capability::implemented`]).
    PauseBeforeSwitchover,
    /// QEMU's `multifd`: not implemented ([`Capability::implemented`]).
    Multifd,
    /// QEMU's `dirty-bitmaps`: not implemented ([`Capability::implemented`]).
    DirtyBitmaps,
    /// QEMU's `postcopy-blocktime`: not implemented ([`Capability::implemented`]).
    PostcopyBlocktime,
    /// QEMU's `late-block-activate`: not implemented ([`Capability::implemented`]).
    LateBlockActivate,
    /// QEMU's `x-ignore-shared`: not implemented ([`Capability::implemented`]).
    XIgnoreShared,
    /// QEMU's `validate-uuid`: not implemented ([`Capability::implemented`]).
    ValidateUuid,
    /// QEMU's `background-snapshot`: not implemented ([`Capability::implemented`]).
    BackgroundSnapshot,
    /// QEMU's `zero-copy-send`: not implemented ([`Capability::implemented`]).
    ZeroCopySend,
    /// QEMU's `postcopy-preempt`: not implemented ([`Capability::implemented`]).
    PostcopyPreempt,
    /// QEMU's `switchover-ack`: not implemented ([`Capability::implemented`]).
    SwitchoverAck,
    /// QEMU's `mapped-ram`: not implemented ([`Capability::implemented`]).
    MappedRam,
}

impl Capability {
    /// Whether kvmscope implements it (`query-migrate-capabilities` lists
    /// these); QEMU's others are names only.
    pub fn implemented(self) -> bool {
        matches!(
            self,
            Capability::AutoConverge | Capability::DirtyLimit | Capability::Events
        )
    }

    /// The name on the wire.
    pub fn name(self) -> String {
        serde_json::to_value(self)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default()
    }
}

/// QEMU's `MigrationCapabilityStatus`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CapabilityStatus {
    /// Which.
    pub capability: Capability,
    /// On or off.
    pub state: bool,
}

/// `migrate-set-capabilities`' arguments.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetCapabilities {
    /// The capabilities to change.
    pub capabilities: Vec<CapabilityStatus>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ram_stats_carry_every_member_qemu_7_2_requires() {
        let ram = serde_json::to_value(RamStats::default()).unwrap();
        // qapi/migration.json's MigrationStats in QEMU 7.2: none optional.
        for member in [
            "transferred",
            "remaining",
            "total",
            "duplicate",
            "skipped",
            "normal",
            "normal-bytes",
            "dirty-pages-rate",
            "mbps",
            "dirty-sync-count",
            "postcopy-requests",
            "page-size",
            "multifd-bytes",
            "pages-per-second",
            "precopy-bytes",
            "downtime-bytes",
            "postcopy-bytes",
            "dirty-sync-missed-zero-copy",
        ] {
            assert!(ram.get(member).is_some(), "{member} missing: {ram}");
        }
    }
}
