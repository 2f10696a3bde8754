//! The readiness report: each figure with how long it took, the scan's error
//! figures for each estimate, and the migration prediction.

use std::fmt::Write as _;
use std::time::Duration;

use super::error::Error;
use super::model::{self, Inputs, Prediction};
use super::options::Options;
use super::scan::Scan;
use crate::protocol::readiness::{
    ConvergeReply, DirtyLimitReply, DirtyRateFigure, EstimateError, LinkFigure, MappedFigure,
    Pages, ReadinessReport, ScanFigure, StallFigure, TimedPages, VcpuStallFigure,
};
use crate::units::{format_bytes, saturating_u64};
use crate::vcpu::stall::{Stall, FAULT_COST};
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
    /// Distinct pages dirtied in the window.
    pub(crate) pages: u64,
    /// `pages` per second of the window.
    pub pages_per_s: f64,
    /// Ring entries harvested per vCPU (ring mode).
    pub(crate) per_vcpu: Option<Vec<u64>>,
    /// Distinct pages at about half the window, and when.
    pub(crate) half: (u64, Duration),
    /// What the window cost the guest.
    pub stall: Stall,
}

impl DirtyRate {
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

    /// The write rate and working set behind the window, for writes spread
    /// uniformly over a working set `W` at `r` pages/s: distinct pages after
    /// `t` are `W·(1 − e^(−r·t/W))`. With `x = e^(−r·t½/W)` from the two
    /// counts (`p/p½ = 1 + x` when `t = 2·t½`), `W = p½/(1 − x)` and
    /// `r = −W·ln x / t½`. When the second half added as much as the first
    /// (no saturation seen) the rate is the window's and the set unknown; when
    /// it added next to nothing (saturated by half time) `x` is taken as 0.05:
    /// the set is what was seen, the rate at least `3·W / t½`.
    pub(crate) fn rate_and_working_set(&self) -> (f64, Option<u64>) {
        let (p_half, t_half) = (self.half.0 as f64, self.half.1.as_secs_f64());
        let (p, t) = (self.pages as f64, self.window.as_secs_f64());
        let linear = (self.pages_per_s, None);
        if p_half < 64.0 || t_half <= 0.0 || (t / t_half - 2.0).abs() > 0.2 {
            return linear;
        }
        let x = p / p_half - 1.0;
        if x >= 0.9 {
            return linear;
        }
        let x = x.max(0.05);
        let w = p_half / (1.0 - x);
        (-w * x.ln() / t_half, Some(saturating_u64(w.round())))
    }
}

/// What the report holds.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// Pages of guest RAM.
    pub(crate) ram_pages: u64,
    /// Guest memory KVM maps, by page size (the stats-only estimate).
    pub(crate) mapped: Figure<Mapped>,
    /// Host-resident pages of the guest-RAM mapping.
    pub(crate) resident: Figure<u64>,
    /// Pages written since boot (dirty logging).
    pub written: Option<Figure<u64>>,
    /// The dirty rate, when a window was measured.
    pub dirty_rate: Option<Figure<DirtyRate>>,
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
    /// `request`, `migration-parameters` or `default`.
    pub(crate) from: &'static str,
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
        if let Some(w) = &self.written {
            out.push(("written", error_of(w.value, truth)));
        }
        out
    }

    /// Writes the figures into the VMM's own stats (`vmmstats`): what the
    /// exporter shows per VM with no request. Stats this report has no figure
    /// for are 0; `readiness_at_ns` says when they were measured.
    pub(crate) fn publish(&self, stats: &VmmStats, at_ns: u64) {
        use crate::vmmstats::VmStat::*;
        let ns = |seconds: f64| {
            if seconds.is_finite() {
                saturating_u64(seconds * 1e9)
            } else {
                u64::MAX
            }
        };
        let nonzero = match &self.scan {
            Some(s) => s.value.nonzero_pages,
            None => self.mapped_pages().min(self.ram_pages),
        };
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
        stats.set_vm(PredictionConverges, p.map_or(0, |p| u64::from(p.converges)));
        stats.set_vm(PredictionTotalTimeNs, p.map_or(0, |p| ns(p.total_seconds)));
        stats.set_vm(PredictionDowntimeNs, p.map_or(0, |p| ns(p.downtime)));
        stats.set_vm(PredictionTransferred, p.map_or(0, |p| p.total_bytes));
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
    }

    /// Fills in the prediction from the best figures at hand: the scan's count
    /// if there is one, else the mapped-page upper bound; the measured dirty rate, else 0.
    ///
    /// # Errors
    /// Options the model rejects.
    pub(crate) fn predict(&mut self, options: &Options) -> Result<(), Error> {
        let (nonzero, used) = match &self.scan {
            Some(s) => (s.value.nonzero_pages, "scan"),
            None => (self.mapped_pages().min(self.ram_pages), "mapped"),
        };
        let (rate, working_set) = self
            .dirty_rate
            .as_ref()
            .map_or((0.0, None), |d| d.value.rate_and_working_set());
        let inputs = Inputs {
            total_pages: self.ram_pages,
            nonzero_pages: nonzero,
            dirty_rate: rate,
            working_set,
            backed_pages: Some(self.resident.value),
            bandwidth: options.bandwidth,
            max_downtime: options.max_downtime.as_secs_f64(),
            vcpus: options.vcpus,
            max_rounds: Some(options.max_rounds),
            stall_per_page: self
                .dirty_rate
                .as_ref()
                .and_then(|d| d.value.stall_per_page()),
            limited: None,
            costs: model::Costs::default(),
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
                smallest_throttle(&inputs),
                entry_rates.and_then(|r| cheapest_dirty_limit(&inputs, &r)),
            )
        };
        self.prediction = Some(prediction);
        self.estimate_used = used;
        self.link = Link {
            bandwidth: options.bandwidth,
            max_downtime: options.max_downtime,
            from: options.link_from,
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
            },
            resident: timed(&self.resident),
            written_since_boot: self.written.as_ref().map(timed),
            dirty_rate: self.dirty_rate.as_ref().map(|d| {
                let (rate, working_set) = d.value.rate_and_working_set();
                DirtyRateFigure {
                    mode: d.value.mode.to_string(),
                    window_s: d.value.window.as_secs_f64(),
                    pages: d.value.pages,
                    pages_per_s: d.value.pages_per_s,
                    bytes_per_s: d.value.pages_per_s * 4096.0,
                    per_vcpu: d.value.per_vcpu.clone(),
                    took_us: us(d.took),
                    half_window_pages: d.value.half.0,
                    model_rate: Some(rate).filter(|r| r.is_finite()),
                    model_working_set: working_set,
                }
            }),
            guest_stall: self
                .dirty_rate
                .as_ref()
                .map(|d| stall_figure(&d.value.stall)),
            scan: self.scan.as_ref().map(|s| self.scan_figure(s, us(s.took))),
            estimate_used: self.estimate_used.to_string(),
            prediction: self.prediction.as_ref().map(Prediction::to_reply),
            converge: self.converge.as_ref().map(|c| ConvergeReply {
                cpu_throttle_percentage: u64::from(c.pct),
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
        let _ = writeln!(
            s,
            "host-resident             {:>12}   in {}",
            b(self.resident.value),
            took(self.resident.took)
        );
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
            let _ = writeln!(s, "dirty rate                        -   not measured (start the VMM with --dirty-log): the prediction assumes no dirtying");
            return;
        };
        let d = &d.value;
        let per_s = format_bytes(saturating_u64(d.pages_per_s * 4096.0));
        let _ = writeln!(
            s,
            "dirty rate ({})   {:>9.0} pages/s ({per_s}/s) over {:.2} s",
            d.mode,
            d.pages_per_s,
            d.window.as_secs_f64()
        );
        if let Some(per) = &d.per_vcpu {
            let _ = writeln!(s, "  per vCPU (ring entries): {per:?}");
        }
        let f = stall_figure(&d.stall);
        let per: Vec<String> = f.vcpus.iter().map(|v| format!("{:.0}", v.ms)).collect();
        let _ = writeln!(
            s,
            "guest stall (tracking)    {:>9.0} ms   {:.1} % of the window's vCPU time; per vCPU ms: [{}]",
            f.total_ms,
            f.share * 100.0,
            per.join(", ")
        );
    }

    fn scan_text(&self, s: &mut String) {
        let Some(sc) = &self.scan else { return };
        let v = &sc.value;
        let _ = writeln!(
            s,
            "scan: {} non-zero, {} zero ({} never backed, skipped)   in {}",
            v.nonzero_pages,
            v.zero_pages,
            v.unbacked_pages,
            took(sc.took)
        );
        for (name, e) in self.errors() {
            let _ = writeln!(
                s,
                "  {name:<9} estimate {:>9} pages, error {:>+9} ({:+.1} %)",
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
        let link = self.link.bandwidth.map_or("unlimited".into(), |b| {
            format!("{}/s", format_bytes(saturating_u64(b)))
        });
        let _ = writeln!(
            s,
            "pre-copy on a {link} link, downtime limit {} ms ({}), {} estimate:",
            self.link.max_downtime.as_millis(),
            self.link.from,
            self.estimate_used
        );
        let _ = writeln!(
            s,
            "  transferred {}  duplicate {}  normal {}  dirty-sync-count {}  total-time {}  downtime {}",
            format_bytes(p.total_bytes),
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
                        "converges with auto-converge at {} % from the start (cpu-throttle-initial {0}, x-cpu-throttle-at-start): transferred {}  total-time {}  downtime {}; the throttle takes {} of vCPU time",
                        c.pct,
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

/// A stall as the readiness report shows it.
pub(crate) fn stall_figure(stall: &Stall) -> StallFigure {
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
        fault_cost_us: FAULT_COST.as_secs_f64() * 1e6,
        vcpus: stall
            .vcpus
            .iter()
            .zip(&stall.faults)
            .enumerate()
            .map(|(cpu_index, (d, &faults))| VcpuStallFigure {
                cpu_index,
                ms: ms(*d),
                faults,
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            resident: Figure {
                value: 900,
                took: Duration::from_micros(50),
            },
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
            prediction: None,
            converge: None,
            converge_dirty_limit: None,
            estimate_used: "",
            link: Link::default(),
        }
    }

    fn window(pages: u64, half: u64) -> DirtyRate {
        DirtyRate {
            mode: "dirty-bitmap",
            window: Duration::from_millis(500),
            pages,
            pages_per_s: pages as f64 * 2.0,
            per_vcpu: None,
            half: (half, Duration::from_millis(250)),
            stall: Stall {
                period: Duration::from_millis(500),
                vcpus: vec![Duration::from_millis(40), Duration::from_millis(10)],
                faults: vec![15_000, 3_000],
                system: vec![None, None],
            },
        }
    }

    #[test]
    fn a_saturated_window_gives_the_write_rate_and_the_working_set() {
        // 20 000 writes/s over 10 000 pages: 3 935 distinct at 0.25 s, 6 321 at 0.5 s.
        let (rate, ws) = window(6321, 3935).rate_and_working_set();
        assert!((rate / 20_000.0 - 1.0).abs() < 0.01, "{rate}");
        assert!(ws.is_some_and(|w| w.abs_diff(10_000) < 100), "{ws:?}");
    }

    #[test]
    fn a_window_saturated_by_half_time_gives_the_set_it_saw() {
        let (rate, ws) = window(5000, 4990).rate_and_working_set();
        assert!(ws.is_some_and(|w| w.abs_diff(5000) < 300), "{ws:?}");
        assert!(rate > 3.0 * 5000.0 / 0.25 * 0.9, "{rate}");
    }

    #[test]
    fn an_unsaturated_window_is_a_plain_rate() {
        assert_eq!(window(2000, 1000).rate_and_working_set(), (4000.0, None));
        assert_eq!(window(40, 20).rate_and_working_set(), (80.0, None));
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
                "scan",
                "text",
                "written_since_boot"
            ]
        );
        assert_eq!(
            keys(&wire["link"]),
            ["bandwidth", "downtime-limit-ms", "from"]
        );
        assert_eq!(
            keys(&wire["guest_stall"]),
            ["fault_cost_us", "period_s", "share", "total_ms", "vcpus"]
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
                "half_window_pages",
                "mode",
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

    /// 128 MiB, a writer rewriting 32 MiB at 20,000 pages/s over 20 MB/s:
    /// it does not converge unhelped.
    fn too_fast(vcpus: u64) -> Inputs {
        Inputs {
            total_pages: 32_768,
            nonzero_pages: 32_768,
            dirty_rate: 20_000.0,
            working_set: Some(8_192),
            backed_pages: None,
            bandwidth: Some(20e6),
            max_downtime: 0.3,
            vcpus,
            max_rounds: None,
            stall_per_page: None,
            limited: None,
            costs: model::Costs::default(),
        }
    }

    #[test]
    fn the_dirty_limit_chosen_costs_the_guest_least_and_spares_the_quiet_vcpu() {
        use crate::vcpu::dirty_limit::MB;
        let inputs = too_fast(2);
        // vCPU 0 writes it all; vCPU 1 dirties 0.5 MB/s.
        let rates = [20_000.0 * 4096.0, 0.5 * MB as f64];
        let c = cheapest_dirty_limit(&inputs, &rates).expect("a limit converges");
        assert!(c.prediction.converges);
        assert_eq!(c.vcpus, vec![0], "only the writer is limited");
        assert!(c.throttle_seconds > 0.0);
        // No limit that converges costs the guest noticeably less.
        let costs: Vec<(u64, f64)> = (1..=80)
            .filter_map(|mb| limit_choice(&inputs, &rates, mb))
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
        assert!(limit_choice(&inputs, &rates, 20).is_none());
        let hopeless = Inputs {
            bandwidth: Some(1.0),
            ..inputs
        };
        assert!(cheapest_dirty_limit(&hopeless, &rates).is_none());
        assert!(cheapest_dirty_limit(&inputs, &[0.0, 0.0]).is_none());
    }

    #[test]
    fn the_throttle_chosen_is_the_smallest_that_converges() {
        let inputs = too_fast(1);
        assert!(
            !model::predict(&inputs).unwrap().converges,
            "the case needs a throttle"
        );
        let c = smallest_throttle(&inputs).expect("a throttle converges");
        assert!((1..=99).contains(&c.pct), "{}", c.pct);
        assert!(c.prediction.converges);
        // One less either does not converge or leaves the guest dirtying
        // more than the trigger's half of the link, where auto-converge
        // would step on.
        let less = Inputs {
            dirty_rate: inputs.dirty_rate * f64::from(100 - (c.pct - 1)) / 100.0,
            ..inputs
        };
        let over_trigger = less.dirty_rate * model::DIRTY_PAGE_WIRE as f64 > 0.5 * less.rate();
        assert!(
            over_trigger || !model::predict(&less).unwrap().converges,
            "{} % is the smallest",
            c.pct
        );
        let kept = Inputs {
            dirty_rate: inputs.dirty_rate * f64::from(100 - c.pct) / 100.0,
            ..inputs
        };
        assert!(kept.dirty_rate * model::DIRTY_PAGE_WIRE as f64 <= 0.5 * kept.rate());
        assert!(c.throttle_seconds > 0.0);
        // A link that cannot keep up whatever the throttle: none.
        let hopeless = Inputs {
            bandwidth: Some(1.0),
            ..inputs
        };
        assert!(smallest_throttle(&hopeless).is_none());
    }
}

/// The smallest auto-converge throttle, % (1 to 99), under which the
/// migration `inputs` describe would converge and auto-converge would not
/// step further (the guest dirties at most the trigger's share, half, of
/// what the link sends), and its prediction: a throttled vCPU runs
/// `100 - pct` % of the time, so it dirties that share of its rate. No
/// round limit: the question is whether it converges, not when it is cut.
fn smallest_throttle(inputs: &Inputs) -> Option<Converge> {
    let trigger = crate::protocol::migration::Parameters::THROTTLE_TRIGGER_PERCENT as f64 / 100.0;
    let converges = |pct: u32| {
        let throttled = Inputs {
            dirty_rate: inputs.dirty_rate * f64::from(100 - pct) / 100.0,
            max_rounds: None,
            ..*inputs
        };
        // Under a throttle that leaves the guest dirtying more than the
        // trigger's share of what the link sends, auto-converge steps on
        // (it did, 82 -> 92 %, on a sweep the model had converge at 82 %
        // in 12 passes): the throttle chosen is one it keeps.
        let dirty_bytes = throttled.dirty_rate * model::DIRTY_PAGE_WIRE as f64;
        (dirty_bytes <= trigger * throttled.rate())
            .then(|| model::predict(&throttled).ok())
            .flatten()
            .filter(|p| p.converges)
    };
    // Convergence only gets easier as the throttle grows: the first that
    // converges, by bisection.
    converges(99)?;
    let (mut lo, mut hi) = (0u32, 99u32);
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
        // Every vCPU sleeps that share of the migration (the throttle starts
        // with it, from the prediction).
        throttle_seconds: prediction.total_seconds * f64::from(hi) / 100.0 * inputs.vcpus as f64,
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
fn cheapest_dirty_limit(inputs: &Inputs, rates: &[f64]) -> Option<LimitChoice> {
    use crate::vcpu::dirty_limit::MB;
    if rates.iter().sum::<f64>() <= 0.0 {
        return None;
    }
    let converges = |mb| limit_choice(inputs, rates, mb);
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
fn limit_choice(inputs: &Inputs, rates: &[f64], mb: u64) -> Option<LimitChoice> {
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
    let slice = crate::vcpu::throttle::TIMESLICE.as_secs_f64();
    let period = crate::vcpu::dirty_limit::DEFAULT_PERIOD_MS as f64 / 1e3;
    for &r in rates {
        let share = inputs.dirty_rate * r / total;
        if r > limit {
            // Its bucket: a period's burst, then the limit; in its first
            // slice it writes at its tracked rate (and sleeps it off).
            held.rate += limit / 4096.0;
            held.burst += limit * period / 4096.0;
            held.first += (r / 4096.0 * slice).max(limit * period / 4096.0);
        } else {
            free += share;
        }
    }
    let limited = Inputs {
        dirty_rate: free,
        working_set: None,
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
            * rates
                .iter()
                .map(|r| (1.0 - limit / r).max(0.0))
                .sum::<f64>(),
        prediction,
    })
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
    /// The throttled migration's prediction.
    pub(crate) prediction: Prediction,
    /// vCPU time the throttle takes from the guest over it, seconds.
    pub(crate) throttle_seconds: f64,
}
