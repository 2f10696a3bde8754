//! One reading of a stats file's data block, with the monotonic time it was taken.
//!
//! A [`Sample`] owns its buffer, sized once for a schema; reading into it is one `pread`
//! straight into the `Vec<u64>` (viewed as bytes), and allocates nothing. Cloning copies the
//! words; [`Sample::copy_from`] (and `clone_from`) reuse the destination's buffer, so a ring
//! of samples costs no allocation after it is filled once.

#![forbid(unsafe_code)]

use std::time::Instant;

use crate::error::{Error, Result};
use crate::read_at::{read_full_at, ReadAt};
use crate::schema::{Schema, StatId};
use crate::value::Value;

/// The data block of one read, as native-endian u64 words, and when it was read.
#[derive(Debug)]
pub struct Sample {
    words: Vec<u64>,
    timestamp: Instant,
}

impl Sample {
    /// A zeroed sample sized for `schema`, stamped now. This is the only allocation.
    pub fn new(schema: &Schema) -> Self {
        // data_size is capped (MAX_DATA_SIZE) when the schema is read.
        let words = (schema.data_size() / 8) as usize;
        Self {
            words: vec![0; words],
            timestamp: Instant::now(),
        }
    }

    /// Reads the data block of `src` (laid out as `schema` says) into this sample with one
    /// positioned read, and stamps it with the time the read returned. Allocates only if
    /// the sample was not sized for `schema`.
    ///
    /// # Errors
    ///
    /// [`Error::Read`] if the read fails, [`Error::Truncated`] if the source ends inside
    /// the data block; the sample's contents are then unspecified.
    pub fn read_from(&mut self, src: &(impl ReadAt + ?Sized), schema: &Schema) -> Result<()> {
        let words = (schema.data_size() / 8) as usize;
        if self.words.len() != words {
            self.words.resize(words, 0);
        }
        let offset = u64::from(schema.header().data_offset);
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut self.words);
        let wanted = bytes.len();
        let got = read_full_at(src, bytes, offset).map_err(|source| Error::Read {
            block: "data",
            offset,
            source,
        })?;
        self.timestamp = Instant::now();
        if got < wanted {
            return Err(Error::Truncated {
                block: "data",
                offset,
                wanted: wanted as u64,
                got: got as u64,
            });
        }
        Ok(())
    }

    /// When the data was read (monotonic clock).
    pub fn timestamp(&self) -> Instant {
        self.timestamp
    }

    /// The whole data block as u64 words.
    pub fn words(&self) -> &[u64] {
        &self.words
    }

    /// The whole data block as u64 words, to fill in: for a sample made
    /// rather than read (sums or differences of other samples, laid out by
    /// a schema of their own).
    pub fn words_mut(&mut self) -> &mut [u64] {
        &mut self.words
    }

    /// The raw values of a stat (one, or one per bucket); empty if `id` does not fit this
    /// sample (an id from another schema).
    pub fn values(&self, id: StatId) -> &[u64] {
        self.words.get(id.words()).unwrap_or(&[])
    }

    /// The first raw value of a stat (the value of a scalar); 0 if `id` does not fit.
    pub fn u64(&self, id: StatId) -> u64 {
        self.values(id).first().copied().unwrap_or(0)
    }

    /// The typed value of a stat; allocates only for histograms and unknown types.
    pub fn value(&self, schema: &Schema, id: StatId) -> Value {
        match schema.get(id) {
            Some(desc) => Value::from_raw(desc, self.values(id)),
            None => Value::Unknown(Vec::new()),
        }
    }

    /// A scalar stat in its unit (seconds, bytes, cycles); `None` for histograms, unknown
    /// types and foreign ids.
    pub fn in_unit(&self, schema: &Schema, id: StatId) -> Option<f64> {
        let desc = schema.get(id)?;
        self.value(schema, id).in_unit(desc)
    }

    /// Makes this sample a copy of `other`, reusing this sample's buffer.
    pub fn copy_from(&mut self, other: &Sample) {
        self.words.clone_from(&other.words);
        self.timestamp = other.timestamp;
    }
}

impl Clone for Sample {
    fn clone(&self) -> Self {
        Self {
            words: self.words.clone(),
            timestamp: self.timestamp,
        }
    }

    fn clone_from(&mut self, source: &Self) {
        self.copy_from(source);
    }
}
