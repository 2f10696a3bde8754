//! The stream's wire format: fixed-size little-endian headers read with
//! zerocopy's checked `read_from_bytes` (never pointer casts), sections whose
//! lengths are bounded before anything is allocated, and a CRC-32 trailer.
//! docs/MIGRATION.md describes it for people.

use std::io::{Read, Write};

use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

/// First bytes of every stream.
pub const MAGIC: [u8; 8] = *b"KVMSMIG\0";
/// The stream version. Bumped only for changes an older receiver would
/// misread; a receiver refuses any other version, naming both.
pub const VERSION: u32 = 1;
/// Guest page size on the wire.
pub const PAGE_SIZE: u64 = 4096;
/// Largest RAM section payload a receiver accepts.
pub const MAX_RAM_SECTION: u64 = 64 << 20;
/// Largest plan section payload a receiver accepts (256 Ki ranges).
pub const MAX_PLAN_SECTION: u64 = 4 << 20;
/// Largest vCPU section payload a receiver accepts.
pub const MAX_VCPU_SECTION: u64 = 4 << 20;
/// Longest message in a reply.
pub const MAX_MESSAGE: u32 = 4096;
/// Most MSRs a vCPU section may carry.
pub const MAX_MSRS: u32 = 4096;

/// Why the stream could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the connection failed")]
    Io(#[from] std::io::Error),
    #[error("the stream ended early (truncated) while reading {0}")]
    Truncated(&'static str),
    #[error("not a kvmscope migration stream (bad magic {0:02x?})")]
    Magic([u8; 8]),
    #[error("stream version {theirs} is not supported: this kvmscope reads version {ours}")]
    Version { theirs: u32, ours: u32 },
    #[error("unknown section kind {0}")]
    Kind(u32),
    #[error("{what} section of {len} bytes is over the {max}-byte limit")]
    TooLong {
        what: &'static str,
        len: u64,
        max: u64,
    },
    #[error("{what} section is {len} bytes, but its contents need {need}")]
    Length {
        what: &'static str,
        len: u64,
        need: u64,
    },
    #[error("pages {first}..{end} lie outside guest RAM ({pages} pages)")]
    PageRange { first: u64, end: u64, pages: u64 },
    #[error("page run of kind {0} is neither zero nor normal")]
    RunKind(u32),
    #[error("the checksum does not match: the stream says {theirs:#010x}, the bytes give {ours:#010x} (corrupt stream)")]
    Checksum { theirs: u32, ours: u32 },
    #[error("the trailer counts {theirs} sections, {ours} arrived")]
    Sections { theirs: u64, ours: u64 },
    #[error("a {0} section came out of order")]
    Order(&'static str),
    #[error(
        "guest RAM differs after loading: the source's CRC-32 is {theirs:#010x}, ours {ours:#010x}"
    )]
    Digest { theirs: u32, ours: u32 },
}

/// The stream's first 16 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct StreamHeader {
    pub magic: [u8; 8],
    pub version: u32,
    pub flags: u32,
}

/// What follows a section header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Kind {
    Config = 1,
    Ram = 2,
    Pass = 3,
    Vcpu = 4,
    End = 5,
    Digest = 6,
    Plan = 7,
}

impl Kind {
    /// The kind a header names.
    ///
    /// # Errors
    /// `Kind` for an unknown value.
    pub fn from_u32(v: u32) -> Result<Kind, Error> {
        Ok(match v {
            1 => Kind::Config,
            2 => Kind::Ram,
            3 => Kind::Pass,
            4 => Kind::Vcpu,
            5 => Kind::End,
            6 => Kind::Digest,
            7 => Kind::Plan,
            other => return Err(Error::Kind(other)),
        })
    }

    /// The kind's name, for errors.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Config => "config",
            Kind::Ram => "RAM",
            Kind::Pass => "pass",
            Kind::Vcpu => "vCPU",
            Kind::End => "end",
            Kind::Digest => "RAM digest",
            Kind::Plan => "plan",
        }
    }

    /// Largest payload a receiver accepts for this kind.
    pub fn max_len(self) -> u64 {
        match self {
            Kind::Config => size_of::<ConfigRecord>() as u64,
            Kind::Ram => MAX_RAM_SECTION,
            Kind::Pass => size_of::<PassRecord>() as u64,
            Kind::Vcpu => MAX_VCPU_SECTION,
            Kind::End => size_of::<Trailer>() as u64,
            Kind::Digest => size_of::<DigestRecord>() as u64,
            Kind::Plan => MAX_PLAN_SECTION,
        }
    }
}

/// Every section starts with this.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct SectionHeader {
    pub kind: u32,
    pub reserved: u32,
    pub len: u64,
}

/// Dirty-log mode codes in [`ConfigRecord`].
pub const DIRTY_NONE: u32 = 0;
/// The bitmap.
pub const DIRTY_BITMAP: u32 = 1;
/// The ring (`ring_entries` per vCPU).
pub const DIRTY_RING: u32 = 2;

/// The VM the stream describes; the destination builds (or checks) its VM from it.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct ConfigRecord {
    pub memory: u64,
    pub tsc_khz: u64,
    pub vcpus: u32,
    pub hugepages: u32,
    pub dirty_mode: u32,
    pub ring_entries: u32,
    pub page_size: u32,
    pub guest_abi: u32,
}

/// A run of pages in a RAM section; `NORMAL` runs are followed by their bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct PageRun {
    pub first: u64,
    pub count: u32,
    pub kind: u32,
}

/// A run of pages that are all zero: the header only (QEMU's `duplicate`).
pub const RUN_ZERO: u32 = 1;
/// A run of pages sent in full (QEMU's `normal`).
pub const RUN_NORMAL: u32 = 2;

/// The end of a pre-copy pass.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct PassRecord {
    pub pass: u64,
    pub pages: u64,
}

/// A CRC-32 of all guest RAM at the source's stop (sent when the
/// `x-check-ram` parameter asks for it); the destination compares its own.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct DigestRecord {
    pub crc32: u32,
    pub reserved: u32,
}

/// A range of pages pass 0 will send with data (a plan entry): the
/// destination backs them ahead, on a second thread, while it receives.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct PlanRange {
    pub first: u64,
    pub count: u64,
}

/// The fixed part of a vCPU section; the KVM structs, MSRs and the VMM's
/// JSON follow, each of a size fixed by this header.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct VcpuHeader {
    pub index: u32,
    pub msr_count: u32,
    pub vmm_len: u32,
    pub tsc_khz: u32,
}

/// One MSR on the wire.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct MsrRecord {
    pub index: u32,
    pub reserved: u32,
    pub value: u64,
}

/// The stream's last section: how many sections came before it and the
/// CRC-32 of every byte before its section header.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct Trailer {
    pub sections: u64,
    pub crc32: u32,
    pub reserved: u32,
}

/// What the destination answers.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct ReplyHeader {
    pub magic: [u8; 4],
    pub code: u32,
    pub len: u32,
    pub reserved: u32,
}

/// Reply magic.
pub const REPLY_MAGIC: [u8; 4] = *b"KSMR";
/// The configuration fits; send the rest.
pub const REPLY_READY: u32 = 1;
/// Everything arrived and checked out; the destination resumes the guest.
pub const REPLY_COMPLETED: u32 = 2;
/// The destination refuses the stream (the message says why).
pub const REPLY_REFUSED: u32 = 3;

/// Writes a stream, counting bytes and sections and keeping the checksum.
pub struct Writer<W: Write> {
    out: W,
    crc: crc32fast::Hasher,
    /// Bytes written so far.
    pub bytes: u64,
    sections: u64,
}

impl<W: Write> Writer<W> {
    /// A writer that starts with the stream header.
    ///
    /// # Errors
    /// The write failed.
    pub fn start(out: W) -> Result<Self, Error> {
        let mut w = Writer {
            out,
            crc: crc32fast::Hasher::new(),
            bytes: 0,
            sections: 0,
        };
        let header = StreamHeader {
            magic: MAGIC,
            version: VERSION,
            flags: 0,
        };
        w.put(header.as_bytes())?;
        Ok(w)
    }

    fn put(&mut self, bytes: &[u8]) -> Result<(), Error> {
        self.out.write_all(bytes)?;
        self.crc.update(bytes);
        self.bytes += bytes.len() as u64;
        Ok(())
    }

    /// Writes one section made of `parts`.
    ///
    /// # Errors
    /// The write failed.
    pub fn section(&mut self, kind: Kind, parts: &[&[u8]]) -> Result<(), Error> {
        let len = parts.iter().map(|p| p.len() as u64).sum();
        let header = SectionHeader {
            kind: kind as u32,
            reserved: 0,
            len,
        };
        self.put(header.as_bytes())?;
        for p in parts {
            self.put(p)?;
        }
        self.sections += 1;
        Ok(())
    }

    /// Writes the trailer and flushes.
    ///
    /// # Errors
    /// The write failed.
    pub fn finish(&mut self) -> Result<(), Error> {
        let trailer = Trailer {
            sections: self.sections,
            crc32: self.crc.clone().finalize(),
            reserved: 0,
        };
        let header = SectionHeader {
            kind: Kind::End as u32,
            reserved: 0,
            len: size_of::<Trailer>() as u64,
        };
        self.out.write_all(header.as_bytes())?;
        self.out.write_all(trailer.as_bytes())?;
        self.bytes += (size_of::<SectionHeader>() + size_of::<Trailer>()) as u64;
        self.out.flush()?;
        Ok(())
    }

    /// The underlying writer.
    pub fn inner(&mut self) -> &mut W {
        &mut self.out
    }

    /// The underlying writer, shared.
    pub fn get_ref(&self) -> &W {
        &self.out
    }
}

/// Reads a stream, keeping the checksum of what it read.
pub struct Reader<R: Read> {
    input: R,
    crc: crc32fast::Hasher,
    /// Bytes read so far.
    pub bytes: u64,
    /// Sections read so far (the trailer not counted).
    pub sections: u64,
}

impl<R: Read> Reader<R> {
    /// Reads and checks the stream header.
    ///
    /// # Errors
    /// `Magic` or `Version`, or the read failed.
    pub fn start(input: R) -> Result<Self, Error> {
        let mut r = Reader {
            input,
            crc: crc32fast::Hasher::new(),
            bytes: 0,
            sections: 0,
        };
        let header: StreamHeader = r.read_obj("the stream header")?;
        if header.magic != MAGIC {
            return Err(Error::Magic(header.magic));
        }
        if header.version != VERSION {
            return Err(Error::Version {
                theirs: header.version,
                ours: VERSION,
            });
        }
        Ok(r)
    }

    /// Fills `buf`, counting it into the checksum.
    ///
    /// # Errors
    /// `Truncated` at the end of the stream, or the read failed.
    pub fn read_exact(&mut self, buf: &mut [u8], what: &'static str) -> Result<(), Error> {
        self.input.read_exact(buf).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => Error::Truncated(what),
            _ => Error::Io(e),
        })?;
        self.crc.update(buf);
        self.bytes += buf.len() as u64;
        Ok(())
    }

    /// Reads one fixed-size record.
    ///
    /// # Errors
    /// As [`read_exact`](Reader::read_exact).
    pub fn read_obj<T: FromBytes + IntoBytes>(&mut self, what: &'static str) -> Result<T, Error> {
        let mut v = T::new_zeroed();
        self.read_exact(v.as_mut_bytes(), what)?;
        Ok(v)
    }

    /// The underlying reader.
    pub fn inner(&mut self) -> &mut R {
        &mut self.input
    }

    /// Reads a section header; its length is checked against the kind's limit.
    ///
    /// # Errors
    /// An unknown kind, a length over the limit, or the read failed.
    pub fn section(&mut self) -> Result<(Kind, u64), Error> {
        let crc_before = self.crc.clone();
        let h: SectionHeader = self.read_obj("a section header")?;
        let kind = Kind::from_u32(h.kind)?;
        if h.len > kind.max_len() {
            return Err(Error::TooLong {
                what: kind.name(),
                len: h.len,
                max: kind.max_len(),
            });
        }
        if kind == Kind::End {
            // The checksum covers everything before the trailer's header.
            self.crc = crc_before;
        } else {
            self.sections += 1;
        }
        Ok((kind, h.len))
    }

    /// Reads the trailer (after its header) and checks it.
    ///
    /// # Errors
    /// `Checksum` or `Sections` when they disagree with what arrived.
    pub fn finish(&mut self, len: u64) -> Result<(), Error> {
        expect_len(Kind::End, len, size_of::<Trailer>() as u64)?;
        let ours = self.crc.clone().finalize();
        let mut t = Trailer::new_zeroed();
        self.input
            .read_exact(t.as_mut_bytes())
            .map_err(|_| Error::Truncated("the trailer"))?;
        if t.crc32 != ours {
            return Err(Error::Checksum {
                theirs: t.crc32,
                ours,
            });
        }
        if t.sections != self.sections {
            return Err(Error::Sections {
                theirs: t.sections,
                ours: self.sections,
            });
        }
        Ok(())
    }
}

/// Checks that a section is exactly `need` bytes.
///
/// # Errors
/// `Length` otherwise.
pub fn expect_len(kind: Kind, len: u64, need: u64) -> Result<(), Error> {
    if len != need {
        return Err(Error::Length {
            what: kind.name(),
            len,
            need,
        });
    }
    Ok(())
}

/// Writes a reply.
///
/// # Errors
/// The write failed.
pub fn write_reply(out: &mut impl Write, code: u32, message: &str) -> Result<(), Error> {
    let bytes = message.as_bytes();
    let bytes = &bytes[..bytes.len().min(MAX_MESSAGE as usize)];
    let h = ReplyHeader {
        magic: REPLY_MAGIC,
        code,
        len: bytes.len() as u32,
        reserved: 0,
    };
    out.write_all(h.as_bytes())?;
    out.write_all(bytes)?;
    out.flush()?;
    Ok(())
}

/// Reads a reply: its code and message.
///
/// # Errors
/// A bad magic or length, or the read failed.
pub fn read_reply(input: &mut impl Read) -> Result<(u32, String), Error> {
    let mut h = ReplyHeader::new_zeroed();
    input
        .read_exact(h.as_mut_bytes())
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => Error::Truncated("the destination's reply"),
            _ => Error::Io(e),
        })?;
    if h.magic != REPLY_MAGIC || h.len > MAX_MESSAGE {
        return Err(Error::Truncated("a well-formed reply"));
    }
    let mut msg = vec![0u8; h.len as usize];
    input
        .read_exact(&mut msg)
        .map_err(|_| Error::Truncated("the reply's message"))?;
    Ok((h.code, String::from_utf8_lossy(&msg).into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(sections: &[(Kind, Vec<u8>)]) -> Vec<u8> {
        let mut w = Writer::start(Vec::new()).unwrap();
        for (k, p) in sections {
            w.section(*k, &[p]).unwrap();
        }
        w.finish().unwrap();
        std::mem::take(w.inner())
    }

    fn read_all(bytes: &[u8]) -> Result<u64, Error> {
        let mut r = Reader::start(bytes)?;
        loop {
            let (kind, len) = r.section()?;
            if kind == Kind::End {
                r.finish(len)?;
                return Ok(r.sections);
            }
            let mut buf = vec![0; len as usize];
            r.read_exact(&mut buf, kind.name())?;
        }
    }

    #[test]
    fn a_written_stream_reads_back_with_its_checksum() {
        let s = stream(&[(
            Kind::Pass,
            PassRecord { pass: 1, pages: 2 }.as_bytes().to_vec(),
        )]);
        assert_eq!(read_all(&s).unwrap(), 1);
    }

    #[test]
    fn a_flipped_byte_is_a_checksum_error() {
        let mut s = stream(&[(Kind::Pass, vec![0; 16])]);
        s[40] ^= 1;
        assert!(matches!(read_all(&s), Err(Error::Checksum { .. })));
    }

    #[test]
    fn a_truncated_stream_says_so() {
        let s = stream(&[(Kind::Pass, vec![0; 16])]);
        for cut in [4, 20, 40, s.len() - 3] {
            assert!(
                matches!(read_all(&s[..cut]), Err(Error::Truncated(_))),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn another_version_is_refused_naming_both() {
        let mut s = stream(&[]);
        s[8] = 9;
        let e = read_all(&s).unwrap_err();
        assert_eq!(
            e.to_string(),
            "stream version 9 is not supported: this kvmscope reads version 1"
        );
    }

    #[test]
    fn an_oversized_section_is_refused_before_allocating() {
        let mut w = Writer::start(Vec::new()).unwrap();
        let h = SectionHeader {
            kind: Kind::Ram as u32,
            reserved: 0,
            len: u64::MAX,
        };
        w.inner().extend_from_slice(h.as_bytes());
        let e = read_all(w.inner()).unwrap_err();
        assert!(matches!(e, Error::TooLong { what: "RAM", .. }), "{e}");
    }

    #[test]
    fn replies_round_trip() {
        let mut buf = Vec::new();
        write_reply(&mut buf, REPLY_REFUSED, "memory differs").unwrap();
        assert_eq!(
            read_reply(&mut &buf[..]).unwrap(),
            (REPLY_REFUSED, "memory differs".to_string())
        );
    }
}
