//! Positioned reads from a stats file, whatever holds it.
//!
//! A stats fd is read with `pread` at fixed offsets and never with a file position, so the
//! parser only needs "read these bytes at this offset". [`ReadAt`] says exactly that; it is
//! implemented for [`File`] (a real stats fd, wherever it came from) and for byte buffers
//! (synthetic files in tests, fuzz inputs, dumps).

#![forbid(unsafe_code)]

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// A source of bytes readable at any offset without a file position.
pub trait ReadAt {
    /// Reads up to `buf.len()` bytes at `offset` into `buf` and returns how many were read;
    /// 0 means end of file.
    ///
    /// # Errors
    ///
    /// Any I/O error of the underlying source.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
}

impl ReadAt for File {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        FileExt::read_at(self, buf, offset)
    }
}

impl ReadAt for [u8] {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let Ok(start) = usize::try_from(offset) else {
            return Ok(0);
        };
        let Some(available) = self.get(start..) else {
            return Ok(0);
        };
        let n = available.len().min(buf.len());
        buf[..n].copy_from_slice(&available[..n]);
        Ok(n)
    }
}

impl ReadAt for Vec<u8> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.as_slice().read_at(buf, offset)
    }
}

impl<T: ReadAt + ?Sized> ReadAt for &T {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        (**self).read_at(buf, offset)
    }
}

/// Fills `buf` from `offset`, retrying short reads; returns how many bytes were read, which is
/// less than `buf.len()` only at end of file. A stats fd answers in one call, so in practice
/// this is one `pread`.
///
/// # Errors
///
/// Any I/O error but `Interrupted`, which is retried.
pub(crate) fn read_full_at(
    src: &(impl ReadAt + ?Sized),
    buf: &mut [u8],
    offset: u64,
) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        let at = offset.saturating_add(done as u64);
        match src.read_at(&mut buf[done..], at) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slice_read_past_end_returns_zero() {
        let data = [1u8, 2, 3];
        let mut buf = [0u8; 4];
        assert_eq!(data[..].read_at(&mut buf, 3).ok(), Some(0));
        assert_eq!(data[..].read_at(&mut buf, u64::MAX).ok(), Some(0));
    }

    #[test]
    fn slice_read_near_end_is_short() {
        let data = vec![1u8, 2, 3];
        let mut buf = [0u8; 4];
        assert_eq!(data.read_at(&mut buf, 1).ok(), Some(2));
        assert_eq!(&buf[..2], &[2, 3]);
    }

    #[test]
    fn read_full_at_stops_at_end_of_file() {
        let data = vec![7u8; 10];
        let mut buf = [0u8; 16];
        assert_eq!(read_full_at(&data, &mut buf, 4).ok(), Some(6));
    }
}
