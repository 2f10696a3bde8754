//! The readiness report: each figure with how long it took, the scan's error
//! figures for each estimate, and the migration prediction.

use std::fmt::Write as _;
use std::time::Duration;

use super::converge::{cheapest_dirty_limit, smallest_throttle, Converge, LimitChoice};
use super::error::Error;
use super::model::{self, Growth, Inputs, Prediction};
use super::options::Options;
use super::scan::{Scan, ZeroSample};
use crate::protocol::migration::VcpuSet;
use crate::protocol::readiness::{
    ConvergeReply, CurvePoint, DirtyLimitReply, DirtyRateFigure, EstimateError, LinkFigure,
    MappedFigure, Pages, ReadinessReport, SampledFigure, ScanFigure, StallFigure, TimedPages,
    VcpuStallFigure,
};
use crate::units::{format_bytes, saturating_u64};
use crate::vcpu::stall::{fault_cost, fault_cost_source, Stall};
use crate::vmmstats::VmmStats;
use kvm_stats::Mapped;

/// A figure and the time it took to get.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure<T> {
    /// The figure.
    pub value: T,
    /// How long getting it took.
    pub took: Duration,
}

/// Distinct pages dirtied in a window.
#[derive(Debug, Clone, PartialEq)]
pub struct DirtyRate {
    /// `dirty-bitmap` or `dirty-ring`, as QEMU names its calc-dirty-rate modes.
    pub(crate) mode: &'static str,
    /// How long the guest was watched.
    pub window: Duration,
    /// Pages KVM mapped at the window's end, the log still held.
    pub(crate) mapped_held: u64,
    /// Distinct pages dirtied in the window.
    pub(crate) pages: u64,
    /// `pages` per second of the window.
    pub pages_per_s: f64,
    /// Ring entries harvested per vCPU (ring mode).
    pub(crate) per_vcpu: Option<Vec<u64>>,
    /// Distinct pages at 1/32, 1/16, ... 1/2 of the window (those at least
    /// [`CURVE_STEP_MIN`](super::CURVE_STEP_MIN) in), and when: how the count
    /// grew.
    pub(crate) curve: Vec<(u64, Duration)>,
    /// What the window cost the guest.
    pub stall: Stall,
    /// What the window left behind, `None` where another consumer (a
    /// migration) went on holding the log.
    pub(crate) left: Option<Left>,
}

/// The pages a window leaves: each protected one faults once more when the
/// guest next writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Left {
    /// Pages the guest had mapped that stay write-protected (mapped at the
    /// window's end less `writable`).
    pub(crate) protected: u64,
    /// Pages the window's last look left writable (written after their last
    /// protection).
    pub(crate) writable: u64,
}

impl DirtyRate {
    /// Each vCPU's share of the pages the window saw written, where it can
    /// tell the vCPUs apart: a ring's entries per vCPU, or with the bitmap
    /// the faults each vCPU took on pages logging protected (the stall's
    /// count: a page's first write after each protection faults on the
    /// vCPU that writes it). `None` when nothing was written, or when the
    /// faults account for under half the pages (hardware that logs writes
    /// without faults, such as Intel's PML: no count to share by).
    pub(crate) fn shares(&self) -> Option<Vec<f64>> {
        let counts = match &self.per_vcpu {
            Some(entries) => entries,
            None if self.stall.faults.iter().sum::<u64>() * 2 >= self.pages => &self.stall.faults,
            None => return None,
        };
        let total = counts.iter().sum::<u64>();
        (total > 0).then(|| counts.iter().map(|&c| c as f64 / total as f64).collect())
    }

    /// vCPU time lost per page written after it was protected, seconds: the
    /// window's stall over the faults it caused (each distinct page once with
    /// the bitmap; each ring entry with the ring, whose resets protect again
    /// within the window). `None` when the window saw no write.
    pub(crate) fn stall_per_page(&self) -> Option<f64> {
        let faults = match &self.per_vcpu {
            Some(entries) => entries.iter().sum::<u64>(),
            None => self.pages,
        };
        (faults > 0).then(|| self.stall.total().as_secs_f64() / faults as f64)
    }

    /// Of the pages the window left protected, those the guest's working
    /// set (as the window's model sees it) will write again: its set less
    /// the pages left writable, at most those left. `None` without a working
    /// set seen (a guest the window could not bound may write any of them).
    pub(crate) fn left_to_pay(&self) -> Option<u64> {
        let left = self.left?;
        let set = self.growth().1.working_set()?;
        Some(set.saturating_sub(left.writable).min(left.protected))
    }

    /// Distinct pages at about half the window (the last point of the
    /// curve, when it lies near half).
    pub(crate) fn half(&self) -> Option<u64> {
        let end = self.window.as_secs_f64();
        self.curve
            .last()
            .filter(|(_, t)| t.as_secs_f64() > 0.0 && (end / t.as_secs_f64() - 2.0).abs() <= 0.2)
            .map(|&(p, _)| p)
    }

    /// The curve's last count and when it was taken, when that was near
    /// the middle of the window: from its half (when it was taken) to two
    /// thirds in (a count that came late, on a busy host: the growth after
    /// it is weighed for the time that was left; later, too little of the
    /// window is left to tell a set from a rate a starved vCPU slowed).
    fn midway(&self) -> Option<(u64, f64)> {
        let end = self.window.as_secs_f64();
        self.curve
            .last()
            .map(|&(p, t)| (p, t.as_secs_f64()))
            .filter(|&(_, t)| (0.45 * end..=0.67 * end).contains(&t))
    }

    /// Whether the window's distinct pages were all there by the curve's
    /// first count (within 3 %): a set filled faster than the window looks,
    /// whose rate [`DirtyRate::growth`] can only bound from below and whose
    /// order of writes (a sweep or random) it cannot tell.
    pub(crate) fn full_at_first_count(&self) -> Option<Duration> {
        self.curve
            .first()
            .filter(|&&(p, _)| self.pages > 0 && p as f64 >= 0.97 * self.pages as f64)
            .map(|&(_, t)| t)
    }

    /// The write rate behind the window, pages/s, and how its distinct pages
    /// grow ([`Growth`]), fitted to the curve. When the window's second half
    /// added as much as its first (no working set seen; [`Self::midway`]),
    /// or the window has too few pages or points, the rate is the window's
    /// and the growth linear. Otherwise two shapes are fitted and the closer one (in the
    /// log of each point's count) is taken:
    /// - sequential, `min(r·t, W)`: a sweep counts up at its write rate until
    ///   its set is full, so `r` is the steepest count-over-time of the curve
    ///   and `W` what the window saw;
    /// - uniform, `W·(1 − e^(−r·t/W))`: for each `W` tried (from what the
    ///   window saw to 20 times that), each point gives an `r`; their
    ///   geometric mean is the fit for that `W`, and the `W` that fits best
    ///   is taken.
    ///
    /// A curve already flat at its first point (a set filled faster than
    /// that) gives only a lower bound on `r`: the first point's count over
    /// its time.
    pub(crate) fn growth(&self) -> (f64, Growth) {
        let end = self.window.as_secs_f64();
        let linear = (self.pages_per_s, Growth::Linear);
        let points: Vec<(f64, f64)> = self
            .curve
            .iter()
            .map(|&(p, t)| (t.as_secs_f64(), p as f64))
            .chain([(end, self.pages as f64)])
            .filter(|&(t, p)| t > 0.0 && p >= MIN_FIT_PAGES)
            .collect();
        let (Some((mid, at)), [.., _, _]) = (self.midway(), points.as_slice()) else {
            return linear;
        };
        // What the rest of the window added against what it would have at
        // the count's rate so far (as much again after the half): 90 % of
        // that or more is a rate with no working set in sight.
        let rest = end / at - 1.0;
        if (mid as f64) < MIN_FIT_PAGES || self.pages as f64 / mid as f64 - 1.0 >= 0.9 * rest {
            return linear;
        }
        let seen = self.pages;
        let (r_seq, misfit_seq) = fit_sequential(&points, seen as f64);
        let (r_uni, w_uni, misfit_uni) = fit_uniform(&points, seen as f64);
        if misfit_seq < misfit_uni {
            (r_seq, Growth::Sequential(seen))
        } else {
            (r_uni, Growth::Uniform(saturating_u64(w_uni.round())))
        }
    }
}

/// Whether KVM maps far fewer pages than the host backs (over twice as
/// many backed, and at least 1 MiB more): mapped is then no bound on
/// non-zero pages. A VM that migrated in holds RAM its VMM wrote, which KVM
/// maps only as the guest touches it again (a 32 MiB guest read 0 B mapped,
/// 32 MiB resident); so do pages KVM's MMU let go (swap, KSM, page migration).
/// The host-resident count bounds them (a page the host does not back is
/// zero, or swapped out).
fn under_mapped(mapped: u64, resident: u64) -> bool {
    resident > mapped.saturating_mul(2) && resident - mapped >= SLACK_PAGES
}

/// Pages two page counts may differ by and still be read as the same (1 MiB).
const SLACK_PAGES: u64 = 256;

/// Pages below which a count says too little about a rate.
const MIN_FIT_PAGES: f64 = 64.0;

/// How far counts `points` (time, pages) are from `model`: the sum of the
/// squared logs of their ratios.
fn misfit(points: &[(f64, f64)], model: impl Fn(f64) -> f64) -> f64 {
    points
        .iter()
        .map(|&(t, p)| (model(t).max(1.0) / p).ln().powi(2))
        .sum()
}

/// A sweep of `w` pages: its rate (the steepest count over time) and misfit.
fn fit_sequential(points: &[(f64, f64)], w: f64) -> (f64, f64) {
    let r = points.iter().map(|&(t, p)| p / t).fold(0.0, f64::max);
    (r, misfit(points, |t| (r * t).min(w)))
}

/// Uniform writes: the rate, the working set and the misfit of the set
/// (from `seen` pages up) that fits best.
fn fit_uniform(points: &[(f64, f64)], seen: f64) -> (f64, f64, f64) {
    const STEPS: i32 = 200;
    let mut best = (0.0, seen, f64::INFINITY);
    for k in 0..=STEPS {
        // 1.0005x to 20x the pages seen, geometrically.
        let w = seen * 1.0005 * (20.0f64 / 1.0005).powf(f64::from(k) / f64::from(STEPS));
        let logs: Vec<f64> = points
            .iter()
            .map(|&(t, p)| (-w * (-p / w).ln_1p() / t).ln())
            .collect();
        let r = (logs.iter().sum::<f64>() / logs.len() as f64).exp();
        let m = misfit(points, |t| {
            Growth::Uniform(saturating_u64(w)).distinct(r * t)
        });
        if m < best.2 {
            best = (r, w, m);
        }
    }
    best
}

/// What the report holds.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// Pages of guest RAM.
    pub(crate) ram_pages: u64,
    /// Guest memory KVM maps, by page size (the stats-only estimate).
    pub(crate) mapped: Figure<Mapped>,
    /// The most pages KVM has mapped at once, as the VMM kept count
    /// (`super::MappedPeak`; `None` where it does not).
    pub(crate) mapped_peak: Option<u64>,
    /// The pages a migration in left holding data (0: the VM did not
    /// migrate in, or the VMM does not keep count).
    pub(crate) loaded_pages: u64,
    /// Host-resident pages of the guest-RAM mapping.
    pub(crate) resident: Figure<u64>,
    /// A sample of them read for zeros (`None` where none was taken).
    pub sampled: Option<Figure<ZeroSample>>,
    /// Pages written since boot (dirty logging).
    pub written: Option<Figure<u64>>,
    /// The dirty rate, when a window was measured.
    pub dirty_rate: Option<Figure<DirtyRate>>,
    /// Whether the VM has a dirty log (`run --dirty-log`): without one no
    /// window can be measured; with one, none was asked for (`calc-time` 0).
    pub(crate) dirty_logged: bool,
    /// The exact zero-page scan, when asked for.
    pub scan: Option<Figure<Scan>>,
    /// The pre-copy prediction, when the inputs allow one.
    pub prediction: Option<Prediction>,
    /// When the prediction does not converge: the smallest auto-converge
    /// throttle under which it would (`None` also when even 99 % would not).
    pub converge: Option<Converge>,
    /// When the prediction does not converge on a ring VM: the dirty limit
    /// per vCPU under which it would at the least cost to the guest (`None`
    /// also when even 1 MB/s would not, or the window gave no per-vCPU rates).
    pub converge_dirty_limit: Option<LimitChoice>,
    /// Which non-zero estimate the prediction used.
    pub estimate_used: &'static str,
    /// The link and downtime limit the prediction is for.
    pub(crate) link: Link,
}

/// The link a prediction is for, and where it came from.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct Link {
    /// Bytes per second; `None`: unlimited.
    pub(crate) bandwidth: Option<f64>,
    /// The downtime limit.
    pub(crate) max_downtime: Duration,
    /// Where the bandwidth came from: `request`, `migration-parameters` or `default`.
    pub(crate) from: &'static str,
    /// Where the downtime limit came from, the same way.
    pub(crate) downtime_from: &'static str,
}

/// A duration as people read it: microseconds below a millisecond, else milliseconds.
fn took(d: Duration) -> String {
    if d < Duration::from_millis(1) {
        format!("{:.1} us", d.as_secs_f64() * 1e6)
    } else {
        format!("{:.2} ms", d.as_secs_f64() * 1e3)
    }
}

/// How far an estimate of non-zero pages is from the scan's count.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScanFigures {
    /// Non-zero pages the estimate counts.
    pub(crate) estimate_pages: u64,
    /// The estimate minus the scan's count (positive: it counts too many).
    pub(crate) error_pages: i64,
    /// `error / truth` (infinite when the truth is 0 and the estimate is not).
    pub(crate) relative: f64,
}

fn error_of(estimate: u64, truth: u64) -> ScanFigures {
    // Page counts of one guest: far below i64::MAX, saturating all the same.
    let error = i64::try_from(i128::from(estimate) - i128::from(truth))
        .unwrap_or(if estimate > truth { i64::MAX } else { i64::MIN });
    let relative = if truth == 0 {
        if error == 0 {
            0.0
        } else {
            f64::INFINITY
        }
    } else {
        error as f64 / truth as f64
    };
    ScanFigures {
        estimate_pages: estimate,
        error_pages: error,
        relative,
    }
}

impl Report {
    /// Mapped bytes as 4 KiB pages: the stats-only upper bound on non-zero pages.
    pub fn mapped_pages(&self) -> u64 {
        self.mapped.value.bytes() / 4096
    }

    /// Each estimate against the scan: (name, figures).
    pub(crate) fn errors(&self) -> Vec<(&'static str, ScanFigures)> {
        let Some(scan) = &self.scan else {
            return Vec::new();
        };
        let truth = scan.value.nonzero_pages;
        let mut out = vec![
            ("mapped", error_of(self.mapped_pages(), truth)),
            ("resident", error_of(self.resident.value, truth)),
        ];
        if let Some(s) = &self.sampled {
            out.push(("sampled", error_of(s.value.estimate(), truth)));
        }
        if let Some(w) = &self.written {
            out.push(("written", error_of(w.value, truth)));
        }
        if let Some(peak) = self.mapped_let_go() {
            out.push(("mapped-peak", error_of(peak, truth)));
        }
        out
    }

    /// Writes the figures into the VMM's own stats (`vmmstats`): what the
    /// exporter shows per VM with no request. Stats this report has no figure
    /// for are 0; `readiness_at_ns` says when they were measured.
    ///
    /// A measurement without a dirty-rate window is not published over one
    /// with a window (its prediction assumes no dirtying: one client's quick
    /// `calc-time 0` question would otherwise replace, on every scraper's
    /// page, a verdict that measured the guest); says whether it published.
    pub(crate) fn publish(&self, stats: &VmmStats, at_ns: u64) -> bool {
        use crate::vmmstats::VmStat::*;
        if self.dirty_rate.is_none() && stats.vm_value(ReadinessWindowNs) > 0 {
            return false;
        }
        // Before the verdict it compares with is overwritten.
        let streak = verdict_streak(stats, self.prediction.as_ref());
        let ns = |seconds: f64| {
            if seconds.is_finite() {
                saturating_u64(seconds * 1e9)
            } else {
                u64::MAX
            }
        };
        // The estimate the prediction takes (a VM that migrated in: the
        // host-resident count, not its near-zero mapped pages).
        let (nonzero, _) = self.nonzero_used();
        let rate = self.dirty_rate.as_ref().map(|d| &d.value);
        stats.set_vm(ReadinessMapped, self.mapped.value.bytes());
        stats.set_vm(ReadinessNonzero, nonzero.saturating_mul(4096));
        stats.set_vm(
            ReadinessWindowNs,
            rate.map_or(0, |r| saturating_u64(r.window.as_secs_f64() * 1e9)),
        );
        stats.set_vm(
            ReadinessDirtyBytesPerSecond,
            rate.map_or(0, |r| saturating_u64(r.pages_per_s * 4096.0)),
        );
        stats.set_vm(
            ReadinessGuestStallNs,
            rate.map_or(0, |r| saturating_u64(r.stall.total().as_secs_f64() * 1e9)),
        );
        let p = self.prediction.as_ref();
        // The streak before the verdict: a reader between the two sees a
        // streak of 1 with the old verdict (unsettled), never an old streak
        // with a verdict that just changed.
        stats.set_vm(PredictionVerdictStreak, streak);
        stats.set_vm(PredictionConverges, p.map_or(0, |p| u64::from(p.converges)));
        stats.set_vm(PredictionTotalTimeNs, p.map_or(0, |p| ns(p.total_seconds)));
        stats.set_vm(PredictionDowntimeNs, p.map_or(0, |p| ns(p.downtime)));
        // A migration that never ends never stops sending (the model's
        // bytes are where it gave up): never, as its total time.
        stats.set_vm(
            PredictionTransferred,
            p.map_or(0, |p| if p.ends() { p.total_bytes } else { u64::MAX }),
        );
        stats.set_vm(
            PredictionGuestStallNs,
            p.and_then(|p| p.stall).map_or(0, ns),
        );
        stats.set_vm(
            PredictionBandwidthBytesPerSecond,
            self.link.bandwidth.map_or(0, saturating_u64),
        );
        let throttle = match (p, &self.converge) {
            (Some(p), _) if p.converges => 0,
            (_, Some(c)) => u64::from(c.pct),
            _ => 100,
        };
        stats.set_vm(PredictionThrottlePercentage, throttle);
        // Last: a reader that sees the new instant sees the figures above.
        stats.set_vm(ReadinessAtNs, at_ns);
        true
    }

    /// The best bound on non-zero pages without a scan, and its name: the
    /// mapped pages, unless the host backs far more than KVM maps
    /// ([`under_mapped`]), or KVM let go of mappings whose pages still hold
    /// data ([`Self::mapped_let_go`]): then the larger of the host-resident
    /// count (the pages mapped once and let go are among them, as are those
    /// mapped at other times, which the most mapped at once may not count)
    /// and the most KVM has mapped (above resident only where the host
    /// swapped some out).
    ///
    /// Where a sample of the resident pages read for zeros finds clearly
    /// fewer non-zero pages than that bound (memory written with zeros or
    /// only read, huge pages written sparsely), the sample's estimate
    /// instead: clearly, by [`SLACK_PAGES`] and by three of its standard
    /// deviations (tens of MiB on a guest of many GiB whose share of zero
    /// pages is far from none or all), so that a bound that is near the
    /// truth is not traded for the sample's noise. Not against the most
    /// mapped, which stands for pages swapped out that the sample cannot
    /// draw; where KVM let mappings go, the sample counts at least that most.
    fn nonzero_bound(&self) -> (u64, &'static str) {
        let (bound, name) = self.mapped_bound();
        let Some(s) = self.sampled.as_ref().map(|s| s.value) else {
            return (bound, name);
        };
        let estimate = s
            .estimate()
            .max(self.mapped_let_go().unwrap_or(0))
            .min(self.ram_pages);
        let margin = SLACK_PAGES.max(saturating_u64((3.0 * s.deviation()).ceil()));
        if name != "mapped-peak" && estimate.saturating_add(margin) < bound {
            (estimate, "sampled")
        } else {
            (bound, name)
        }
    }

    /// The bound from what KVM maps and the host backs, as
    /// [`Self::nonzero_bound`] says.
    fn mapped_bound(&self) -> (u64, &'static str) {
        let mapped = self.mapped_pages().min(self.ram_pages);
        let resident = self.resident.value.min(self.ram_pages);
        if under_mapped(mapped, resident) {
            return (resident, "resident");
        }
        match self.mapped_let_go() {
            Some(peak) if resident >= peak => (resident, "resident"),
            Some(peak) => (peak.min(self.ram_pages), "mapped-peak"),
            None => (mapped, "mapped"),
        }
    }

    /// The most pages KVM has mapped at once, where that is clearly more
    /// than it maps now (by [`SLACK_PAGES`], 1 MiB): KVM let mappings go
    /// (dirty logging let go on huge pages, host reclaim) whose pages still
    /// hold the guest's data.
    pub(crate) fn mapped_let_go(&self) -> Option<u64> {
        self.mapped_peak
            .filter(|&peak| peak >= self.mapped_pages().saturating_add(SLACK_PAGES))
    }

    /// Why KVM maps fewer pages than were known to hold data, in words.
    fn let_go_cause(&self) -> &'static str {
        if self.loaded_pages >= self.mapped_pages().saturating_add(SLACK_PAGES) {
            "a VM that migrated in, whose pages KVM maps again only as the guest touches them"
        } else {
            "KVM let mappings go whose pages still hold data (dirty logging let go on huge pages, or host reclaim)"
        }
    }

    /// The non-zero pages a prediction takes, and the estimate's name: the
    /// scan's count if there is one, else [`Self::nonzero_bound`].
    fn nonzero_used(&self) -> (u64, &'static str) {
        match &self.scan {
            Some(s) => (s.value.nonzero_pages, "scan"),
            None => self.nonzero_bound(),
        }
    }

    /// Fills in the prediction from the best figures at hand: the scan's count
    /// if there is one, else the mapped-page upper bound (or the host-resident
    /// one where mapped is no bound, [`under_mapped`]); the measured dirty
    /// rate, else 0.
    ///
    /// # Errors
    /// Options the model rejects.
    pub(crate) fn predict(&mut self, options: &Options) -> Result<(), Error> {
        let (nonzero, used) = self.nonzero_used();
        let (rate, growth) = self
            .dirty_rate
            .as_ref()
            .map_or((0.0, Growth::Linear), |d| d.value.growth());
        let inputs = Inputs {
            total_pages: self.ram_pages,
            nonzero_pages: nonzero,
            dirty_rate: rate,
            growth,
            backed_pages: Some(self.resident.value),
            bandwidth: options.bandwidth,
            max_downtime: options.max_downtime.as_secs_f64(),
            vcpus: options.vcpus,
            state_extra: options.state_extra,
            max_rounds: Some(options.max_rounds),
            stall_per_page: self
                .dirty_rate
                .as_ref()
                .and_then(|d| d.value.stall_per_page()),
            limited: None,
            costs: crate::wire::Costs::default(),
        };
        let prediction = model::predict(&inputs)?;
        let entry_rates = self.dirty_rate.as_ref().and_then(|d| {
            let secs = d.value.window.as_secs_f64();
            d.value.per_vcpu.as_ref().filter(|_| secs > 0.0).map(|e| {
                e.iter()
                    .map(|&n| n as f64 * 4096.0 / secs)
                    .collect::<Vec<_>>()
            })
        });
        (self.converge, self.converge_dirty_limit) = if prediction.converges {
            (None, None)
        } else {
            (
                smallest_throttle(
                    &inputs,
                    self.dirty_rate
                        .as_ref()
                        .and_then(|d| d.value.shares())
                        .as_deref(),
                ),
                entry_rates
                    .and_then(|r| cheapest_dirty_limit(&inputs, &r, options.dirty_limit_period)),
            )
        };
        self.prediction = Some(prediction);
        self.estimate_used = used;
        self.link = Link {
            bandwidth: options.bandwidth,
            max_downtime: options.max_downtime,
            from: options.link_from,
            downtime_from: options.downtime_from,
        };
        Ok(())
    }

    /// The report as `query-readiness` returns it, its text included.
    pub(crate) fn to_reply(&self) -> ReadinessReport {
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let timed = |f: &Figure<u64>| TimedPages {
            pages: f.value,
            bytes: f.value * 4096,
            took_us: us(f.took),
        };
        let m = &self.mapped.value;
        ReadinessReport {
            ram: Pages {
                pages: self.ram_pages,
                bytes: self.ram_pages * 4096,
            },
            mapped: MappedFigure {
                pages_4k: m.pages_4k,
                pages_2m: m.pages_2m,
                pages_1g: m.pages_1g,
                bytes: m.bytes(),
                took_us: us(self.mapped.took),
                peak_bytes: self.mapped_peak.map(|p| p.saturating_mul(4096)),
            },
            resident: timed(&self.resident),
            sampled: self.sampled.as_ref().map(|f| SampledFigure {
                pages: f.value.estimate(),
                bytes: f.value.estimate().saturating_mul(4096),
                pages_read: f.value.read,
                nonzero_read: f.value.nonzero,
                of_pages: f.value.of,
                took_us: us(f.took),
            }),
            written_since_boot: self.written.as_ref().map(timed),
            dirty_rate: self.dirty_rate.as_ref().map(|d| {
                let (rate, growth) = d.value.growth();
                DirtyRateFigure {
                    mode: d.value.mode.to_string(),
                    window_s: d.value.window.as_secs_f64(),
                    pages: d.value.pages,
                    pages_per_s: d.value.pages_per_s,
                    bytes_per_s: d.value.pages_per_s * 4096.0,
                    per_vcpu: d.value.per_vcpu.clone(),
                    took_us: us(d.took),
                    half_window_pages: d.value.half().unwrap_or(0),
                    curve: d
                        .value
                        .curve
                        .iter()
                        .map(|&(pages, t)| CurvePoint {
                            s: t.as_secs_f64(),
                            pages,
                        })
                        .collect(),
                    model_rate: Some(rate).filter(|r| r.is_finite()),
                    model_working_set: growth.working_set(),
                    model_growth: growth.name().to_string(),
                }
            }),
            guest_stall: self.dirty_rate.as_ref().map(|d| stall_figure(&d.value)),
            scan: self.scan.as_ref().map(|s| self.scan_figure(s, us(s.took))),
            estimate_used: self.estimate_used.to_string(),
            prediction: self.prediction.as_ref().map(Prediction::to_reply),
            converge: self.converge.as_ref().map(|c| ConvergeReply {
                cpu_throttle_percentage: u64::from(c.pct),
                vcpus: c.vcpus.clone(),
                throttle_seconds: Some(c.throttle_seconds).filter(|s| s.is_finite()),
                prediction: c.prediction.to_reply(),
            }),
            converge_dirty_limit: self.converge_dirty_limit.as_ref().map(|c| DirtyLimitReply {
                vcpu_dirty_limit: c.mb,
                vcpus: c.vcpus.clone(),
                throttle_seconds: Some(c.throttle_seconds).filter(|s| s.is_finite()),
                prediction: c.prediction.to_reply(),
            }),
            link: LinkFigure {
                bandwidth: self.link.bandwidth,
                downtime_limit_ms: crate::units::millis(self.link.max_downtime),
                from: self.link.from.to_string(),
                downtime_limit_from: self.link.downtime_from.to_string(),
            },
            text: self.to_text(),
        }
    }

    fn scan_figure(&self, s: &Figure<Scan>, took_us: f64) -> ScanFigure {
        let errors = self
            .errors()
            .into_iter()
            .map(|(n, e)| {
                let error = EstimateError {
                    estimate_pages: e.estimate_pages,
                    error_pages: e.error_pages,
                    relative: Some(e.relative).filter(|r| r.is_finite()),
                };
                (n.to_string(), error)
            })
            .collect();
        ScanFigure {
            zero_pages: s.value.zero_pages,
            nonzero_pages: s.value.nonzero_pages,
            unbacked_pages: s.value.unbacked_pages,
            nonzero_in_arena: s.value.nonzero_in_range,
            took_us,
            errors,
        }
    }

    /// The report for people.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        self.estimates_text(&mut s);
        self.dirty_text(&mut s);
        self.scan_text(&mut s);
        self.prediction_text(&mut s);
        s
    }

    fn estimates_text(&self, s: &mut String) {
        let b = |p: u64| format_bytes(p * 4096);
        let m = &self.mapped.value;
        let _ = writeln!(s, "guest RAM                 {:>12}", b(self.ram_pages));
        let (bytes, time) = (format_bytes(m.bytes()), took(self.mapped.took));
        let _ = writeln!(
            s,
            "mapped (pages_4k/2m/1g)   {bytes:>12}   4k={} 2m={} 1g={}   in {time}",
            m.pages_4k, m.pages_2m, m.pages_1g
        );
        if let Some(peak) = self.mapped_let_go() {
            let _ = writeln!(
                s,
                "  at most since boot      {:>12}   {}",
                b(peak),
                self.let_go_cause()
            );
        }
        let _ = writeln!(
            s,
            "host-resident             {:>12}   in {}",
            b(self.resident.value),
            took(self.resident.took)
        );
        if let Some(f) = &self.sampled {
            let z = &f.value;
            let how = if z.whole() {
                format!("every resident page read, {} non-zero", z.nonzero)
            } else {
                format!(
                    "{} of {} resident pages read, {} non-zero",
                    z.read, z.of, z.nonzero
                )
            };
            let _ = writeln!(
                s,
                "sampled non-zero          {:>12}   {how}   in {}",
                b(z.estimate()),
                took(f.took)
            );
        }
        let _ = match &self.written {
            Some(w) => writeln!(
                s,
                "written since boot        {:>12}   in {}",
                b(w.value),
                took(w.took)
            ),
            None => writeln!(
                s,
                "written since boot                 -   (needs --dirty-log bitmap, which logs from boot)"
            ),
        };
    }

    fn dirty_text(&self, s: &mut String) {
        let Some(d) = &self.dirty_rate else {
            let why = if self.dirty_logged {
                "no window asked for: --calc-time 0s"
            } else {
                "start the VMM with --dirty-log"
            };
            let _ = writeln!(s, "dirty rate                        -   not measured ({why}): the prediction assumes no dirtying");
            return;
        };
        let d = &d.value;
        let per_s = format_bytes(saturating_u64(d.pages_per_s * 4096.0));
        let _ = writeln!(
            s,
            "dirty rate ({})   {:>9.0} pages/s ({per_s}/s) over {:.2} s, each page counted once (QEMU's calc-dirty-rate figure: it falls with a longer window once a working set is full; the model below is what a pass sees)",
            d.mode,
            d.pages_per_s,
            d.window.as_secs_f64()
        );
        if let Some(per) = &d.per_vcpu {
            let _ = writeln!(s, "  per vCPU (ring entries): {per:?}");
        }
        let (rate, growth) = d.growth();
        let _ = match (growth.working_set(), d.full_at_first_count()) {
            (Some(w), Some(at)) => writeln!(
                s,
                "  model: a working set of {w} pages ({}), full by the window's first count ({}): at least {rate:.0} pages/s, in an order the window cannot tell",
                format_bytes(w * 4096),
                took(at)
            ),
            (Some(w), None) => writeln!(
                s,
                "  model: {} writes at {rate:.0} pages/s over a working set of {w} pages ({}): the rate a pass sees, which the prediction uses",
                growth.name(),
                format_bytes(w * 4096)
            ),
            (None, _) => writeln!(s, "  model: {rate:.0} pages/s, no working set seen"),
        };
        let f = stall_figure(d);
        let per: Vec<String> = f.vcpus.iter().map(|v| format!("{:.0}", v.ms)).collect();
        let _ = writeln!(
            s,
            "guest stall (tracking)    {:>9.0} ms   {:.1} % of the window's vCPU time; per vCPU ms: [{}]{}",
            f.total_ms,
            f.share * 100.0,
            per.join(", "),
            crate::protocol::migration::waited_note(f.waited_ms)
        );
        if f.fault_cost_source.as_deref() == Some("default") {
            let _ = writeln!(
                s,
                "  faults priced at the default {:.1} us each: this host's cost was not measured (a VMM measures it at its start when it serves a socket or metrics; --fault-cost gives it)",
                f.fault_cost_us
            );
        }
        if let (Some(pages), Some(ms)) = (f.left_protected_pages, f.left_stall_ms_max) {
            let expected = f.left_stall_ms_expected.map_or_else(String::new, |e| {
                format!(", about {e:.0} ms for those its working set writes again")
            });
            let _ = writeln!(
                s,
                "  left write-protected: {pages} pages ({}): up to {ms:.0} ms more, a fault each as the guest writes them again{expected} (the running total guest_stall_ns counts them as they come)",
                format_bytes(pages * 4096)
            );
        }
    }

    fn scan_text(&self, s: &mut String) {
        let Some(sc) = &self.scan else { return };
        let v = &sc.value;
        let _ = writeln!(
            s,
            "scan: {} non-zero, {} zero ({} holding no data, skipped)   in {}",
            v.nonzero_pages,
            v.zero_pages,
            v.unbacked_pages,
            took(sc.took)
        );
        for (name, e) in self.errors() {
            let _ = writeln!(
                s,
                "  {name:<11} estimate {:>9} pages, error {:>+9} ({:+.1} %)",
                e.estimate_pages,
                e.error_pages,
                e.relative * 100.0
            );
        }
    }

    fn prediction_text(&self, s: &mut String) {
        let Some(p) = &self.prediction else { return };
        let ms = |v: f64| {
            if v.is_finite() {
                format!("{:.0} ms", v * 1e3)
            } else {
                "-".into()
            }
        };
        let link = self.link.bandwidth.map_or("an unlimited".into(), |b| {
            format!("a {}/s", format_bytes(saturating_u64(b)))
        });
        let _ = writeln!(
            s,
            "pre-copy on {link} link ({}), downtime limit {} ms ({}), {} estimate:",
            self.link.from,
            self.link.max_downtime.as_millis(),
            self.link.downtime_from,
            self.estimate_used
        );
        if let Some(peak) = self
            .mapped_let_go()
            .filter(|_| matches!(self.estimate_used, "resident" | "mapped-peak"))
        {
            let _ = writeln!(
                s,
                "  (KVM maps {} now, {} at most since boot: {}; the host backs {}; --scan counts exactly)",
                format_bytes(self.mapped.value.bytes()),
                format_bytes(peak * 4096),
                self.let_go_cause(),
                format_bytes(self.resident.value * 4096)
            );
        } else if let Some(z) = self
            .sampled
            .as_ref()
            .filter(|_| self.estimate_used == "sampled")
        {
            let _ = writeln!(
                s,
                "  (KVM maps {} and the host backs {}, but {} of {} resident pages read held a non-zero byte: the rest holds zeros, which go as runs; --scan counts exactly)",
                format_bytes(self.mapped.value.bytes()),
                format_bytes(self.resident.value * 4096),
                z.value.nonzero,
                z.value.read
            );
        } else if self.estimate_used == "resident" {
            let _ = writeln!(
                s,
                "  (KVM maps {} of the {} the host backs, no bound on what must go: a VM that migrated in, or mappings let go; --scan counts exactly)",
                format_bytes(self.mapped.value.bytes()),
                format_bytes(self.resident.value * 4096)
            );
        }
        // A migration that never ends never stops sending: its bytes are
        // the model's count up to where the passes stop shrinking.
        let transferred = if p.ends() {
            format_bytes(p.total_bytes)
        } else {
            format!(
                "{} by the time passes stop shrinking, then more for ever",
                format_bytes(p.total_bytes)
            )
        };
        let _ = writeln!(
            s,
            "  transferred {transferred}  duplicate {}  normal {}  dirty-sync-count {}  total-time {}  downtime {}",
            p.duplicate,
            p.normal,
            p.dirty_sync_count(),
            ms(p.total_seconds),
            ms(p.downtime)
        );
        if let Some(stall) = p.stall {
            let _ = writeln!(s, "  guest stall (dirty tracking) {}", ms(stall));
        }
        let verdict = if p.converges {
            "converges"
        } else {
            "does NOT converge"
        };
        let _ = writeln!(s, "verdict: {verdict} — {}", p.reason);
        if !p.converges {
            match &self.converge {
                Some(c) => {
                    let _ = writeln!(
                        s,
                        "converges with auto-converge at {} % from the start (cpu-throttle-initial {0}, x-cpu-throttle-at-start; throttles {}): transferred {}  total-time {}  downtime {}; the throttle takes {} of vCPU time",
                        c.pct,
                        if c.every {
                            "every vCPU".to_string()
                        } else {
                            let set = VcpuSet::try_from(c.vcpus.clone()).unwrap_or_default();
                            format!("{set}, x-cpu-throttle-vcpus")
                        },
                        format_bytes(c.prediction.total_bytes),
                        ms(c.prediction.total_seconds),
                        ms(c.prediction.downtime),
                        ms(c.throttle_seconds)
                    );
                }
                None => {
                    let _ = writeln!(s, "no throttle up to 99 % would make it converge");
                }
            }
            if let Some(c) = &self.converge_dirty_limit {
                let _ = writeln!(
                    s,
                    "converges with dirty-limit at {} MB/s per vCPU from the start (vcpu-dirty-limit {0}, x-vcpu-dirty-limit-at-start; limits vCPUs {:?}): transferred {}  total-time {}  downtime {}; the limit takes {} of vCPU time",
                    c.mb,
                    c.vcpus,
                    format_bytes(c.prediction.total_bytes),
                    ms(c.prediction.total_seconds),
                    ms(c.prediction.downtime),
                    ms(c.throttle_seconds)
                );
            }
        }
    }
}

/// A window's stall as the readiness report shows it, with the pages it
/// left write-protected.
pub(crate) fn stall_figure(d: &DirtyRate) -> StallFigure {
    let stall = &d.stall;
    let left_protected = d.left.map(|l| l.protected);
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let vcpu_time = stall.period.as_secs_f64() * stall.vcpus.len() as f64;
    StallFigure {
        total_ms: ms(stall.total()),
        share: if vcpu_time > 0.0 {
            stall.total().as_secs_f64() / vcpu_time
        } else {
            0.0
        },
        period_s: stall.period.as_secs_f64(),
        fault_cost_us: fault_cost().as_secs_f64() * 1e6,
        fault_cost_source: Some(<&str>::from(fault_cost_source()).to_string()),
        left_protected_pages: left_protected,
        left_stall_ms_max: left_protected.map(|n| n as f64 * ms(fault_cost())),
        left_stall_ms_expected: d.left_to_pay().map(|n| n as f64 * ms(fault_cost())),
        waited_ms: stall.total_waited().map(ms),
        vcpus: stall
            .vcpus
            .iter()
            .zip(&stall.faults)
            .enumerate()
            .map(|(cpu_index, (d, &faults))| VcpuStallFigure {
                cpu_index,
                ms: ms(*d),
                faults,
                waited_ms: stall.waited(cpu_index).map(ms),
            })
            .collect(),
    }
}

/// The prediction's verdict streak to publish with `p`: the one published
/// before plus one when its verdict is the same, else 1; 0 without a
/// prediction. Read from the stats themselves before they are overwritten:
/// one measurement publishes at a time (the VMM runs one at once).
fn verdict_streak(stats: &VmmStats, p: Option<&Prediction>) -> u64 {
    use crate::vmmstats::VmStat::*;
    let Some(p) = p else { return 0 };
    // A streak above 0 was published with a prediction before this one.
    let before = stats.vm_value(PredictionVerdictStreak);
    let same = before > 0 && stats.vm_value(PredictionConverges) == u64::from(p.converges);
    if same {
        before.saturating_add(1)
    } else {
        1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::readiness::converge::tests::too_fast;

    fn report() -> Report {
        let mapped = Mapped {
            pages_4k: 300,
            pages_2m: 1,
            pages_1g: 0,
        };
        Report {
            ram_pages: 4096,
            mapped: Figure {
                value: mapped,
                took: Duration::from_micros(3),
            },
            mapped_peak: None,
            loaded_pages: 0,
            resident: Figure {
                value: 900,
                took: Duration::from_micros(50),
            },
            sampled: None,
            written: Some(Figure {
                value: 700,
                took: Duration::ZERO,
            }),
            dirty_rate: None,
            scan: Some(Figure {
                value: Scan {
                    zero_pages: 3696,
                    nonzero_pages: 400,
                    unbacked_pages: 3000,
                    nonzero_in_range: 390,
                    elapsed: Duration::ZERO,
                },
                took: Duration::ZERO,
            }),
            dirty_logged: true,
            prediction: None,
            converge: None,
            converge_dirty_limit: None,
            estimate_used: "",
            link: Link::default(),
        }
    }

    #[test]
    fn the_verdict_streak_counts_measurements_in_a_row_with_the_same_verdict() {
        use crate::vmmstats::VmStat::{PredictionConverges, PredictionVerdictStreak};
        let stats = VmmStats::new(7, 1).unwrap();
        let converges = model::predict(&Inputs {
            dirty_rate: 0.0,
            ..too_fast(1)
        })
        .unwrap();
        let never = model::predict(&too_fast(1)).unwrap();
        assert!(converges.converges && !never.converges);
        let mut r = report();
        let mut seen = Vec::new();
        let steps = [
            Some(&converges),
            Some(&converges),
            Some(&never),
            Some(&never),
            Some(&never),
            None,
            Some(&converges),
        ];
        for (at, p) in (1..).zip(steps) {
            r.prediction = p.cloned();
            r.publish(&stats, at);
            seen.push((
                stats.vm_value(PredictionConverges),
                stats.vm_value(PredictionVerdictStreak),
            ));
        }
        assert_eq!(
            seen,
            [(1, 1), (1, 2), (0, 1), (0, 2), (0, 3), (0, 0), (1, 1)]
        );
    }

    #[test]
    fn a_migration_that_never_ends_is_published_as_never_sending_less() {
        use crate::readiness::model::Inputs;
        use crate::vmmstats::VmStat::{PredictionTotalTimeNs, PredictionTransferred};
        let stats = VmmStats::new(7, 1).unwrap();
        let mut r = report();
        // No x-max-rounds to force a stop: it never ends.
        r.prediction = Some(model::predict(&too_fast(1)).unwrap());
        assert!(r.publish(&stats, 1));
        assert_eq!(stats.vm_value(PredictionTotalTimeNs), u64::MAX);
        assert_eq!(stats.vm_value(PredictionTransferred), u64::MAX);
        // The text gives the model's bytes as what they are.
        let text = r.to_text();
        assert!(
            text.contains("by the time passes stop shrinking, then more for ever"),
            "{text}"
        );
        // Forced after 4 passes: what those send.
        let forced = model::predict(&Inputs {
            max_rounds: Some(4),
            ..too_fast(1)
        })
        .unwrap();
        let bytes = forced.total_bytes;
        r.prediction = Some(forced);
        assert!(r.publish(&stats, 2));
        assert_eq!(stats.vm_value(PredictionTransferred), bytes);
    }

    #[test]
    fn the_page_publishes_the_non_zero_estimate_the_prediction_took() {
        use crate::vmmstats::VmStat::ReadinessNonzero;
        let stats = VmmStats::new(7, 1).unwrap();
        let mut r = report();
        // The scan's count, when there is one.
        r.predict(&Options::default()).unwrap();
        assert!(r.publish(&stats, 1));
        assert_eq!(stats.vm_value(ReadinessNonzero), 400 * 4096);
        // Without one: the mapped pages (300 small, one 2 MiB: 812).
        r.scan = None;
        r.predict(&Options::default()).unwrap();
        assert_eq!(r.estimate_used, "mapped");
        assert!(r.publish(&stats, 2));
        assert_eq!(stats.vm_value(ReadinessNonzero), 812 * 4096);
        // A VM that migrated in: KVM maps next to nothing of what the host
        // backs, and the prediction (and the page) take the resident count.
        r.mapped.value = Mapped {
            pages_4k: 10,
            pages_2m: 0,
            pages_1g: 0,
        };
        r.predict(&Options::default()).unwrap();
        assert_eq!(r.estimate_used, "resident");
        assert!(r.publish(&stats, 3));
        assert_eq!(stats.vm_value(ReadinessNonzero), 900 * 4096);
    }

    #[test]
    fn a_measurement_without_a_window_never_replaces_one_with_a_window() {
        use crate::vmmstats::VmStat::{
            PredictionConverges, PredictionVerdictStreak, ReadinessAtNs, ReadinessWindowNs,
        };
        let stats = VmmStats::new(7, 1).unwrap();
        let never = model::predict(&too_fast(1)).unwrap();
        let assumes_none = model::predict(&Inputs {
            dirty_rate: 0.0,
            ..too_fast(1)
        })
        .unwrap();
        let mut quick = report();
        quick.dirty_rate = None;
        quick.prediction = Some(assumes_none);
        // Nothing measured with a window yet: a window-less one is published.
        assert!(quick.publish(&stats, 1));
        assert_eq!(stats.vm_value(PredictionConverges), 1);
        let mut measured = report();
        measured.dirty_rate = Some(Figure {
            value: window_of(1000, |t| 1000.0 * t),
            took: Duration::ZERO,
        });
        measured.prediction = Some(never);
        for at in [2, 3] {
            assert!(measured.publish(&stats, at));
        }
        let published = |s: &VmmStats| {
            [
                ReadinessAtNs,
                ReadinessWindowNs,
                PredictionConverges,
                PredictionVerdictStreak,
            ]
            .map(|v| s.vm_value(v))
        };
        let before = published(&stats);
        assert_eq!(before, [3, 1_000_000_000, 0, 2]);
        // A client's quick question (calc-time 0) leaves the page as it was.
        assert!(!quick.publish(&stats, 4));
        assert_eq!(published(&stats), before);
        // The next window publishes, its streak going on from the last.
        assert!(measured.publish(&stats, 5));
        assert_eq!(published(&stats), [5, 1_000_000_000, 0, 3]);
        // A VM without a dirty log never has a window: each of its
        // measurements is published.
        let plain = VmmStats::new(7, 1).unwrap();
        quick.dirty_logged = false;
        assert!(quick.publish(&plain, 1) && quick.publish(&plain, 2));
        assert_eq!(plain.vm_value(PredictionVerdictStreak), 2);
    }

    /// A window of `ms` whose distinct pages after `t` seconds are `count(t)`,
    /// counted as the window counts them.
    fn window_of(ms: u64, count: impl Fn(f64) -> f64) -> DirtyRate {
        let window = Duration::from_millis(ms);
        let curve = (1..=super::super::CURVE_POINTS)
            .rev()
            .map(|k| window / (1 << k))
            .map(|t| (saturating_u64(count(t.as_secs_f64()).round()), t))
            .collect();
        let pages = saturating_u64(count(window.as_secs_f64()).round());
        DirtyRate {
            mode: "dirty-bitmap",
            window,
            mapped_held: pages,
            pages,
            pages_per_s: pages as f64 / window.as_secs_f64(),
            per_vcpu: None,
            curve,
            stall: Stall {
                period: window,
                vcpus: vec![Duration::from_millis(40), Duration::from_millis(10)],
                faults: vec![15_000, 3_000],
                system: vec![None, None],
                waited: vec![None, None],
            },
            left: Some(Left {
                protected: 20_000,
                writable: 9_000,
            }),
        }
    }

    #[test]
    fn of_what_a_window_left_protected_its_working_set_pays_for_what_it_writes_again() {
        // 12,000 pages, all there by the first count: a working set of
        // 12,000 pages, 9,000 of them left writable.
        let w = window_of(500, |_| 12_000.0);
        assert_eq!(w.growth().1.working_set(), Some(12_000));
        assert_eq!(w.left_to_pay(), Some(3_000));
        // Never more than was left.
        let few = DirtyRate {
            left: Some(Left {
                protected: 1_000,
                writable: 0,
            }),
            ..window_of(500, |_| 12_000.0)
        };
        assert_eq!(few.left_to_pay(), Some(1_000));
        // A rate with no set seen: it may write any of them.
        let linear = window_of(500, |t| 40_000.0 * t);
        assert_eq!(linear.growth().1.working_set(), None);
        assert_eq!(linear.left_to_pay(), None);
        // A migration went on holding the log: nothing was left by the window.
        let held = DirtyRate {
            left: None,
            ..window_of(500, |_| 12_000.0)
        };
        assert_eq!(held.left_to_pay(), None);
    }

    #[test]
    fn each_vcpus_share_is_its_ring_entries_or_its_faults_where_they_account_for_the_pages() {
        // Bitmap: 15,000 and 3,000 faults for the window's pages.
        let mut w = window_of(500, |_| 12_000.0);
        let s = w.shares().expect("the faults account for the pages");
        assert!((s[0] - 15.0 / 18.0).abs() < 1e-12 && (s[1] - 3.0 / 18.0).abs() < 1e-12);
        // Faults under half the pages (hardware that logs without faults):
        // no shares.
        w.pages = 40_000;
        assert_eq!(w.shares(), None);
        // A ring's entries, whatever the faults.
        w.per_vcpu = Some(vec![0, 4]);
        assert_eq!(w.shares(), Some(vec![0.0, 1.0]));
        // Nothing written: no shares.
        w.per_vcpu = Some(vec![0, 0]);
        assert_eq!(w.shares(), None);
    }

    fn window(pages: u64, half: u64) -> DirtyRate {
        let mut w = window_of(500, |_| pages as f64);
        w.curve = vec![(half, Duration::from_millis(250))];
        w
    }

    fn near(got: f64, want: f64, within: f64) -> bool {
        (got / want - 1.0).abs() < within
    }

    #[test]
    fn random_writes_fit_a_uniform_working_set() {
        // 20 000 writes/s over 10 000 pages, a 500 ms window.
        let w = window_of(500, |t| Growth::Uniform(10_000).distinct(20_000.0 * t));
        let (rate, growth) = w.growth();
        assert!(near(rate, 20_000.0, 0.02), "{rate}");
        assert!(
            matches!(growth, Growth::Uniform(s) if s.abs_diff(10_000) < 200),
            "{growth:?}"
        );
    }

    #[test]
    fn a_sweep_fits_sequential_growth_at_its_write_rate() {
        // 340 000 pages/s sweeping 24 600 pages, full 72 ms in: a 1 s window
        // sees the set whole from 125 ms on.
        let w = window_of(1000, |t| (340_000.0 * t).min(24_600.0));
        let (rate, growth) = w.growth();
        assert!(near(rate, 340_000.0, 0.01), "{rate}");
        assert_eq!(growth, Growth::Sequential(24_600));
        assert_eq!(
            w.full_at_first_count(),
            None,
            "10,625 pages at its first count"
        );
        // The same sweep fitted as random writes from the window's two halves
        // alone (the old model) put the rate at less than half of that.
        let (old, _) = window(24_600, 24_600).growth();
        assert!(old < 0.5 * 340_000.0, "{old}");
    }

    #[test]
    fn a_window_saturated_by_its_first_count_gives_the_set_and_a_lower_bound() {
        let w = window_of(1000, |_| 5000.0);
        let (rate, growth) = w.growth();
        assert_eq!(growth.working_set(), Some(5000));
        // Said as such: the order of its writes cannot be told.
        assert_eq!(w.full_at_first_count(), Some(Duration::from_micros(31_250)));
        // At least the first count (31.25 ms in) over its time.
        assert!(rate >= 5000.0 / 0.03125 * 0.99, "{rate}");
    }

    #[test]
    fn an_unsaturated_window_is_a_plain_rate() {
        assert_eq!(window(2000, 1000).growth(), (4000.0, Growth::Linear));
        assert_eq!(window(40, 20).growth(), (80.0, Growth::Linear));
        let steady = window_of(1000, |t| 9000.0 * t);
        assert_eq!(steady.growth(), (9000.0, Growth::Linear));
        let mut no_half = window_of(1000, |t| (340_000.0 * t).min(24_600.0));
        no_half.curve.pop();
        assert_eq!(no_half.growth().1, Growth::Linear);
    }

    #[test]
    fn a_count_taken_late_on_a_busy_host_still_shows_the_working_set() {
        // The half's count taken at 330 ms of a 500 ms window (the thread
        // that takes it waited for a CPU): a set full from the first count
        // is still a set, and a steady rate still a rate.
        let late = |pages: &dyn Fn(f64) -> f64| {
            let mut w = window_of(500, pages);
            let at = Duration::from_millis(330);
            *w.curve.last_mut().unwrap() = (saturating_u64(pages(at.as_secs_f64()).round()), at);
            w
        };
        let set = late(&|_| 2_048.0);
        assert_eq!(set.growth().1.working_set(), Some(2_048));
        let steady = late(&|t| 9_000.0 * t);
        assert_eq!(steady.growth().1, Growth::Linear);
        // Taken past two thirds of the window, it says too little.
        let mut past = window_of(500, |_| 2_048.0);
        past.curve.last_mut().unwrap().1 = Duration::from_millis(350);
        assert_eq!(past.growth().1, Growth::Linear);
    }

    #[test]
    fn errors_compare_each_estimate_with_the_scan() {
        let r = report();
        let e = r.errors();
        // 300 4 KiB pages + one 2 MiB page = 812 page-equivalents, against 400 non-zero.
        assert_eq!(
            e[0],
            (
                "mapped",
                ScanFigures {
                    estimate_pages: 812,
                    error_pages: 412,
                    relative: 1.03
                }
            )
        );
        assert_eq!(e[1].1.error_pages, 500);
        assert_eq!(e[2].1.error_pages, 300);
    }

    #[test]
    fn prediction_prefers_the_scan_and_falls_back_to_mapped() {
        let mut r = report();
        r.predict(&Options::default()).unwrap();
        assert_eq!(r.estimate_used, "scan");
        assert_eq!(
            r.prediction.as_ref().unwrap().rounds[0].bytes,
            model::pass0_bytes(4096, 400)
        );
        r.scan = None;
        r.predict(&Options::default()).unwrap();
        assert_eq!(r.estimate_used, "mapped");
        assert_eq!(
            r.prediction.unwrap().rounds[0].bytes,
            model::pass0_bytes(4096, 812)
        );
    }

    #[test]
    fn where_kvm_maps_far_less_than_the_host_backs_the_resident_count_is_the_bound() {
        // A VM that migrated in: 3,000 pages written by its VMM, 20 mapped
        // again by its guest since.
        let mut r = report();
        r.scan = None;
        r.mapped.value = Mapped {
            pages_4k: 20,
            ..Mapped::default()
        };
        r.resident.value = 3000;
        r.predict(&Options::default()).unwrap();
        assert_eq!(r.estimate_used, "resident");
        assert_eq!(
            r.prediction.unwrap().rounds[0].bytes,
            model::pass0_bytes(4096, 3000)
        );
        // Within twice, or under 1 MiB apart: mapped, as before.
        assert!(!under_mapped(812, 1600) && !under_mapped(20, 270));
        assert!(under_mapped(812, 1625) && under_mapped(20, 276));
    }

    #[test]
    fn where_kvm_let_go_of_mappings_the_host_backs_what_it_let_go() {
        let mut r = report();
        r.scan = None;
        // 812 mapped now, 1,500 resident; at most 1,200 mapped since boot (a
        // window on huge pages let go): the host backs what was let go, and
        // what was mapped at other times, which the most at once misses.
        r.mapped_peak = Some(1_200);
        r.resident.value = 1_500;
        r.predict(&Options::default()).unwrap();
        assert_eq!(r.estimate_used, "resident");
        assert_eq!(
            r.prediction.as_ref().unwrap().rounds[0].bytes,
            model::pass0_bytes(4096, 1_500)
        );
        let text = r.to_text();
        assert!(
            text.contains("at most since boot") && text.contains("KVM let mappings go"),
            "{text}"
        );
        assert_eq!(r.to_reply().mapped.peak_bytes, Some(1_200 * 4096));
        // The same figures on a VM that migrated in: the cause named so.
        r.loaded_pages = 1_200;
        let text = r.to_text();
        assert!(
            text.contains("a VM that migrated in") && !text.contains("KVM let mappings go"),
            "{text}"
        );
        r.loaded_pages = 0;
        // Less resident than the most mapped (the host swapped some out):
        // the most mapped, named so.
        r.mapped_peak = Some(2_000);
        r.predict(&Options::default()).unwrap();
        assert_eq!(r.estimate_used, "mapped-peak");
        assert_eq!(
            r.prediction.as_ref().unwrap().rounds[0].bytes,
            model::pass0_bytes(4096, 2_000)
        );
        // Within 1 MiB of what it maps now: what it maps now.
        r.mapped_peak = Some(812 + 255);
        r.predict(&Options::default()).unwrap();
        assert_eq!(r.estimate_used, "mapped");
        // The host backing over twice what KVM maps now: resident, as
        // before, whatever the most.
        r.mapped_peak = Some(1_000);
        r.resident.value = 1_700;
        r.predict(&Options::default()).unwrap();
        assert_eq!(r.estimate_used, "resident");
    }

    #[test]
    fn a_sample_that_reads_mostly_zeros_is_the_estimate_where_it_is_clearly_lower() {
        // 812 mapped, 900 resident; of 900 pages read, 200 non-zero: the
        // rest was written with zeros or only read.
        let mut r = report();
        r.scan = None;
        let sample = |nonzero| {
            Some(Figure {
                value: ZeroSample {
                    read: 900,
                    nonzero,
                    of: 900,
                },
                took: Duration::from_micros(700),
            })
        };
        r.sampled = sample(200);
        r.predict(&Options::default()).unwrap();
        assert_eq!(r.estimate_used, "sampled");
        assert_eq!(
            r.prediction.as_ref().unwrap().rounds[0].bytes,
            model::pass0_bytes(4096, 200)
        );
        let text = r.to_text();
        assert!(
            text.contains("sampled non-zero")
                && text.contains("200 of 900 resident pages read held a non-zero byte"),
            "{text}"
        );
        let reply = r.to_reply();
        let s = reply.sampled.unwrap();
        assert_eq!(
            (s.pages, s.pages_read, s.nonzero_read, s.of_pages),
            (200, 900, 200, 900)
        );
        // Within 1 MiB of the mapped bound: the bound, as before.
        r.sampled = sample(812 - 256);
        r.predict(&Options::default()).unwrap();
        assert_eq!(r.estimate_used, "mapped");
        r.sampled = sample(812 - 257);
        r.predict(&Options::default()).unwrap();
        assert_eq!(r.estimate_used, "sampled");
        // Never against the most mapped, which stands for pages swapped
        // out that the sample cannot draw.
        r.mapped_peak = Some(2_000);
        r.sampled = sample(200);
        r.predict(&Options::default()).unwrap();
        assert_eq!(r.estimate_used, "mapped-peak");
        // With a scan, the sample is set against it too.
        let mut r = report();
        r.sampled = sample(390);
        assert!(r
            .errors()
            .iter()
            .any(|(n, e)| *n == "sampled" && e.estimate_pages == 390));
    }

    #[test]
    fn a_drawn_sample_must_be_below_the_bound_by_three_deviations_and_counts_what_kvm_let_go() {
        // A big guest: 1,000,000 resident pages, half of 8,192 read non-zero
        // (500,000 estimated, a deviation of 5,524 pages).
        let mut r = report();
        r.scan = None;
        r.ram_pages = 2_000_000;
        r.resident.value = 1_000_000;
        let sample = ZeroSample {
            read: 8192,
            nonzero: 4096,
            of: 1_000_000,
        };
        assert!(
            (sample.deviation() - 5524.3).abs() < 1.0,
            "{}",
            sample.deviation()
        );
        r.sampled = Some(Figure {
            value: sample,
            took: Duration::ZERO,
        });
        let mapped = |pages_4k| Mapped {
            pages_4k,
            ..Mapped::default()
        };
        // Mapped 510,000: within three deviations of the estimate, kept.
        r.mapped.value = mapped(510_000);
        r.predict(&Options::default()).unwrap();
        assert_eq!(r.estimate_used, "mapped");
        // Mapped 520,000: beyond them, the sample.
        r.mapped.value = mapped(520_000);
        r.predict(&Options::default()).unwrap();
        assert_eq!(r.estimate_used, "sampled");
        // KVM let go of mappings (most 1,200 of a small guest, 812 now):
        // the sample counts at least what it let go.
        let mut r = report();
        r.scan = None;
        r.mapped_peak = Some(1_200);
        r.resident.value = 1_500;
        r.sampled = Some(Figure {
            value: ZeroSample {
                read: 1_500,
                nonzero: 200,
                of: 1_500,
            },
            took: Duration::ZERO,
        });
        r.predict(&Options::default()).unwrap();
        assert_eq!(r.estimate_used, "sampled");
        assert_eq!(
            r.prediction.as_ref().unwrap().rounds[0].bytes,
            model::pass0_bytes(4096, 1_200)
        );
    }

    #[test]
    fn zero_truth_gives_infinite_relative_error_and_null_json() {
        let e = error_of(5, 0);
        assert!(e.relative.is_infinite());
        assert_eq!(error_of(0, 0).relative, 0.0);
        let mut r = report();
        r.scan.as_mut().unwrap().value.nonzero_pages = 0;
        let reply = r.to_reply();
        let errors = &reply.scan.as_ref().unwrap().errors;
        assert_eq!(errors["mapped"].relative, None);
        let wire = serde_json::to_value(&reply).unwrap();
        assert!(wire["scan"]["errors"]["mapped"]["relative"].is_null());
    }

    fn keys(v: &serde_json::Value) -> Vec<&str> {
        v.as_object().unwrap().keys().map(String::as_str).collect()
    }

    #[test]
    fn the_reply_decodes_back_as_sent_with_the_wire_names() {
        let mut r = report();
        r.dirty_rate = Some(Figure {
            value: DirtyRate {
                per_vcpu: Some(vec![3, 4]),
                ..window(6321, 3935)
            },
            took: Duration::from_millis(500),
        });
        r.predict(&Options::default()).unwrap();
        let reply = r.to_reply();
        let line = serde_json::to_string(&reply).unwrap();
        let back: ReadinessReport = serde_json::from_str(&line).unwrap();
        assert_eq!(back, reply);
        let wire: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(
            keys(&wire),
            [
                "converge",
                "converge_dirty_limit",
                "dirty_rate",
                "estimate_used",
                "guest_stall",
                "link",
                "mapped",
                "prediction",
                "ram",
                "resident",
                "sampled",
                "scan",
                "text",
                "written_since_boot"
            ]
        );
        assert_eq!(
            keys(&wire["link"]),
            [
                "bandwidth",
                "downtime-limit-from",
                "downtime-limit-ms",
                "from"
            ]
        );
        assert_eq!(
            keys(&wire["guest_stall"]),
            [
                "fault_cost_source",
                "fault_cost_us",
                "left_protected_pages",
                "left_stall_ms_expected",
                "left_stall_ms_max",
                "period_s",
                "share",
                "total_ms",
                "vcpus",
                "waited_ms"
            ]
        );
        assert_eq!(wire["guest_stall"]["left_protected_pages"], 20_000);
        let left_ms = wire["guest_stall"]["left_stall_ms_max"].as_f64().unwrap();
        let cost_us = wire["guest_stall"]["fault_cost_us"].as_f64().unwrap();
        assert!(
            (left_ms - 20_000.0 * cost_us / 1e3).abs() < 1e-6,
            "a fault each: {left_ms} ms at {cost_us} us"
        );
        // The pages of the working set the model saw that are not writable:
        // what it will write again, at most what was left.
        let rate = &r.dirty_rate.as_ref().unwrap().value;
        let expected = rate.left_to_pay().map(|n| n as f64 * cost_us / 1e3);
        assert_eq!(
            wire["guest_stall"]["left_stall_ms_expected"].as_f64(),
            expected,
            "{}",
            wire["guest_stall"]
        );
        assert_eq!(wire["guest_stall"]["total_ms"], 50.0);
        assert_eq!(wire["guest_stall"]["share"], 0.05, "50 ms of 2 x 0.5 s");
        assert_eq!(wire["guest_stall"]["vcpus"][1]["cpu_index"], 1);
        assert_eq!(wire["guest_stall"]["vcpus"][1]["ms"], 10.0);
        assert_eq!(wire["guest_stall"]["vcpus"][1]["faults"], 3000);
        assert_eq!(wire["link"]["downtime-limit-ms"], 300);
        assert_eq!(
            keys(&wire["dirty_rate"]),
            [
                "bytes_per_s",
                "curve",
                "half_window_pages",
                "mode",
                "model_growth",
                "model_rate",
                "model_working_set",
                "pages",
                "pages_per_s",
                "per_vcpu",
                "took_us",
                "window_s"
            ]
        );
        assert_eq!(
            keys(&wire["scan"]["errors"]["written"]),
            ["error_pages", "estimate_pages", "relative"]
        );
        let p = &wire["prediction"];
        assert_eq!(
            keys(p),
            [
                "converges",
                "downtime_seconds",
                "guest_stall_seconds",
                "migrate",
                "reason",
                "rounds",
                "stop_and_copy",
                "total_bytes",
                "total_seconds"
            ]
        );
        assert_eq!(
            keys(&p["migrate"]),
            [
                "downtime",
                "ram",
                "status",
                "total-time",
                "x-converges",
                "x-guest-stall-ms"
            ]
        );
        assert_eq!(
            keys(&p["migrate"]["ram"]),
            [
                "dirty-sync-count",
                "duplicate",
                "normal",
                "normal-bytes",
                "transferred"
            ]
        );
        assert_eq!(p["migrate"]["status"], "completed");
        assert!(back.text.starts_with("guest RAM"), "{}", back.text);
    }

    #[test]
    fn absent_figures_are_null_not_missing() {
        let mut r = report();
        r.written = None;
        r.scan = None;
        let wire = serde_json::to_value(r.to_reply()).unwrap();
        for key in ["written_since_boot", "dirty_rate", "scan", "prediction"] {
            assert!(
                wire.get(key).is_some_and(serde_json::Value::is_null),
                "{key}"
            );
        }
        assert!(wire["link"]["bandwidth"].is_null());
    }
}
