//! Errors of reading a stats file: the schema (header, id, descriptors) and samples.
//!
//! Every malformed-input error names the field and the value that broke a rule, so a bad
//! file can be diagnosed from the message alone. Problems inside one descriptor are
//! [`StatError`]s wrapped in [`Error::Stat`] with the descriptor's index and name.

#![forbid(unsafe_code)]

use std::io;
use std::ops::Range;

use crate::descriptor::StatError;
use crate::strict::Warning;

/// Why a stats file could not be read or did not follow the format.
#[derive(Debug, thiserror::Error)]
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
