//! One stats file of the VMM's own, laid out exactly as KVM's binary stats
//! (header, id, descriptors, data; ../shared/KVM_STATS_ABI.md): a sealed
//! memfd whose data block the VMM keeps current in place, one atomic store
//! per value, and hands out read-only, as KVM hands out its stats fds.

use std::fs::File;
use std::io::Write as _;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};

use kvm_stats::builder::StatsFileBuilder;
use kvm_stats::{Base, StatType, Unit};
use rustix::fs::{MemfdFlags, OFlags, SealFlags};
use vm_memory::mmap::MmapRegion;
use vm_memory::{FileOffset, VolatileMemory};

/// What `/proc/self/fd/N` names one of these files: readers (the exporter)
/// recognise them by it, as they recognise KVM's by `anon_inode:kvm-vm-stats`.
pub const MEMFD_NAME: &str = "kvmscope-stats";

/// One stat of a file: its name (KVM's style: lower case, `_ns` for
/// nanoseconds), type, unit and exponent.
#[derive(Debug, Clone)]
pub struct Def {
    /// The descriptor's name.
    pub name: std::borrow::Cow<'static, str>,
    /// Cumulative (only grows), instant or peak.
    pub kind: StatType,
    /// Its unit.
    pub unit: Unit,
    /// Its power of ten (-9 for nanoseconds).
    pub exponent: i16,
}

/// Why a stats file could not be made.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// memfd_create, write, seal or reopen failed.
    #[error("{0}")]
    Io(&'static str, #[source] std::io::Error),
    /// The data block could not be mapped.
    #[error("mapping the stats file")]
    Map(#[source] vm_memory::mmap::MmapRegionError),
}

/// A stats file and its data block, mapped for the VMM to write.
pub struct StatsFile {
    file: File,
    map: MmapRegion,
    /// Each stat's value's offset in the mapping (the data block's start
    /// plus the descriptor's offset).
    offsets: Vec<usize>,
}

impl std::fmt::Debug for StatsFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatsFile")
            .field("fd", &self.file.as_raw_fd())
            .field("stats", &self.offsets.len())
            .finish()
    }
}

impl StatsFile {
    /// A file with id `id` and one single-value stat per `defs`, all 0.
    ///
    /// # Errors
    /// The memfd cannot be made, written, sealed or mapped.
    pub fn new(id: &str, defs: &[Def]) -> Result<StatsFile, Error> {
        let builder = defs.iter().fold(StatsFileBuilder::new(id), |b, d| {
            let base = if d.unit == Unit::Bytes {
                Base::Pow2
            } else {
                Base::Pow10
            };
            b.stat(&d.name, d.kind, d.unit, base, d.exponent, &[0])
        });
        let header = builder.layout();
        let bytes = builder.build();
        let data = header.data_offset as usize;
        let offsets = builder
            .stats
            .iter()
            .map(|(d, _)| data + d.offset as usize)
            .collect();
        let fd =
            rustix::fs::memfd_create(MEMFD_NAME, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
                .map_err(|e| Error::Io("memfd_create", e.into()))?;
        let mut file = File::from(fd);
        file.write_all(&bytes)
            .map_err(|e| Error::Io("writing the stats file", e))?;
        // Its size is fixed for good: a reader's pread never meets a shorter file.
        rustix::fs::fcntl_add_seals(&file, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
            .map_err(|e| Error::Io("sealing the stats file", e.into()))?;
        let mapped = file
            .try_clone()
            .map_err(|e| Error::Io("duplicating the stats file", e))?;
        let map =
            MmapRegion::from_file(FileOffset::new(mapped, 0), bytes.len()).map_err(Error::Map)?;
        Ok(StatsFile { file, map, offsets })
    }

    /// Stores stat `index`'s value: one atomic store, as KVM updates its own
    /// (a reader may see values from slightly different instants).
    pub fn set(&self, index: usize, value: u64) {
        if let Some(cell) = self.cell(index) {
            cell.store(value, Ordering::Release);
        }
    }

    /// Stat `index`'s value now.
    pub fn get(&self, index: usize) -> u64 {
        self.cell(index).map_or(0, |c| c.load(Ordering::Acquire))
    }

    fn cell(&self, index: usize) -> Option<&AtomicU64> {
        let offset = *self.offsets.get(index)?;
        self.map.get_atomic_ref::<AtomicU64>(offset).ok()
    }

    /// A new read-only fd of the file (its own open file description, as a
    /// fresh KVM stats fd is): what `get-stats-fd` hands out.
    ///
    /// # Errors
    /// Reopening through `/proc/self/fd` failed.
    pub fn reader(&self) -> Result<File, Error> {
        let path = format!("/proc/self/fd/{}", self.file.as_raw_fd());
        rustix::fs::open(
            path.as_str(),
            OFlags::RDONLY | OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map(File::from)
        .map_err(|e| Error::Io("reopening the stats file read-only", e.into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvm_stats::StatsFd;

    use std::borrow::Cow;

    const DEFS: [Def; 3] = [
        Def {
            name: Cow::Borrowed("exits_io"),
            kind: StatType::Cumulative,
            unit: Unit::None,
            exponent: 0,
        },
        Def {
            name: Cow::Borrowed("guest_stall_ns"),
            kind: StatType::Cumulative,
            unit: Unit::Seconds,
            exponent: -9,
        },
        Def {
            name: Cow::Borrowed("readiness_mapped"),
            kind: StatType::Instant,
            unit: Unit::Bytes,
            exponent: 0,
        },
    ];

    #[test]
    fn a_kvm_stats_reader_reads_it_strictly_and_sees_each_store() {
        let f = StatsFile::new("kvmscope-7/vcpu-1", &DEFS).unwrap();
        let fd = StatsFd::new_strict(f.reader().unwrap()).unwrap();
        assert_eq!(fd.schema().id(), "kvmscope-7/vcpu-1");
        let names: Vec<&str> = fd.schema().iter().map(|(_, d)| d.name.as_str()).collect();
        assert_eq!(names, ["exits_io", "guest_stall_ns", "readiness_mapped"]);
        let mut sample = fd.new_sample();
        f.set(0, 41);
        f.set(1, 2_500);
        f.set(2, 64 << 20);
        fd.read_sample(&mut sample).unwrap();
        let value =
            |sample: &kvm_stats::Sample, name| sample.values(fd.schema().find(name).unwrap())[0];
        assert_eq!(value(&sample, "exits_io"), 41);
        assert_eq!(value(&sample, "guest_stall_ns"), 2_500);
        assert_eq!(value(&sample, "readiness_mapped"), 64 << 20);
        f.set(0, 42);
        fd.read_sample(&mut sample).unwrap();
        assert_eq!(value(&sample, "exits_io"), 42);
        assert_eq!(f.get(0), 42);
    }

    #[test]
    fn what_it_hands_out_is_read_only_and_cannot_change_size() {
        let f = StatsFile::new("kvmscope-7", &DEFS).unwrap();
        let mut r = f.reader().unwrap();
        let mode = rustix::fs::fcntl_getfl(&r).unwrap();
        assert_eq!(mode & OFlags::RWMODE, OFlags::RDONLY);
        assert!(r.write_all(b"x").is_err());
        let link = std::fs::read_link(format!("/proc/self/fd/{}", r.as_raw_fd())).unwrap();
        assert!(
            link.to_string_lossy()
                .starts_with(&format!("/memfd:{MEMFD_NAME}")),
            "{link:?}"
        );
        assert!(f.file.set_len(1).is_err(), "sealed against shrinking");
    }
}
