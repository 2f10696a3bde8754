//! Reader for the KVM binary statistics interface (`KVM_GET_STATS_FD`, Linux 5.14+).
//!
//! Works with any stats fd: one made here with [`ioctl::get_stats_fd`], one received over a
//! socket, one inherited from another process. The schema (header, id string, descriptors)
//! is read and checked once ([`Schema`]); each [`Sample`] is then one `pread` of the data
//! block into a buffer the caller owns, with no allocation. On top of that: typed values
//! ([`Value`]) scaled to seconds, bytes or cycles, deltas and rates between samples
//! ([`delta()`]), checks on sampled values ([`check`]), a human table ([`format`](mod@format)) and JSON
//! shaped like QEMU's `query-stats` ([`json`]).
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let vm_fd = std::fs::File::open("/dev/null")?;
//! let stats = kvm_stats::StatsFd::new(kvm_stats::ioctl::get_stats_fd(&vm_fd)?)?;
//! let pages = stats.schema().find("pages_4k").ok_or("no pages_4k")?;
//! let mut sample = stats.new_sample();
//! stats.read_sample(&mut sample)?;
//! println!("{} pages of 4 KiB mapped", sample.u64(pages));
//! # Ok(())
//! # }
//! ```
//!
//! Malformed input is a typed [`Error`] naming the field and value, never a panic; no
//! allocation is sized by a header field before it is checked against a cap. Names and
//! the id string must be UTF-8 without characters a terminal acts on (control
//! characters, line separators, bidirectional overrides): they are shown as they are. Only
//! [`ioctl`] has unsafe code; every other module forbids it.

#![deny(unsafe_code)]
#![warn(missing_docs)]
// Every number here comes from the kernel or a peer: no cast may lose,
// wrap or sign-flip one silently (use `try_from` and a typed error).
#![warn(
    clippy::cast_lossless,
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap,
    clippy::cast_sign_loss
)]

pub mod builder;
pub mod check;
mod delta;
mod descriptor;
mod error;
mod fd;
mod filter;
mod flags;
pub mod format;
#[cfg(feature = "fuzzing")]
pub mod fuzz;
mod header;
#[allow(unsafe_code)]
pub mod ioctl;
pub mod json;
mod mapped;
mod read_at;
mod sample;
mod schema;
pub mod strict;
mod value;

pub use delta::{delta, Change, Delta};
pub use descriptor::Descriptor;
pub use error::{Error, Result, StatError, Warning};
pub use fd::StatsFd;
pub use filter::{BadPattern, NameFilter};
pub use flags::{Base, StatType, Unit};
pub use header::{Header, HEADER_SIZE, MAX_DATA_SIZE, MAX_NAME_SIZE, MAX_NUM_DESC};
pub use mapped::Mapped;
pub use read_at::ReadAt;
pub use sample::Sample;
pub use schema::{Schema, StatId, Target};
pub use value::{Bucket, Value};
