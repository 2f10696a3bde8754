//! The guest's own count of its work (the mailbox's `progress`, guest ABI 3):
//! pages touched, read or verified, page writes of `dirty`, exits of `exits`,
//! stored by the guest as it goes. The VMM reads it from guest RAM whenever it
//! likes (one atomic load, no exit, no kick), and sets its rate against the
//! rate before something slowed the guest: what a migration, a throttle or a
//! dirty limit cost the guest in its own units, not in the VMM's.
//!
//! Units differ between commands (a page read is not a page written), so a
//! rate is only comparable with the same vCPU running the same kind of
//! command. A guest that does not store it (another ELF, ABI 2) reads 0.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use vm_memory::{Bytes, GuestAddress};

use crate::abi::mailbox_offset;
use crate::boot::mailbox_addr;
use crate::memory::GuestMemory;

/// Where one vCPU's guest keeps its count.
pub(crate) struct Counter {
    mem: GuestMemory,
    at: GuestAddress,
}

impl Counter {
    /// vCPU `index`'s counter in `mem`.
    pub(crate) fn new(mem: GuestMemory, index: usize) -> Counter {
        Counter {
            mem,
            at: GuestAddress(mailbox_addr(index as u64) + mailbox_offset::PROGRESS),
        }
    }

    /// The count now (`None`: the mailbox is outside guest RAM).
    pub(crate) fn read(&self) -> Option<u64> {
        self.mem.load(self.at, Ordering::Relaxed).ok()
    }
}

/// Over how long [`Meter`] takes a rate.
pub(crate) const RATE_SPAN: Duration = Duration::from_secs(1);

/// Every vCPU's rate over the last [`RATE_SPAN`], from readings taken at
/// any pace (the `vmm-stats` thread's, every 100 ms), over the readings of
/// the command it runs now only (units differ between commands, and a rate
/// across two, a `touch` then a paced `dirty`, compares nothing), since it
/// was last paused (a pause is the host's, not the guest's: a rate over
/// one read a writer of 55.6 M/s as 24.3 M/s, and none while paused).
#[derive(Default)]
pub(crate) struct Meter {
    readings: VecDeque<Reading>,
    /// Each vCPU's command, the last one seen running.
    commands: Vec<u64>,
}

/// One reading of [`Meter`]'s: when, each vCPU's count, the command it
/// counted for, and whether it was paused.
struct Reading {
    at: Instant,
    counts: Vec<Option<u64>>,
    commands: Vec<u64>,
    paused: Vec<bool>,
}

impl Meter {
    /// Adds the counts read at `at` (one per vCPU, `None` where unreadable)
    /// with the command each vCPU runs (its sequence number; `None` while it
    /// runs none, waiting or parked: then the last one seen) and whether
    /// each is paused (missing: not), and returns each vCPU's rate, units
    /// per second, over the readings of the last [`RATE_SPAN`] taken during
    /// its current command since it was last paused: `None` until they span
    /// half of it, while it is paused, and while the count read is below the
    /// one a span ago (the count is the guest's to write: a guest that
    /// lowers it has no rate until a span has passed).
    pub(crate) fn add(
        &mut self,
        at: Instant,
        counts: Vec<Option<u64>>,
        running: &[Option<u64>],
        paused: &[bool],
    ) -> Vec<Option<f64>> {
        let n = counts.len();
        self.commands.resize(n, 0);
        for (c, r) in self.commands.iter_mut().zip(running) {
            if let Some(r) = r {
                *c = *r;
            }
        }
        let paused = (0..n)
            .map(|i| paused.get(i).copied().unwrap_or(false))
            .collect();
        self.readings.push_back(Reading {
            at,
            counts,
            commands: self.commands.clone(),
            paused,
        });
        while self
            .readings
            .get(1)
            .is_some_and(|r| at.saturating_duration_since(r.at) >= RATE_SPAN)
        {
            self.readings.pop_front();
        }
        let Some(Reading {
            at: t1,
            counts: last,
            ..
        }) = self.readings.back()
        else {
            return vec![None; n];
        };
        (0..n)
            .map(|i| {
                let command = self.commands[i];
                // The readings at the end of this command, since a pause.
                let Reading {
                    at: t0,
                    counts: first,
                    ..
                } = self
                    .readings
                    .iter()
                    .rev()
                    .take_while(|r| {
                        r.commands.get(i) == Some(&command) && r.paused.get(i) == Some(&false)
                    })
                    .last()?;
                let span = t1.saturating_duration_since(*t0).as_secs_f64();
                match (first.get(i).copied().flatten(), last[i]) {
                    (Some(a), Some(b)) if span >= RATE_SPAN.as_secs_f64() / 2.0 => {
                        b.checked_sub(a).map(|d| d as f64 / span)
                    }
                    _ => None,
                }
            })
            .collect()
    }
}

/// Each vCPU's progress over a period (a migration's pre-copy), against
/// its rate just before it.
pub(crate) struct Period {
    start: Instant,
    at_start: Vec<Option<u64>>,
    before: Vec<Option<f64>>,
    /// Counts and time at the end, once it ended (the guest stopped).
    end: Option<(Instant, Vec<Option<u64>>)>,
}

impl Period {
    /// A period starting now, at `counts`, after rates `before`.
    pub(crate) fn begin(counts: Vec<Option<u64>>, before: Vec<Option<f64>>) -> Period {
        Period {
            start: Instant::now(),
            at_start: counts,
            before,
            end: None,
        }
    }

    /// Ends the period at `counts` (later reports keep these).
    pub(crate) fn end(&mut self, counts: Vec<Option<u64>>) {
        self.end.get_or_insert((Instant::now(), counts));
    }

    /// Each vCPU's figures, with `counts` now where the period has not ended.
    pub(crate) fn figures(&self, counts: &[Option<u64>]) -> Vec<Figures> {
        let (until, now) = match &self.end {
            Some((t, c)) => (*t, c.as_slice()),
            None => (Instant::now(), counts),
        };
        let secs = until.saturating_duration_since(self.start).as_secs_f64();
        (0..self.at_start.len())
            .map(|i| {
                let done = match (self.at_start[i], now.get(i).copied().flatten()) {
                    // A guest that lowered its count has no figure.
                    (Some(a), Some(b)) => b.checked_sub(a),
                    _ => None,
                };
                Figures {
                    done,
                    per_second: done.filter(|_| secs > 0.0).map(|d| d as f64 / secs),
                    before_per_second: self.before.get(i).copied().flatten(),
                }
            })
            .collect()
    }
}

/// One vCPU's progress over a period.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Figures {
    /// Units done in the period.
    pub(crate) done: Option<u64>,
    /// Units per second in it.
    pub(crate) per_second: Option<f64>,
    /// Units per second over the [`RATE_SPAN`] before it.
    pub(crate) before_per_second: Option<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_is_taken_over_the_last_second_of_readings() {
        let mut m = Meter::default();
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        assert_eq!(m.add(at(0), vec![Some(0), None], &[], &[]), [None, None]);
        assert_eq!(
            m.add(at(400), vec![Some(400), None], &[], &[]),
            [None, None],
            "under half a span"
        );
        let r = m.add(at(500), vec![Some(500), Some(7)], &[], &[]);
        assert_eq!(r[0], Some(1000.0));
        assert_eq!(r[1], None, "unreadable at the start of the span");
        // The guest speeds up to 3000/s from 1 s on; the readings before
        // 1 s ago drop out.
        m.add(at(1000), vec![Some(1000), Some(7)], &[], &[]);
        let r = m.add(at(2000), vec![Some(4000), Some(7)], &[], &[]);
        assert_eq!(r, [Some(3000.0), Some(0.0)]);
    }

    #[test]
    fn the_rate_is_the_current_commands_only() {
        let mut m = Meter::default();
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        // Command 1 counts 10,000 units/s for 0.8 s; command 2, from 0.8 s, 1,000/s.
        m.add(at(0), vec![Some(0)], &[Some(1)], &[]);
        m.add(at(800), vec![Some(8000)], &[Some(1)], &[]);
        let r = m.add(at(1000), vec![Some(8200)], &[Some(2)], &[]);
        assert_eq!(r, [None], "0.2 s of command 2: under half a span");
        let r = m.add(at(1500), vec![Some(8700)], &[Some(2)], &[]);
        assert_eq!(r, [Some(1000.0)], "not (8700 - 0) / 1.5 s");
        // Waiting or parked, a vCPU keeps its last command's readings.
        let r = m.add(at(1600), vec![Some(8700)], &[None], &[]);
        assert_eq!(r, [Some(500.0 / 0.6)]);
    }

    /// A pause is the host's: the rate is taken over the readings since it,
    /// none while it lasts (a writer of 1,000/s paused 3 s read 300/s a
    /// second after; a paced one catching up, its catching up only).
    #[test]
    fn the_rate_leaves_out_the_time_a_vcpu_was_paused() {
        let mut m = Meter::default();
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        m.add(at(0), vec![Some(0)], &[Some(1)], &[]);
        assert_eq!(
            m.add(at(600), vec![Some(600)], &[Some(1)], &[]),
            [Some(1000.0)]
        );
        for t in (700..=3600).step_by(100) {
            let r = m.add(at(t), vec![Some(700)], &[None], &[true]);
            assert_eq!(r, [None], "paused at {t} ms");
        }
        m.add(at(3700), vec![Some(700)], &[Some(1)], &[]);
        assert_eq!(
            m.add(at(4000), vec![Some(1000)], &[Some(1)], &[]),
            [None],
            "0.3 s since"
        );
        assert_eq!(
            m.add(at(4300), vec![Some(1300)], &[Some(1)], &[]),
            [Some(1000.0)]
        );
    }

    #[test]
    fn a_guest_that_lowers_its_count_has_no_rate_until_a_span_has_passed() {
        let mut m = Meter::default();
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        m.add(at(0), vec![Some(u64::MAX - 5)], &[], &[]);
        // Down to 0: not a rate of 2^64 units a second.
        assert_eq!(m.add(at(600), vec![Some(0)], &[], &[]), [None]);
        assert_eq!(m.add(at(1000), vec![Some(100)], &[], &[]), [None]);
        assert_eq!(m.add(at(1600), vec![Some(700)], &[], &[]), [Some(700.0)]);
        let p = Period::begin(vec![Some(50)], vec![None]);
        assert_eq!(p.figures(&[Some(10)])[0].done, None);
        assert_eq!(p.figures(&[Some(10)])[0].per_second, None);
    }

    #[test]
    fn a_period_freezes_at_its_end_and_keeps_the_rate_before() {
        let mut p = Period::begin(vec![Some(10), None], vec![Some(50.0), None]);
        std::thread::sleep(Duration::from_millis(20));
        let f = p.figures(&[Some(30), Some(3)]);
        assert_eq!(f[0].done, Some(20));
        assert!(f[0].per_second.is_some_and(|r| r > 0.0 && r <= 1000.0));
        assert_eq!(f[0].before_per_second, Some(50.0));
        assert_eq!(f[1].done, None, "no count at the start");
        p.end(vec![Some(40), Some(3)]);
        p.end(vec![Some(99), Some(3)]);
        let f = p.figures(&[Some(1000), Some(3)]);
        assert_eq!(
            f[0].done,
            Some(30),
            "the first end counts; later counts do not"
        );
    }
}
