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
/// unread (`0`), as [`scan`] takes it.
///
/// # Errors
/// The page map could not be opened or read.
pub fn pages_to_read(region: &MmapRegion<()>) -> Result<Vec<u8>, crate::backing::Error> {
    // A GiB of guest RAM at a time: the runs of a fragmented guest take 24
    // bytes each, up to one per two pages, where the map takes one a page.
    const CHUNK: usize = 1 << 18;
    let pages = region.size() / PAGE;
    let mut map = vec![0u8; pages];
    for chunk in (0..pages).step_by(CHUNK) {
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
    Ok(map)
}

/// What the scan found.
#[derive(Debug, Clone, PartialEq)]
pub struct Scan {
    /// Pages that read as all zeros (never-backed ones included).
    pub(crate) zero_pages: u64,
    /// Pages with a non-zero byte.
    pub(crate) nonzero_pages: u64,
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
}
