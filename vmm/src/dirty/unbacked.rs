//! The pages the host had never backed when logging was turned on, whose
//! initially-set bits are left set.
//!
//! With `KVM_DIRTY_LOG_INITIALLY_SET`, turning logging on sets every bit and
//! protects nothing, and a window must clear the bits (which protects the
//! pages) before it can tell a write from its start. Clearing costs KVM a
//! look at each page's mappings, nearly all of it wasted on a large guest
//! that has touched little: a page the host never backed has no mapping to
//! protect (KVM maps only what the host backs and drops its mapping when the
//! host drops the page). So the VMM clears only the bits of pages that hold
//! data, and tells the others apart from writes at each fold by what the host
//! backs now: a page still unbacked (or mapped to the shared zero page, which
//! a read maps) was not written, since a write backs it; one backed by a
//! 4 KiB page now was written; one backed by a transparent huge page may have
//! been backed with a neighbour that was written, so its content decides
//! (all zero: not written, or written with zeros, which changes nothing a
//! consumer needs to send or count). A fold protects the pages backed since
//! (clears their bits) before it reads their content, so that a write after
//! the read is logged by KVM, and they leave the set.
//!
//! Needs `PAGEMAP_SCAN` (Linux 6.7+): without it every bit is cleared when
//! logging is turned on, as before.

use vm_memory::{Bytes as _, GuestRegionMmap, MemoryRegionAddress};

use super::bitmap::Bitmap;
use super::error::Error;
use crate::backing::{self, DataRun};

/// Pages whose bits were left set when logging was turned on.
#[derive(Debug)]
pub(crate) struct Unbacked {
    pages: Bitmap,
}

/// Pages of an [`Unbacked`] set that the host backs now.
#[derive(Debug, Default)]
pub(crate) struct Fresh {
    /// Backed by a 4 KiB page of their own, which only a write does.
    written: Vec<u64>,
    /// Backed by a transparent huge page: their content decides.
    huge: Vec<u64>,
}

impl Unbacked {
    /// An empty set for a slot of `pages` pages.
    pub(crate) fn new(pages: u64) -> Unbacked {
        Unbacked {
            pages: Bitmap::new(pages),
        }
    }

    /// Scans pages `[first, end)` of `region` (guest RAM) as they are armed:
    /// adds those that hold no data to the set and returns the runs that do
    /// (their bits are to be cleared, which protects them). `None` where the
    /// kernel has no `PAGEMAP_SCAN`.
    pub(crate) fn scan(
        &mut self,
        region: &GuestRegionMmap<()>,
        first: u64,
        end: u64,
    ) -> Option<Vec<DataRun>> {
        let runs = backing::data_runs(region, first, end.saturating_sub(first))?;
        let mut at = first;
        for r in &runs {
            self.pages.set_run(at, r.first.saturating_sub(at));
            at = r.first + r.count;
        }
        self.pages.set_run(at, end.saturating_sub(at));
        Some(runs)
    }

    /// Whether `page` is in the set.
    pub(crate) fn contains(&self, page: u64) -> bool {
        self.pages.contains(page)
    }

    /// Pages in the set.
    pub(crate) fn count(&self) -> u64 {
        self.pages.count()
    }

    /// The set's pages that the host backs now.
    ///
    /// # Errors
    /// `Backing`: the page map could not be scanned (it could when logging
    /// was turned on).
    pub(crate) fn fresh(&self, region: &GuestRegionMmap<()>) -> Result<Fresh, Error> {
        let runs = backing::data_runs(region, 0, u64::MAX).ok_or(Error::Backing)?;
        let mut fresh = Fresh::default();
        for r in runs {
            let pages = self.pages.iter_range(r.first, r.first + r.count);
            if r.huge {
                fresh.huge.extend(pages);
            } else {
                fresh.written.extend(pages);
            }
        }
        Ok(fresh)
    }

    /// Clears the set's bits from `words` (a KVM bitmap as read) and sets
    /// those of the set's pages written since ([`Fresh::written`], their
    /// content read now, nothing cleared); returns those pages.
    ///
    /// # Errors
    /// As [`Unbacked::fresh`].
    pub(crate) fn writes_into(
        &self,
        region: &GuestRegionMmap<()>,
        words: &mut [u64],
    ) -> Result<Vec<u64>, Error> {
        let fresh = self.fresh(region)?;
        self.mask(words);
        let written = fresh.written(region);
        written.iter().for_each(|&p| set_bit(words, p));
        Ok(written)
    }

    /// Clears the set's bits from `words` (a KVM bitmap as read): they were
    /// left set when logging began, and are not writes.
    pub(crate) fn mask(&self, words: &mut [u64]) {
        for (w, u) in words.iter_mut().zip(self.pages.words()) {
            *w &= !u;
        }
    }

    /// Takes `pages` out of the set: KVM's bits for them mean writes from now on.
    pub(crate) fn forget(&mut self, pages: impl IntoIterator<Item = u64>) {
        for p in pages {
            self.pages.unset(p);
        }
    }
}

impl Fresh {
    /// Every page backed since.
    pub(crate) fn all(&self) -> impl Iterator<Item = u64> + '_ {
        self.written.iter().chain(&self.huge).copied()
    }

    /// The pages written: those backed by a page of their own, and those
    /// of a huge page that are not all zero (read from `region`; a page
    /// that cannot be read counts as written).
    pub(crate) fn written(&self, region: &GuestRegionMmap<()>) -> Vec<u64> {
        let mut page = [0u8; 4096];
        let nonzero = self.huge.iter().copied().filter(|&p| {
            region
                .read_slice(&mut page, MemoryRegionAddress(p * 4096))
                .map_or(true, |()| !backing::is_zero(&page))
        });
        self.written.iter().copied().chain(nonzero).collect()
    }
}

/// Sets page `page`'s bit in `words` (a KVM bitmap); pages past the end are ignored.
pub(crate) fn set_bit(words: &mut [u64], page: u64) {
    if let Some(w) = words.get_mut(usize::try_from(page / 64).unwrap_or(usize::MAX)) {
        *w |= 1 << (page % 64);
    }
}
