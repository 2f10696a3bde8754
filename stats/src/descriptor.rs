//! One stat's descriptor (`struct kvm_stats_desc`): what it is, where its values live, how
//! to scale them; and the checks one descriptor must pass on its own.

#![forbid(unsafe_code)]

use std::ops::Range;

use crate::error::StatError;
use crate::flags::{Base, StatType, Unit};
use crate::header::{DESC_FIXED_LEN, MAX_DATA_SIZE};

/// One stat, as its descriptor declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    /// Name, without the NUL.
    pub name: String,
    /// Raw `flags`, including bits this library does not know.
    pub flags: u32,
    /// Type, decoded from `flags`.
    pub kind: StatType,
    /// Unit, decoded from `flags`.
    pub unit: Unit,
    /// Base of the scale, decoded from `flags`.
    pub base: Base,
    /// The value times `base^exponent` is in the unit.
    pub exponent: i16,
    /// Number of u64 values: 1, or the bucket count of a histogram.
    pub size: u16,
    /// Offset of the values from the start of the data block.
    pub offset: u32,
    /// Width of a linear histogram's buckets, else 0.
    pub bucket_size: u32,
}

impl Descriptor {
    /// Decodes one descriptor from its `16 + name_size` bytes. Only the name can fail here;
    /// [`Descriptor::validate`] checks the rest.
    ///
    /// # Errors
    ///
    /// [`StatError::NameNotTerminated`], [`StatError::NameEmpty`] or
    /// [`StatError::NameNotUtf8`].
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, StatError> {
        let Some((head, name_bytes)) = bytes.split_first_chunk::<DESC_FIXED_LEN>() else {
            return Err(StatError::NameNotTerminated);
        };
        let u32_at =
            |i: usize| u32::from_ne_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
        let flags = u32_at(0);
        let name = parse_name(name_bytes)?;
        Ok(Self {
            name,
            flags,
            kind: StatType::from_flags(flags),
            unit: Unit::from_flags(flags),
            base: Base::from_flags(flags),
            exponent: i16::from_ne_bytes([head[4], head[5]]),
            size: u16::from_ne_bytes([head[6], head[7]]),
            offset: u32_at(8),
            bucket_size: u32_at(12),
        })
    }

    /// Encodes the descriptor with a name field of `name_size` bytes (the name is cut to
    /// `name_size - 1` bytes so the NUL always fits; nothing is written when `name_size` is 0).
    pub fn to_bytes(&self, name_size: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(DESC_FIXED_LEN + name_size);
        out.extend_from_slice(&self.flags.to_ne_bytes());
        out.extend_from_slice(&self.exponent.to_ne_bytes());
        out.extend_from_slice(&self.size.to_ne_bytes());
        out.extend_from_slice(&self.offset.to_ne_bytes());
        out.extend_from_slice(&self.bucket_size.to_ne_bytes());
        let mut name = vec![0u8; name_size];
        let len = self.name.len().min(name_size.saturating_sub(1));
        name[..len].copy_from_slice(&self.name.as_bytes()[..len]);
        out.extend_from_slice(&name);
        out
    }

    /// Checks the rules one descriptor must follow on its own (the kernel selftest's, plus
    /// alignment, the boolean rules and the data-size cap). Unknown types, units and bases
    /// pass: the rules that depend on them are skipped.
    ///
    /// # Errors
    ///
    /// The first [`StatError`] found.
    pub fn validate(&self) -> Result<(), StatError> {
        if self.size == 0 {
            return Err(StatError::ZeroSize);
        }
        if self.offset % 8 != 0 {
            return Err(StatError::Misaligned {
                field: "offset",
                value: self.offset,
            });
        }
        let end = self.data_range().end;
        if end > MAX_DATA_SIZE {
            return Err(StatError::OutsideData {
                end,
                limit: MAX_DATA_SIZE,
            });
        }
        self.validate_bucket_size()?;
        self.validate_exponent()?;
        self.validate_boolean()
    }

    fn validate_bucket_size(&self) -> Result<(), StatError> {
        let ok = match self.kind {
            StatType::LinearHistogram => self.bucket_size != 0,
            StatType::Unknown(_) => true,
            _ => self.bucket_size == 0,
        };
        if ok {
            return Ok(());
        }
        Err(StatError::BucketSize {
            kind: self.kind,
            value: self.bucket_size,
        })
    }

    fn validate_exponent(&self) -> Result<(), StatError> {
        let ok = match self.unit {
            Unit::None | Unit::Bytes | Unit::Cycles => self.exponent >= 0,
            Unit::Seconds => self.exponent <= 0,
            Unit::Boolean => self.exponent == 0,
            Unit::Unknown(_) => true,
        };
        if ok {
            return Ok(());
        }
        Err(StatError::ExponentSign {
            unit: self.unit,
            exponent: self.exponent,
        })
    }

    fn validate_boolean(&self) -> Result<(), StatError> {
        if self.unit != Unit::Boolean {
            return Ok(());
        }
        match self.kind {
            StatType::Log2Histogram => Err(StatError::BooleanLog2Histogram),
            StatType::LinearHistogram if self.size != 2 => {
                Err(StatError::BooleanBuckets { size: self.size })
            }
            _ => Ok(()),
        }
    }

    /// Byte range of the values within the data block.
    pub fn data_range(&self) -> Range<u64> {
        let start = u64::from(self.offset);
        start..start + u64::from(self.size) * 8
    }

    /// `base^exponent`: multiply a raw value by it to get the unit (seconds, bytes, ...);
    /// `None` when the base is unknown.
    pub fn scale(&self) -> Option<f64> {
        let radix = self.base.radix()?;
        Some(f64::from(radix).powi(i32::from(self.exponent)))
    }

    /// A raw value in the unit (seconds, bytes, cycles); the raw value itself when the base
    /// is unknown.
    pub fn to_unit(&self, raw: u64) -> f64 {
        // u64 -> f64 rounds above 2^53; stats that large are far beyond any precision shown.
        let value = raw as f64;
        self.scale().map_or(value, |scale| value * scale)
    }

    /// Raw bounds `[lower, upper)` of histogram bucket `index`; `upper` is `None` for the
    /// last, open-ended bucket. `None` if the stat is not a histogram or has no such bucket.
    /// Log2 bounds past 2^63 saturate at `u64::MAX`.
    pub fn bucket_bounds(&self, index: usize) -> Option<(u64, Option<u64>)> {
        if index >= usize::from(self.size) {
            return None;
        }
        let last = index + 1 == usize::from(self.size);
        let i = index as u64;
        let (lower, upper) = match self.kind {
            StatType::LinearHistogram => {
                let width = u64::from(self.bucket_size);
                (width * i, width * (i + 1))
            }
            StatType::Log2Histogram if index == 0 => (0, 1),
            StatType::Log2Histogram => (pow2_saturating(i - 1), pow2_saturating(i)),
            _ => return None,
        };
        Some((lower, (!last).then_some(upper)))
    }
}

fn pow2_saturating(exponent: u64) -> u64 {
    u32::try_from(exponent)
        .ok()
        .and_then(|e| 1u64.checked_shl(e))
        .unwrap_or(u64::MAX)
}

fn parse_name(bytes: &[u8]) -> Result<String, StatError> {
    let Some(nul) = bytes.iter().position(|&b| b == 0) else {
        return Err(StatError::NameNotTerminated);
    };
    if nul == 0 {
        return Err(StatError::NameEmpty);
    }
    let name = std::str::from_utf8(&bytes[..nul]).map_err(|_| StatError::NameNotUtf8)?;
    if !printable(name) {
        return Err(StatError::NameNotPrintable);
    }
    Ok(name.to_owned())
}

/// Whether `text` holds nothing a terminal acts on: no control character
/// (newline, escape, carriage return), line or paragraph separator, or
/// bidirectional override. KVM's names and ids are identifiers; a file
/// whose names hold such characters would forge lines of a table or move
/// a terminal's cursor.
pub(crate) fn printable(text: &str) -> bool {
    !text.chars().any(|c| {
        c.is_control()
            || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_a_terminal_would_act_on_are_refused() {
        for bad in ["a\nb", "\u{1b}[2J", "x\u{202e}y", "tab\there", "del\u{7f}"] {
            let mut bytes = bad.as_bytes().to_vec();
            bytes.push(0);
            assert_eq!(
                super::parse_name(&bytes),
                Err(super::StatError::NameNotPrintable),
                "{bad:?}"
            );
        }
        assert_eq!(
            super::parse_name(b"halt_poll_success_ns\0").as_deref(),
            Ok("halt_poll_success_ns")
        );
        assert_eq!(
            super::parse_name("caf\u{e9}\0".as_bytes()).as_deref(),
            Ok("caf\u{e9}")
        );
    }

    use super::*;

    fn desc(kind: StatType, unit: Unit, exponent: i16, size: u16, bucket_size: u32) -> Descriptor {
        let flags = kind.to_flags() | unit.to_flags();
        Descriptor {
            name: "stat".into(),
            flags,
            kind,
            unit,
            base: Base::Pow10,
            exponent,
            size,
            offset: 0,
            bucket_size,
        }
    }

    #[test]
    fn descriptor_round_trips_through_bytes() {
        let d = desc(StatType::LinearHistogram, Unit::Seconds, -9, 4, 100);
        let bytes = d.to_bytes(48);
        assert_eq!(bytes.len(), 64);
        assert_eq!(Descriptor::from_bytes(&bytes), Ok(d));
    }

    #[test]
    fn from_bytes_rejects_unterminated_name() {
        let mut d = desc(StatType::Cumulative, Unit::None, 0, 1, 0);
        d.name = "abcdefgh".into();
        let mut bytes = d.to_bytes(8);
        bytes[23] = b'h';
        assert_eq!(
            Descriptor::from_bytes(&bytes),
            Err(StatError::NameNotTerminated)
        );
    }

    #[test]
    fn validate_rejects_bucket_size_on_log2_histogram() {
        let d = desc(StatType::Log2Histogram, Unit::None, 0, 4, 8);
        assert!(matches!(
            d.validate(),
            Err(StatError::BucketSize { value: 8, .. })
        ));
    }

    #[test]
    fn validate_skips_rules_of_unknown_unit() {
        let d = desc(StatType::Cumulative, Unit::Unknown(9), -3, 1, 0);
        assert_eq!(d.validate(), Ok(()));
    }

    #[test]
    fn linear_bucket_bounds_follow_bucket_size() {
        let d = desc(StatType::LinearHistogram, Unit::None, 0, 3, 10);
        assert_eq!(d.bucket_bounds(0), Some((0, Some(10))));
        assert_eq!(d.bucket_bounds(1), Some((10, Some(20))));
        assert_eq!(d.bucket_bounds(2), Some((20, None)));
        assert_eq!(d.bucket_bounds(3), None);
    }

    #[test]
    fn log2_bucket_bounds_are_powers_of_two() {
        let d = desc(StatType::Log2Histogram, Unit::None, 0, 70, 0);
        assert_eq!(d.bucket_bounds(0), Some((0, Some(1))));
        assert_eq!(d.bucket_bounds(1), Some((1, Some(2))));
        assert_eq!(d.bucket_bounds(4), Some((8, Some(16))));
        assert_eq!(d.bucket_bounds(65), Some((u64::MAX, Some(u64::MAX))));
        assert_eq!(d.bucket_bounds(69), Some((u64::MAX, None)));
    }

    #[test]
    fn nanoseconds_scale_to_seconds() {
        let d = desc(StatType::Cumulative, Unit::Seconds, -9, 1, 0);
        assert!((d.to_unit(1_250_000_000) - 1.25).abs() < 1e-12);
    }
}
