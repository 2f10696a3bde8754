//! The VMM's own statistics, in KVM's binary stats format: one file for the
//! VM and one per vCPU (`file`), with what KVM cannot know: our exit counters
//! per reason, the guest's stall to dirty tracking, a migration's progress,
//! and the latest readiness figures and prediction (docs/PROTOCOL.md,
//! "The kvmscope stats provider"). Any KVM stats reader reads them unchanged;
//! `get-stats-fd` with `"provider": "kvmscope"` hands them out read-only.
//!
//! Each value has one writer (the control thread's publisher, every
//! [`PUBLISH_PERIOD`]), and is stored atomically.

pub mod file;
pub mod view;

use std::borrow::Cow;
use std::time::Duration;

use kvm_stats::{StatType, Unit};
use strum::IntoEnumIterator;

use crate::exits::Reason;
pub use file::{Def, Error, StatsFile, MEMFD_NAME};

/// How often the publisher refreshes the files.
pub const PUBLISH_PERIOD: Duration = Duration::from_millis(100);

/// The VM file's stats, in file order. Times are nanoseconds; `*_at_ns` are
/// wall-clock (`CLOCK_REALTIME`) instants, 0 for never.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, strum::EnumIter, strum::IntoStaticStr, strum::EnumMessage,
)]
#[strum(serialize_all = "snake_case")]
pub enum VmStat {
    /// When the publisher last wrote the files (a wall-clock instant: Unix
    /// time).
    PublishedAtNs,
    /// vCPU time the guest lost to dirty tracking, all vCPUs, over every
    /// window and migration that has ended.
    GuestStallNs,
    /// The migration's status: 0 none, 1 setup, 2 active, 3 device,
    /// 4 completed, 5 failed, 6 cancelled.
    MigrationStatus,
    /// `query-migrate`'s `ram.transferred` (bytes).
    MigrationTransferred,
    /// `ram.remaining`.
    MigrationRemaining,
    /// `ram.total`.
    MigrationTotal,
    /// `ram.dirty-sync-count`.
    MigrationDirtySyncs,
    /// `ram.dirty-pages-rate` (pages per second).
    MigrationDirtyPagesRate,
    /// When the readiness figures were measured (a wall-clock instant: Unix
    /// time); 0: never.
    ReadinessAtNs,
    /// The dirty-rate window they were measured over.
    ReadinessWindowNs,
    /// Guest memory the KVM MMU mapped (bytes).
    ReadinessMapped,
    /// The estimate of non-zero RAM the prediction used (bytes).
    ReadinessNonzero,
    /// Distinct bytes dirtied in the window over its length (QEMU's
    /// calc-dirty-rate: a working set rewritten faster than the window reads
    /// as the set over the window's length).
    ReadinessDirtyBytesPerSecond,
    /// The guest's stall during the window.
    ReadinessGuestStallNs,
    /// 1 when the predicted migration converges.
    PredictionConverges,
    /// The predicted migration's total time (u64::MAX ns, 18446744073.7 s:
    /// it never ends).
    PredictionTotalTimeNs,
    /// Its predicted downtime (u64::MAX ns, 18446744073.7 s: it never stops).
    PredictionDowntimeNs,
    /// Bytes it would send (u64::MAX, 1.8e19: it never ends, so never stops
    /// sending).
    PredictionTransferred,
    /// The guest stall it would cost (u64::MAX ns, 18446744073.7 s: it
    /// never ends).
    PredictionGuestStallNs,
    /// The link bandwidth it assumed (bytes per second; 0: unlimited).
    PredictionBandwidthBytesPerSecond,
    /// The smallest auto-converge throttle, %, that makes it converge: 0 when
    /// none is needed, 100 when none would.
    PredictionThrottlePercentage,
    /// Measurements in a row, this one included, whose prediction had this
    /// verdict: 1 for the first, or when the verdict just changed (a guest
    /// whose recent measurements disagree changes what it does faster than
    /// they come, and its verdict is the moment's, not the migration's).
    PredictionVerdictStreak,
    /// The VM's run state, as `query-status` names it: 0 prelaunch,
    /// 1 running, 2 paused, 3 inmigrate (a migration's destination whose
    /// guest has not arrived: its RAM is given, its guest is not there
    /// yet), 4 postmigrate (the guest left), 5 internal-error, 6 shutdown.
    RunState,
}

impl VmStat {
    fn def(self) -> Def {
        use VmStat::*;
        let (kind, unit, exponent) = match self {
            GuestStallNs => (StatType::Cumulative, Unit::Seconds, -9),
            PublishedAtNs
            | ReadinessAtNs
            | ReadinessWindowNs
            | ReadinessGuestStallNs
            | PredictionTotalTimeNs
            | PredictionDowntimeNs
            | PredictionGuestStallNs => (StatType::Instant, Unit::Seconds, -9),
            MigrationTransferred
            | MigrationRemaining
            | MigrationTotal
            | ReadinessMapped
            | ReadinessNonzero
            | PredictionTransferred => (StatType::Instant, Unit::Bytes, 0),
            PredictionConverges => (StatType::Instant, Unit::Boolean, 0),
            MigrationStatus
            | MigrationDirtySyncs
            | MigrationDirtyPagesRate
            | ReadinessDirtyBytesPerSecond
            | PredictionBandwidthBytesPerSecond
            | PredictionThrottlePercentage
            | PredictionVerdictStreak
            | RunState => (StatType::Instant, Unit::None, 0),
        };
        Def {
            name: Cow::Borrowed(self.into()),
            kind,
            unit,
            exponent,
        }
    }
}

/// A vCPU file's stats after the exit counters (`exits_<reason>`, one per
/// [`Reason`], first).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, strum::EnumIter, strum::IntoStaticStr, strum::EnumMessage,
)]
#[strum(serialize_all = "snake_case")]
pub enum VcpuStat {
    /// vCPU time this vCPU's guest lost to dirty tracking.
    GuestStallNs,
    /// Time its thread spent harvesting its full dirty ring.
    DirtyRingFullNs,
    /// Time it slept for auto-converge's throttle or its dirty limit (its
    /// guest did not run).
    ThrottledNs,
    /// The throttle in force, % (0: none).
    ThrottlePercentage,
    /// Its dirty limit in force, bytes/s (0: none).
    DirtyLimitBytesPerSecond,
    /// Its dirty rate over the last period of its limit, bytes/s (0 unlimited).
    DirtyLimitRateBytesPerSecond,
    /// The guest's own count of the work it has done (guest ABI `progress`:
    /// pages touched or read, page writes).
    GuestProgress,
    /// That count's rate over the last second, units/s (0 until known).
    GuestProgressPerSecond,
}

impl VcpuStat {
    fn def(self) -> Def {
        let (kind, unit, exponent) = match self {
            VcpuStat::ThrottlePercentage
            | VcpuStat::DirtyLimitBytesPerSecond
            | VcpuStat::DirtyLimitRateBytesPerSecond
            | VcpuStat::GuestProgressPerSecond => (StatType::Instant, Unit::None, 0),
            VcpuStat::GuestProgress => (StatType::Cumulative, Unit::None, 0),
            _ => (StatType::Cumulative, Unit::Seconds, -9),
        };
        Def {
            name: Cow::Borrowed(self.into()),
            kind,
            unit,
            exponent,
        }
    }
}

/// The VMM's stats files: the VM's and each vCPU's.
#[derive(Debug)]
pub struct VmmStats {
    vm: StatsFile,
    vcpus: Vec<StatsFile>,
}

impl VmmStats {
    /// Files for a VM of `vcpus` vCPUs in process `pid`, every value 0. Ids
    /// follow KVM's: `kvmscope-<pid>`, `kvmscope-<pid>/vcpu-<index>`.
    ///
    /// # Errors
    /// A file cannot be made.
    pub fn new(pid: u32, vcpus: usize) -> Result<VmmStats, Error> {
        let vm_defs: Vec<Def> = VmStat::iter().map(VmStat::def).collect();
        let vm = StatsFile::new(&format!("kvmscope-{pid}"), &vm_defs)?;
        let vcpu_defs = vcpu_defs();
        let vcpus = (0..vcpus)
            .map(|i| StatsFile::new(&format!("kvmscope-{pid}/vcpu-{i}"), &vcpu_defs))
            .collect::<Result<_, _>>()?;
        Ok(VmmStats { vm, vcpus })
    }

    /// Sets a VM stat.
    pub fn set_vm(&self, stat: VmStat, value: u64) {
        self.vm.set(stat as usize, value);
    }

    /// A VM stat's value now.
    pub fn vm_value(&self, stat: VmStat) -> u64 {
        self.vm.get(stat as usize)
    }

    /// Sets vCPU `index`'s count of exits for `reason` (the counters come
    /// first, in `Reason::ALL` order, which is the enum's: a reason's
    /// discriminant is its place).
    pub fn set_exits(&self, index: usize, reason: Reason, value: u64) {
        if let Some(f) = self.vcpus.get(index) {
            f.set(reason as usize, value);
        }
    }

    /// Sets one of vCPU `index`'s own stats.
    pub fn set_vcpu(&self, index: usize, stat: VcpuStat, value: u64) {
        if let Some(f) = self.vcpus.get(index) {
            f.set(Reason::ALL.len() + stat as usize, value);
        }
    }

    /// The VM file.
    pub fn vm(&self) -> &StatsFile {
        &self.vm
    }

    /// Each vCPU's file, by index.
    pub fn vcpus(&self) -> &[StatsFile] {
        &self.vcpus
    }
}

/// What stat `name` of the VMM's own files means (a vCPU file's with
/// `vcpu`, else the VM file's), from its definition's documentation, in one
/// line: for a page's `# HELP`. `None` for a name this build does not
/// define (a file of another build).
pub fn meaning(name: &str, vcpu: bool) -> Option<&'static str> {
    // Made once: a page asks for each family's meaning at every scrape.
    static MEANINGS: std::sync::OnceLock<Vec<(String, bool, String)>> = std::sync::OnceLock::new();
    let table = MEANINGS.get_or_init(|| {
        use strum::EnumMessage;
        let line = |doc: &str| doc.replace('`', "").split_whitespace().collect::<Vec<_>>().join(" ");
        let exits = Reason::ALL.iter().map(|r| {
            let reason = r.label();
            (
                format!("exits_{reason}"),
                true,
                format!("exits that reached the VMM for {reason}, by its own count (KVM's stats miss some on some backends)"),
            )
        });
        let vm = VmStat::iter().map(|s| {
            (<&str>::from(s).to_string(), false, line(s.get_documentation().unwrap_or_default()))
        });
        let vcpus = VcpuStat::iter().map(|s| {
            (<&str>::from(s).to_string(), true, line(s.get_documentation().unwrap_or_default()))
        });
        exits.chain(vm).chain(vcpus).collect()
    });
    table
        .iter()
        .find(|(n, v, _)| *v == vcpu && n == name)
        .map(|(_, _, m)| m.as_str())
        .filter(|m| !m.is_empty())
}

/// Whether a stat of the VM file is a readiness figure (`readiness_*`,
/// `prediction_*`): all 0 until the VMM's first measurement, when readers
/// that show the file (the exporter's page, `kvmscope stats`' table) leave
/// them out rather than show zeros that read as figures.
pub fn is_readiness_figure(name: &str) -> bool {
    name.starts_with("readiness_") || name.starts_with("prediction_")
}

/// Whether a sample of the VM file holds readiness figures: its
/// `readiness_at_ns` is set (a file without that stat, an older VMM's,
/// never does).
pub fn measured(schema: &kvm_stats::Schema, sample: &kvm_stats::Sample) -> bool {
    let at: &str = VmStat::ReadinessAtNs.into();
    schema
        .find(at)
        .is_some_and(|id| sample.values(id).first().is_some_and(|&v| measured_at(v)))
}

/// Whether a VM file whose `readiness_at_ns` reads `at` holds readiness
/// figures ([`measured`], from the value alone).
pub fn measured_at(at: u64) -> bool {
    at != 0
}

/// How `kvmscope stats` and `watch` show a value of the VMM's own files
/// where its unit cannot say what it is: a wall-clock instant (`*_at_ns`,
/// nanoseconds since the epoch, which the format calls seconds) as its UTC
/// date and age, `never` for 0; a duration of `u64::MAX` ns (a prediction
/// that never ends) as `never`; a rate (`*_bytes_per_second`, which the
/// format has no unit for) in bytes per second, and the prediction's link
/// of 0 as `unlimited`; `None` for every other stat (shown by its unit).
pub fn value_text(d: &kvm_stats::Descriptor, raw: u64) -> Option<String> {
    let name = d.name.as_str();
    if name.ends_with("_at_ns") {
        if raw == 0 {
            return Some("never".into());
        }
        return instant_text_at(raw, std::time::SystemTime::now());
    }
    if name.ends_with("_ns") && raw == u64::MAX {
        return Some("never".into());
    }
    if raw == u64::MAX && name == <&str>::from(VmStat::PredictionTransferred) {
        return Some("never ends".into());
    }
    if name.ends_with("_bytes_per_second") {
        if raw == 0 && name == <&str>::from(VmStat::PredictionBandwidthBytesPerSecond) {
            return Some("unlimited".into());
        }
        return Some(format!("{}/s", crate::units::format_bytes(raw)));
    }
    None
}

/// [`value_text`] of a nonzero instant as seen at `now`.
fn instant_text_at(raw: u64, now: std::time::SystemTime) -> Option<String> {
    let at = jiff::Timestamp::from_nanosecond(i128::from(raw)).ok()?;
    let then = std::time::UNIX_EPOCH + Duration::from_nanos(raw);
    let age = match now.duration_since(then) {
        Ok(age) => format!("{:.1} s ago", age.as_secs_f64()),
        Err(ahead) => format!("{:.1} s from now", ahead.duration().as_secs_f64()),
    };
    Some(format!("{at:.3} ({age})"))
}

/// A vCPU file's stats: `exits_<reason>` per [`Reason`], then [`VcpuStat`]s.
fn vcpu_defs() -> Vec<Def> {
    let exits = Reason::ALL.iter().map(|r| Def {
        name: Cow::Owned(format!("exits_{}", r.label())),
        kind: StatType::Cumulative,
        unit: Unit::None,
        exponent: 0,
    });
    let own = VcpuStat::iter().map(VcpuStat::def);
    exits.chain(own).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvm_stats::StatsFd;

    /// An instant stat's descriptor, in `unit` times 10^`exponent`.
    fn instant(name: &str, unit: Unit, exponent: i16) -> kvm_stats::Descriptor {
        kvm_stats::Descriptor {
            name: name.into(),
            flags: 0,
            kind: StatType::Instant,
            unit,
            base: kvm_stats::Base::Pow10,
            exponent,
            size: 1,
            offset: 0,
            bucket_size: 0,
        }
    }

    #[test]
    fn every_own_stat_has_a_meaning_in_one_line() {
        let stats = VmmStats::new(1, 1).unwrap();
        for (file, vcpu) in [(stats.vm(), false), (&stats.vcpus()[0], true)] {
            let fd = StatsFd::new(file.reader().unwrap()).unwrap();
            for (_, d) in fd.schema().iter() {
                let m =
                    meaning(&d.name, vcpu).unwrap_or_else(|| panic!("{} has no meaning", d.name));
                assert!(
                    !m.is_empty() && !m.contains(['\n', '`']),
                    "{}: {m:?}",
                    d.name
                );
            }
        }
        assert_eq!(
            meaning("prediction_total_time_ns", false),
            Some("The predicted migration's total time (u64::MAX ns, 18446744073.7 s: it never ends).")
        );
        // One name in both files: each file's own meaning.
        assert_ne!(
            meaning("guest_stall_ns", false),
            meaning("guest_stall_ns", true)
        );
        assert_eq!(meaning("no_such_stat", true), None);
    }

    #[test]
    fn an_instant_shows_as_its_utc_date_and_age_and_zero_as_never() {
        let d = |name: &str| instant(name, Unit::Seconds, -9);
        assert_eq!(
            value_text(&d("readiness_at_ns"), 0).as_deref(),
            Some("never")
        );
        assert_eq!(value_text(&d("guest_stall_ns"), 5), None, "a duration");
        // 2026-11-27T16:44:36.019Z, seen 1.5 s later and 2 s earlier.
        let raw = 1_795_797_876_019_400_000;
        let at = std::time::UNIX_EPOCH + Duration::from_nanos(raw);
        let later = instant_text_at(raw, at + Duration::from_millis(1500));
        assert_eq!(
            later.as_deref(),
            Some("2026-11-27T16:44:36.019Z (1.5 s ago)")
        );
        let earlier = instant_text_at(raw, at - Duration::from_secs(2));
        assert_eq!(
            earlier.as_deref(),
            Some("2026-11-27T16:44:36.019Z (2.0 s from now)")
        );
        // The latest a u64 of nanoseconds reaches, in 2554, is a date too.
        assert!(value_text(&d("published_at_ns"), u64::MAX)
            .unwrap()
            .starts_with("2554-"));
    }

    #[test]
    fn a_prediction_that_never_ends_and_rates_read_as_what_they_are() {
        let text = |name: &str, raw: u64| value_text(&instant(name, Unit::None, 0), raw);
        assert_eq!(
            text("prediction_total_time_ns", u64::MAX).as_deref(),
            Some("never")
        );
        assert_eq!(
            text("prediction_total_time_ns", 7),
            None,
            "a duration: its unit says"
        );
        // Bytes it would send: never ending, not 16 EiB.
        assert_eq!(
            text("prediction_transferred", u64::MAX).as_deref(),
            Some("never ends")
        );
        assert_eq!(text("prediction_transferred", 4096), None);
        assert_eq!(
            text("readiness_dirty_bytes_per_second", 5 << 20).as_deref(),
            Some("5 MiB/s")
        );
        assert_eq!(
            text("prediction_bandwidth_bytes_per_second", 0).as_deref(),
            Some("unlimited")
        );
        assert_eq!(
            text("dirty_limit_bytes_per_second", 0).as_deref(),
            Some("0 B/s")
        );
        assert_eq!(text("exits_hlt", 3), None);
    }

    #[test]
    fn every_file_reads_strictly_and_each_setter_lands_on_its_stat() {
        let s = VmmStats::new(42, 2).unwrap();
        let vm = StatsFd::new_strict(s.vm().reader().unwrap()).unwrap();
        assert_eq!(vm.schema().id(), "kvmscope-42");
        assert!(vm.schema().find("prediction_total_time_ns").is_some());
        s.set_vm(VmStat::PredictionDowntimeNs, 123);
        let mut sample = vm.new_sample();
        vm.read_sample(&mut sample).unwrap();
        let id = vm.schema().find("prediction_downtime_ns").unwrap();
        assert_eq!(sample.values(id), [123]);
        let vcpu1 = StatsFd::new_strict(s.vcpus()[1].reader().unwrap()).unwrap();
        assert_eq!(vcpu1.schema().id(), "kvmscope-42/vcpu-1");
        assert!(
            Reason::ALL
                .iter()
                .enumerate()
                .all(|(i, r)| *r as usize == i),
            "a reason's discriminant is its place in Reason::ALL"
        );
        s.set_exits(1, Reason::ALL[0], 7);
        s.set_vcpu(1, VcpuStat::DirtyRingFullNs, 9);
        let mut sample = vcpu1.new_sample();
        vcpu1.read_sample(&mut sample).unwrap();
        let exits = vcpu1
            .schema()
            .find(&format!("exits_{}", Reason::ALL[0].label()))
            .unwrap();
        assert_eq!(sample.values(exits), [7]);
        let ring = vcpu1.schema().find("dirty_ring_full_ns").unwrap();
        assert_eq!(sample.values(ring), [9]);
    }
}
