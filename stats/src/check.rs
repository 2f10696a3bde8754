//! Checks on sampled values, which the schema alone cannot make: booleans are 0 or 1, and
//! between two samples cumulative and peak stats never decrease.
//!
//! Values are read without locking, but each u64 is read whole, so these hold for any pair
//! of reads of a correct kernel.

#![forbid(unsafe_code)]

use crate::flags::{StatType, Unit};
use crate::sample::Sample;
use crate::schema::Schema;

/// A sampled value that breaks the format's rules.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The sample does not hold the schema's data block.
    #[error("sample holds {got} words, the schema needs {expected}")]
    SampleSize {
        /// Words the schema's data block has.
        expected: usize,
        /// Words the sample has.
        got: usize,
    },
    /// A boolean scalar holds something other than 0 or 1.
    #[error("boolean stat {stat:?} holds {value}")]
    NotBoolean {
        /// Stat name.
        stat: String,
        /// The value.
        value: u64,
    },
    /// A cumulative or peak stat went down between two samples.
    #[error("{kind} stat {stat:?} went down from {older} to {newer}")]
    Decreased {
        /// Stat name.
        stat: String,
        /// Cumulative or peak.
        kind: StatType,
        /// Value in the older sample.
        older: u64,
        /// Value in the newer sample.
        newer: u64,
    },
    /// The newer sample was taken before the older one.
    #[error("the newer sample was taken before the older one")]
    TimeReversed,
}

fn check_size(schema: &Schema, sample: &Sample) -> Result<(), Error> {
    let expected = (schema.data_size() / 8) as usize;
    let got = sample.words().len();
    if got != expected {
        return Err(Error::SampleSize { expected, got });
    }
    Ok(())
}

/// Checks one sample against its schema: size, and boolean scalars 0 or 1 (the buckets of a
/// boolean histogram are counts, not booleans, and are not checked).
///
/// # Errors
///
/// The first [`Error::SampleSize`] or [`Error::NotBoolean`] found.
pub fn validate_sample(schema: &Schema, sample: &Sample) -> Result<(), Error> {
    check_size(schema, sample)?;
    for (id, desc) in schema.iter() {
        if desc.unit != Unit::Boolean || desc.kind.is_histogram() {
            continue;
        }
        if let Some(&value) = sample.values(id).iter().find(|&&v| v > 1) {
            return Err(Error::NotBoolean {
                stat: desc.name.clone(),
                value,
            });
        }
    }
    Ok(())
}

/// Checks that between `older` and `newer` no cumulative or peak value went down (every
/// value of the stat, so scalar arrays too) and time did not run backwards.
///
/// # Errors
///
/// [`Error::SampleSize`], [`Error::TimeReversed`] or the first [`Error::Decreased`].
pub fn check_monotonic(schema: &Schema, older: &Sample, newer: &Sample) -> Result<(), Error> {
    check_size(schema, older)?;
    check_size(schema, newer)?;
    if newer.timestamp() < older.timestamp() {
        return Err(Error::TimeReversed);
    }
    for (id, desc) in schema.iter() {
        if !matches!(desc.kind, StatType::Cumulative | StatType::Peak) {
            continue;
        }
        let pairs = older.values(id).iter().zip(newer.values(id));
        if let Some((&o, &n)) = pairs.into_iter().find(|(o, n)| n < o) {
            return Err(Error::Decreased {
                stat: desc.name.clone(),
                kind: desc.kind,
                older: o,
                newer: n,
            });
        }
    }
    Ok(())
}
