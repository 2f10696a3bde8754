//! The three fields packed in a descriptor's `flags`: type (bits 0-3), unit (bits 4-7) and
//! base (bits 8-11).
//!
//! Values this library does not know are kept as `Unknown(raw)` rather than rejected: a newer
//! kernel may add a type or unit, and a reader must keep working on the stats it does know.
//! [`crate::Schema::warnings`] lists them for callers that want to be strict.

#![forbid(unsafe_code)]

use std::fmt;

const TYPE_MASK: u32 = 0xf;
const UNIT_SHIFT: u32 = 4;
const UNIT_MASK: u32 = 0xf << UNIT_SHIFT;
const BASE_SHIFT: u32 = 8;
const BASE_MASK: u32 = 0xf << BASE_SHIFT;
/// Bits of `flags` that carry no field today.
pub(crate) const UNKNOWN_BITS: u32 = !(TYPE_MASK | UNIT_MASK | BASE_MASK);

/// How a stat's value behaves over time (`KVM_STATS_TYPE_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StatType {
    /// Only grows (a counter or a total).
    Cumulative,
    /// Goes up and down (a level).
    Instant,
    /// The highest value seen; only grows.
    Peak,
    /// Histogram whose bucket `i` counts values in `[bucket_size*i, bucket_size*(i+1))`.
    LinearHistogram,
    /// Histogram whose bucket 0 counts 0 and bucket `i` counts `[2^(i-1), 2^i)`.
    Log2Histogram,
    /// A type this library does not know; the raw 4-bit field.
    Unknown(u32),
}

impl StatType {
    /// Decodes the type field of a descriptor's `flags`.
    pub fn from_flags(flags: u32) -> Self {
        match flags & TYPE_MASK {
            0 => Self::Cumulative,
            1 => Self::Instant,
            2 => Self::Peak,
            3 => Self::LinearHistogram,
            4 => Self::Log2Histogram,
            other => Self::Unknown(other),
        }
    }

    /// The type field as it sits in `flags`.
    pub fn to_flags(self) -> u32 {
        match self {
            Self::Cumulative => 0,
            Self::Instant => 1,
            Self::Peak => 2,
            Self::LinearHistogram => 3,
            Self::Log2Histogram => 4,
            Self::Unknown(raw) => raw & TYPE_MASK,
        }
    }

    /// True for both histogram types.
    pub fn is_histogram(self) -> bool {
        matches!(self, Self::LinearHistogram | Self::Log2Histogram)
    }

    /// The name QEMU's `StatsType` uses, or `None` for an unknown type.
    pub fn qapi_name(self) -> Option<&'static str> {
        match self {
            Self::Cumulative => Some("cumulative"),
            Self::Instant => Some("instant"),
            Self::Peak => Some("peak"),
            Self::LinearHistogram => Some("linear-histogram"),
            Self::Log2Histogram => Some("log2-histogram"),
            Self::Unknown(_) => None,
        }
    }
}

impl fmt::Display for StatType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.qapi_name(), self) {
            (Some(name), _) => f.write_str(name),
            (None, _) => write!(f, "unknown type {}", self.to_flags()),
        }
    }
}

/// What a stat measures (`KVM_STATS_UNIT_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    /// A plain count.
    None,
    /// Memory, in bytes.
    Bytes,
    /// Time, in seconds.
    Seconds,
    /// CPU clock cycles.
    Cycles,
    /// 0 or 1.
    Boolean,
    /// A unit this library does not know; the raw field shifted down to 0..=15.
    Unknown(u32),
}

impl Unit {
    /// Decodes the unit field of a descriptor's `flags`.
    pub fn from_flags(flags: u32) -> Self {
        match (flags & UNIT_MASK) >> UNIT_SHIFT {
            0 => Self::None,
            1 => Self::Bytes,
            2 => Self::Seconds,
            3 => Self::Cycles,
            4 => Self::Boolean,
            other => Self::Unknown(other),
        }
    }

    /// The unit field as it sits in `flags`.
    pub fn to_flags(self) -> u32 {
        let raw = match self {
            Self::None => 0,
            Self::Bytes => 1,
            Self::Seconds => 2,
            Self::Cycles => 3,
            Self::Boolean => 4,
            Self::Unknown(raw) => raw & 0xf,
        };
        raw << UNIT_SHIFT
    }

    /// The name QEMU's `StatsUnit` uses; `None` for a plain count and for an unknown unit.
    pub fn qapi_name(self) -> Option<&'static str> {
        match self {
            Self::Bytes => Some("bytes"),
            Self::Seconds => Some("seconds"),
            Self::Cycles => Some("cycles"),
            Self::Boolean => Some("boolean"),
            Self::None | Self::Unknown(_) => None,
        }
    }
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::None => f.write_str("none"),
            Self::Unknown(raw) => write!(f, "unknown unit {raw}"),
            known => f.write_str(known.qapi_name().unwrap_or("none")),
        }
    }
}

/// The base of the scale: the value times `base^exponent` is in the unit (`KVM_STATS_BASE_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Base {
    /// Powers of 10 (time, cycles, counts).
    Pow10,
    /// Powers of 2 (memory).
    Pow2,
    /// A base this library does not know; the raw field shifted down to 0..=15.
    Unknown(u32),
}

impl Base {
    /// Decodes the base field of a descriptor's `flags`.
    pub fn from_flags(flags: u32) -> Self {
        match (flags & BASE_MASK) >> BASE_SHIFT {
            0 => Self::Pow10,
            1 => Self::Pow2,
            other => Self::Unknown(other),
        }
    }

    /// The base field as it sits in `flags`.
    pub fn to_flags(self) -> u32 {
        let raw = match self {
            Self::Pow10 => 0,
            Self::Pow2 => 1,
            Self::Unknown(raw) => raw & 0xf,
        };
        raw << BASE_SHIFT
    }

    /// The base as a number (10 or 2), `None` when unknown.
    pub fn radix(self) -> Option<u32> {
        match self {
            Self::Pow10 => Some(10),
            Self::Pow2 => Some(2),
            Self::Unknown(_) => None,
        }
    }
}

impl fmt::Display for Base {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.radix() {
            Some(radix) => write!(f, "{radix}"),
            None => write!(f, "unknown base {}", self.to_flags() >> BASE_SHIFT),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_fields_round_trip_through_flags() {
        let flags =
            StatType::Log2Histogram.to_flags() | Unit::Seconds.to_flags() | Base::Pow2.to_flags();
        assert_eq!(flags, 0x124);
        assert_eq!(StatType::from_flags(flags), StatType::Log2Histogram);
        assert_eq!(Unit::from_flags(flags), Unit::Seconds);
        assert_eq!(Base::from_flags(flags), Base::Pow2);
    }

    #[test]
    fn unknown_fields_are_kept_with_their_raw_value() {
        let flags = 0x0f7;
        assert_eq!(StatType::from_flags(flags), StatType::Unknown(7));
        assert_eq!(Unit::from_flags(flags), Unit::Unknown(0xf));
        assert_eq!(Base::from_flags(0x300), Base::Unknown(3));
        assert_eq!(
            StatType::Unknown(7).to_flags() | Unit::Unknown(0xf).to_flags(),
            flags
        );
    }

    #[test]
    fn qapi_names_match_qemu_enums() {
        assert_eq!(
            StatType::LinearHistogram.qapi_name(),
            Some("linear-histogram")
        );
        assert_eq!(Unit::None.qapi_name(), None);
        assert_eq!(Unit::Boolean.qapi_name(), Some("boolean"));
        assert_eq!(StatType::Unknown(9).qapi_name(), None);
    }
}
