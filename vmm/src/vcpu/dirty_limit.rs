//! A vCPU's dirty page rate limit: QEMU's `set-vcpu-dirty-limit` and its
//! `dirty-limit` migration capability, done from exact counts.
//!
//! QEMU (8.1+) measures each vCPU's dirty rate once a period from its dirty
//! ring and adjusts a sleep taken on every ring-full exit until the measured
//! rate meets the limit, which takes several periods to settle. kvmscope
//! counts the ring entries each vCPU has produced (harvested, whoever did it,
//! and still in its ring: `DirtyLog::ring_entries_now`) and keeps a token
//! bucket per vCPU: the limit accrues as bytes over time, at most
//! [`burst`]'s worth (two looks' worth, not a period's; a period's for a
//! vCPU whose last period was under its limit, [`Bucket`]), each entry spends
//! 4 KiB, and a vCPU in debt sleeps until it is not. The vCPU thread looks
//! after each ring-full exit and when its own timer kicks it out of
//! `KVM_RUN`: [`SHORTEST_RUN`] after the limit is set, then after as long
//! as its fastest recent pace takes to spend a burst (at most a timeslice;
//! the main loop kicks every limited vCPU that is not quiet each timeslice
//! too, and a quiet one as below). A writer far above its limit so runs
//! a fraction of a millisecond and sleeps tens: its rate holds from the
//! first period and within a fraction of a second, where looks a timeslice
//! apart let it write 14 MB at full speed and then sleep 1.4 s at 10 MB/s.
//! Looking does not reset the ring; the vCPU
//! harvests it once a period, as QEMU's reaper does, so that a page
//! rewritten all the time counts about once a period, as in QEMU. A vCPU
//! that dirties nothing never sleeps. One whose pace would not spend its
//! burst within a timeslice and that owes nothing goes **quiet**: no timer
//! of its own, no kick; the main loop, which counts every limited vCPU's
//! ring each timeslice without stopping it, kicks it once it has dirtied
//! half its burst since its last look, or a period after it (its period's
//! harvest and figures; `Vm::kick_throttled`, [`DirtyLimit::wake_due`]). So
//! a vCPU that does not dirty memory takes one exit a period for its
//! limit, near QEMU's, whose limit acts only on ring-full exits (where
//! every limited vCPU looked every timeslice: a reader beside a limited
//! writer took 150-180 signal exits a second).
//!
//! The rates are QEMU's "MB/s": 2^20 bytes a second.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::protocol::migration::Parameters;

/// QEMU's MB in dirty rates: 2^20 bytes.
pub const MB: u64 = 1 << 20;

/// Bytes a ring entry stands for (one 4 KiB page).
const PAGE_BYTES: u64 = 4096;

/// QEMU's `x-vcpu-dirty-limit-period` default, ms.
pub const DEFAULT_PERIOD_MS: u64 = Parameters::DEFAULT_DIRTY_LIMIT_PERIOD_MS;

/// How much of its limit a vCPU may save up: two timeslices' worth (what
/// accrues between two looks, with room for one look late), or the period
/// if shorter. Not a period's worth: a vCPU rewriting pages already logged
/// spends nothing and saved up a whole period (a second of its limit, here
/// its whole 64 MiB working set), which it then spent at full speed after
/// the next reset, in a migration's last pass: 52 MB where the model
/// counted 17 at the limit, a downtime of 270 ms against 151 predicted.
pub(crate) fn burst(period: Duration) -> Duration {
    period.min(super::throttle::TIMESLICE * 2)
}

/// One vCPU's dirty limit, as set, and what it has done over the last period.
#[derive(Debug, Default)]
pub struct DirtyLimit {
    /// The limit, MB/s (0: none).
    limit_mb: AtomicU64,
    /// The period the rate is measured over and a burst allowed, ms.
    period_ms: AtomicU64,
    /// The vCPU's dirty rate over its last period while limited, bytes/s.
    current: AtomicU64,
    /// Time slept for the limit per ring's worth of pages dirtied over the
    /// last period, us (what QEMU calls the throttle time per full ring).
    per_round_us: AtomicU64,
    /// Quiet since when, and its ring's entries then (module docs).
    quiet: Mutex<Option<(u64, Instant)>>,
    /// The main loop woke it from quiet: its next chance is a look, due or
    /// not (its last run, a whole timeslice, may not be over).
    woken: AtomicBool,
}

impl DirtyLimit {
    /// Limits the vCPU to `mb` MB/s measured over `period_ms` (0 lifts it).
    pub(crate) fn set(&self, mb: u64, period_ms: u64) {
        self.period_ms.store(period_ms.max(1), Ordering::Relaxed);
        self.limit_mb.store(mb, Ordering::Release);
        self.wake();
        if mb == 0 {
            self.current.store(0, Ordering::Relaxed);
            self.per_round_us.store(0, Ordering::Relaxed);
        }
    }

    /// The limit in force, MB/s (0: none).
    pub fn limit_mb(&self) -> u64 {
        self.limit_mb.load(Ordering::Acquire)
    }

    /// The vCPU's dirty rate over its last period while limited, MB/s.
    pub fn current_mb(&self) -> u64 {
        self.current_bytes() / MB
    }

    /// The vCPU's dirty rate over its last period while limited, bytes/s.
    pub fn current_bytes(&self) -> u64 {
        self.current.load(Ordering::Relaxed)
    }

    /// Time slept per ring's worth of pages over the last period, us.
    pub fn per_round_us(&self) -> u64 {
        self.per_round_us.load(Ordering::Relaxed)
    }

    /// The vCPU goes quiet with `entries` in its ring's count (module docs).
    pub(crate) fn go_quiet(&self, entries: u64, now: Instant) {
        *crate::lock(&self.quiet) = Some((entries, now));
    }

    /// It looks again (a kick, a ring-full exit, a new limit).
    pub(crate) fn wake(&self) {
        *crate::lock(&self.quiet) = None;
    }

    /// Whether the vCPU must look now: not quiet, or quiet and its ring's
    /// count now (from `count`, asked only of a quiet vCPU; `None` where it
    /// cannot be had at once, which wakes it) is half its burst past its
    /// last look, or a period has gone by since it. A quiet vCPU told to
    /// look is woken (no longer quiet; its next chance is a look,
    /// [`DirtyLimit::take_woken`]).
    pub(crate) fn wake_due(&self, count: impl FnOnce() -> Option<u64>) -> bool {
        let mut quiet = crate::lock(&self.quiet);
        let Some((at, since)) = *quiet else {
            return true;
        };
        let period = self.period();
        let half_burst =
            self.limit_mb().saturating_mul(MB) as f64 * burst(period).as_secs_f64() / 2.0;
        let grown = count().map(|now| now.saturating_sub(at) * PAGE_BYTES);
        let due = grown.is_none_or(|g| g as f64 >= half_burst.max(PAGE_BYTES as f64))
            || since.elapsed() >= period;
        if due {
            *quiet = None;
            self.woken.store(true, Ordering::Release);
        }
        due
    }

    /// Whether the main loop woke it from quiet since it last asked.
    pub(crate) fn take_woken(&self) -> bool {
        self.woken.swap(false, Ordering::AcqRel)
    }

    pub(crate) fn period(&self) -> Duration {
        Duration::from_millis(self.period_ms.load(Ordering::Relaxed).max(1))
    }

    pub(crate) fn publish(&self, figures: PeriodFigures) {
        self.current.store(figures.rate, Ordering::Relaxed);
        self.per_round_us
            .store(figures.per_round_us, Ordering::Relaxed);
    }
}

/// The shortest a limited vCPU runs between two looks, and the first run
/// after its limit is set: a writer at full speed on a software backend
/// (1.4 GB/s of new pages) spends a 20 ms burst of a 10 MB/s limit in
/// 0.14 ms. Shorter looks cost a signal and an exit each for little.
pub(crate) const SHORTEST_RUN: Duration = Duration::from_micros(250);

/// What one run may dirty without counting as a pace, bytes: four pages.
const NOT_A_PACE: u64 = 4 * PAGE_BYTES;

/// How long a vCPU whose pace is `pace` bytes/s may run before its next
/// look: as long as it takes to spend its bucket's most at that pace (at
/// least [`SHORTEST_RUN`]); twice the last run when it dirties nothing;
/// never above a timeslice, the main loop's kick.
fn next_run(pace: f64, most: f64, last: Duration) -> Duration {
    let slice = super::throttle::TIMESLICE;
    let run = if pace <= 0.0 {
        last.saturating_mul(2)
    } else {
        Duration::try_from_secs_f64(most / pace).unwrap_or(slice)
    };
    run.clamp(SHORTEST_RUN, slice)
}

/// What a vCPU did over one period of its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PeriodFigures {
    /// Bytes dirtied per second.
    pub(crate) rate: u64,
    /// Time slept per ring's worth of pages, us.
    pub(crate) per_round_us: u64,
}

/// The share of its limit under which a vCPU's period counts as under it
/// (one held to its limit dirties at about the limit).
const UNDER: f64 = 0.75;

/// How much more than it dirtied in its last period a vCPU under its limit
/// may save up.
const ROOM_MARGIN: f64 = 1.25;

/// The vCPU thread's token bucket for its limit.
#[derive(Debug)]
pub(crate) struct Bucket {
    /// Bytes the vCPU may still dirty (negative: its debt).
    tokens: f64,
    /// What it may save up beyond a [`burst`], bytes, and the limit that was
    /// set against: where its last period, unpaused, was under its limit
    /// ([`UNDER`]), what it dirtied then and a quarter more
    /// ([`ROOM_MARGIN`]), at most a period's worth. A vCPU that dirties
    /// under its limit on average may do it in bursts: a page rewritten all
    /// the time is dirtied again all at once after each period's harvest (a
    /// writer of 1 MB/s under a 2 MB/s limit slept 400 ms a second for it).
    /// One held to its limit, an idle one, and one whose period was paused
    /// (its rate then reads low) keep the small burst (see [`burst`]: a
    /// period's worth spent at full speed after a reset broke a migration's
    /// last pass); a new limit starts from it.
    room: Option<(f64, u64)>,
    /// Whether the vCPU was paused during the current period.
    paused_in_period: bool,
    /// When the tokens were last topped up.
    at: Instant,
    /// Ring entries counted so far.
    entries: u64,
    /// When the vCPU next looks.
    pub(crate) next_check: Instant,
    /// When its last look ended (its sleep over): where its run began.
    resumed: Instant,
    /// How long it runs before its next look.
    run: Duration,
    /// The fastest pace seen (bytes/s), halved every period that passes:
    /// what its runs are sized from. A writer whose last run dirtied little
    /// because its pages were still in the ring writes at full pace again
    /// as soon as the ring is reset (its period's harvest, a window's fold);
    /// a run sized from the last run's pace alone let it write 13-50 MB at
    /// full speed before its next look, then sleep half a second.
    peak: f64,
    /// When it last harvested its ring for the limit.
    harvested: Instant,
    /// The current period: its start, the entries then, the time slept in it.
    period: (Instant, u64, Duration),
}

impl Bucket {
    /// A full bucket (its [`burst`]), its count starting at `entries`,
    /// for a vCPU limited to `limit` bytes/s over `period`.
    pub(crate) fn new(now: Instant, entries: u64, limit: u64, period: Duration) -> Bucket {
        Bucket {
            tokens: limit as f64 * burst(period).as_secs_f64(),
            room: None,
            paused_in_period: false,
            at: now,
            entries,
            next_check: now + SHORTEST_RUN,
            resumed: now,
            run: SHORTEST_RUN,
            peak: 0.0,
            harvested: now,
            period: (now, entries, Duration::ZERO),
        }
    }

    /// Whether the vCPU may go quiet (module docs): at its pace a burst
    /// lasts a whole timeslice or more.
    pub(crate) fn slow(&self) -> bool {
        self.run >= super::throttle::TIMESLICE
    }

    /// After a look that ended at `at` (its sleep included): how long the
    /// vCPU runs until the next (its own timer's kick, or a ring-full exit).
    pub(crate) fn looked(&mut self, at: Instant) -> Duration {
        self.resumed = at;
        self.next_check = at + self.run;
        self.run
    }

    /// Whether the vCPU should look now (its slice is over, or a ring-full
    /// exit set `next_check` to now).
    pub(crate) fn due(&self, now: Instant) -> bool {
        now >= self.next_check
    }

    /// Whether the ring is due for its harvest of the period (and, if so,
    /// the next one counts from `now`).
    pub(crate) fn harvest_due(&mut self, now: Instant, period: Duration) -> bool {
        if now.saturating_duration_since(self.harvested) < period {
            return false;
        }
        self.harvested = now;
        true
    }

    /// Tops the bucket up to `now` at `limit` bytes/s (at most its
    /// [`burst`]), spends the ring entries counted since the last look (`entries`
    /// is the running total) and returns the sleep the vCPU owes.
    pub(crate) fn owe(
        &mut self,
        now: Instant,
        entries: u64,
        limit: u64,
        period: Duration,
    ) -> Duration {
        let small = limit.max(1) as f64 * burst(period).as_secs_f64();
        let most = match self.room {
            Some((room, set_for)) if set_for == limit => room.max(small),
            _ => small,
        };
        let limit = limit.max(1) as f64;
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + limit * elapsed).min(most);
        self.at = now;
        let spent = entries.saturating_sub(self.entries) * PAGE_BYTES;
        self.entries = entries;
        self.tokens -= spent as f64;
        // A vCPU woken from quiet wrote for at most a timeslice before the
        // main loop saw it (it looks at the kick that follows): its pace is
        // over that, not over its quiet time.
        let ran = now
            .saturating_duration_since(self.resumed)
            .min(super::throttle::TIMESLICE);
        // A look with no run since the last (the bucket's first, made at
        // this very look) keeps the run it has: nothing was seen to go by.
        if !ran.is_zero() {
            // A few pages in a short run are any vCPU's own stack and
            // mailbox, not a pace: counted (they are spent), they do not
            // set the peak, which would keep a reader looking every few
            // milliseconds for periods (a full-speed writer's first 250 us
            // are some 85 pages).
            let pace = match spent {
                s if s <= NOT_A_PACE => 0.0,
                s => s as f64 / ran.as_secs_f64(),
            };
            let halvings = elapsed / period.as_secs_f64().max(1e-3);
            self.peak = pace.max(self.peak * 0.5f64.powf(halvings));
            // Sized from the small burst, room or not: a run as long as a
            // roomy bucket lasts at full pace is the grain `burst` avoids.
            self.run = next_run(self.peak, small, self.run);
        }
        if self.tokens >= 0.0 {
            return Duration::ZERO;
        }
        Duration::from_secs_f64(-self.tokens / limit)
    }

    /// The vCPU was paused (parked): its period's rate reads low, so it
    /// earns no room, and it has none until a period after.
    pub(crate) fn paused(&mut self) {
        self.paused_in_period = true;
        self.room = None;
    }

    /// Records `d` slept for the limit (the bucket refills over it at the next look).
    pub(crate) fn slept(&mut self, d: Duration) {
        self.period.2 += d;
    }

    /// At a look: when the period is over, its figures (and a new period
    /// starts, with room for a period's worth if this one was under the
    /// vCPU's `limit`, bytes/s); `ring` is the ring's size in entries.
    pub(crate) fn end_period(
        &mut self,
        now: Instant,
        period: Duration,
        ring: u64,
        limit: u64,
    ) -> Option<PeriodFigures> {
        let (start, entries0, slept) = self.period;
        let elapsed = now.saturating_duration_since(start);
        if elapsed < period {
            return None;
        }
        let pages = self.entries.saturating_sub(entries0);
        let rate = (pages * PAGE_BYTES) as f64 / elapsed.as_secs_f64();
        let per_round_us = if pages == 0 {
            0
        } else {
            crate::units::saturating_u64(slept.as_secs_f64() * 1e6 * ring as f64 / pages as f64)
        };
        self.period = (now, self.entries, Duration::ZERO);
        let bytes = (pages * PAGE_BYTES) as f64;
        let under = rate <= UNDER * limit as f64 && !self.paused_in_period && pages > 0;
        let most = limit as f64 * period.as_secs_f64();
        self.room = under.then(|| ((bytes * ROOM_MARGIN).min(most), limit));
        self.paused_in_period = false;
        Some(PeriodFigures {
            rate: crate::units::saturating_u64(rate),
            per_round_us,
        })
    }
}

/// QEMU's estimate of the time a vCPU takes to fill its ring at `rate`
/// bytes/s (`dirty-limit-ring-full-time`), us; 0 for a vCPU that does not dirty.
pub(crate) fn ring_full_time_us(ring_entries: u64, rate: u64) -> u64 {
    if rate == 0 {
        return 0;
    }
    crate::units::saturating_u64((ring_entries * PAGE_BYTES) as f64 / rate as f64 * 1e6)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: u64 = 4 * MB;

    /// A bucket emptied of its burst, as after a period of writes.
    fn empty(t0: Instant, entries: u64, period: Duration) -> Bucket {
        let mut b = Bucket::new(t0, entries, LIMIT, period);
        b.tokens = 0.0;
        b
    }

    #[test]
    fn a_vcpu_within_its_limit_owes_nothing_and_one_over_it_owes_the_excess() {
        let t0 = Instant::now();
        let second = Duration::from_secs(1);
        let slice = Duration::from_millis(10);
        let mut b = empty(t0, 100, second);
        // 10 ms at 4 MB/s allows 10.24 pages; 10 dirtied: no debt.
        assert_eq!(b.owe(t0 + slice, 110, LIMIT, second), Duration::ZERO);
        // 40 more in the next 10 ms (10.24 allowed, plus the 0.24 left):
        // 29.52 pages over, owed at 1,024 a second.
        let owed = b.owe(t0 + slice * 2, 150, LIMIT, second);
        let want = (40.0 - 10.24 - 0.24) / 1_024.0;
        assert!(
            (owed.as_secs_f64() - want).abs() < 1e-6,
            "{owed:?} vs {want}"
        );
    }

    #[test]
    fn the_burst_is_two_timeslices_of_the_limit_or_the_period() {
        let t0 = Instant::now();
        let period = Duration::from_secs(1);
        let mut b = Bucket::new(t0, 0, LIMIT, period);
        // 20 ms of 4 MB/s: 20.48 pages.
        assert_eq!(
            b.owe(t0, 20, LIMIT, period),
            Duration::ZERO,
            "a full burst at first"
        );
        b.tokens = 0.0;
        // Idle (or rewriting logged pages) for ten seconds: only 20 ms of
        // allowance kept, not the period's 1,024 pages.
        let owed = b.owe(t0 + Duration::from_secs(10), 220, LIMIT, period);
        let want = (200.0 - 20.48) / 1_024.0;
        assert!((owed.as_secs_f64() - want).abs() < 1e-6, "{owed:?}");
        assert_eq!(
            burst(Duration::from_millis(5)),
            Duration::from_millis(5),
            "a period shorter than two slices"
        );
    }

    /// A vCPU whose period was under its limit may dirty a period's worth
    /// at once (its pages again after the harvest) without sleeping; one
    /// held at its limit keeps the small burst.
    #[test]
    fn a_vcpu_under_its_limit_may_burst_a_periods_worth_one_held_at_it_may_not() {
        let t0 = Instant::now();
        let period = Duration::from_secs(1);
        let at = |ms| t0 + Duration::from_millis(ms);
        // 1 MiB a period (a quarter of the limit), all in its first 10 ms:
        // 256 pages where a burst holds about 20.
        let mut b = Bucket::new(t0, 0, LIMIT, period);
        assert!(
            b.owe(at(10), 256, LIMIT, period) > Duration::ZERO,
            "first period: small burst"
        );
        let f = b.end_period(at(1000), period, 4096, LIMIT).unwrap();
        assert!(f.rate < LIMIT / 2);
        let _ = b.owe(at(1000), 256, LIMIT, period);
        assert_eq!(b.owe(at(1900), 256, LIMIT, period), Duration::ZERO);
        assert_eq!(
            b.owe(at(1910), 512, LIMIT, period),
            Duration::ZERO,
            "its 256 pages again at once, under its limit"
        );
        // What it may save up is what it dirtied and a quarter more: 320
        // pages, not a period's 1,024 (it spent 256 of them just now).
        let _ = b.owe(at(2800), 512, LIMIT, period);
        assert_eq!(b.owe(at(2805), 832, LIMIT, period), Duration::ZERO);
        assert!(
            b.owe(at(2810), 900, LIMIT, period) > Duration::ZERO,
            "past its room"
        );
        // A new limit starts from the small burst.
        let _ = b.owe(at(3800), 900, LIMIT * 2, period);
        assert!(b.owe(at(3805), 1_100, LIMIT * 2, period) > Duration::ZERO);
        // Held at the limit: 1,024 pages a second.
        let mut held = Bucket::new(t0, 0, LIMIT, period);
        let _ = held.owe(at(1000), 1_024, LIMIT, period);
        held.end_period(at(1000), period, 4096, LIMIT).unwrap();
        let _ = held.owe(at(1900), 1_024, LIMIT, period);
        assert!(held.owe(at(1910), 1_280, LIMIT, period) > Duration::ZERO);
        // Idle (nothing dirtied), or paused in its period: no room.
        for paused in [false, true] {
            let mut idle = Bucket::new(t0, 0, LIMIT, period);
            let pages = if paused {
                idle.paused();
                100
            } else {
                0
            };
            let _ = idle.owe(at(1000), pages, LIMIT, period);
            idle.end_period(at(1000), period, 4096, LIMIT).unwrap();
            let _ = idle.owe(at(1900), pages, LIMIT, period);
            assert!(
                idle.owe(at(1910), pages + 100, LIMIT, period) > Duration::ZERO,
                "paused: {paused}"
            );
        }
    }

    #[test]
    fn a_period_reports_its_rate_and_the_sleep_per_full_ring() {
        let t0 = Instant::now();
        let period = Duration::from_secs(1);
        let mut b = empty(t0, 0, period);
        let _ = b.owe(t0 + period / 2, 512, LIMIT, period);
        b.slept(Duration::from_millis(250));
        assert_eq!(
            b.end_period(t0 + period / 2, period, 256, LIMIT),
            None,
            "not over"
        );
        let _ = b.owe(t0 + period * 2, 1_024, LIMIT, period);
        let f = b.end_period(t0 + period * 2, period, 256, LIMIT).unwrap();
        assert_eq!(f.rate, 1_024 * 4096 / 2);
        // 250 ms for four rings of 256 entries.
        assert_eq!(f.per_round_us, 62_500);
        b.next_check = t0 + period * 3;
        assert!(!b.due(t0 + period * 2));
        assert!(b.due(t0 + period * 3));
        assert!(b.harvest_due(t0 + period, period), "once a period");
        assert!(!b.harvest_due(t0 + period * 3 / 2, period));
    }

    #[test]
    fn a_vcpu_far_over_its_limit_looks_after_short_runs_and_one_within_it_every_timeslice() {
        let t0 = Instant::now();
        let period = Duration::from_secs(1);
        let slice = crate::vcpu::throttle::TIMESLICE;
        let mut b = Bucket::new(t0, 0, LIMIT, period);
        // The first look after the limit is set comes its shortest run on:
        // the look that made the bucket (nothing owed) keeps that run.
        assert_eq!(b.owe(t0, 0, LIMIT, period), Duration::ZERO);
        assert_eq!(b.looked(t0), SHORTEST_RUN);
        assert!(!b.due(t0 + SHORTEST_RUN / 2));
        assert!(b.due(t0 + SHORTEST_RUN));
        // A full-speed writer: 100 pages in its first 250 us (1.6 GB/s). Its
        // burst (20 ms of 4 MB/s, 80 KiB) goes in 50 us at that pace: the
        // shortest run next, after the sleep it owes.
        let owed = b.owe(t0 + SHORTEST_RUN, 100, LIMIT, period);
        assert!(owed > Duration::from_millis(50), "{owed:?}");
        let woke = t0 + SHORTEST_RUN + owed;
        assert_eq!(b.looked(woke), SHORTEST_RUN);
        assert!(!b.due(woke + SHORTEST_RUN / 2));
        assert!(b.due(woke + SHORTEST_RUN));
        // Its next run dirties nothing (its pages are still in the ring): it
        // still looks after the shortest run, for the ring may be reset at
        // any moment and it writes at full pace again.
        let _ = b.owe(woke + SHORTEST_RUN, 100, LIMIT, period);
        assert_eq!(b.looked(woke + SHORTEST_RUN), SHORTEST_RUN);
        // Its fast pace is forgotten over periods (halved each): 20 s later,
        // a writer under its limit (1 page in 2 ms: 2 MB/s) would take 40 ms
        // to spend its burst: it runs a timeslice, the longest.
        let late = woke + Duration::from_secs(20);
        let _ = b.owe(late, 100, LIMIT, period);
        b.looked(late);
        let _ = b.owe(late + Duration::from_millis(2), 101, LIMIT, period);
        assert_eq!(b.looked(late + Duration::from_millis(2)), slice);
        // At 4 MB/s, its limit, the burst would last 20 ms: a slice.
        let t1 = woke + Duration::from_secs(1);
        let _ = b.owe(t1, 101, LIMIT, period);
        b.looked(t1);
        let _ = b.owe(t1 + Duration::from_millis(4), 105, LIMIT, period);
        assert_eq!(
            b.looked(t1 + Duration::from_millis(4)),
            slice,
            "20 ms: a slice at most"
        );
        // Dirtying nothing, it looks half as often each time, up to a slice.
        let mut b = Bucket::new(t0, 0, LIMIT, period);
        let mut at = t0;
        let mut runs = vec![];
        for _ in 0..8 {
            at += b.run;
            let _ = b.owe(at, 0, LIMIT, period);
            runs.push(b.looked(at).as_micros());
        }
        assert_eq!(
            runs,
            [500, 1_000, 2_000, 4_000, 8_000, 10_000, 10_000, 10_000]
        );
    }

    #[test]
    fn a_few_pages_in_a_short_run_are_no_pace() {
        let t0 = Instant::now();
        let period = Duration::from_secs(1);
        let mut b = Bucket::new(t0, 0, LIMIT, period);
        assert_eq!(b.looked(t0), SHORTEST_RUN);
        // Three pages (a stack, a mailbox) in 250 us: the run doubles, as
        // for none.
        let at = t0 + SHORTEST_RUN;
        assert_eq!(b.owe(at, 3, LIMIT, period), Duration::ZERO);
        assert_eq!(b.looked(at), SHORTEST_RUN * 2);
        assert!(!b.slow());
        // 85 pages in 500 us (a full-speed writer) is a pace: the shortest run.
        let at = at + SHORTEST_RUN * 2;
        b.owe(at, 3 + 85, LIMIT, period);
        assert_eq!(b.looked(at), SHORTEST_RUN);
    }

    #[test]
    fn a_quiet_vcpu_looks_at_half_a_burst_or_after_a_period() {
        let l = DirtyLimit::default();
        l.set(4, 1000);
        let never = || -> Option<u64> { panic!("a vCPU that is not quiet is not counted") };
        assert!(l.wake_due(never), "not quiet: it looks on its own");
        let t0 = Instant::now();
        l.go_quiet(100, t0);
        // 4 MB/s over a 20 ms burst: 81.9 KiB, half of it 10.24 pages.
        assert!(!l.wake_due(|| Some(100)), "nothing dirtied");
        assert!(!l.wake_due(|| Some(110)), "under half a burst");
        assert!(!l.take_woken());
        assert!(l.wake_due(|| Some(111)), "half a burst");
        assert!(l.take_woken(), "its next chance is a look");
        assert!(!l.take_woken(), "once");
        assert!(l.wake_due(never), "woken: no longer quiet");
        // A log too busy to count now wakes it.
        l.go_quiet(100, t0);
        assert!(l.wake_due(|| None));
        // A period after it went quiet, whatever it dirtied.
        if let Some(before) = t0.checked_sub(Duration::from_secs(1)) {
            l.go_quiet(100, before);
            assert!(l.wake_due(|| Some(100)));
        }
        // A new limit wakes it.
        l.go_quiet(100, t0);
        l.set(8, 1000);
        assert!(l.wake_due(never));
    }

    #[test]
    fn the_next_run_spends_a_burst_at_the_pace() {
        let slice = crate::vcpu::throttle::TIMESLICE;
        let ms = Duration::from_millis(1);
        // 400 KiB a millisecond; 200 KiB of burst: half a millisecond.
        assert_eq!(
            next_run(f64::from(400 << 10) * 1e3, f64::from(200 << 10), ms),
            Duration::from_micros(500)
        );
        assert_eq!(next_run(f64::MAX, 1.0, ms), SHORTEST_RUN);
        assert_eq!(next_run(1.0, 1e9, ms), slice);
        assert_eq!(next_run(0.0, 1.0, Duration::from_secs(9)), slice);
    }

    #[test]
    fn the_ring_full_time_is_the_rings_bytes_at_the_rate() {
        assert_eq!(ring_full_time_us(4096, 16 * MB), 1_000_000);
        assert_eq!(ring_full_time_us(4096, 0), 0);
    }
}
