//! A stats fd with its schema: the object a VMM keeps for each VM and vCPU.

#![forbid(unsafe_code)]

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};

use crate::error::Result;
use crate::sample::Sample;
use crate::schema::Schema;

/// An open stats fd (made here with [`crate::ioctl::get_stats_fd`], received over a socket,
/// or inherited) and its schema, read once.
#[derive(Debug)]
pub struct StatsFd {
    file: File,
    schema: Schema,
}

impl StatsFd {
    /// Reads and checks the schema, then reads the data block once to check it is readable
    /// in full. Unknown types, units and bases are accepted (see [`Schema::warnings`]).
    ///
    /// # Errors
    ///
    /// Those of [`Schema::read`] and of [`Sample::read_from`].
    pub fn new(file: File) -> Result<Self> {
        let schema = Schema::read(&file)?;
        Self::with_schema(file, schema)
    }

    /// Like [`StatsFd::new`], but fails on anything this library does not know.
    ///
    /// # Errors
    ///
    /// Those of [`Schema::read_strict`] and of [`Sample::read_from`].
    pub fn new_strict(file: File) -> Result<Self> {
        let schema = Schema::read_strict(&file)?;
        Self::with_schema(file, schema)
    }

    /// Like [`StatsFd::new`] with a schema the caller read (and checked: its
    /// data size, say, before the data block is read and allocated).
    ///
    /// # Errors
    ///
    /// Those of [`Sample::read_from`].
    pub fn with_schema(file: File, schema: Schema) -> Result<Self> {
        let fd = Self { file, schema };
        let mut probe = fd.new_sample();
        fd.read_sample(&mut probe)?;
        Ok(fd)
    }

    /// The schema read when the fd was opened.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// Shares `other`'s descriptors where they are the same as this fd's
    /// (see [`Schema::share_descriptors`]); says whether they now are.
    pub fn share_descriptors(&mut self, other: &Schema) -> bool {
        self.schema.share_descriptors(other)
    }

    /// A sample sized for this fd (the one allocation; reuse it for every read).
    pub fn new_sample(&self) -> Sample {
        Sample::new(&self.schema)
    }

    /// Reads the data block into `sample` with one `pread` and stamps it; allocates nothing
    /// when `sample` came from [`StatsFd::new_sample`].
    ///
    /// # Errors
    ///
    /// [`crate::Error::Read`] if the read fails, [`crate::Error::Truncated`] if it comes back short.
    pub fn read_sample(&self, sample: &mut Sample) -> Result<()> {
        sample.read_from(&self.file, &self.schema)
    }

    /// The file, for callers that poll or pass it on.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Gives the file back, dropping the schema.
    pub fn into_file(self) -> File {
        self.file
    }
}

impl AsRawFd for StatsFd {
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

impl AsFd for StatsFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}
