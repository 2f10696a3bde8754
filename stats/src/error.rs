//! Errors of reading a stats file: the schema (header, id, descriptors) and samples.
//!
//! Every malformed-input error names the field and the value that broke a rule, so a bad
//! file can be diagnosed from the message alone. Problems inside one descriptor are
//! [`StatError`]s wrapped in [`Error::Stat`] with the descriptor's index and name.
//! What a schema uses that this library does not know is a [`Warning`], not an
//! error unless the caller asks for strictness (`crate::strict`). Every error type of
//! the crate lives here, below the modules that raise them.

#![forbid(unsafe_code)]

use std::io;
use std::ops::Range;

use crate::flags::{StatType, Unit};

/// Why a stats file could not be read or did not follow the format.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The source failed to read.
    #[error("cannot read the {block} at offset {offset}")]
    Read {
        /// Which block was being read: "header", "id", "descriptors" or "data".
        block: &'static str,
        /// Where the read started.
        offset: u64,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The file ended inside a block.
    #[error("the {block} at offset {offset} ends after {got} of its {wanted} bytes")]
    Truncated {
        /// Which block: "header", "id", "descriptors" or "data".
        block: &'static str,
        /// Where the block starts.
        offset: u64,
        /// Bytes the block needs.
        wanted: u64,
        /// Bytes the file had.
        got: u64,
    },
    /// A header field that must be 0 is not (`flags`).
    #[error("header field {field} is {value:#x}, expected 0")]
    NonZero {
        /// Name of the header field.
        field: &'static str,
        /// Its value.
        value: u64,
    },
    /// A block offset is not 8-byte aligned.
    #[error("header field {field} is {value}, not a multiple of 8")]
    Misaligned {
        /// `id_offset`, `desc_offset` or `data_offset`.
        field: &'static str,
        /// Its value.
        value: u64,
    },
    /// A size is over the sanity cap checked before anything is allocated.
    #[error("{field} is {value}, above the limit of {limit}")]
    TooLarge {
        /// `name_size`, `num_desc` or a block length.
        field: &'static str,
        /// Its value.
        value: u64,
        /// The cap.
        limit: u64,
    },
    /// A size is too small to hold what must fit in it.
    #[error("header field {field} is {value}, below the minimum of {min}")]
    TooSmall {
        /// `name_size`.
        field: &'static str,
        /// Its value.
        value: u64,
        /// The smallest value that works.
        min: u64,
    },
    /// A block offset points inside the 24-byte header.
    #[error("header field {field} is {value}, inside the 24-byte header")]
    InsideHeader {
        /// `id_offset`, `desc_offset` or `data_offset`.
        field: &'static str,
        /// Its value.
        value: u64,
    },
    /// Two blocks share bytes.
    #[error("the {first} block {first_range:?} overlaps the {second} block {second_range:?}")]
    Overlap {
        /// First block: "id", "descriptors" or "data".
        first: &'static str,
        /// Its byte range in the file.
        first_range: Range<u64>,
        /// Second block.
        second: &'static str,
        /// Its byte range in the file.
        second_range: Range<u64>,
    },
    /// The id string has no NUL within `name_size` bytes.
    #[error("the id string has no NUL terminator within name_size bytes")]
    IdNotTerminated,
    /// The id string does not start with "kvm".
    #[error("the id string {id:?} does not start with \"kvm\"")]
    IdPrefix {
        /// The id, lossily decoded.
        id: String,
    },
    /// The id string is not UTF-8.
    #[error("the id string is not UTF-8")]
    IdNotUtf8,
    /// The id string holds a character a terminal acts on (a control
    /// character, a line separator, a bidirectional override).
    #[error("the id string holds a control character")]
    IdNotPrintable,
    /// One descriptor breaks a rule.
    #[error("stat #{index} ({name:?}) is malformed")]
    Stat {
        /// Position of the descriptor.
        index: usize,
        /// Its name, or "" when the name itself is malformed.
        name: String,
        /// What is wrong with it.
        #[source]
        source: StatError,
    },
    /// Two stats have the same name.
    #[error("stat name {name:?} is used by descriptors #{first} and #{second}")]
    DuplicateName {
        /// The name.
        name: String,
        /// Index of the first descriptor with it.
        first: usize,
        /// Index of the second.
        second: usize,
    },
    /// The values of two stats share bytes of the data block.
    #[error("stats {first:?} and {second:?} share bytes of the data block")]
    StatsOverlap {
        /// Name of the stat with the lower offset.
        first: String,
        /// Name of the other stat.
        second: String,
    },
    /// Strict mode: the schema uses something this library does not know.
    #[error("strict mode rejects the schema")]
    Unsupported(#[source] Warning),
}

/// Result of this crate's reading functions.
pub type Result<T> = std::result::Result<T, Error>;

/// What is wrong with one descriptor (wrapped in [`crate::Error::Stat`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StatError {
    /// The name has no NUL within `name_size` bytes.
    #[error("name has no NUL terminator within name_size bytes")]
    NameNotTerminated,
    /// The name is empty.
    #[error("name is empty")]
    NameEmpty,
    /// The name is not UTF-8.
    #[error("name is not UTF-8")]
    NameNotUtf8,
    /// The name holds a character a terminal acts on (a control character,
    /// a line separator, a bidirectional override): names are shown in
    /// tables and logs as they are.
    #[error("name holds a control character")]
    NameNotPrintable,
    /// `size` is 0.
    #[error("field size is 0")]
    ZeroSize,
    /// `offset` is not a multiple of 8.
    #[error("field {field} is {value}, not a multiple of 8")]
    Misaligned {
        /// Always "offset".
        field: &'static str,
        /// Its value.
        value: u32,
    },
    /// `bucket_size` is 0 for a linear histogram, or non-zero for another type.
    #[error("field bucket_size is {value}, which a {kind} cannot have")]
    BucketSize {
        /// The stat's type.
        kind: StatType,
        /// Its `bucket_size`.
        value: u32,
    },
    /// The exponent's sign does not fit the unit (none/bytes/cycles >= 0, seconds <= 0,
    /// boolean == 0).
    #[error("field exponent is {exponent}, which unit {unit} cannot have")]
    ExponentSign {
        /// The stat's unit.
        unit: Unit,
        /// Its exponent.
        exponent: i16,
    },
    /// A boolean stat declared as a log2 histogram.
    #[error("a boolean stat cannot be a log2 histogram")]
    BooleanLog2Histogram,
    /// A boolean linear histogram without exactly two buckets.
    #[error("field size is {size}, but a boolean linear histogram has 2 buckets")]
    BooleanBuckets {
        /// Its `size`.
        size: u16,
    },
    /// The values end past the largest data block accepted.
    #[error("values end at byte {end} of the data block, past the limit of {limit}")]
    OutsideData {
        /// `offset + size * 8`.
        end: u64,
        /// [`crate::MAX_DATA_SIZE`].
        limit: u64,
    },
}

/// Something a stat uses that this library does not know; not an error by default.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Warning {
    /// The type field is not one of the five known types.
    #[error("stat {stat:?} has unknown type {value}")]
    UnknownType {
        /// Stat name.
        stat: String,
        /// Raw type field.
        value: u32,
    },
    /// The unit field is not one of the five known units.
    #[error("stat {stat:?} has unknown unit {value:#x}")]
    UnknownUnit {
        /// Stat name.
        stat: String,
        /// Raw unit field, in place in `flags` (e.g. 0x50).
        value: u32,
    },
    /// The base field is neither 10 nor 2.
    #[error("stat {stat:?} has unknown base {value:#x}")]
    UnknownBase {
        /// Stat name.
        stat: String,
        /// Raw base field, in place in `flags` (e.g. 0x200).
        value: u32,
    },
    /// `flags` has bits set above bit 11.
    #[error("stat {stat:?} sets unknown flag bits {bits:#x}")]
    UnknownFlagBits {
        /// Stat name.
        stat: String,
        /// The unknown bits.
        bits: u32,
    },
    /// A scalar type (cumulative, instant, peak) with more than one value: the format says 1.
    #[error("stat {stat:?} is a scalar with {size} values")]
    ScalarArray {
        /// Stat name.
        stat: String,
        /// Its `size`.
        size: u16,
    },
}
