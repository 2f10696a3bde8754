//! The axes' ranges and tick labels: what plotters is asked to draw on the
//! time, byte and rate axes, and how the ticks read (binary units for bytes,
//! k/M for rates, decades on the log rate axis).

use std::ops::Range;

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};
use plotters::coord::types::RangedCoordf64;

/// Binary units, one per power of 1024.
const BYTE_UNITS: [&str; 9] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"];

/// Most ticks a log axis labels; more decades than this share a tick.
const MAX_LOG_TICKS: f64 = 8.0;

/// Head room above the largest value on the linear axes.
const HEAD_ROOM: f64 = 1.05;

/// The time range from `t0` to `t1` seconds, from 0 when `t0` is close to it
/// (the sampler's clock starts at 0); a single instant gets a second around it.
pub(super) fn time_range(t0: f64, t1: f64) -> Range<f64> {
    if t1 > t0 {
        let near_zero = t0 > 0.0 && t0 <= 0.1 * (t1 - t0);
        (if near_zero { 0.0 } else { t0 })..t1
    } else {
        let lo = (t0 - 0.5).max(0.0).min(t0);
        lo..lo + 1.0
    }
}

/// The byte axis: one binary unit for every label, chosen by the largest value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct ByteAxis {
    /// Bytes in one unit of the axis.
    pub(crate) unit_bytes: f64,
    /// The unit's name (`MiB`).
    pub(crate) unit: &'static str,
    /// The top of the axis, in units.
    pub(crate) top: f64,
}

impl ByteAxis {
    /// An axis from zero to a little above `max` bytes (1 KiB when there is nothing).
    pub(crate) fn new(max: f64) -> Self {
        let max = if max.is_finite() && max >= 1.0 {
            max
        } else {
            1024.0
        };
        let k = (max.log2() / 10.0)
            .floor()
            .clamp(0.0, (BYTE_UNITS.len() - 1) as f64);
        let unit_bytes = 1024f64.powf(k);
        let scaled = max / unit_bytes;
        // One KiB on an empty axis is its whole height, not 95% of it.
        let top = if scaled <= 1.0 {
            1.0
        } else {
            scaled * HEAD_ROOM
        };
        ByteAxis {
            unit_bytes,
            unit: BYTE_UNITS
                .get(crate::units::saturating_usize(k))
                .copied()
                .unwrap_or("B"),
            top,
        }
    }

    /// `bytes` in axis units, within the axis.
    pub(crate) fn y(&self, bytes: f64) -> f64 {
        clamp(bytes / self.unit_bytes, 0.0, self.top)
    }

    /// A tick's label: `30 MiB`, `0`.
    pub(crate) fn label(&self, v: f64) -> String {
        if v == 0.0 {
            "0".into()
        } else {
            format!("{} {}", number(v), self.unit)
        }
    }
}

/// The exit-rate axis, log (in decades, from 1/s) or linear (from zero).
#[derive(Debug, Clone, PartialEq)]
pub(super) enum RateAxis {
    /// Values are `log10(rate)`, from 0 (1/s and less) to `top` decades.
    Log { top: f64, decades: Vec<f64> },
    /// Values are rates, from 0 to `top`.
    Linear { top: f64 },
}

impl RateAxis {
    /// A log axis up to the decade above `max`.
    pub(crate) fn log(max: f64) -> Self {
        let top = if max.is_finite() && max > 1.0 {
            max.log10().ceil().max(1.0)
        } else {
            1.0
        };
        let every = (top / MAX_LOG_TICKS).ceil().max(1.0);
        let decades = (0..)
            .map(|i| f64::from(i) * every)
            .take_while(|e| *e <= top)
            .collect();
        RateAxis::Log { top, decades }
    }

    /// A linear axis up to a little above `max`.
    pub(crate) fn linear(max: f64) -> Self {
        // Capped so that the head room above it is still finite.
        let max = if max.is_finite() && max > 0.0 {
            max.min(1e300)
        } else {
            1.0
        };
        RateAxis::Linear {
            top: max * HEAD_ROOM,
        }
    }

    /// The top of the axis, in axis values.
    pub(crate) fn top(&self) -> f64 {
        match self {
            RateAxis::Log { top, .. } | RateAxis::Linear { top } => *top,
        }
    }

    /// `rate` as an axis value, within the axis. On the log axis, rates at or
    /// below 1/s (zero included) sit on the bottom.
    pub(crate) fn y(&self, rate: f64) -> f64 {
        match self {
            RateAxis::Log { top, .. } if rate > 1.0 => clamp(rate.log10(), 0.0, *top),
            RateAxis::Log { .. } => 0.0,
            RateAxis::Linear { top } => clamp(rate, 0.0, *top),
        }
    }

    /// A tick's label: `≤1`, `100`, `10k` on the log axis; `80k` on the linear one.
    pub(crate) fn label(&self, v: f64) -> String {
        match self {
            RateAxis::Log { .. } if v == 0.0 => "≤1".into(),
            RateAxis::Log { .. } => si(10f64.powf(v)),
            RateAxis::Linear { .. } => si(v),
        }
    }
}

/// plotters draws the rate axis through this: values are mapped linearly
/// (they are already logarithms on the log axis); the ticks are the decades
/// on the log axis and plotters' own round numbers on the linear one.
impl Ranged for RateAxis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        RangedCoordf64::from(self.range()).map(value, limit)
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        match self {
            // Decades only: no lighter lines between them.
            RateAxis::Log { .. } if hint.weight().allow_light_points() => Vec::new(),
            RateAxis::Log { decades, .. } => decades.clone(),
            RateAxis::Linear { .. } => RangedCoordf64::from(self.range()).key_points(hint),
        }
    }

    fn range(&self) -> Range<f64> {
        0.0..self.top()
    }
}

/// `v` within `lo..=hi`, NaN on the bottom.
fn clamp(v: f64, lo: f64, hi: f64) -> f64 {
    if v.is_nan() {
        lo
    } else {
        v.clamp(lo, hi)
    }
}

/// A tick value with at most three decimals and no trailing zeros: `0.2`, `10`.
pub(super) fn number(v: f64) -> String {
    let text = format!("{v:.3}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    if text == "-0" {
        "0".into()
    } else {
        text.to_string()
    }
}

/// A short label for a count: `950`, `1.5k`, `20M`, `1e18`.
pub(super) fn si(v: f64) -> String {
    let (div, suffix) = match v.abs() {
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

    #[test]
    fn byte_axis_uses_mebibytes_for_mebibyte_values() {
        let a = ByteAxis::new(48.0 * 1048576.0);
        assert_eq!((a.unit, a.label(30.0)), ("MiB", "30 MiB".to_string()));
        assert!((a.top - 50.4).abs() < 1e-9);
    }

    #[test]
    fn byte_axis_of_zero_spans_one_kibibyte() {
        let a = ByteAxis::new(0.0);
        assert_eq!((a.unit, a.top), ("KiB", 1.0));
        assert_eq!(a.label(1.0), "1 KiB");
    }

    #[test]
    fn byte_axis_of_huge_values_stays_finite_in_yobibytes() {
        let a = ByteAxis::new(u64::MAX as f64 * 1073741824.0);
        assert_eq!(a.unit, "YiB");
        assert!(a.top.is_finite());
        assert_eq!(a.y(f64::INFINITY), a.top);
    }

    #[test]
    fn time_range_of_one_instant_spans_a_second() {
        assert_eq!(time_range(3.0, 3.0), 2.5..3.5);
    }

    #[test]
    fn time_range_starts_at_zero_when_the_first_sample_is_near_it() {
        assert_eq!(time_range(0.013, 1.9), 0.0..1.9);
        assert_eq!(time_range(10.0, 12.0), 10.0..12.0);
    }

    #[test]
    fn log_axis_puts_zero_and_small_rates_on_the_bottom() {
        let a = RateAxis::log(25_000.0);
        assert_eq!(a.top(), 5.0);
        assert_eq!((a.y(0.0), a.y(0.5), a.y(f64::NAN)), (0.0, 0.0, 0.0));
        assert!((a.y(1000.0) - 3.0).abs() < 1e-9);
        let labels: Vec<String> = (0..6).map(|e| a.label(f64::from(e))).collect();
        assert_eq!(labels, ["≤1", "10", "100", "1k", "10k", "100k"]);
    }

    #[test]
    fn log_axis_of_huge_rates_thins_its_ticks() {
        let a = RateAxis::log(f64::MAX);
        let RateAxis::Log { decades, .. } = &a else {
            panic!("not a log axis");
        };
        assert!(decades.len() <= 9, "{decades:?}");
        assert_eq!(a.y(f64::INFINITY), a.top());
    }

    #[test]
    fn linear_axis_of_the_largest_float_stays_finite() {
        assert!(RateAxis::linear(f64::MAX).top().is_finite());
    }

    #[test]
    fn labels_use_k_and_m_and_trim_zeros() {
        assert_eq!(RateAxis::linear(1.0).label(80_000.0), "80k");
        assert_eq!(si(1_500_000.0), "1.5M");
        assert_eq!(si(0.25), "0.25");
        assert_eq!(
            (number(0.2), number(1.0), number(-0.0)),
            ("0.2".into(), "1".into(), "0".into())
        );
    }
}
