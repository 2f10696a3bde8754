//! The stream's wire format: fixed-size little-endian headers read with
//! zerocopy's checked `read_from_bytes` (never pointer casts), sections whose
//! lengths are bounded before anything is allocated, and a CRC-32 trailer.
//! docs/MIGRATION.md describes it for people.

use std::io::{Read, Write};

use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout, TryFromBytes};

/// First bytes of every stream.
pub(crate) const MAGIC: [u8; 8] = *b"KVMSMIG\0";
/// The stream version. Bumped only for changes an older receiver would
/// misread; a receiver refuses any other version, naming both.
pub(crate) const VERSION: u32 = 1;
/// Guest page size on the wire, the one definition: page N of a run or a
/// plan is guest physical address N × `PAGE_SIZE`, the dirty log counts in
/// it, and a normal run carries `PAGE_SIZE` bytes per page.
pub(crate) const PAGE_SIZE: u64 = 4096;
/// [`PAGE_SIZE`] as a buffer length (the same number, another type).
#[allow(clippy::cast_possible_truncation)] // exact: checked below
pub(crate) const PAGE_BYTES: usize = PAGE_SIZE as usize;
/// What the config record's 32-bit `page_size` field carries: the sender's
/// [`PAGE_SIZE`], which a receiver compares with its own.
#[allow(clippy::cast_possible_truncation)] // exact: checked below
pub(crate) const PAGE_SIZE_FIELD: u32 = PAGE_SIZE as u32;
// Both conversions of PAGE_SIZE above are exact, or the build fails here.
const _: () = assert!(PAGE_BYTES as u64 == PAGE_SIZE && PAGE_SIZE_FIELD as u64 == PAGE_SIZE);
/// Largest RAM section payload a receiver accepts.
pub(crate) const MAX_RAM_SECTION: u64 = 64 << 20;
/// Largest plan section payload a receiver accepts (256 Ki ranges).
pub(crate) const MAX_PLAN_SECTION: u64 = 4 << 20;
/// Largest vCPU section payload a receiver accepts.
pub(crate) const MAX_VCPU_SECTION: u64 = 4 << 20;
/// Longest message in a reply.
pub(crate) const MAX_MESSAGE: u32 = 4096;
/// Most MSRs a vCPU section may carry: what one `KVM_SET_MSRS` call of
/// kvm-bindings takes (the source reads them with one `KVM_GET_MSRS`).
#[allow(clippy::cast_possible_truncation)] // 256
pub(crate) const MAX_MSRS: u32 = kvm_bindings::KVM_MAX_MSR_ENTRIES as u32;

/// Why the stream could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading from or writing to the connection failed.
    #[error("the connection failed")]
    Io(#[from] std::io::Error),
    /// The peer closed the stream in the middle of the named record.
    #[error("the stream ended early (truncated) while reading {0}: the source cancelled the migration, failed or was killed (its query-migrate says which)")]
    Truncated(&'static str),
    /// The destination's reply is not one: why.
    #[error("the destination's reply is malformed: {0}")]
    BadReply(String),
    /// The first 8 bytes are not [`MAGIC`]; they are given.
    #[error("not a kvmscope migration stream (bad magic {0:02x?})")]
    Magic([u8; 8]),
    /// The stream header names a version other than [`VERSION`].
    #[error("stream version {theirs} is not supported: this kvmscope reads version {ours}")]
    Version {
        /// The version in the stream header.
        theirs: u32,
        /// [`VERSION`], the only one this build reads.
        ours: u32,
    },
    /// A section header's `kind` is none of [`Kind`].
    #[error("unknown section kind {0}")]
    Kind(u32),
    /// A section header's `len` is over its kind's [`Kind::max_len`];
    /// refused before anything is allocated.
    #[error("{what} section of {len} bytes is over the {max}-byte limit")]
    TooLong {
        /// The section kind's name ([`Kind::name`]).
        what: &'static str,
        /// The payload length the header claims, in bytes.
        len: u64,
        /// The kind's limit, in bytes.
        max: u64,
    },
    /// A section's `len` disagrees with the size its contents add up to.
    #[error("{what} section is {len} bytes, but its contents need {need}")]
    Length {
        /// The section kind's name ([`Kind::name`]).
        what: &'static str,
        /// The payload length the header claims, in bytes.
        len: u64,
        /// The length its records need, in bytes.
        need: u64,
    },
    /// A page run or plan range reaches past the end of guest RAM.
    #[error("pages {first}..{end} lie outside guest RAM ({pages} pages)")]
    PageRange {
        /// First guest page number of the run (guest physical address / 4096).
        first: u64,
        /// One past its last page.
        end: u64,
        /// Guest RAM size in pages.
        pages: u64,
    },
    /// A page run that starts below the end of the section's run before it.
    #[error("a page run at page {first} comes after one that ends at page {after} (runs go up within a section)")]
    RunOrder {
        /// Its first page.
        first: u64,
        /// One past the last page of the run before it.
        after: u64,
    },
    /// A page run of no pages (its first page given).
    #[error("a page run at page {0} holds no pages")]
    EmptyRun(u64),
    /// A page run's `kind` is no [`RunKind`].
    #[error("page run of kind {0} is neither zero nor normal")]
    RunKind(u32),
    /// The trailer's CRC-32 differs from that of the bytes that arrived.
    #[error("the checksum does not match: the stream says {theirs:#010x}, the bytes give {ours:#010x} (corrupt stream)")]
    Checksum {
        /// The CRC-32 in the trailer.
        theirs: u32,
        /// The CRC-32 of the bytes read.
        ours: u32,
    },
    /// The trailer's section count differs from the sections that arrived.
    #[error("the trailer counts {theirs} sections, {ours} arrived")]
    Sections {
        /// The count in the trailer.
        theirs: u64,
        /// Sections read before the trailer.
        ours: u64,
    },
    /// A section came where the receiver's state machine does not take it
    /// (such as RAM after the first vCPU section).
    #[error("a {0} section came out of order")]
    Order(&'static str),
    /// The destination's reply gave its code and not all of its message
    /// (a COMPLETED so cut may be one the destination acts on).
    #[error("the destination's reply (code {code}) ended before its message did")]
    ReplyCut {
        /// The reply's code.
        code: u32,
        /// Why the message could not be read.
        #[source]
        source: std::io::Error,
    },
    /// A pass section whose number is not above the last one's.
    #[error("pass {pass} came after pass {last} (passes count up)")]
    PassOrder {
        /// Its number.
        pass: u64,
        /// The last pass section's number.
        last: u64,
    },
    /// A config field holds a value this stream version does not define.
    #[error("the config's {what} is {value}, which stream version 1 does not define")]
    Field {
        /// The field (`dirty_mode`, `hugepages`).
        what: &'static str,
        /// Its value.
        value: u64,
    },
    /// The source's RAM digest differs from the destination's RAM after loading.
    #[error(
        "guest RAM differs after loading: the source's CRC-32 is {theirs:#010x}, ours {ours:#010x}"
    )]
    Digest {
        /// The CRC-32 in the stream's digest section.
        theirs: u32,
        /// The CRC-32 of the destination's guest RAM.
        ours: u32,
    },
}

/// The stream's first 16 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub(crate) struct StreamHeader {
    /// Always [`MAGIC`].
    pub(crate) magic: [u8; 8],
    /// The stream version, [`VERSION`].
    pub(crate) version: u32,
    /// No flags are defined: the sender writes 0 and the receiver ignores it.
    pub(crate) flags: u32,
}

/// What follows a section header: on the wire its `u32` value, read with
/// zerocopy's validity check (an unknown value is refused, never transmuted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, TryFromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(u32)]
pub enum Kind {
    /// One [`ConfigRecord`], the stream's first section.
    Config = 1,
    /// Page runs: a [`PageRun`] each, a normal run followed by its pages.
    Ram = 2,
    /// One [`PassRecord`] closing a pre-copy pass.
    Pass = 3,
    /// One vCPU's state: a [`VcpuHeader`], KVM structs, MSRs, the VMM's JSON.
    Vcpu = 4,
    /// The [`Trailer`], the stream's last section.
    End = 5,
    /// One [`DigestRecord`], sent only when `x-check-ram` asks for it.
    Digest = 6,
    /// [`PlanRange`]s that pass 0 sends with data, once, before its RAM.
    Plan = 7,
}

impl Kind {
    /// The kind's name, for errors.
    pub(crate) fn name(self) -> &'static str {
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
    pub(crate) fn max_len(self) -> u64 {
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
#[derive(Debug, Clone, Copy, TryFromBytes, IntoBytes, Immutable, KnownLayout)]
pub(crate) struct SectionHeader {
    /// What follows, a [`Kind`] (its `u32` value on the wire).
    pub(crate) kind: Kind,
    /// Written as 0, ignored on reading.
    pub(crate) reserved: u32,
    /// Payload bytes that follow this header, bounded by [`Kind::max_len`].
    pub(crate) len: u64,
}

/// Dirty-log mode codes in [`ConfigRecord`].
pub(crate) const DIRTY_NONE: u32 = 0;
/// The bitmap.
pub(crate) const DIRTY_BITMAP: u32 = 1;
/// The ring (`ring_entries` per vCPU).
pub(crate) const DIRTY_RING: u32 = 2;

/// The VM the stream describes; the destination builds (or checks) its VM from it.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub(crate) struct ConfigRecord {
    /// Guest RAM size in bytes.
    pub(crate) memory: u64,
    /// The TSC frequency in kHz that the source told its guest (vCPU 0's
    /// mailbox); 0 when it could not be read.
    pub(crate) tsc_khz: u64,
    /// Number of vCPUs.
    pub(crate) vcpus: u32,
    /// 1 when guest RAM is backed by huge pages, 0 otherwise.
    pub(crate) hugepages: u32,
    /// The source's dirty-log mode: [`DIRTY_NONE`], [`DIRTY_BITMAP`] or [`DIRTY_RING`].
    pub(crate) dirty_mode: u32,
    /// Dirty ring entries per vCPU with [`DIRTY_RING`], 0 otherwise.
    pub(crate) ring_entries: u32,
    /// The page size pages travel in, [`PAGE_SIZE`].
    pub(crate) page_size: u32,
    /// The guest ABI version of the source's guest program; it must equal ours.
    pub(crate) guest_abi: u32,
}

/// A run of pages in a RAM section; normal runs are followed by their bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, TryFromBytes, IntoBytes, Immutable, KnownLayout)]
pub(crate) struct PageRun {
    /// First guest page number (guest physical address / [`PAGE_SIZE`]).
    pub(crate) first: u64,
    /// Pages in the run, above zero; the run must lie inside guest RAM.
    pub(crate) count: u32,
    /// Zero or normal (a `u32` on the wire).
    pub(crate) kind: RunKind,
}

/// What a [`PageRun`] holds; on the wire its `u32` value, read with
/// zerocopy's validity check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, TryFromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(u32)]
pub enum RunKind {
    /// Pages that are all zero: the header only (QEMU's `duplicate`).
    Zero = 1,
    /// Pages sent in full after the header (QEMU's `normal`).
    Normal = 2,
}

/// The end of a pre-copy pass.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub(crate) struct PassRecord {
    /// The pass number, from 0 (the pass that sends every page).
    pub(crate) pass: u64,
    /// Pages sent in this pass, zero and normal runs together.
    pub(crate) pages: u64,
}

/// A CRC-32 of all guest RAM at the source's stop (sent when the
/// `x-check-ram` parameter asks for it); the destination compares its own.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub(crate) struct DigestRecord {
    /// CRC-32 of all guest RAM, in guest physical order.
    pub(crate) crc32: u32,
    /// Padding, written as 0.
    pub(crate) reserved: u32,
}

/// A range of pages pass 0 will send with data (a plan entry): the
/// destination backs them ahead, on a second thread, while it receives.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub(crate) struct PlanRange {
    /// First guest page number of the range.
    pub(crate) first: u64,
    /// Pages in the range; the range must lie inside guest RAM.
    pub(crate) count: u64,
}

/// The fixed part of a vCPU section; the KVM structs, MSRs and the VMM's
/// JSON follow, each of a size fixed by this header.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub(crate) struct VcpuHeader {
    /// The vCPU's index, below the config's `vcpus`; each index comes once.
    pub(crate) index: u32,
    /// [`MsrRecord`]s after the KVM structs, at most [`MAX_MSRS`].
    pub(crate) msr_count: u32,
    /// Bytes of the VMM's JSON after the MSRs.
    pub(crate) vmm_len: u32,
    /// This vCPU's TSC frequency in kHz (0 when KVM could not say).
    pub(crate) tsc_khz: u32,
}

/// One MSR on the wire.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub(crate) struct MsrRecord {
    /// The MSR's number, as in `KVM_GET_MSR_INDEX_LIST`.
    pub(crate) index: u32,
    /// Padding, written as 0.
    pub(crate) reserved: u32,
    /// The MSR's value.
    pub(crate) value: u64,
}

/// The stream's last section: how many sections came before it and the
/// CRC-32 of every byte before its section header.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub(crate) struct Trailer {
    /// Sections before the trailer.
    pub(crate) sections: u64,
    /// CRC-32 of every stream byte before the trailer's section header.
    pub(crate) crc32: u32,
    /// Padding, written as 0.
    pub(crate) reserved: u32,
}

/// What the destination answers.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub(crate) struct ReplyHeader {
    /// Always [`REPLY_MAGIC`].
    pub(crate) magic: [u8; 4],
    /// [`REPLY_READY`], [`REPLY_COMPLETED`] or [`REPLY_REFUSED`].
    pub(crate) code: u32,
    /// Bytes of UTF-8 message that follow, at most [`MAX_MESSAGE`].
    pub(crate) len: u32,
    /// Padding, written as 0.
    pub(crate) reserved: u32,
}

/// Reply magic.
pub(crate) const REPLY_MAGIC: [u8; 4] = *b"KSMR";
/// The configuration fits; send the rest.
pub const REPLY_READY: u32 = 1;
/// Everything arrived and checked out; the destination resumes the guest.
pub const REPLY_COMPLETED: u32 = 2;
/// What a reply cut at the stream's end is named, in [`Error::Truncated`].
pub(crate) const REPLY_WHAT: &str = "the destination's reply";
/// The destination refuses the stream (the message says why).
pub(crate) const REPLY_REFUSED: u32 = 3;

/// Writes a stream, counting bytes and sections and keeping the checksum.
pub(crate) struct Writer<W: Write> {
    out: W,
    crc: crc32fast::Hasher,
    /// Bytes written so far.
    pub(crate) bytes: u64,
    sections: u64,
}

impl<W: Write> Writer<W> {
    /// A writer that starts with the stream header.
    ///
    /// # Errors
    /// The write failed.
    pub(crate) fn start(out: W) -> Result<Self, Error> {
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

    /// Writes one section made of `parts`, at most `piece` bytes of it at a
    /// time, calling `after` with each piece's bytes once it is written (a
    /// paced writer sleeps there, so that a slow link sees a trickle rather
    /// than a section and then silence).
    ///
    /// # Errors
    /// A write failed, or `after` did.
    pub(crate) fn section_in_pieces<E: From<Error>>(
        &mut self,
        kind: Kind,
        parts: &[&[u8]],
        piece: usize,
        mut after: impl FnMut(u64) -> Result<(), E>,
    ) -> Result<(), E> {
        let piece = piece.max(1);
        let len = parts.iter().map(|p| p.len() as u64).sum();
        let header = SectionHeader {
            kind,
            reserved: 0,
            len,
        };
        self.put(header.as_bytes())?;
        let mut since = size_of::<SectionHeader>();
        for p in parts {
            let mut rest: &[u8] = p;
            while !rest.is_empty() {
                let n = rest.len().min(piece.saturating_sub(since)).max(1);
                let (now, later) = rest.split_at(n);
                self.put(now)?;
                since += n;
                rest = later;
                if since >= piece {
                    after(since as u64)?;
                    since = 0;
                }
            }
        }
        self.sections += 1;
        if since > 0 {
            after(since as u64)?;
        }
        Ok(())
    }

    /// Writes the trailer and flushes.
    ///
    /// # Errors
    /// The write failed.
    pub(crate) fn finish(&mut self) -> Result<(), Error> {
        let trailer = Trailer {
            sections: self.sections,
            crc32: self.crc.clone().finalize(),
            reserved: 0,
        };
        let header = SectionHeader {
            kind: Kind::End,
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
    pub(crate) fn inner(&mut self) -> &mut W {
        &mut self.out
    }

    /// The underlying writer, shared.
    pub(crate) fn get_ref(&self) -> &W {
        &self.out
    }
}

/// Reads a stream, keeping the checksum of what it read.
pub struct Reader<R: Read> {
    input: R,
    crc: crc32fast::Hasher,
    /// Bytes read so far.
    pub(crate) bytes: u64,
    /// Sections read so far (the trailer not counted).
    pub(crate) sections: u64,
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
    pub(crate) fn read_obj<T: FromBytes + IntoBytes>(
        &mut self,
        what: &'static str,
    ) -> Result<T, Error> {
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
        let mut raw = [0u8; size_of::<SectionHeader>()];
        self.read_exact(&mut raw, "a section header")?;
        let h = SectionHeader::try_read_from_bytes(&raw[..]).map_err(|_| {
            // The kind is the one field a header can hold wrong.
            Error::Kind(u32::from_ne_bytes([raw[0], raw[1], raw[2], raw[3]]))
        })?;
        let kind = h.kind;
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
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::UnexpectedEof => Error::Truncated("the trailer"),
                // A deadline or a stop, said as such.
                _ => Error::Io(e),
            })?;
        self.bytes += size_of::<Trailer>() as u64;
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

/// A section's payload length as a buffer size (already within its kind's
/// [`Kind::max_len`], so this fails only where that does not fit memory).
///
/// # Errors
/// `TooLong` when `len` does not fit this host's address space.
pub(crate) fn payload_len(kind: Kind, len: u64) -> Result<usize, Error> {
    usize::try_from(len).map_err(|_| Error::TooLong {
        what: kind.name(),
        len,
        max: u64::try_from(usize::MAX).unwrap_or(u64::MAX),
    })
}

/// Checks that a section is exactly `need` bytes.
///
/// # Errors
/// `Length` otherwise.
pub(crate) fn expect_len(kind: Kind, len: u64, need: u64) -> Result<(), Error> {
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
        // At most MAX_MESSAGE (a u32) bytes, cut above.
        len: u32::try_from(bytes.len()).unwrap_or(MAX_MESSAGE),
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
pub(crate) fn read_reply(input: &mut impl Read) -> Result<(u32, String), Error> {
    let mut h = ReplyHeader::new_zeroed();
    input
        .read_exact(h.as_mut_bytes())
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => Error::Truncated(REPLY_WHAT),
            _ => Error::Io(e),
        })?;
    if h.magic != REPLY_MAGIC {
        return Err(Error::BadReply(format!(
            // One line, in hex ("{:#04x?}" spread the bytes over lines).
            "its magic is {:02x?} (\"{}\"), not {REPLY_MAGIC:02x?}: not a kvmscope destination",
            h.magic,
            crate::units::peer_text(&h.magic, 4)
        )));
    }
    if h.len > MAX_MESSAGE {
        return Err(Error::BadReply(format!(
            "its message would be {} bytes, over the {MAX_MESSAGE}-byte limit",
            h.len
        )));
    }
    let mut msg = vec![0u8; h.len as usize];
    input
        .read_exact(&mut msg)
        .map_err(|source| Error::ReplyCut {
            code: h.code,
            source,
        })?;
    // Shown in the source's log and error-desc: one line, the peer's text.
    Ok((h.code, crate::units::peer_text(&msg, 500)))
}

#[cfg(test)]
#[path = "format_tests.rs"]
mod tests;
