//! A reader's view of a VMM's own stats file received over a socket: the
//! file mapped read-only, its data block read with one load per value and
//! no syscall. A host exporter reads hundreds of these per scrape, and a
//! `pread` of a memfd costs more than one of KVM's stats fds (page cache
//! lookup, access time); the file never changes size, so a mapping reads
//! what `pread` would.
//!
//! Only a file sealed against shrinking is mapped: a peer that could
//! truncate it would make every later load fault (`SIGBUS`) in the reader.
//! Any other file is read with `pread`, as any KVM stats file is.

use std::fs::File;
use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use kvm_stats::{ReadAt, Schema};
use rustix::fs::SealFlags;
use rustix::mm::{MapFlags, ProtFlags};

/// Why a stats file is read with `pread` rather than through a mapping.
#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    /// Its seals could not be read (not a memfd: KVM's own stats fds).
    #[error("reading its seals")]
    Seals(#[source] io::Error),
    /// Its owner could still shrink it under the mapping.
    #[error("it is not sealed against shrinking")]
    NotSealed,
    /// The data block is not where a mapping can load whole values.
    #[error("its data block at {0} is not 8-byte aligned")]
    Misaligned(u32),
    /// The file is shorter than its header says.
    #[error("it is {size} bytes, its data block ends at {end}")]
    Short {
        /// The file's size.
        size: u64,
        /// Where its data block ends.
        end: u64,
    },
    /// Its size could not be read.
    #[error("reading its size")]
    Size(#[source] io::Error),
    /// The mapping failed.
    #[error("mapping it read-only")]
    Map(#[source] io::Error),
}

/// A stats file mapped read-only, from its start to the end of its data
/// block. The mapping holds no fd: the exporter's fd budget counts the
/// file once.
pub struct View {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is read-only and only read with atomic loads; it is
// unmapped once, on drop, by its only owner.
unsafe impl Send for View {}
// SAFETY: as above: shared references only load.
unsafe impl Sync for View {}

impl std::fmt::Debug for View {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("View").field("len", &self.len).finish()
    }
}

impl View {
    /// Maps `file`, whose schema is `schema`, if it is sealed against
    /// shrinking and long enough for its data block.
    ///
    /// # Errors
    /// Why it is not mapped; the caller reads it with `pread` instead.
    pub fn of(file: &File, schema: &Schema) -> Result<View, ViewError> {
        let seals = rustix::fs::fcntl_get_seals(file).map_err(|e| ViewError::Seals(e.into()))?;
        if !seals.contains(SealFlags::SHRINK) {
            return Err(ViewError::NotSealed);
        }
        let offset = schema.header().data_offset;
        if offset % 8 != 0 {
            return Err(ViewError::Misaligned(offset));
        }
        let end = u64::from(offset) + schema.data_size();
        let size = file.metadata().map_err(ViewError::Size)?.len();
        if size < end {
            return Err(ViewError::Short { size, end });
        }
        let len = usize::try_from(end).map_err(|_| ViewError::Short { size, end })?;
        if len == 0 {
            return Err(ViewError::Short { size, end });
        }
        // SAFETY: a new shared read-only mapping at an address the kernel
        // picks, so nothing already mapped is touched; the file is sealed
        // against shrinking and at least `len` long, so every byte of the
        // mapping stays backed while it is mapped.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ,
                MapFlags::SHARED,
                file,
                0,
            )
        }
        .map_err(|e| ViewError::Map(e.into()))?;
        let ptr = NonNull::new(ptr.cast::<u8>())
            .ok_or_else(|| ViewError::Map(io::Error::other("mmap returned a null address")))?;
        Ok(View { ptr, len })
    }

    /// The 8-byte value at `offset`, loaded atomically; `None` past the
    /// mapping or off an 8-byte boundary.
    fn load(&self, offset: usize) -> Option<u64> {
        if offset % 8 != 0 || offset.checked_add(8)? > self.len {
            return None;
        }
        // SAFETY: `offset` is 8-aligned and the 8 bytes lie inside the
        // mapping (whose start is page-aligned), which lives as long as
        // `self`; the writer (the VMM) stores these words only atomically,
        // and this side only loads, atomically.
        let cell = unsafe { AtomicU64::from_ptr(self.ptr.as_ptr().add(offset).cast::<u64>()) };
        Some(cell.load(Ordering::Acquire))
    }

    /// Asks the CPU to start loading the data block of the file (whose
    /// schema is `schema`, as given to [`View::of`]) into its cache, without
    /// waiting: a reader of hundreds of files asks for them all, then reads
    /// them, and the misses (a cache and a TLB miss per file, each file a
    /// page of its own) overlap rather than come one after another.
    pub fn prefetch(&self, schema: &Schema) {
        for at in self.data_lines(schema) {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `at` lies inside the mapping (`data_lines`); a
            // prefetch is a hint that reads no value and never faults.
            unsafe {
                use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
                _mm_prefetch::<_MM_HINT_T0>(self.ptr.as_ptr().add(at).cast::<i8>());
            }
            #[cfg(not(target_arch = "x86_64"))]
            let _ = at;
        }
    }

    /// The offset of each cache line (64 bytes on every x86-64 CPU) that
    /// holds part of the data block, all inside the mapping; none where the
    /// schema puts the data block past it.
    fn data_lines(&self, schema: &Schema) -> impl Iterator<Item = usize> {
        const LINE: usize = 64;
        let start = match usize::try_from(schema.header().data_offset) {
            Ok(from) if from < self.len => from & !(LINE - 1),
            _ => self.len,
        };
        (start..self.len).step_by(LINE)
    }
}

impl Drop for View {
    fn drop(&mut self) {
        // SAFETY: `ptr` and `len` are the mapping `of` made, unmapped here
        // once; no reference into it outlives `self`.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Reads whole 8-byte values, each with one atomic load, as the VMM stores
/// them: a value is never torn, though two may come from different instants
/// (as with KVM's own stats). Offsets and lengths that are not whole values
/// read nothing (`Sample::read_from` then says the data was cut short).
impl ReadAt for View {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let Ok(start) = usize::try_from(offset) else {
            return Ok(0);
        };
        let mut read = 0;
        for (i, chunk) in buf.chunks_exact_mut(8).enumerate() {
            let Some(value) = self.load(start + i * 8) else {
                break;
            };
            chunk.copy_from_slice(&value.to_ne_bytes());
            read += 8;
        }
        Ok(read)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vmmstats::{Def, StatsFile};
    use kvm_stats::{StatType, StatsFd, Unit};
    use std::borrow::Cow;
    use std::io::Write as _;

    fn defs() -> Vec<Def> {
        ["exits_io", "guest_stall_ns"]
            .into_iter()
            .map(|n| Def {
                name: Cow::Borrowed(n),
                kind: StatType::Cumulative,
                unit: Unit::None,
                exponent: 0,
            })
            .collect()
    }

    #[test]
    fn the_lines_asked_for_cover_the_data_block_and_stay_inside_the_mapping() {
        let f = StatsFile::new("kvmscope-1/vm", &defs()).unwrap();
        let fd = StatsFd::new_strict(f.reader().unwrap()).unwrap();
        let view = View::of(fd.file(), fd.schema()).unwrap();
        let data = fd.schema().header().data_offset as usize;
        let lines: Vec<usize> = view.data_lines(fd.schema()).collect();
        assert!(!lines.is_empty());
        assert!(lines.iter().all(|&at| at % 64 == 0 && at < view.len));
        assert!(
            lines[0] <= data && data < lines[0] + 64,
            "from the data block's line"
        );
        assert!(
            *lines.last().unwrap() + 64 >= view.len,
            "to the mapping's end"
        );
        // A schema whose data block lies past this mapping (a bigger
        // file's): nothing asked for.
        let many: Vec<Def> = (0..200)
            .map(|i| Def {
                name: Cow::Owned(format!("stat_{i}")),
                kind: StatType::Cumulative,
                unit: Unit::None,
                exponent: 0,
            })
            .collect();
        let big = StatsFile::new("kvmscope-1/vm", &many).unwrap();
        let big = StatsFd::new_strict(big.reader().unwrap()).unwrap();
        assert!(big.schema().header().data_offset as usize >= view.len);
        assert_eq!(view.data_lines(big.schema()).count(), 0);
    }

    #[test]
    fn a_view_reads_each_store_as_pread_does() {
        let f = StatsFile::new("kvmscope-1/vm", &defs()).unwrap();
        let fd = StatsFd::new_strict(f.reader().unwrap()).unwrap();
        let view = View::of(fd.file(), fd.schema()).unwrap();
        let (mut by_view, mut by_pread) = (fd.new_sample(), fd.new_sample());
        for (a, b) in [(1, 2), (41, u64::MAX)] {
            f.set(0, a);
            f.set(1, b);
            by_view.read_from(&view, fd.schema()).unwrap();
            fd.read_sample(&mut by_pread).unwrap();
            assert_eq!(by_view.words(), [a, b]);
            assert_eq!(by_view.words(), by_pread.words());
        }
    }

    /// A VMM stats file, and an unsealed memfd holding its bytes but the
    /// last `len_less`.
    fn copy_in_memfd(len_less: usize) -> (StatsFd, File) {
        let f = StatsFile::new("kvmscope-1/vm", &defs()).unwrap();
        let fd = StatsFd::new_strict(f.reader().unwrap()).unwrap();
        let bytes = std::fs::read(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(fd.file())
        ))
        .unwrap();
        let memfd =
            rustix::fs::memfd_create("copy", rustix::fs::MemfdFlags::ALLOW_SEALING).unwrap();
        let mut memfd = File::from(memfd);
        memfd.write_all(&bytes[..bytes.len() - len_less]).unwrap();
        (fd, memfd)
    }

    /// This process's fds open on the file whose inode is `ino`.
    fn fds_on(ino: u64) -> usize {
        use std::os::unix::fs::MetadataExt;
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .flatten()
            .filter(|e| std::fs::metadata(e.path()).is_ok_and(|m| m.ino() == ino))
            .count()
    }

    #[test]
    fn a_view_holds_no_fd_and_reads_on_after_the_file_is_closed() {
        use std::os::unix::fs::MetadataExt;
        let f = StatsFile::new("kvmscope-1/vm", &defs()).unwrap();
        let fd = StatsFd::new_strict(f.reader().unwrap()).unwrap();
        let ino = fd.file().metadata().unwrap().ino();
        let before = fds_on(ino);
        let view = View::of(fd.file(), fd.schema()).unwrap();
        assert_eq!(fds_on(ino), before, "the mapping keeps no fd of its own");
        let (schema, mut sample) = (fd.schema().clone(), fd.new_sample());
        drop(fd);
        f.set(1, 7);
        sample.read_from(&view, &schema).unwrap();
        assert_eq!(sample.words(), [0, 7]);
    }

    #[test]
    fn a_file_its_owner_could_shrink_is_not_mapped() {
        // The same bytes in an unsealed memfd; and a plain file, which has
        // no seals to read at all.
        let (fd, memfd) = copy_in_memfd(0);
        assert!(matches!(
            View::of(&memfd, fd.schema()),
            Err(ViewError::NotSealed)
        ));
        let plain = tempfile::tempfile().unwrap();
        assert!(matches!(
            View::of(&plain, fd.schema()),
            Err(ViewError::Seals(_))
        ));
    }

    #[test]
    fn a_sealed_file_shorter_than_its_data_block_is_not_mapped() {
        let (fd, memfd) = copy_in_memfd(8);
        rustix::fs::fcntl_add_seals(&memfd, SealFlags::SHRINK).unwrap();
        assert!(matches!(
            View::of(&memfd, fd.schema()),
            Err(ViewError::Short { .. })
        ));
    }
}
