//! Arming: clearing the bits `KVM_DIRTY_LOG_INITIALLY_SET` set when logging
//! was turned on, which write-protects their pages, so that their next
//! write is logged.
//!
//! Only the bits of pages that hold data are cleared (the page map says
//! which); the others stay set and are told apart from writes at each fold
//! (`unbacked.rs`). A consumer that needs a clean start (a readiness window)
//! gets every chunk of [`protect::CHUNK_PAGES`] armed when it subscribes. A
//! consumer that reads every page anyway (a migration's first pass) arms a
//! range at a time just before reading it ([`Consumer::arm`]), so that
//! turning logging on protects nothing at once and the guest's faults spread
//! over the pass: a write before a range's arming is in what is read, one
//! after it is logged. Anyone who folds before every chunk is armed arms the
//! rest first (the arming consumer's later reads still come after).

use std::time::Instant;

use super::bitmap::Bitmap;
use super::error::Error;
use super::protect::{self, Protection, CHUNK_PAGES};
use super::unbacked::Unbacked;
use super::{Consumer, DirtyLog, State};
use crate::backing::{self, Backing, DataRun};
use crate::memory;

impl DirtyLog {
    /// Called as logging is turned on: where the bits start set and the page
    /// map can be scanned, every chunk starts unarmed, and all are armed
    /// unless `armed` is false (the consumer arms them itself). Initially
    /// set without a page map scan: every bit cleared at once. Otherwise
    /// nothing to do.
    pub(super) fn arm(&self, state: &mut State, armed: bool) -> Result<(), Error> {
        state.unbacked = None;
        state.unarmed.clear();
        if self.protection != Protection::INITIALLY_SET {
            return Ok(());
        }
        if memory::region(&self.mem).is_none() || !backing::scan_supported() {
            protect::clear_all(&self.vm, 0, self.pages)?;
            return Ok(());
        }
        state.unbacked = Some(Unbacked::new(self.pages));
        state.unarmed = vec![true; usize::try_from(self.pages.div_ceil(CHUNK_PAGES)).unwrap_or(0)];
        if armed {
            let t = Instant::now();
            let protected = self.arm_rest(state.unbacked.as_mut(), &mut state.unarmed)?;
            log::debug!(
                "dirty log: armed the {protected} pages that hold data in {:?}, left {} unbacked pages set",
                t.elapsed(),
                state.unbacked.as_ref().map_or(0, Unbacked::count)
            );
        }
        Ok(())
    }

    /// Arms every chunk not armed yet; returns how many pages it protected.
    pub(super) fn arm_rest(
        &self,
        unbacked: Option<&mut Unbacked>,
        unarmed: &mut [bool],
    ) -> Result<u64, Error> {
        let Some(unbacked) = unbacked else {
            return Ok(0);
        };
        let mut protected = 0;
        for chunk in 0..unarmed.len() {
            if let Some(runs) = self.arm_chunk(unbacked, unarmed, chunk)? {
                protected += runs.iter().map(|r| r.count).sum::<u64>();
            }
        }
        Ok(protected)
    }

    /// Arms chunk `chunk` if it is not yet: scans it, adds its pages that
    /// hold no data to `unbacked` (their bits stay set) and clears the
    /// others' bits. Returns its data runs; `None` if it was armed already.
    fn arm_chunk(
        &self,
        unbacked: &mut Unbacked,
        unarmed: &mut [bool],
        chunk: usize,
    ) -> Result<Option<Vec<DataRun>>, Error> {
        if !unarmed.get(chunk).copied().unwrap_or(false) {
            return Ok(None);
        }
        let region = memory::region(&self.mem).ok_or(Error::Backing)?;
        let first = chunk as u64 * CHUNK_PAGES;
        let end = (first + CHUNK_PAGES).min(self.pages);
        let runs = unbacked.scan(region, first, end).ok_or(Error::Backing)?;
        if !runs.is_empty() {
            let mut bits = Bitmap::new(CHUNK_PAGES);
            for r in &runs {
                bits.set_run(r.first - first, r.count);
            }
            protect::clear_chunk(&self.vm, 0, first, self.pages, bits.words())?;
        }
        if let Some(u) = unarmed.get_mut(chunk) {
            *u = false;
        }
        Ok(Some(runs))
    }
}

impl Consumer {
    /// Whether a reader of every page must go through [`Consumer::arm`]:
    /// the log left chunks to arm or pages set as never backed. Otherwise
    /// (a ring, a whole-slot bitmap, one armed at boot) every page was
    /// logged from the subscription on, and a classification taken after it
    /// holds for the whole pass.
    pub fn arms_by_range(&self) -> bool {
        self.log.lock().unbacked.is_some()
    }

    /// Arms pages `[first, first + count)` where they are not armed yet
    /// (see [`DirtyLog::subscribe_unarmed`]) and returns their backing as of
    /// then, as runs `(first page, count, backing)` in order: read them after
    /// this, and each write that the read does not see is logged. A range
    /// within a chunk arms the whole chunk; the chunk's other pages are
    /// returned, classified afresh, when asked for. A page whose bit was left
    /// set as never backed is returned as never backed (read as zero)
    /// whatever backs it now: every consumer then holds zero for every page
    /// of that set, which is what a fold that finds one backed but all zero
    /// takes it to hold (it was written after, and is logged then).
    ///
    /// # Errors
    /// The page map could not be scanned or read, or KVM refused a clear.
    pub fn arm(&self, first: u64, count: u64) -> Result<Vec<(u64, u64, Backing)>, Error> {
        let log = &self.log;
        let mut guard = log.lock();
        let state = &mut *guard;
        let Some(region) = memory::region(&log.mem) else {
            return Ok(Vec::new());
        };
        let end = first.saturating_add(count).min(log.pages);
        let mut runs = Vec::new();
        let mut at = first;
        while at < end {
            let chunk = at / CHUNK_PAGES;
            let stop = ((chunk + 1) * CHUNK_PAGES).min(end);
            let armed = match state.unbacked.as_mut() {
                Some(u) => {
                    let chunk = usize::try_from(chunk).unwrap_or(usize::MAX);
                    log.arm_chunk(u, &mut state.unarmed, chunk)?
                }
                None => None,
            };
            match armed {
                Some(data) => push_runs(&mut runs, &data, at, stop),
                None => {
                    let now =
                        backing::classify_range(region, at, stop - at).map_err(Error::Pages)?;
                    match state.unbacked.as_ref() {
                        Some(u) => overlay(&mut runs, &now, u),
                        None => runs.extend(now),
                    }
                }
            }
            at = stop;
        }
        Ok(runs)
    }
}

/// Appends `now` (runs of an armed range, classified afresh) with the pages
/// of `unbacked` in it as never backed.
fn overlay(runs: &mut Vec<(u64, u64, Backing)>, now: &[(u64, u64, Backing)], unbacked: &Unbacked) {
    for &(first, count, b) in now {
        if b == Backing::None {
            backing::push(runs, first, count, b);
            continue;
        }
        for p in first..first + count {
            let b = if unbacked.contains(p) {
                Backing::None
            } else {
                b
            };
            backing::push(runs, p, 1, b);
        }
    }
}

/// Appends runs covering `[at, stop)`: the parts of `data` within it as
/// data, the gaps between as never backed.
fn push_runs(runs: &mut Vec<(u64, u64, Backing)>, data: &[DataRun], at: u64, stop: u64) {
    let mut pos = at;
    for r in data {
        let (s, e) = (r.first.max(pos), (r.first + r.count).min(stop));
        if s >= e {
            continue;
        }
        if s > pos {
            runs.push((pos, s - pos, Backing::None));
        }
        runs.push((s, e - s, Backing::Data));
        pos = e;
    }
    if pos < stop {
        runs.push((pos, stop - pos, Backing::None));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_cover_the_range_with_data_where_the_scan_found_it() {
        let data = [
            DataRun {
                first: 2,
                count: 3,
                huge: false,
            },
            DataRun {
                first: 8,
                count: 10,
                huge: true,
            },
        ];
        let mut runs = Vec::new();
        push_runs(&mut runs, &data, 0, 12);
        assert_eq!(
            runs,
            vec![
                (0, 2, Backing::None),
                (2, 3, Backing::Data),
                (5, 3, Backing::None),
                (8, 4, Backing::Data)
            ]
        );
        let mut inner = Vec::new();
        push_runs(&mut inner, &data, 3, 6);
        assert_eq!(inner, vec![(3, 2, Backing::Data), (5, 1, Backing::None)]);
        let mut none = Vec::new();
        push_runs(&mut none, &[], 4, 4);
        assert!(none.is_empty());
    }
}
