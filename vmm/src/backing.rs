//! Which pages of guest RAM the host ever backed: a migration's round 0
//! sends the rest as zero without reading them (reading would fault in a
//! page per page), and dirty logging leaves their initially-set bits set
//! rather than protect pages that have no mapping ([`data_runs`]).
//! `mincore` cannot tell: it says "not resident" both for a page never
//! touched and for one swapped out, and a swapped-out page holds data. The
//! page map can: `PAGEMAP_SCAN` (Linux 6.7+) returns present, swapped and
//! zero-page ranges in one call per few thousand ranges; without it each
//! page's `/proc/self/pagemap` entry has a present and a swapped bit.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};

use vm_memory::MmapRegion;
use vmm_sys_util::ioctl::ioctl_with_mut_ref;

/// Why the page map could not be read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `/proc/self/pagemap` could not be opened.
    #[error("opening /proc/self/pagemap")]
    Open(#[source] std::io::Error),
    /// Reading an entry of `/proc/self/pagemap` failed.
    #[error("reading /proc/self/pagemap")]
    Read(#[source] std::io::Error),
}

/// What backs a run of pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backing {
    /// Never backed (or given back): zero, not read.
    None,
    /// Mapped to the shared zero page (read but never written): zero, not read.
    ZeroPage,
    /// Present or swapped out: must be read.
    Data,
}

const PAGE_IS_PRESENT: u64 = 1 << 3;
const PAGE_IS_SWAPPED: u64 = 1 << 4;
const PAGE_IS_PFNZERO: u64 = 1 << 5;
const PAGE_IS_HUGE: u64 = 1 << 6;
const PM_PRESENT: u64 = 1 << 63;
const PM_SWAP: u64 = 1 << 62;

#[repr(C)]
#[derive(Default)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

/// One range `PAGEMAP_SCAN` returns.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct PageRegion {
    /// First byte's host virtual address, page-aligned.
    pub(crate) start: u64,
    /// One past the last byte's host virtual address, page-aligned.
    pub(crate) end: u64,
    /// The kernel's `PAGE_IS_*` bits that hold for every page of the region.
    pub(crate) categories: u64,
}

/// The macro makes a `pub fn`; this module keeps the ioctl number out of the
/// crate's API.
mod nr {
    use crate::backing::PmScanArg;
    vmm_sys_util::ioctl_iowr_nr!(PAGEMAP_SCAN, b'f' as u32, 16, PmScanArg);
}
use nr::PAGEMAP_SCAN;

/// The backing of one `/proc/self/pagemap` entry.
pub(crate) fn entry_backing(entry: u64) -> Backing {
    if entry & (PM_PRESENT | PM_SWAP) != 0 {
        Backing::Data
    } else {
        Backing::None
    }
}

/// The backing of a `PAGEMAP_SCAN` region's categories.
pub(crate) fn region_backing(categories: u64) -> Backing {
    if categories & PAGE_IS_SWAPPED != 0 {
        Backing::Data
    } else if categories & PAGE_IS_PFNZERO != 0 {
        Backing::ZeroPage
    } else if categories & PAGE_IS_PRESENT != 0 {
        Backing::Data
    } else {
        Backing::None
    }
}

/// Appends a run, merging it with the last one when they touch and match.
pub(crate) fn push(runs: &mut Vec<(u64, u64, Backing)>, first: u64, count: u64, b: Backing) {
    if count == 0 {
        return;
    }
    match runs.last_mut() {
        Some((f, n, lb)) if *lb == b && *f + *n == first => *n += count,
        _ => runs.push((first, count, b)),
    }
}

/// Runs of pages `(first, count, backing)` covering `[base, base + len)`
/// from `PAGEMAP_SCAN` regions (ascending, within the range); the gaps
/// between regions were never backed.
pub(crate) fn runs_from_regions(
    base: u64,
    len: u64,
    regions: &[PageRegion],
) -> Vec<(u64, u64, Backing)> {
    let page = |addr: u64| (addr - base) / 4096;
    let mut runs = Vec::new();
    let mut at = base;
    for r in regions {
        let (start, end) = (r.start.max(at), r.end.min(base + len));
        if start >= end {
            continue;
        }
        push(&mut runs, page(at), page(start) - page(at), Backing::None);
        push(
            &mut runs,
            page(start),
            page(end) - page(start),
            region_backing(r.categories),
        );
        at = end;
    }
    push(
        &mut runs,
        page(at),
        page(base + len) - page(at),
        Backing::None,
    );
    runs
}

/// The backing of every page of `region` (a mapping of this process), as runs `(first page, count, backing)`.
///
/// # Errors
/// The page map could not be opened or read.
pub fn classify(region: &MmapRegion<()>) -> Result<Vec<(u64, u64, Backing)>, Error> {
    classify_range(region, 0, u64::MAX)
}

/// [`classify`] for the pages `[first, first + count)` of `region` (cut at
/// its end); pages are still counted from the region's start.
///
/// # Errors
/// The page map could not be opened or read.
pub(crate) fn classify_range(
    region: &MmapRegion<()>,
    first: u64,
    count: u64,
) -> Result<Vec<(u64, u64, Backing)>, Error> {
    let file = File::open("/proc/self/pagemap").map_err(Error::Open)?;
    let (base, len) = span(region, first, count);
    let runs = match scan(&file, base, len) {
        Some(regions) => runs_from_regions(base, len, &regions),
        None => read_entries(file, base, len)?,
    };
    Ok(runs
        .into_iter()
        .map(|(f, n, b)| (f + first, n, b))
        .collect())
}

/// The host addresses of pages `[first, first + count)` of `region`, cut at
/// its end: the start and the length in bytes.
fn span(region: &MmapRegion<()>, first: u64, count: u64) -> (u64, u64) {
    let pages = region.size() as u64 / 4096;
    let first = first.min(pages);
    let count = count.min(pages - first);
    (region.as_ptr() as u64 + first * 4096, count * 4096)
}

/// A run of pages that hold data (present or swapped out, not the shared
/// zero page).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DataRun {
    /// The run's first page, counted from the region's start.
    pub(crate) first: u64,
    /// Pages in the run.
    pub(crate) count: u64,
    /// Backed by a transparent huge page: a write to one of its 4 KiB pages
    /// backs all 512, so that being backed says nothing of the others.
    pub(crate) huge: bool,
}

/// The runs of pages `[first, first + count)` of `region` (a mapping of this
/// process; cut at its end) that hold data, by `PAGEMAP_SCAN` alone: `None`
/// where this kernel has no such ioctl (reading a `/proc/self/pagemap` entry
/// per page of a large guest costs more than the callers save). Pages are
/// counted from the region's start.
pub(crate) fn data_runs(region: &MmapRegion<()>, first: u64, count: u64) -> Option<Vec<DataRun>> {
    let file = File::open("/proc/self/pagemap").ok()?;
    let (base, len) = span(region, first, count);
    let end = base + len;
    let regions = scan(&file, base, len)?;
    let origin = region.as_ptr() as u64;
    let runs = regions
        .iter()
        .filter(|r| region_backing(r.categories) == Backing::Data)
        .filter_map(|r| {
            let (start, stop) = (r.start.max(base), r.end.min(end));
            (start < stop).then(|| DataRun {
                first: (start - origin) / 4096,
                count: (stop - start) / 4096,
                huge: r.categories & PAGE_IS_HUGE != 0,
            })
        })
        .collect();
    Some(runs)
}

/// Whether this kernel has `PAGEMAP_SCAN` (Linux 6.7+), tried once on a
/// page of this process.
pub fn scan_supported() -> bool {
    static SUPPORTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SUPPORTED.get_or_init(|| {
        let page = vec![0u8; 2 * 4096];
        let base = (page.as_ptr() as u64).next_multiple_of(4096);
        File::open("/proc/self/pagemap").is_ok_and(|f| scan(&f, base, 4096).is_some())
    })
}

/// `PAGEMAP_SCAN` over the range; `None` if this kernel has no such ioctl.
fn scan(file: &File, base: u64, len: u64) -> Option<Vec<PageRegion>> {
    let mut regions = Vec::new();
    let mut buf = vec![PageRegion::default(); 4096];
    let end = base + len;
    let mut at = base;
    while at < end {
        let mut arg = PmScanArg {
            size: size_of::<PmScanArg>() as u64,
            start: at,
            end,
            vec: buf.as_mut_ptr() as u64,
            vec_len: buf.len() as u64,
            category_anyof_mask: PAGE_IS_PRESENT | PAGE_IS_SWAPPED,
            return_mask: PAGE_IS_PRESENT | PAGE_IS_SWAPPED | PAGE_IS_PFNZERO | PAGE_IS_HUGE,
            ..Default::default()
        };
        // SAFETY: `arg` points the kernel at `buf`, which holds `vec_len`
        // regions; the scanned range is this process's own mapping.
        let n = unsafe { ioctl_with_mut_ref(file, PAGEMAP_SCAN(), &mut arg) };
        if n < 0 {
            return None;
        }
        regions.extend_from_slice(buf.get(..usize::try_from(n).ok()?)?);
        if arg.walk_end <= at {
            return None;
        }
        at = arg.walk_end;
    }
    Some(regions)
}

/// The fallback: one pagemap entry per page.
fn read_entries(mut file: File, base: u64, len: u64) -> Result<Vec<(u64, u64, Backing)>, Error> {
    const CHUNK: u64 = 64 << 10;
    const CHUNK_BYTES: usize = 8 * (64 << 10);
    let pages = len / 4096;
    let mut runs = Vec::new();
    let mut buf = vec![0u8; CHUNK_BYTES];
    let mut done = 0;
    file.seek(SeekFrom::Start(base / 4096 * 8))
        .map_err(Error::Read)?;
    while done < pages {
        let n = (pages - done).min(CHUNK);
        // n <= CHUNK, so n * 8 fits the buffer.
        let bytes = &mut buf[..usize::try_from(n * 8).unwrap_or(CHUNK_BYTES)];
        file.read_exact(bytes).map_err(Error::Read)?;
        for (i, e) in bytes.chunks_exact(8).enumerate() {
            let mut word = [0u8; 8];
            word.copy_from_slice(e);
            push(
                &mut runs,
                done + i as u64,
                1,
                entry_backing(u64::from_ne_bytes(word)),
            );
        }
        done += n;
    }
    Ok(runs)
}

/// Whether a page (or any buffer) is all zero.
pub(crate) fn is_zero(page: &[u8]) -> bool {
    let chunks = page.chunks_exact(16);
    let tail = chunks.remainder();
    chunks
        .map(|c| <[u8; 16]>::try_from(c).map_or(1, u128::from_ne_bytes))
        .all(|w| w == 0)
        && tail.iter().all(|&b| b == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_swapped_out_page_is_data_not_never_backed() {
        // A fabricated pagemap: not present but swapped (type 1, offset 5).
        let swapped = PM_SWAP | (5 << 5) | 1;
        assert_eq!(entry_backing(swapped), Backing::Data);
        assert_eq!(entry_backing(PM_PRESENT | 1234), Backing::Data);
        assert_eq!(entry_backing(0), Backing::None);
        assert_eq!(region_backing(PAGE_IS_SWAPPED), Backing::Data);
        assert_eq!(
            region_backing(PAGE_IS_PRESENT | PAGE_IS_PFNZERO),
            Backing::ZeroPage
        );
    }

    #[test]
    fn regions_become_runs_with_never_backed_gaps() {
        let base = 0x10_0000;
        let regions = [
            PageRegion {
                start: base + 4096,
                end: base + 3 * 4096,
                categories: PAGE_IS_PRESENT,
            },
            PageRegion {
                start: base + 3 * 4096,
                end: base + 4 * 4096,
                categories: PAGE_IS_SWAPPED,
            },
        ];
        assert_eq!(
            runs_from_regions(base, 6 * 4096, &regions),
            vec![
                (0, 1, Backing::None),
                (1, 3, Backing::Data),
                (4, 2, Backing::None)
            ]
        );
    }

    #[test]
    fn this_process_pages_classify_as_touched_or_not() {
        use vm_memory::{Bytes, VolatileMemory};
        let len = 64 * 4096;
        let region = vm_memory::MmapRegion::<()>::new(len).unwrap();
        region.as_volatile_slice().write_obj(7u8, 3 * 4096).unwrap();
        let runs = classify(&region).unwrap();
        assert!(runs.contains(&(3, 1, Backing::Data)), "{runs:?}");
        assert_eq!(runs.iter().map(|r| r.1).sum::<u64>(), 64);
        assert_eq!(runs.first(), Some(&(0, 3, Backing::None)));
    }

    #[test]
    fn zero_check_sees_any_set_byte() {
        let mut page = vec![0u8; 4096];
        assert!(is_zero(&page));
        page[4095] = 1;
        assert!(!is_zero(&page));
        assert!(!is_zero(&page[1..]));
    }
}
