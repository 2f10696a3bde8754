//! Typed values of one stat: a scalar, a boolean or a histogram with its bucket bounds, and
//! their conversion to the base unit (seconds, bytes, cycles).

#![forbid(unsafe_code)]

use crate::descriptor::Descriptor;
use crate::flags::{StatType, Unit};

/// One histogram bucket: `count` values fell in `[lower, upper)` (raw units).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucket {
    /// Inclusive lower bound, raw.
    pub lower: u64,
    /// Exclusive upper bound, raw; `None` for the last, open-ended bucket.
    pub upper: Option<u64>,
    /// How many values fell in the bucket.
    pub count: u64,
}

impl Bucket {
    /// The lower bound in the stat's unit (e.g. seconds).
    pub fn lower_in_unit(&self, desc: &Descriptor) -> f64 {
        desc.to_unit(self.lower)
    }

    /// The upper bound in the stat's unit; `None` for the open-ended bucket.
    pub fn upper_in_unit(&self, desc: &Descriptor) -> Option<f64> {
        self.upper.map(|upper| desc.to_unit(upper))
    }
}

/// The typed value of one stat in one sample.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A counter, level or peak (cumulative, instant or peak type).
    Scalar(u64),
    /// A boolean scalar (any non-zero raw value reads as true; see
    /// [`crate::check::validate_sample`] to catch values other than 0 and 1).
    Boolean(bool),
    /// A histogram, every bucket with its bounds.
    Histogram(Vec<Bucket>),
    /// A stat of a type this library does not know: its raw values.
    Unknown(Vec<u64>),
}

impl Value {
    /// Builds the typed value of a stat from its raw values.
    pub fn from_raw(desc: &Descriptor, raw: &[u64]) -> Self {
        let first = raw.first().copied().unwrap_or(0);
        match desc.kind {
            StatType::Cumulative | StatType::Instant | StatType::Peak
                if desc.unit == Unit::Boolean =>
            {
                Self::Boolean(first != 0)
            }
            StatType::Cumulative | StatType::Instant | StatType::Peak => Self::Scalar(first),
            StatType::LinearHistogram | StatType::Log2Histogram => {
                Self::Histogram(buckets(desc, raw))
            }
            StatType::Unknown(_) => Self::Unknown(raw.to_vec()),
        }
    }

    /// A scalar in the stat's unit: seconds for a `*_ns` stat, bytes, cycles, or the count
    /// times `base^exponent`; booleans as 0.0 or 1.0. `None` for histograms and unknown types.
    pub fn in_unit(&self, desc: &Descriptor) -> Option<f64> {
        match self {
            Self::Scalar(raw) => Some(desc.to_unit(*raw)),
            Self::Boolean(b) => Some(f64::from(u8::from(*b))),
            Self::Histogram(_) | Self::Unknown(_) => None,
        }
    }

    /// The raw scalar, or `None` for histograms and unknown types.
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Self::Scalar(raw) => Some(*raw),
            Self::Boolean(b) => Some(u64::from(*b)),
            Self::Histogram(_) | Self::Unknown(_) => None,
        }
    }
}

/// The buckets of a histogram stat, with their bounds.
pub fn buckets(desc: &Descriptor, raw: &[u64]) -> Vec<Bucket> {
    raw.iter()
        .enumerate()
        .filter_map(|(i, &count)| {
            let (lower, upper) = desc.bucket_bounds(i)?;
            Some(Bucket {
                lower,
                upper,
                count,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flags::Base;

    fn desc(kind: StatType, unit: Unit, exponent: i16, size: u16) -> Descriptor {
        Descriptor {
            name: "x".into(),
            flags: kind.to_flags() | unit.to_flags(),
            kind,
            unit,
            base: Base::Pow10,
            exponent,
            size,
            offset: 0,
            bucket_size: if kind == StatType::LinearHistogram {
                1
            } else {
                0
            },
        }
    }

    #[test]
    fn boolean_instant_reads_as_boolean() {
        let d = desc(StatType::Instant, Unit::Boolean, 0, 1);
        assert_eq!(Value::from_raw(&d, &[1]), Value::Boolean(true));
    }

    #[test]
    fn log2_histogram_reads_buckets_with_bounds() {
        let d = desc(StatType::Log2Histogram, Unit::Seconds, -9, 3);
        let Value::Histogram(b) = Value::from_raw(&d, &[5, 6, 7]) else {
            panic!("not a histogram");
        };
        assert_eq!(
            b[2],
            Bucket {
                lower: 2,
                upper: None,
                count: 7
            }
        );
        assert!((b[1].lower_in_unit(&d) - 1e-9).abs() < 1e-18);
    }

    #[test]
    fn unknown_type_keeps_raw_values() {
        let d = desc(StatType::Unknown(7), Unit::None, 0, 2);
        assert_eq!(Value::from_raw(&d, &[1, 2]), Value::Unknown(vec![1, 2]));
    }

    #[test]
    fn scalar_in_unit_applies_exponent() {
        let d = desc(StatType::Cumulative, Unit::Seconds, -9, 1);
        assert_eq!(Value::Scalar(2_000_000_000).in_unit(&d), Some(2.0));
    }
}
