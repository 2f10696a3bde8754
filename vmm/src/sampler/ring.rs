//! A bounded ring of points: the oldest goes when it is full, and its buffers
//! are reused for the next point, so a long run allocates nothing per tick.

use std::collections::VecDeque;

use super::record::Point;

/// A page of points (`Ring::page`).
#[derive(Debug, Default)]
pub(crate) struct Page {
    /// The points, oldest first.
    pub(crate) points: Vec<Point>,
    /// Points after `since` that are not in the page and will not come:
    /// dropped from the ring, or skipped for the newest.
    pub(crate) dropped: u64,
    /// More points follow this page: ask again from its last point.
    pub(crate) more: bool,
}

/// The sampler's memory.
pub(crate) struct Ring {
    points: VecDeque<Point>,
    capacity: usize,
    next_seq: u64,
    spare: Option<Point>,
    /// The sampler has stopped: no more points will come.
    pub(crate) stopped: bool,
}

impl Ring {
    /// A ring holding at most `capacity` points.
    pub(crate) fn new(capacity: usize) -> Self {
        Ring {
            // Grows as points come, rather than reserving the bound up front.
            points: VecDeque::new(),
            capacity,
            next_seq: 1,
            spare: None,
            stopped: false,
        }
    }

    /// A point to fill: the buffers of the one the ring dropped last, when
    /// it has dropped one. The ring itself keeps its points until `push`: a
    /// reader while the point is filled sees all of them (it saw one fewer
    /// while the oldest was taken out to be refilled).
    pub(crate) fn recycle(&mut self) -> Point {
        let mut p = self.spare.take().unwrap_or_default();
        p.seq = self.next_seq;
        p
    }

    /// Adds a point filled after `recycle`.
    pub(crate) fn push(&mut self, point: Point) {
        self.next_seq = point.seq + 1;
        if self.points.len() == self.capacity {
            self.spare = self.points.pop_front();
        }
        self.points.push_back(point);
    }

    /// Points newer than `since`, and how many newer ones were already dropped.
    pub(crate) fn since(&self, since: u64) -> (Vec<Point>, u64) {
        let oldest = self.points.front().map_or(self.next_seq, |p| p.seq);
        let dropped = oldest.saturating_sub(since.saturating_add(1));
        (
            self.points
                .iter()
                .filter(|p| p.seq > since)
                .cloned()
                .collect(),
            dropped,
        )
    }

    /// At most `max` points newer than `since`: the oldest of them, or with
    /// `newest` the newest (older ones then count as dropped). Only the page
    /// is copied.
    pub(crate) fn page(&self, since: u64, max: usize, newest: bool) -> Page {
        let oldest = self.points.front().map_or(self.next_seq, |p| p.seq);
        let mut dropped = oldest.saturating_sub(since.saturating_add(1));
        // Points are in sequence order without gaps, so the first one after
        // `since` is found by arithmetic.
        let first = usize::try_from(since.saturating_add(1).saturating_sub(oldest))
            .unwrap_or(usize::MAX)
            .min(self.points.len());
        let after = self.points.len() - first;
        let (start, more) = match (newest, after > max) {
            (true, true) => {
                dropped += (after - max) as u64;
                (self.points.len() - max, false)
            }
            (false, true) => (first, true),
            (_, false) => (first, false),
        };
        Page {
            points: self.points.range(start..).take(max).cloned().collect(),
            dropped,
            more,
        }
    }

    /// Sequence number of the newest point (0 before any).
    pub(crate) fn last_seq(&self) -> u64 {
        self.next_seq - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fill(ring: &mut Ring, n: usize) {
        for _ in 0..n {
            let mut p = ring.recycle();
            p.pages_4k = p.seq * 10;
            ring.push(p);
        }
    }

    fn seqs(page: &Page) -> Vec<u64> {
        page.points.iter().map(|p| p.seq).collect()
    }

    #[test]
    fn pages_walk_forward_from_since_until_no_more() {
        let mut r = Ring::new(100);
        fill(&mut r, 10);
        let p = r.page(2, 3, false);
        assert_eq!((seqs(&p), p.dropped, p.more), (vec![3, 4, 5], 0, true));
        let p = r.page(8, 3, false);
        assert_eq!((seqs(&p), p.dropped, p.more), (vec![9, 10], 0, false));
        assert!(r.page(10, 3, false).points.is_empty());
    }

    #[test]
    fn a_newest_page_counts_skipped_points_as_dropped() {
        let mut r = Ring::new(6);
        fill(&mut r, 10);
        let p = r.page(0, 2, true);
        assert_eq!((seqs(&p), p.dropped, p.more), (vec![9, 10], 8, false));
        let p = r.page(0, 3, false);
        assert_eq!((seqs(&p), p.dropped, p.more), (vec![5, 6, 7], 4, true));
    }

    #[test]
    fn keeps_at_most_capacity_points() {
        let mut r = Ring::new(4);
        fill(&mut r, 10);
        assert_eq!(r.points.len(), 4);
        assert_eq!(r.last_seq(), 10);
        let (pts, dropped) = r.since(0);
        assert_eq!(
            pts.iter().map(|p| p.seq).collect::<Vec<_>>(),
            vec![7, 8, 9, 10]
        );
        assert_eq!(dropped, 6);
    }

    #[test]
    fn since_returns_only_newer_points_without_drops() {
        let mut r = Ring::new(8);
        fill(&mut r, 5);
        let (pts, dropped) = r.since(3);
        assert_eq!(
            pts.iter().map(|p| (p.seq, p.pages_4k)).collect::<Vec<_>>(),
            vec![(4, 40), (5, 50)]
        );
        assert_eq!(dropped, 0);
        assert!(r.since(5).0.is_empty());
    }

    #[test]
    fn recycled_points_get_fresh_sequence_numbers() {
        let mut r = Ring::new(2);
        fill(&mut r, 3);
        let p = r.recycle();
        assert_eq!(p.seq, 4);
    }

    #[test]
    fn a_full_ring_keeps_every_point_while_the_next_is_filled() {
        let mut r = Ring::new(3);
        fill(&mut r, 5);
        let p = r.recycle();
        // The point being filled reuses the dropped one's buffers; the ring
        // still holds its three.
        assert_eq!(r.since(0).0.len(), 3);
        r.push(p);
        let (points, dropped) = r.since(0);
        assert_eq!((points.len(), dropped), (3, 3));
        assert_eq!(points.last().unwrap().seq, 6);
    }

    #[test]
    fn empty_ring_reports_nothing() {
        let r = Ring::new(2);
        assert!(r.points.is_empty());
        assert_eq!(r.last_seq(), 0);
        assert_eq!(r.since(0), (vec![], 0));
    }
}
