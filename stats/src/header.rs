//! The 24-byte header at offset 0 of a stats file, and the checks made on it before anything
//! it describes is allocated or read.

#![forbid(unsafe_code)]

use std::ops::Range;

use crate::error::{Error, Result};
use crate::read_at::{read_full_at, ReadAt};

/// Size of `struct kvm_stats_header`, as a buffer length.
pub const HEADER_LEN: usize = 24;
/// Size of `struct kvm_stats_header`, as a file offset.
pub const HEADER_SIZE: u64 = HEADER_LEN as u64;
/// Size of the fixed part of `struct kvm_stats_desc`, before the name, as a buffer length.
pub const DESC_FIXED_LEN: usize = 16;
/// Size of the fixed part of `struct kvm_stats_desc`, as a file offset.
pub const DESC_FIXED_SIZE: u64 = DESC_FIXED_LEN as u64;
/// Largest `name_size` accepted (QEMU's cap; the kernel uses 48).
pub const MAX_NAME_SIZE: u32 = 1 << 20;
/// Largest `num_desc` accepted (QEMU's cap; x86 kernels have fewer than 100).
pub const MAX_NUM_DESC: u32 = 1024;
/// Smallest `name_size` that can hold an id starting with "kvm" and its NUL.
pub const MIN_NAME_SIZE: u32 = 4;
/// Largest data block accepted, in bytes: far above any kernel's (a few KiB), low enough that
/// a hostile descriptor offset cannot make a reader allocate gigabytes for a sample.
pub const MAX_DATA_SIZE: u64 = 16 << 20;

/// `struct kvm_stats_header`, as read from the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Header {
    /// Reserved; 0 today.
    pub flags: u32,
    /// Bytes of the id string and of each descriptor's name, NUL included.
    pub name_size: u32,
    /// Number of descriptors.
    pub num_desc: u32,
    /// Offset of the id string.
    pub id_offset: u32,
    /// Offset of the first descriptor.
    pub desc_offset: u32,
    /// Offset of the data block.
    pub data_offset: u32,
}

impl Header {
    /// Decodes the header from its 24 bytes (native endianness).
    pub fn from_bytes(bytes: &[u8; HEADER_LEN]) -> Self {
        let field =
            |i: usize| u32::from_ne_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
        Self {
            flags: field(0),
            name_size: field(4),
            num_desc: field(8),
            id_offset: field(12),
            desc_offset: field(16),
            data_offset: field(20),
        }
    }

    /// Encodes the header as the kernel lays it out.
    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        let fields = [
            self.flags,
            self.name_size,
            self.num_desc,
            self.id_offset,
            self.desc_offset,
            self.data_offset,
        ];
        for (chunk, value) in out.chunks_exact_mut(4).zip(fields) {
            chunk.copy_from_slice(&value.to_ne_bytes());
        }
        out
    }

    /// Reads the header at offset 0 and checks it with [`Header::validate`].
    ///
    /// # Errors
    ///
    /// [`Error::Read`] or [`Error::Truncated`] if 24 bytes cannot be read, or any error of
    /// [`Header::validate`].
    pub fn read(src: &(impl ReadAt + ?Sized)) -> Result<Self> {
        let mut bytes = [0u8; HEADER_LEN];
        let got = read_full_at(src, &mut bytes, 0).map_err(|source| Error::Read {
            block: "header",
            offset: 0,
            source,
        })?;
        if got < bytes.len() {
            return Err(Error::Truncated {
                block: "header",
                offset: 0,
                wanted: HEADER_SIZE,
                got: got as u64,
            });
        }
        let header = Self::from_bytes(&bytes);
        header.validate()?;
        Ok(header)
    }

    /// Checks what the header alone can tell: flags, sanity caps, alignment, offsets past
    /// the header, and that the id and descriptor blocks do not overlap. The data block's
    /// extent depends on the descriptors and is checked by [`crate::Schema::read`].
    ///
    /// # Errors
    ///
    /// [`Error::NonZero`], [`Error::TooSmall`], [`Error::TooLarge`], [`Error::Misaligned`],
    /// [`Error::InsideHeader`] or [`Error::Overlap`], naming the field and its value.
    pub fn validate(&self) -> Result<()> {
        if self.flags != 0 {
            return Err(Error::NonZero {
                field: "flags",
                value: self.flags.into(),
            });
        }
        check_range("name_size", self.name_size, MIN_NAME_SIZE, MAX_NAME_SIZE)?;
        check_range("num_desc", self.num_desc, 0, MAX_NUM_DESC)?;
        for (field, value) in self.offsets() {
            if value % 8 != 0 {
                return Err(Error::Misaligned { field, value });
            }
        }
        for (field, value) in self.offsets() {
            if value < HEADER_SIZE {
                return Err(Error::InsideHeader { field, value });
            }
        }
        check_disjoint(("id", self.id_range()), ("descriptors", self.desc_range()))
    }

    fn offsets(&self) -> [(&'static str, u64); 3] {
        [
            ("id_offset", self.id_offset.into()),
            ("desc_offset", self.desc_offset.into()),
            ("data_offset", self.data_offset.into()),
        ]
    }

    /// Bytes from one descriptor to the next: 16 plus `name_size`.
    pub fn desc_stride(&self) -> u64 {
        DESC_FIXED_SIZE + u64::from(self.name_size)
    }

    /// Byte range of the id string in the file.
    pub fn id_range(&self) -> Range<u64> {
        let start = u64::from(self.id_offset);
        start..start + u64::from(self.name_size)
    }

    /// Byte range of the descriptor block in the file.
    pub fn desc_range(&self) -> Range<u64> {
        let start = u64::from(self.desc_offset);
        start..start + u64::from(self.num_desc) * self.desc_stride()
    }

    /// Byte range of a data block of `data_size` bytes in the file.
    pub fn data_range(&self, data_size: u64) -> Range<u64> {
        let start = u64::from(self.data_offset);
        start..start + data_size
    }
}

fn check_range(field: &'static str, value: u32, min: u32, max: u32) -> Result<()> {
    if value < min {
        return Err(Error::TooSmall {
            field,
            value: value.into(),
            min: min.into(),
        });
    }
    if value > max {
        return Err(Error::TooLarge {
            field,
            value: value.into(),
            limit: max.into(),
        });
    }
    Ok(())
}

/// Fails if two non-empty byte ranges share a byte.
pub(crate) fn check_disjoint(
    a: (&'static str, Range<u64>),
    b: (&'static str, Range<u64>),
) -> Result<()> {
    let (first, first_range) = a;
    let (second, second_range) = b;
    let empty = first_range.is_empty() || second_range.is_empty();
    if empty || first_range.end <= second_range.start || second_range.end <= first_range.start {
        return Ok(());
    }
    Err(Error::Overlap {
        first,
        first_range,
        second,
        second_range,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel_like() -> Header {
        Header {
            flags: 0,
            name_size: 48,
            num_desc: 2,
            id_offset: 24,
            desc_offset: 72,
            data_offset: 200,
        }
    }

    #[test]
    fn header_round_trips_through_bytes() {
        let header = kernel_like();
        assert_eq!(Header::from_bytes(&header.to_bytes()), header);
    }

    #[test]
    fn kernel_like_header_is_valid() {
        assert!(kernel_like().validate().is_ok());
    }

    #[test]
    fn validate_rejects_nonzero_flags() {
        let header = Header {
            flags: 1,
            ..kernel_like()
        };
        assert!(matches!(
            header.validate(),
            Err(Error::NonZero {
                field: "flags",
                value: 1
            })
        ));
    }

    #[test]
    fn validate_rejects_misaligned_desc_offset() {
        let header = Header {
            desc_offset: 13,
            ..kernel_like()
        };
        assert!(matches!(
            header.validate(),
            Err(Error::Misaligned {
                field: "desc_offset",
                value: 13
            })
        ));
    }

    #[test]
    fn validate_rejects_name_size_over_cap() {
        let header = Header {
            name_size: MAX_NAME_SIZE + 1,
            ..kernel_like()
        };
        assert!(matches!(
            header.validate(),
            Err(Error::TooLarge {
                field: "name_size",
                ..
            })
        ));
    }

    #[test]
    fn validate_rejects_id_inside_header() {
        let header = Header {
            id_offset: 16,
            ..kernel_like()
        };
        assert!(matches!(
            header.validate(),
            Err(Error::InsideHeader {
                field: "id_offset",
                value: 16
            })
        ));
    }

    #[test]
    fn disjoint_accepts_touching_and_empty_ranges() {
        assert!(check_disjoint(("a", 0..8), ("b", 8..16)).is_ok());
        assert!(check_disjoint(("a", 4..4), ("b", 0..16)).is_ok());
        assert!(check_disjoint(("a", 0..9), ("b", 8..16)).is_err());
    }
}
