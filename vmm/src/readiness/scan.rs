//! Ground truth: an exact count of zero and non-zero pages by reading guest
//! RAM, skipping pages that hold no data (never backed, or mapping the
//! shared zero page: they read as zero without being read). Which those are
//! comes from the page map ([`crate::backing`]), not `mincore`: a page the
//! host swapped out is "not resident" to `mincore` as one never touched,
//! and holds data.

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use vm_memory::MmapRegion;

/// Bytes of a page.
const PAGE: usize = 4096;

/// Guest RAM as the scan sees it: a host mapping that no vCPU writes while a
/// `Ram` exists (see [`Ram::paused`]).
pub struct Ram<'a> {
    bytes: &'a [u8],
}

impl<'a> Ram<'a> {
    /// Views a guest-RAM mapping as plain bytes, for reading at memory speed
    /// (a volatile copy per page would halve the scan's rate).
    ///
    /// # Safety
    /// Nothing may write the mapping while the `Ram` lives: every vCPU paused
    /// (KVM itself writes no guest memory for this VMM: no kvmclock, no PV
    /// features), and the VMM's mailbox writes happen only on vCPU threads.
    pub(crate) unsafe fn paused(region: &'a MmapRegion<()>) -> Ram<'a> {
        // SAFETY: `region` maps `size()` bytes for as long as it is borrowed,
        // and the caller guarantees nothing writes them meanwhile.
        let bytes = unsafe { std::slice::from_raw_parts(region.as_ptr(), region.size()) };
        Ram { bytes }
    }

    /// A view of a buffer the caller owns (tests, benchmarks).
    pub fn from_slice(bytes: &'a [u8]) -> Ram<'a> {
        Ram { bytes }
    }

    /// Pages in the view.
    pub(crate) fn pages(&self) -> u64 {
        (self.bytes.len() / PAGE) as u64
    }
}

/// Whether a page holds only zeros. ORs 256-byte blocks together without a
/// branch inside a block (so the loop vectorises) and stops at the first
/// non-zero block.
pub(crate) fn page_is_zero(page: &[u8]) -> bool {
    page.chunks(256)
        .all(|block| block.iter().fold(0u8, |acc, &b| acc | b) == 0)
}

/// For each page of `region`, whether the scan must read it (`1`: the host
/// backs it with data, present or swapped out) or may count it as zero
/// unread (`0`), as [`scan`] takes it. `go_on` is asked before each GiB
/// (without `PAGEMAP_SCAN` the page map of a GiB is 2 MiB to read); where it
/// says [`ControlFlow::Break`], the walk stops and gives `None`.
///
/// # Errors
/// The page map could not be opened or read.
pub fn pages_to_read(
    region: &MmapRegion<()>,
    mut go_on: impl FnMut() -> ControlFlow<()>,
) -> Result<Option<Vec<u8>>, crate::backing::Error> {
    // A GiB of guest RAM at a time: the runs of a fragmented guest take 24
    // bytes each, up to one per two pages, where the map takes one a page.
    const CHUNK: usize = 1 << 18;
    let pages = region.size() / PAGE;
    let mut map = vec![0u8; pages];
    for chunk in (0..pages).step_by(CHUNK) {
        if go_on().is_break() {
            return Ok(None);
        }
        let runs = crate::backing::classify_range(region, chunk as u64, CHUNK as u64)?;
        for (first, count, backing) in runs {
            if backing == crate::backing::Backing::Data {
                let first = usize::try_from(first).unwrap_or(usize::MAX).min(pages);
                let end = first
                    .saturating_add(usize::try_from(count).unwrap_or(usize::MAX))
                    .min(pages);
                map[first..end].fill(1);
            }
        }
    }
    Ok(Some(map))
}

/// How many resident pages a measurement reads for zeros ([`sample`]): 32 MiB
/// of reading, a few milliseconds, whatever the guest's size; the share of
/// non-zero pages is then known to within about half a percent (one
/// standard deviation at worst, a share of one half).
pub(crate) const SAMPLE_PAGES: u64 = 8192;

/// What a sample of the host-resident pages, read for zeros while the guest
/// runs, says of the non-zero pages ([`sample`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZeroSample {
    /// Pages read (drawn with replacement: a page may be read twice).
    pub read: u64,
    /// Of them, the pages read holding a non-zero byte.
    pub nonzero: u64,
    /// The host-resident pages they were drawn from.
    pub of: u64,
}

impl ZeroSample {
    /// The non-zero pages, estimated: the resident ones times the share read
    /// non-zero (a count where every resident page was read, [`Self::whole`]).
    pub fn estimate(&self) -> u64 {
        crate::units::saturating_u64((self.of as f64 * self.share()).round())
    }

    /// The estimate's standard deviation, pages: `of` times that of the share
    /// read non-zero (0 where every resident page was read, or none).
    pub fn deviation(&self) -> f64 {
        if self.whole() || self.read == 0 {
            return 0.0;
        }
        let share = self.share();
        self.of as f64 * (share * (1.0 - share) / self.read as f64).sqrt()
    }

    /// The share of the pages read that held a non-zero byte (0 of none).
    fn share(&self) -> f64 {
        if self.read == 0 {
            return 0.0;
        }
        self.nonzero as f64 / self.read as f64
    }

    /// Whether every resident page was read once: the estimate is a count
    /// (of a guest that may have written meanwhile: it was not paused).
    pub fn whole(&self) -> bool {
        self.read == self.of
    }
}

/// Copies page `index` of `region` into `page` while the guest may write it
/// (a volatile copy: it reads as it was at one moment or another); false
/// where the page lies outside the region.
pub(crate) fn copy_page(region: &MmapRegion<()>, index: usize, page: &mut [u8; PAGE]) -> bool {
    use vm_memory::VolatileMemory;
    region
        .as_volatile_slice()
        .subslice(index * PAGE, PAGE)
        .map(|s| s.copy_to(&mut page[..]))
        .is_ok_and(|copied| copied == PAGE)
}

/// Reads `n` of the `of` pages that `resident` (one byte per page, bit 0 set
/// where the host backs it, as `mincore` gives, with its count: both as
/// [`crate::memory::resident`] returns them) marks, drawn at random
/// with replacement (a fixed seed: the same guest gives the same draw), or
/// every one where there are no more than `n`, and counts those holding a
/// non-zero byte. The guest is not paused: each page is copied out
/// (volatile) before it is looked at, and a page written meanwhile is read
/// as it was at one moment or another. Reading backs nothing new: the pages
/// read are resident already.
pub(crate) fn sample(region: &MmapRegion<()>, resident: &[u8], of: u64, n: u64) -> ZeroSample {
    let pages = (region.size() / PAGE).min(resident.len());
    let marked = |i: &usize| resident[*i] & 1 != 0;
    let mut page = [0u8; PAGE];
    let mut nonzero_at = |index: usize| copy_page(region, index, &mut page) && !page_is_zero(&page);
    let (mut read, mut nonzero) = (0u64, 0u64);
    if of <= n {
        for index in (0..pages).filter(marked) {
            read += 1;
            nonzero += u64::from(nonzero_at(index));
        }
        return ZeroSample { read, nonzero, of };
    }
    // Ranks among the resident pages, in order, then one walk of the map.
    let mut rng = fastrand::Rng::with_seed(0x6b76_6d73_636f_7065);
    let mut ranks: Vec<u64> = (0..n).map(|_| rng.u64(0..of)).collect();
    ranks.sort_unstable();
    let mut next = ranks.iter().peekable();
    for (rank, index) in (0u64..).zip((0..pages).filter(marked)) {
        while next.next_if_eq(&&rank).is_some() {
            read += 1;
            nonzero += u64::from(nonzero_at(index));
        }
        if next.peek().is_none() {
            break;
        }
    }
    ZeroSample { read, nonzero, of }
}

/// What the scan found.
#[derive(Debug, Clone, PartialEq)]
pub struct Scan {
    /// Pages that read as all zeros (never-backed ones included).
    pub(crate) zero_pages: u64,
    /// Pages with a non-zero byte.
    pub nonzero_pages: u64,
    /// Pages skipped because they hold no data (never backed, or the shared
    /// zero page; counted as zero).
    pub unbacked_pages: u64,
    /// Non-zero pages within the range asked for (e.g. the arena).
    pub nonzero_in_range: u64,
    /// How long the scan took (the guest is paused meanwhile).
    pub(crate) elapsed: Duration,
}

/// Counts zero and non-zero pages of `ram`, reading only pages whose
/// `to_read` byte says they hold data ([`pages_to_read`]; `None`: read
/// every page).
/// `range` (in pages) also gets its own non-zero count. `progress(done, total)`
/// is called every 64 Ki pages (256 MiB: about 20 ms of reading); the scan
/// stops where it says [`ControlFlow::Break`], and then returns `None`.
pub fn scan(
    ram: &Ram<'_>,
    to_read: Option<&[u8]>,
    range: std::ops::Range<u64>,
    mut progress: impl FnMut(u64, u64) -> ControlFlow<()>,
) -> Option<Scan> {
    let started = Instant::now();
    let total = ram.pages();
    let (mut zero, mut nonzero, mut unbacked, mut in_range) = (0, 0, 0, 0);
    for ((index, i), page) in (0usize..).zip(0u64..).zip(ram.bytes.chunks_exact(PAGE)) {
        if i % 65536 == 0 && progress(i, total).is_break() {
            return None;
        }
        let backed = to_read.is_none_or(|r| r.get(index).is_some_and(|b| b & 1 != 0));
        if !backed {
            unbacked += 1;
            zero += 1;
        } else if page_is_zero(page) {
            zero += 1;
        } else {
            nonzero += 1;
            if range.contains(&i) {
                in_range += 1;
            }
        }
    }
    // Done: nothing is left to stop.
    let _ = progress(total, total);
    Some(Scan {
        zero_pages: zero,
        nonzero_pages: nonzero,
        unbacked_pages: unbacked,
        nonzero_in_range: in_range,
        elapsed: started.elapsed(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ops::ControlFlow::{Break, Continue};

    #[test]
    fn zero_check_finds_a_single_nonzero_byte_anywhere() {
        let mut page = vec![0u8; PAGE];
        assert!(page_is_zero(&page));
        for at in [0, 7, 255, 256, 2048, 4095] {
            page[at] = 1;
            assert!(!page_is_zero(&page), "byte {at}");
            page[at] = 0;
        }
    }

    #[test]
    fn scan_counts_pages_and_the_range() {
        let mut buf = vec![0u8; 8 * PAGE];
        for p in [1, 3, 6] {
            buf[p * PAGE + 100] = 0xab;
        }
        let s = scan(&Ram::from_slice(&buf), None, 2..8, |_, _| Continue(())).unwrap();
        assert_eq!(
            (
                s.zero_pages,
                s.nonzero_pages,
                s.unbacked_pages,
                s.nonzero_in_range
            ),
            (5, 3, 0, 2)
        );
    }

    #[test]
    fn scan_skips_unbacked_pages_as_zero() {
        let mut buf = vec![0u8; 4 * PAGE];
        buf[PAGE] = 1;
        buf[2 * PAGE] = 1;
        let residency = [1u8, 1, 0, 0];
        let s = scan(&Ram::from_slice(&buf), Some(&residency), 0..4, |_, _| {
            Continue(())
        })
        .unwrap();
        // Page 2 is "unbacked", so it is not read (and counts as zero).
        assert_eq!((s.zero_pages, s.nonzero_pages, s.unbacked_pages), (3, 1, 2));
    }

    #[test]
    fn a_scan_stops_where_its_caller_says_and_reports_nothing() {
        // 3 x 64 Ki pages, none backed: a zeroed allocation the host maps
        // lazily, and which the scan never reads.
        let buf = vec![0u8; 3 * 65536 * PAGE];
        let residency = vec![0u8; 3 * 65536];
        let mut calls = Vec::new();
        let s = scan(
            &Ram::from_slice(&buf),
            Some(&residency),
            0..0,
            |done, total| {
                calls.push((done, total));
                if done >= 65536 {
                    Break(())
                } else {
                    Continue(())
                }
            },
        );
        assert!(s.is_none());
        // Asked at 0 and at 64 Ki pages, stopped there: never at the end.
        assert_eq!(calls, [(0, 3 * 65536), (65536, 3 * 65536)]);
    }

    #[test]
    fn the_page_map_walk_is_asked_before_each_gib_and_stops_where_told() {
        // Three GiB reserved and never touched: the walk reads their page
        // map (nothing backed) a GiB at a time.
        let region = MmapRegion::<()>::new(3 << 30).unwrap();
        let mut asked = 0;
        let map = pages_to_read(&region, || {
            asked += 1;
            Continue(())
        })
        .unwrap()
        .unwrap();
        assert_eq!((asked, map.len()), (3, 3 << 18));
        assert!(map.iter().all(|&b| b == 0));
        // Stopped before the second GiB: nothing more read, no map.
        let mut asked = 0;
        let stopped = pages_to_read(&region, || {
            asked += 1;
            if asked > 1 {
                Break(())
            } else {
                Continue(())
            }
        })
        .unwrap();
        assert!(stopped.is_none());
        assert_eq!(asked, 2);
    }

    /// The pages a residency map marks, as `memory::resident` counts them.
    fn marked(resident: &[u8]) -> u64 {
        resident.iter().filter(|&&b| b & 1 != 0).count() as u64
    }

    /// A mapping of `pages` pages, those `nonzero` says written non-zero,
    /// the rest written with zeros, all marked resident.
    fn written(pages: usize, nonzero: impl Fn(usize) -> bool) -> (MmapRegion<()>, Vec<u8>) {
        use vm_memory::{Bytes, VolatileMemory};
        let region = MmapRegion::<()>::new(pages * PAGE).unwrap();
        for p in (0..pages).filter(|&p| nonzero(p)) {
            region
                .as_volatile_slice()
                .write_obj(0xa5u8, p * PAGE + 123)
                .unwrap();
        }
        (region, vec![1u8; pages])
    }

    #[test]
    fn a_sample_of_few_resident_pages_reads_each_once_and_counts_exactly() {
        let (region, mut resident) = written(64, |p| p % 3 == 0);
        // Pages 60 to 63 not resident: neither read nor counted.
        resident[60..].fill(0);
        let s = sample(&region, &resident, marked(&resident), SAMPLE_PAGES);
        assert_eq!((s.read, s.nonzero, s.of), (60, 20, 60));
        assert!(s.whole());
        assert_eq!(s.estimate(), 20);
    }

    #[test]
    fn a_sample_of_many_pages_estimates_the_share_written_non_zero() {
        // One page in four non-zero over 40,000 pages, and a sparse layout
        // a stride would alias with (one in 16): the share within 2.5 points
        // (three standard deviations of 4,096 draws at a share of 1/4).
        for (every, truth) in [(4, 10_000), (16, 2_500)] {
            let (region, resident) = written(40_000, |p| p % every == 0);
            let s = sample(&region, &resident, marked(&resident), 4096);
            assert_eq!((s.read, s.of), (4096, 40_000));
            assert!(!s.whole());
            let off = s.estimate().abs_diff(truth) as f64 / s.of as f64;
            assert!(off < 0.025, "{s:?}: {} for {truth}", s.estimate());
        }
        // All zero and all non-zero are exact, drawn or not.
        let (region, resident) = written(40_000, |_| false);
        assert_eq!(
            sample(&region, &resident, marked(&resident), 4096).estimate(),
            0
        );
        let (region, resident) = written(40_000, |_| true);
        assert_eq!(
            sample(&region, &resident, marked(&resident), 4096).estimate(),
            40_000
        );
    }
}
