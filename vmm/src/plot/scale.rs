//! Axis scales: where the ticks go on a time, byte or rate axis, and how their
//! labels read (round numbers, binary units for bytes, k/M for rates).

/// Binary units, one per power of 1024.
const BYTE_UNITS: [&str; 9] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"];

/// Most ticks a log axis labels; more decades than this share a tick.
const MAX_LOG_TICKS: f64 = 8.0;

/// A labelled position on an axis.
#[derive(Debug, Clone, PartialEq)]
pub struct Tick {
    pub value: f64,
    pub label: String,
}

/// A mapping from data values to a fraction of the axis length, with ticks.
#[derive(Debug, Clone, PartialEq)]
pub struct Axis {
    lo: f64,
    hi: f64,
    log: bool,
    pub ticks: Vec<Tick>,
}

impl Axis {
    /// Where `v` falls between the ends of the axis, 0.0 to 1.0 (clamped).
    /// On a log axis, values at or below the bottom (zero included) sit on it.
    pub fn frac(&self, v: f64) -> f64 {
        let f = if self.log {
            if v <= 10f64.powf(self.lo) {
                0.0
            } else {
                (v.log10() - self.lo) / (self.hi - self.lo)
            }
        } else {
            (v - self.lo) / (self.hi - self.lo)
        };
        if f.is_nan() {
            0.0
        } else {
            f.clamp(0.0, 1.0)
        }
    }

    /// The largest value the axis shows.
    #[cfg(test)]
    pub fn top(&self) -> f64 {
        if self.log {
            10f64.powf(self.hi)
        } else {
            self.hi
        }
    }
}

/// A round step (1, 2 or 5 times a power of ten) that cuts `span` into about
/// `target` parts (the multiplier nearest on a log scale, so the count stays close).
pub fn nice_step(span: f64, target: f64) -> f64 {
    let raw = span / target;
    if !(raw.is_finite() && raw > 0.0) {
        return 1.0;
    }
    let mag = 10f64.powf(raw.log10().floor());
    let mult = match raw / mag {
        n if n < std::f64::consts::SQRT_2 => 1.0,
        n if n < 3.16 => 2.0,
        n if n < 7.07 => 5.0,
        _ => 10.0,
    };
    mult * mag
}

/// Decimal places a label needs to tell ticks `step` apart.
fn decimals(step: f64) -> usize {
    if step >= 1.0 || !step.is_finite() || step <= 0.0 {
        0
    } else {
        (-step.log10()).ceil().min(12.0) as usize
    }
}

/// Multiples of `step` from `lo` to `hi`.
fn multiples(lo: f64, hi: f64, step: f64) -> Vec<f64> {
    let first = (lo / step - 1e-9).ceil();
    (0..200)
        .map(|i| (first + f64::from(i)) * step)
        .take_while(|v| *v <= hi + step * 1e-9)
        .collect()
}

/// The time axis from `t0` to `t1` seconds, from 0 when `t0` is close to it
/// (the sampler's clock starts at 0); a single instant gets a second around it.
pub fn time_axis(t0: f64, t1: f64) -> Axis {
    let (lo, hi) = if t1 > t0 {
        let near_zero = t0 > 0.0 && t0 <= 0.1 * (t1 - t0);
        (if near_zero { 0.0 } else { t0 }, t1)
    } else {
        let lo = (t0 - 0.5).max(0.0).min(t0);
        (lo, lo + 1.0)
    };
    let step = nice_step(hi - lo, 8.0);
    let d = decimals(step);
    let ticks = multiples(lo, hi, step)
        .into_iter()
        .map(|v| Tick {
            value: v,
            label: if v == 0.0 {
                "0".into()
            } else {
                format!("{v:.d$}")
            },
        })
        .collect();
    Axis {
        lo,
        hi,
        log: false,
        ticks,
    }
}

/// A byte axis from zero to a round number above `max` in one binary unit.
pub fn bytes_axis(max: f64) -> Axis {
    let max = if max.is_finite() && max >= 1.0 {
        max
    } else {
        1024.0
    };
    let k = (max.log2() / 10.0)
        .floor()
        .clamp(0.0, (BYTE_UNITS.len() - 1) as f64) as i32;
    let unit_bytes = 1024f64.powi(k);
    let scaled = max / unit_bytes;
    let step = nice_step(scaled, 5.0);
    let top = (scaled / step - 1e-9).ceil().max(1.0) * step;
    let d = decimals(step);
    let unit = BYTE_UNITS[k as usize];
    let ticks = multiples(0.0, top, step)
        .into_iter()
        .map(|v| Tick {
            value: v * unit_bytes,
            label: if v == 0.0 {
                "0".to_string()
            } else {
                format!("{v:.d$} {unit}")
            },
        })
        .collect();
    Axis {
        lo: 0.0,
        hi: top * unit_bytes,
        log: false,
        ticks,
    }
}

/// A linear rate axis from zero to a round number above `max`.
pub fn linear_rate_axis(max: f64) -> Axis {
    // Capped so that a round step above it is still finite.
    let max = if max.is_finite() && max > 0.0 {
        max.min(1e300)
    } else {
        1.0
    };
    let step = nice_step(max, 5.0);
    let top = (max / step - 1e-9).ceil().max(1.0) * step;
    let ticks = multiples(0.0, top, step)
        .into_iter()
        .map(|v| Tick {
            value: v,
            label: si(v),
        })
        .collect();
    Axis {
        lo: 0.0,
        hi: top,
        log: false,
        ticks,
    }
}

/// A log rate axis from 1/s to the decade above `max`. Anything lower, zero
/// included, sits on the bottom, so its tick reads `≤1`.
pub fn log_rate_axis(max: f64) -> Axis {
    let hi = if max.is_finite() && max > 1.0 {
        max.log10().ceil().max(1.0)
    } else {
        1.0
    };
    let every = (hi / MAX_LOG_TICKS).ceil().max(1.0);
    let ticks = multiples(0.0, hi, every)
        .into_iter()
        .map(|e| {
            let value = 10f64.powf(e);
            Tick {
                value,
                label: if e == 0.0 { "≤1".into() } else { si(value) },
            }
        })
        .collect();
    Axis {
        lo: 0.0,
        hi,
        log: true,
        ticks,
    }
}

/// A short label for a count: `950`, `1.5k`, `20M`, `1e18`.
pub fn si(v: f64) -> String {
    let a = v.abs();
    let (div, suffix) = match a {
        a if a >= 1e15 => return format!("{v:.0e}"),
        a if a >= 1e12 => (1e12, "T"),
        a if a >= 1e9 => (1e9, "G"),
        a if a >= 1e6 => (1e6, "M"),
        a if a >= 1e3 => (1e3, "k"),
        _ => (1.0, ""),
    };
    let text = format!("{:.2}", v / div);
    let text = text.trim_end_matches('0').trim_end_matches('.');
    format!("{text}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(a: &Axis) -> Vec<&str> {
        a.ticks.iter().map(|t| t.label.as_str()).collect()
    }

    #[test]
    fn nice_step_picks_one_two_or_five() {
        assert_eq!(nice_step(10.0, 5.0), 2.0);
        assert_eq!(nice_step(48.0, 5.0), 10.0);
        assert_eq!(nice_step(0.7, 5.0), 0.1);
        assert_eq!(nice_step(1.8, 5.0), 0.5);
        assert_eq!(nice_step(0.0, 5.0), 1.0);
        assert_eq!(nice_step(f64::NAN, 5.0), 1.0);
    }

    #[test]
    fn bytes_axis_labels_mebibytes_for_mebibyte_values() {
        let a = bytes_axis(48.0 * 1048576.0);
        assert_eq!(
            labels(&a),
            ["0", "10 MiB", "20 MiB", "30 MiB", "40 MiB", "50 MiB"]
        );
        assert_eq!(a.top(), 50.0 * 1048576.0);
    }

    #[test]
    fn bytes_axis_of_zero_spans_one_kibibyte() {
        let a = bytes_axis(0.0);
        assert_eq!(a.top(), 1024.0);
        assert_eq!(labels(&a).last(), Some(&"1.0 KiB"));
    }

    #[test]
    fn bytes_axis_of_huge_values_stays_finite() {
        let a = bytes_axis(u64::MAX as f64 * 1073741824.0);
        assert!(a.top().is_finite());
        assert!(a
            .ticks
            .iter()
            .all(|t| t.label.ends_with("YiB") || t.label == "0"));
    }

    #[test]
    fn time_axis_of_one_instant_spans_a_second() {
        let a = time_axis(3.0, 3.0);
        assert_eq!((a.frac(2.5), a.frac(3.0), a.frac(3.5)), (0.0, 0.5, 1.0));
    }

    #[test]
    fn time_axis_keeps_a_late_start() {
        let a = time_axis(10.0, 12.0);
        assert_eq!(labels(&a).first(), Some(&"10.0"));
    }

    #[test]
    fn time_axis_ticks_are_round() {
        let a = time_axis(0.013, 1.9);
        assert_eq!(
            labels(&a),
            ["0", "0.2", "0.4", "0.6", "0.8", "1.0", "1.2", "1.4", "1.6", "1.8"]
        );
    }

    #[test]
    fn log_axis_puts_zero_and_small_rates_on_the_bottom() {
        let a = log_rate_axis(25_000.0);
        assert_eq!(labels(&a), ["≤1", "10", "100", "1k", "10k", "100k"]);
        assert_eq!(a.frac(0.0), 0.0);
        assert_eq!(a.frac(0.5), 0.0);
        assert!((a.frac(1000.0) - 0.6).abs() < 1e-9);
    }

    #[test]
    fn log_axis_of_huge_rates_thins_its_ticks() {
        let a = log_rate_axis(1e300);
        assert!(a.ticks.len() <= 9, "{:?}", labels(&a));
        assert_eq!(a.frac(f64::INFINITY), 1.0);
    }

    #[test]
    fn linear_rate_axis_of_the_largest_float_stays_finite() {
        let a = linear_rate_axis(f64::MAX);
        assert!(a.top().is_finite() && a.ticks.len() > 1);
    }

    #[test]
    fn linear_rate_axis_uses_k_and_m() {
        assert_eq!(
            labels(&linear_rate_axis(4500.0)),
            ["0", "1k", "2k", "3k", "4k", "5k"]
        );
        assert_eq!(si(1_500_000.0), "1.5M");
        assert_eq!(si(0.25), "0.25");
    }
}
