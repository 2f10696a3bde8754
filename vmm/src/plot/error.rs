//! Why a plot could not be made.

use std::path::PathBuf;

use super::options::{MAX_SERIES_BYTES, MAX_SIDE, MIN_HEIGHT, MIN_WIDTH};
use crate::sampler::record::ParseError;

/// A plot that could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// The output file name has no extension to pick a format by.
    #[error("output '{}' has no extension: name it .svg or .png", path.display())]
    NoOutputExtension {
        /// The output file.
        path: PathBuf,
    },
    /// The output file's extension names no format we write.
    #[error("unsupported output extension '.{ext}': use .svg or .png")]
    UnsupportedExtension {
        /// The extension, without its dot.
        ext: String,
    },
    /// The chart would be too small for its axes and legend, or too large.
    #[error("chart size {width}x{height} is out of range: width {MIN_WIDTH} to {MAX_SIDE}, height {MIN_HEIGHT} to {MAX_SIDE}")]
    BadSize {
        /// Width asked for.
        width: u32,
        /// Height asked for.
        height: u32,
    },
    /// The series file could not be read.
    #[error("cannot read series {}", path.display())]
    ReadSeries {
        /// The series file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The series file is not a sampler series.
    #[error("series {} is not a sampler series ({read_as})", path.display())]
    ParseSeries {
        /// The series file.
        path: PathBuf,
        /// How it was read, and why: its name picks the format.
        read_as: &'static str,
        /// The line and what is wrong with it.
        #[source]
        source: ParseError,
    },
    /// No sample has a finite time.
    #[error("series {name} has no samples to plot (none with a finite time)")]
    EmptySeries {
        /// The series' name (its file name).
        name: String,
    },
    /// The samples' times span more than a float holds (first, last).
    #[error("series {name}'s times run from {first:e} s to {last:e} s: a span no axis can hold")]
    TimeSpan {
        /// The series' name (its file name).
        name: String,
        /// The earliest finite time.
        first: f64,
        /// The latest finite time.
        last: f64,
    },
    /// The series file is larger than a plot reads (its size at least).
    #[error("series {} is over {} MiB: plot a part of it (e.g. its header and last lines: head -n 1; tail -n 100000)", path.display(), MAX_SERIES_BYTES >> 20)]
    TooLarge {
        /// The series file.
        path: PathBuf,
    },
    /// `--vcpu` names a vCPU the series does not have.
    #[error("vCPU {vcpu} is not in the series (it has {vcpus})")]
    NoSuchVcpu {
        /// The vCPU asked for.
        vcpu: usize,
        /// vCPUs in the series.
        vcpus: usize,
    },
    /// The image buffer would not fit in memory.
    #[error("cannot allocate a {width}x{height} image")]
    AllocateImage {
        /// Width asked for.
        width: u32,
        /// Height asked for.
        height: u32,
    },
    /// plotters could not draw the chart.
    #[error("cannot draw the chart")]
    Draw(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The PNG encoder failed.
    #[error("cannot encode the PNG")]
    EncodePng(#[source] ::png::EncodingError),
    /// The image could not be written.
    #[error("cannot write {}", path.display())]
    WriteOutput {
        /// The output file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}
