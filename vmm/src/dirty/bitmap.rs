//! A set of guest pages, one bit each, with a running count.

/// A set of guest pages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bitmap {
    words: Vec<u64>,
    count: u64,
}

impl Bitmap {
    /// An empty set for `pages` pages.
    pub(crate) fn new(pages: u64) -> Self {
        Bitmap {
            words: vec![0; usize::try_from(pages.div_ceil(64)).unwrap_or(usize::MAX)],
            count: 0,
        }
    }

    /// Adds a page; pages past the end are ignored.
    pub(crate) fn set(&mut self, page: u64) {
        if let Some(w) = self.words.get_mut((page / 64) as usize) {
            let bit = 1u64 << (page % 64);
            if *w & bit == 0 {
                *w |= bit;
                self.count += 1;
            }
        }
    }

    /// Adds the pages `[first, first + n)`, a word at a time where it can;
    /// pages past the end are ignored.
    pub(crate) fn set_run(&mut self, first: u64, n: u64) {
        for (i, mask) in self.masks(first, n) {
            let w = &mut self.words[i];
            self.count += u64::from((mask & !*w).count_ones());
            *w |= mask;
        }
    }

    /// Removes the pages `[first, first + n)`, a word at a time where it
    /// can; pages past the end are ignored.
    pub(crate) fn unset_run(&mut self, first: u64, n: u64) {
        for (i, mask) in self.masks(first, n) {
            let w = &mut self.words[i];
            self.count -= u64::from((mask & *w).count_ones());
            *w &= !mask;
        }
    }

    /// The words that pages `[first, first + n)` lie in, each with the bits
    /// of those pages; none past the end.
    fn masks(&self, first: u64, n: u64) -> impl Iterator<Item = (usize, u64)> {
        let end = first.saturating_add(n).min(self.words.len() as u64 * 64);
        let mut p = first;
        std::iter::from_fn(move || {
            if p >= end {
                return None;
            }
            let bits = (end - p).min(64 - p % 64);
            let mask = if bits == 64 {
                u64::MAX
            } else {
                ((1u64 << bits) - 1) << (p % 64)
            };
            let word = (p / 64) as usize;
            p += bits;
            Some((word, mask))
        })
    }

    /// Removes a page.
    pub(crate) fn unset(&mut self, page: u64) {
        if let Some(w) = self.words.get_mut((page / 64) as usize) {
            let bit = 1u64 << (page % 64);
            if *w & bit != 0 {
                *w &= !bit;
                self.count -= 1;
            }
        }
    }

    /// The set as KVM lays out a bitmap: 64 pages a word, page 0 in bit 0.
    pub(crate) fn words(&self) -> &[u64] {
        &self.words
    }

    /// Adds every page set in `other` (a KVM bitmap, 64 pages a word).
    pub(crate) fn or_words(&mut self, other: &[u64]) {
        for (w, o) in self.words.iter_mut().zip(other) {
            self.count += u64::from((o & !*w).count_ones());
            *w |= o;
        }
    }

    /// Pages in the set or in `other` (a KVM bitmap), without adding them.
    pub(crate) fn count_with_words(&self, other: &[u64]) -> u64 {
        self.count
            + self
                .words
                .iter()
                .zip(other)
                .map(|(w, o)| u64::from((o & !w).count_ones()))
                .sum::<u64>()
    }

    /// Adds every page of `other` (a set of the same size).
    pub(crate) fn or(&mut self, other: &Bitmap) {
        self.or_words(&other.words);
    }

    /// Whether `page` is in the set.
    pub fn contains(&self, page: u64) -> bool {
        self.words
            .get((page / 64) as usize)
            .is_some_and(|w| w & (1 << (page % 64)) != 0)
    }

    /// Pages in the set.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Pages in the set within `[first, first + n)`.
    pub fn count_range(&self, first: u64, n: u64) -> u64 {
        (first..first + n).filter(|&p| self.contains(p)).count() as u64
    }

    /// The pages in the set, in ascending order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.words.iter().enumerate().flat_map(|(i, &w)| {
            let mut w = w;
            std::iter::from_fn(move || {
                if w == 0 {
                    return None;
                }
                let bit = u64::from(w.trailing_zeros());
                w &= w - 1;
                Some(i as u64 * 64 + bit)
            })
        })
    }

    /// The pages of the set within `[first, end)`, ascending; empty words are
    /// skipped 64 pages at a time.
    pub(crate) fn iter_range(&self, first: u64, end: u64) -> impl Iterator<Item = u64> + '_ {
        let word = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        let (lo, hi) = (word(first / 64), word(end.div_ceil(64)));
        let words = self.words.get(lo..hi.min(self.words.len())).unwrap_or(&[]);
        words
            .iter()
            .enumerate()
            .filter(|(_, &w)| w != 0)
            .flat_map(move |(i, &w)| {
                let base = (lo + i) as u64 * 64;
                (0..64)
                    .filter(move |b| w & (1 << b) != 0)
                    .map(move |b| base + b)
            })
            .filter(move |&p| p >= first && p < end)
    }

    /// The set as runs of consecutive pages `(first, count)`, ascending.
    pub(crate) fn runs(&self) -> Vec<(u64, u64)> {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for p in self.iter() {
            match runs.last_mut() {
                Some((first, n)) if *first + *n == p => *n += 1,
                _ => runs.push((p, 1)),
            }
        }
        runs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitmap_counts_distinct_pages() {
        let mut b = Bitmap::new(200);
        for p in [0, 5, 5, 63, 64, 199, 500] {
            b.set(p);
        }
        assert_eq!(b.count(), 5);
        assert!(b.contains(64) && !b.contains(65) && !b.contains(500));
        assert_eq!(b.count_range(0, 64), 3);
    }

    #[test]
    fn bitmap_or_counts_only_new_pages() {
        let mut b = Bitmap::new(128);
        b.set(1);
        b.or_words(&[0b11, 1 << 63]);
        assert_eq!(b.count(), 3);
        assert!(b.contains(0) && b.contains(1) && b.contains(127));
    }

    #[test]
    fn set_run_and_unset_keep_the_count() {
        let mut b = Bitmap::new(320);
        b.set(70);
        b.set_run(60, 140);
        assert_eq!(b.count(), 140);
        assert!(!b.contains(59) && b.contains(60) && b.contains(199) && !b.contains(200));
        assert_eq!(b.words()[1], u64::MAX);
        b.set_run(290, 64);
        assert_eq!(b.count(), 140 + 30, "pages past the end are ignored");
        b.unset(70);
        b.unset(70);
        b.unset(1000);
        assert_eq!(b.count(), 169);
        assert!(!b.contains(70));
        assert_eq!(b.iter().count() as u64, b.count());
        b.unset_run(65, 100);
        assert_eq!(b.count(), 169 - 99, "70 was not set");
        assert!(b.contains(64) && !b.contains(65) && !b.contains(164) && b.contains(165));
        b.unset_run(300, u64::MAX);
        assert_eq!(b.iter().count() as u64, b.count());
        assert!(!b.contains(319) && b.contains(299));
    }

    #[test]
    fn iter_and_runs_list_pages_in_order() {
        let mut b = Bitmap::new(300);
        for p in [3, 4, 5, 63, 64, 65, 200] {
            b.set(p);
        }
        assert_eq!(b.iter().collect::<Vec<_>>(), vec![3, 4, 5, 63, 64, 65, 200]);
        assert_eq!(b.runs(), vec![(3, 3), (63, 3), (200, 1)]);
        assert_eq!(b.iter_range(4, 65).collect::<Vec<_>>(), vec![4, 5, 63, 64]);
        assert_eq!(b.iter_range(201, 300).count(), 0);
    }
}
