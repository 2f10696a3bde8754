//! The throttle chosen from the model: for a migration the model says does
//! not converge, the smallest auto-converge throttle and the cheapest dirty
//! limit per vCPU under which it would, each with the throttled
//! migration's prediction and what it takes from the guest
//! (docs/MIGRATION.md, "Making it converge").

use std::time::Duration;

use super::model::{self, Growth, Inputs, Prediction};
use crate::units::saturating_u64;

/// The smallest auto-converge throttle, % (1 to 99), under which the
/// migration `inputs` describe would converge and auto-converge would not
/// step further (the guest dirties at most the trigger's share, half, of
/// what the link sends), and its prediction: a throttled vCPU runs
/// `100 - pct` % of the time, so it dirties that share of its rate. No
/// round limit: the question is whether it converges, not when it is cut.
///
/// `shares`: each vCPU's share of the pages written (`DirtyRate::shares`,
/// one per vCPU). Where some vCPUs write next to nothing, only the others
/// are throttled (`x-cpu-throttle-vcpus`) when that converges and takes no
/// more vCPU time from the guest than throttling every vCPU would: a vCPU
/// that only reads or computes keeps its pace, as under a dirty limit.
/// Otherwise, or without shares, every vCPU, as QEMU's auto-converge.
pub(crate) fn smallest_throttle(inputs: &Inputs, shares: Option<&[f64]>) -> Option<Converge> {
    let all: Vec<usize> = (0..usize::try_from(inputs.vcpus).unwrap_or(0)).collect();
    let every = throttle_of(inputs, 1.0, all.clone());
    let Some(s) = shares.filter(|s| s.len() == all.len()) else {
        return every;
    };
    let writers: Vec<usize> = all.into_iter().filter(|&i| s[i] >= WRITER_SHARE).collect();
    if writers.is_empty() || writers.len() == s.len() {
        return every;
    }
    let held = writers.iter().map(|&i| s[i]).sum::<f64>();
    // The writers alone, unless throttling every vCPU would take less vCPU
    // time from the guest (a throttle of the writers alone at 99 % against
    // every vCPU at 30 %, say).
    match (throttle_of(inputs, held, writers), every) {
        (Some(w), Some(e)) if e.throttle_seconds < w.throttle_seconds => Some(e),
        (Some(w), _) => Some(w),
        (None, e) => e,
    }
}

/// A vCPU that wrote less than this share of a window's pages is not
/// throttled when the others' throttle alone converges.
const WRITER_SHARE: f64 = 0.01;

/// The smallest throttle of `vcpus`, which write `held` of the guest's
/// pages, that converges (see [`smallest_throttle`]).
fn throttle_of(inputs: &Inputs, held: f64, vcpus: Vec<usize>) -> Option<Converge> {
    const MAX_THROTTLE: u32 = 99;
    let trigger = crate::protocol::migration::Parameters::THROTTLE_TRIGGER_PERCENT as f64 / 100.0;
    let converges = |pct: u32| {
        let kept = held * f64::from(100 - pct) / 100.0 + (1.0 - held);
        let throttled = Inputs {
            dirty_rate: inputs.dirty_rate * kept,
            max_rounds: None,
            ..*inputs
        };
        // Under a throttle that leaves the guest dirtying more than the
        // trigger's share of what the link sends, auto-converge steps on
        // (it did, 82 -> 92 %, on a sweep the model had converge at 82 %
        // in 12 passes): the throttle chosen is one it keeps. At 99 % there
        // is no step left to take.
        let dirty_bytes = throttled.dirty_rate * crate::wire::DIRTY_PAGE_WIRE as f64;
        (pct >= MAX_THROTTLE || dirty_bytes <= trigger * throttled.rate())
            .then(|| model::predict(&throttled).ok())
            .flatten()
            .filter(|p| p.converges)
    };
    // Convergence only gets easier as the throttle grows: the first that
    // converges, by bisection.
    converges(MAX_THROTTLE)?;
    let (mut lo, mut hi) = (0u32, MAX_THROTTLE);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if converges(mid).is_some() {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    converges(hi).map(|prediction| Converge {
        pct: hi,
        // Each throttled vCPU sleeps that share of the migration (the
        // throttle starts with it, from the prediction).
        throttle_seconds: prediction.total_seconds * f64::from(hi) / 100.0 * vcpus.len() as f64,
        every: u64::try_from(vcpus.len()).is_ok_and(|n| n == inputs.vcpus),
        vcpus,
        prediction,
    })
}

/// The dirty limit per vCPU, MB/s (2^20 bytes), under which the migration
/// `inputs` describe would converge at the least vCPU time taken from the
/// guest, and its prediction. `rates`
/// are the vCPUs' ring-entry rates over the window, bytes/s; the model's
/// write rate is shared out in their proportion. A limit `L` caps a vCPU's
/// ring entries, so a vCPU over it dirties at most `L` of new pages: its
/// share, capped at `L`. Under a limit every ring entry is taken to be a new
/// page (no saturation of the working set), which no writer beats: the
/// random-write saturation the model fits to a window would let a
/// sequential sweep limited near the link seem to converge when its passes
/// do not shrink. A vCPU under the limit is not slowed. No round limit, as
/// for the throttle.
pub(crate) fn cheapest_dirty_limit(
    inputs: &Inputs,
    rates: &[f64],
    period: Duration,
) -> Option<LimitChoice> {
    use crate::vcpu::dirty_limit::MB;
    if rates.iter().sum::<f64>() <= 0.0 {
        return None;
    }
    let converges = |mb| limit_choice(inputs, rates, mb, period);
    converges(1)?;
    // Convergence only gets harder as the limit grows: the last that
    // converges, by bisection up to the fastest vCPU's rate.
    let top = saturating_u64(rates.iter().copied().fold(0.0, f64::max) / MB as f64) + 1;
    let (mut lo, mut hi) = (1u64, top);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if converges(mid).is_some() {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    // Near the largest limit the passes barely shrink and the migration
    // drags on; a lower one slows the writers more each second but ends
    // sooner. Of the limits that converge (a 5 % grid), the one that takes
    // the least vCPU time from the guest over the whole migration; within
    // 2 % of that, the highest.
    let mut grid = vec![lo];
    while let Some(&last) = grid.last().filter(|&&mb| mb > 1) {
        grid.push((last * 19 / 20).min(last - 1).max(1));
    }
    let choices: Vec<LimitChoice> = grid.into_iter().filter_map(converges).collect();
    let least = choices
        .iter()
        .map(|c| c.throttle_seconds)
        .fold(f64::INFINITY, f64::min);
    choices
        .into_iter()
        .find(|c| c.throttle_seconds <= least * 1.02)
}

/// The migration under a dirty limit of `mb` MB/s per vCPU, if it converges.
fn limit_choice(inputs: &Inputs, rates: &[f64], mb: u64, period: Duration) -> Option<LimitChoice> {
    let total: f64 = rates.iter().sum();
    let limit = (mb * crate::vcpu::dirty_limit::MB) as f64;
    let (mut free, mut held) = (
        0.0,
        model::Limited {
            rate: 0.0,
            burst: 0.0,
            first: 0.0,
        },
    );
    let first_run = crate::vcpu::dirty_limit::SHORTEST_RUN.as_secs_f64();
    let burst = crate::vcpu::dirty_limit::burst(period).as_secs_f64();
    let demands = demands(inputs, rates);
    for (&r, &demand) in rates.iter().zip(&demands) {
        let share = inputs.dirty_rate * r / total;
        if demand > limit {
            // Its bucket: its burst, then the limit. From the moment
            // logging starts until its first counted look, it writes new
            // pages at its tracked pace, the model's write rate (and then
            // sleeps it off): setting the limit kicks it at once, and that
            // look only starts its count, so the first counted look is its
            // first run later, on its own timer. (At the window's entry
            // rate a 64 MiB writer limited from the start came to 80 pages
            // where it wrote ~2,000 in a first run of a timeslice: a
            // downtime of 41 ms against 16 predicted.)
            held.rate += limit / 4096.0;
            held.burst += limit * burst / 4096.0;
            held.first += (demand / 4096.0 * first_run).max(limit * burst / 4096.0);
        } else {
            free += share;
        }
    }
    let limited = Inputs {
        dirty_rate: free,
        growth: Growth::Linear,
        max_rounds: None,
        limited: (held.rate > 0.0).then_some(held),
        ..*inputs
    };
    let prediction = model::predict(&limited).ok().filter(|p| p.converges)?;
    Some(LimitChoice {
        mb,
        vcpus: (0..rates.len()).filter(|&i| rates[i] > limit).collect(),
        // A limited vCPU sleeps the share of its time it would dirty over
        // the limit, for the whole migration.
        throttle_seconds: prediction.total_seconds
            * demands
                .iter()
                .map(|d| (1.0 - limit / d).max(0.0))
                .sum::<f64>(),
        prediction,
    })
}

/// How fast each vCPU would produce ring entries under a limit, bytes/s:
/// the model's write rate shared out in proportion to the vCPUs' entries in
/// the window, or their entry rate if higher. A window's entries stop at
/// the working set (a page counts once until its ring is reset), so a sweep
/// of 128 MiB rewriting it many times a second showed 128 MiB/s of entries
/// in a 1 s window; under a limit below a period's worth of its set, every
/// write it is let do is a new page (each harvest and migration sync
/// protects them again), so it wants entries at its write rate, here 1.3
/// GB/s. Taking the entry rate, a limit of 86 MB/s seemed to cost it 33 %
/// of its time and was chosen over 3 MB/s; it slept 87 % of an 8 s
/// migration against 1.2 s for 3 MB/s.
fn demands(inputs: &Inputs, rates: &[f64]) -> Vec<f64> {
    let total: f64 = rates.iter().sum();
    rates
        .iter()
        .map(|&r| r.max(inputs.dirty_rate * 4096.0 * r / total))
        .collect()
}

/// The dirty limit that makes a migration converge at the least cost to
/// the guest.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitChoice {
    /// The limit per vCPU, MB/s.
    pub(crate) mb: u64,
    /// The vCPUs it slows (the others dirty less than it).
    pub(crate) vcpus: Vec<usize>,
    /// The limited migration's prediction.
    pub(crate) prediction: Prediction,
    /// vCPU time the limit takes from the guest over it, seconds.
    pub(crate) throttle_seconds: f64,
}

/// The smallest auto-converge throttle that makes a migration converge.
#[derive(Debug, Clone, PartialEq)]
pub struct Converge {
    /// The throttle, %.
    pub(crate) pct: u32,
    /// The vCPUs it throttles (every one unless the window told the
    /// writers apart).
    pub(crate) vcpus: Vec<usize>,
    /// `vcpus` is every vCPU.
    pub(crate) every: bool,
    /// The throttled migration's prediction.
    pub(crate) prediction: Prediction,
    /// vCPU time the throttle takes from the guest over it, seconds.
    pub(crate) throttle_seconds: f64,
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The default dirty-limit period.
    const PERIOD: Duration = Duration::from_millis(crate::vcpu::dirty_limit::DEFAULT_PERIOD_MS);

    /// 128 MiB, a writer rewriting 32 MiB at 20,000 pages/s over 20 MB/s:
    /// it does not converge unhelped.
    pub(crate) fn too_fast(vcpus: u64) -> Inputs {
        Inputs {
            total_pages: 32_768,
            nonzero_pages: 32_768,
            dirty_rate: 20_000.0,
            growth: Growth::Uniform(8_192),
            backed_pages: None,
            bandwidth: Some(20e6),
            max_downtime: 0.3,
            vcpus,
            state_extra: 0,
            max_rounds: None,
            stall_per_page: None,
            limited: None,
            costs: crate::wire::Costs::default(),
        }
    }

    #[test]
    fn a_sweep_whose_window_saturates_is_limited_by_its_write_rate_not_its_entries() {
        // 96 MiB swept at 385,000 pages/s over 100 MB/s, beside a reader:
        // a 1 s window saw each page once, 96 MiB/s of entries, but under a
        // limit each write it is let do is a new page.
        let inputs = Inputs {
            total_pages: 65_536,
            nonzero_pages: 25_000,
            dirty_rate: 385_000.0,
            growth: Growth::Sequential(24_577),
            bandwidth: Some(100e6),
            ..too_fast(2)
        };
        let rates = [24_577.0 * 4096.0, 0.0];
        assert_eq!(demands(&inputs, &rates), [385_000.0 * 4096.0, 0.0]);
        let c = cheapest_dirty_limit(&inputs, &rates, PERIOD).expect("a limit converges");
        // A high limit drags the migration on with the writer asleep most
        // of it: the choice is a low one, under a quarter of the 96 MB/s
        // of entries the window saw (16 MB/s with a timeslice's first
        // slice, 10 with half of one).
        assert!(c.mb <= 24, "{} MB/s chosen", c.mb);
        // Limited from the start, it writes at its write rate from when
        // logging starts until its first counted look, its first run later:
        // at 1 MB/s (256 pages a second) the last pass holds at least that run.
        let slice = 385_000.0 * crate::vcpu::dirty_limit::SHORTEST_RUN.as_secs_f64();
        let low = limit_choice(&inputs, &rates, 1, PERIOD).expect("1 MB/s converges");
        let last = low.prediction.stop_and_copy.map_or(0, |r| r.pages);
        assert!(last as f64 >= slice, "{last} pages in the last pass");
        if let Some(high) = limit_choice(&inputs, &rates, 80, PERIOD) {
            assert!(
                high.throttle_seconds > 2.0 * c.throttle_seconds,
                "80 MB/s: {} s, {} MB/s: {} s",
                high.throttle_seconds,
                c.mb,
                c.throttle_seconds
            );
        }
    }

    #[test]
    fn the_dirty_limit_chosen_costs_the_guest_least_and_spares_the_quiet_vcpu() {
        use crate::vcpu::dirty_limit::MB;
        let inputs = too_fast(2);
        // vCPU 0 writes it all; vCPU 1 dirties 0.5 MB/s.
        let rates = [20_000.0 * 4096.0, 0.5 * MB as f64];
        let c = cheapest_dirty_limit(&inputs, &rates, PERIOD).expect("a limit converges");
        assert!(c.prediction.converges);
        assert_eq!(c.vcpus, vec![0], "only the writer is limited");
        assert!(c.throttle_seconds > 0.0);
        // No limit that converges costs the guest noticeably less.
        let costs: Vec<(u64, f64)> = (1..=80)
            .filter_map(|mb| limit_choice(&inputs, &rates, mb, PERIOD))
            .map(|l| (l.mb, l.throttle_seconds))
            .collect();
        assert!(costs.len() > 1, "{costs:?}");
        assert!(
            costs.iter().all(|&(_, t)| c.throttle_seconds <= t * 1.06),
            "{} MB/s: {} s, against {costs:?}",
            c.mb,
            c.throttle_seconds
        );
        // A limit past the link never converges: every entry a new page.
        assert!(limit_choice(&inputs, &rates, 20, PERIOD).is_none());
        let hopeless = Inputs {
            bandwidth: Some(1.0),
            ..inputs
        };
        assert!(cheapest_dirty_limit(&hopeless, &rates, PERIOD).is_none());
        assert!(cheapest_dirty_limit(&inputs, &[0.0, 0.0], PERIOD).is_none());
        // The bucket saves up 20 ms of the limit whatever the period
        // (x-vcpu-dirty-limit-period), less only for a shorter period.
        let long = limit_choice(&inputs, &rates, c.mb, PERIOD * 5).map(|l| l.prediction);
        assert_eq!(long.as_ref(), Some(&c.prediction));
        let short = limit_choice(&inputs, &rates, c.mb, Duration::from_millis(5))
            .expect("a smaller burst converges too")
            .prediction;
        assert!(short.total_bytes <= c.prediction.total_bytes, "{short:?}");
    }

    #[test]
    fn the_throttle_chosen_is_the_smallest_that_converges() {
        let inputs = too_fast(1);
        assert!(
            !model::predict(&inputs).unwrap().converges,
            "the case needs a throttle"
        );
        let c = smallest_throttle(&inputs, None).expect("a throttle converges");
        assert_eq!(c.vcpus, vec![0]);
        assert!((1..=99).contains(&c.pct), "{}", c.pct);
        assert!(c.prediction.converges);
        // One less either does not converge or leaves the guest dirtying
        // more than the trigger's half of the link, where auto-converge
        // would step on.
        let less = Inputs {
            dirty_rate: inputs.dirty_rate * f64::from(100 - (c.pct - 1)) / 100.0,
            ..inputs
        };
        let over_trigger =
            less.dirty_rate * crate::wire::DIRTY_PAGE_WIRE as f64 > 0.5 * less.rate();
        assert!(
            over_trigger || !model::predict(&less).unwrap().converges,
            "{} % is the smallest",
            c.pct
        );
        let kept = Inputs {
            dirty_rate: inputs.dirty_rate * f64::from(100 - c.pct) / 100.0,
            ..inputs
        };
        assert!(kept.dirty_rate * crate::wire::DIRTY_PAGE_WIRE as f64 <= 0.5 * kept.rate());
        assert!(c.throttle_seconds > 0.0);
        // A link that cannot keep up whatever the throttle: none.
        let hopeless = Inputs {
            bandwidth: Some(1.0),
            ..inputs
        };
        assert!(smallest_throttle(&hopeless, None).is_none());
    }

    #[test]
    fn a_vcpu_that_writes_nothing_is_left_unthrottled_when_the_writers_throttle_converges() {
        let inputs = too_fast(2);
        let every = smallest_throttle(&inputs, None).expect("a throttle converges");
        assert_eq!(every.vcpus, vec![0, 1]);
        // vCPU 1 read: the writer alone is throttled, to the same percentage
        // (it writes all the pages), at half the vCPU time.
        let c = smallest_throttle(&inputs, Some(&[1.0, 0.0])).expect("converges");
        assert_eq!((c.vcpus.clone(), c.pct), (vec![0], every.pct));
        assert!((c.throttle_seconds * 2.0 - every.throttle_seconds).abs() < 1e-9);
        // Two writers of 70 and 30 %, a reader: both writers, not the reader.
        let three = too_fast(3);
        let c = smallest_throttle(&three, Some(&[0.7, 0.3, 0.0])).unwrap();
        assert_eq!(c.vcpus, vec![0, 1]);
        // A writer of 0.5 % left free still lets the others converge.
        let c = smallest_throttle(&three, Some(&[0.6, 0.395, 0.005])).unwrap();
        assert_eq!(c.vcpus, vec![0, 1]);
        assert!(
            c.pct >= every.pct,
            "the free writer's pages need more of the others"
        );
        // When the one left free writes too much for any throttle of the
        // others (no step below 100 % converges), every vCPU is throttled.
        let heavy = Inputs {
            dirty_rate: 300_000.0,
            ..too_fast(3)
        };
        let c =
            smallest_throttle(&heavy, Some(&[0.991, 0.0, 0.009])).expect("99 % of all converges");
        assert_eq!((c.vcpus, c.pct), (vec![0, 1, 2], 99));
    }

    #[test]
    fn the_largest_throttle_is_chosen_when_only_it_converges_even_above_the_trigger() {
        // A writer making 260,000 new pages/s over a 32 MiB set (a random
        // writer here, where every new page takes a fault) on a 20 MB/s
        // link: at 99 % it still dirties 10.7 MB/s, over the trigger's half
        // of the link, but its passes shrink, and auto-converge has no step
        // left to take.
        let inputs = Inputs {
            dirty_rate: 260_000.0,
            growth: Growth::Sequential(8_193),
            ..too_fast(1)
        };
        let at_99 = Inputs {
            dirty_rate: 2_600.0,
            ..inputs
        };
        assert!(at_99.dirty_rate * crate::wire::DIRTY_PAGE_WIRE as f64 > 0.5 * at_99.rate());
        assert!(model::predict(&at_99).unwrap().converges);
        let c = smallest_throttle(&inputs, None).expect("99 % converges");
        assert_eq!(c.pct, 99);
    }

    #[test]
    fn shares_that_are_not_one_per_vcpu_throttle_every_vcpu() {
        let c = smallest_throttle(&too_fast(2), Some(&[1.0])).expect("converges");
        assert_eq!(c.vcpus, vec![0, 1]);
    }
}
