//! The part of a stats file that never changes: header, id string and descriptors, read and
//! checked once, with an index from name to stat.

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::sync::Arc;

use crate::descriptor::Descriptor;
use crate::error::{Error, Result};
use crate::header::{check_disjoint, Header};
use crate::read_at::{read_full_at, ReadAt};
use crate::strict::{self, Warning};

/// Descriptors are read in chunks of about this many bytes (at least one descriptor per
/// chunk), so a hostile `num_desc * name_size` never sizes one allocation.
const DESC_CHUNK_BYTES: u64 = 64 << 10;

/// A handle on one stat of one schema: its index and where its values sit in a sample.
/// Cheap to copy; get one from [`Schema::find`] or [`Schema::iter`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StatId {
    index: u32,
    word: u32,
    len: u16,
}

impl StatId {
    /// Position of the stat's descriptor in [`Schema::stats`].
    pub fn index(self) -> usize {
        self.index as usize
    }

    /// Range of the stat's values in [`crate::Sample::words`].
    pub(crate) fn words(self) -> std::ops::Range<usize> {
        let start = self.word as usize;
        start..start + usize::from(self.len)
    }
}

/// What a stats fd is about, from its id string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    /// A VM (`kvm-<pid>`), or an id this library cannot place.
    Vm,
    /// A vCPU (`kvm-<pid>/vcpu-<index>`).
    Vcpu(u32),
}

impl Target {
    /// Places an id string: `.../vcpu-<n>` is vCPU `n`, anything else a VM.
    pub fn from_id(id: &str) -> Self {
        id.rsplit_once("/vcpu-")
            .and_then(|(_, index)| index.parse().ok())
            .map_or(Self::Vm, Self::Vcpu)
    }

    /// "vm" or "vcpu", as QEMU's `StatsTarget`.
    pub fn qapi_name(self) -> &'static str {
        match self {
            Self::Vm => "vm",
            Self::Vcpu(_) => "vcpu",
        }
    }
}

/// The checked schema of a stats file.
#[derive(Debug, Clone)]
pub struct Schema {
    header: Header,
    id: String,
    table: Arc<Table>,
}

/// What the schemas of one layout have in common (every vCPU of one kernel):
/// the descriptors and their lookups, shared once [`Schema::share_descriptors`]
/// has found them equal.
#[derive(Debug)]
struct Table {
    stats: Vec<Descriptor>,
    ids: Vec<StatId>,
    by_name: HashMap<String, usize>,
    data_size: u64,
    layout: u64,
}

impl Schema {
    /// Reads and checks header, id string and descriptors. Unknown types, units and bases are
    /// kept (see [`Schema::warnings`]).
    ///
    /// # Errors
    ///
    /// [`Error::Read`] if the source fails, [`Error::Truncated`] if it ends inside a block,
    /// and a malformed-input variant naming the field and value for any broken rule.
    pub fn read(src: &(impl ReadAt + ?Sized)) -> Result<Self> {
        Self::read_after(src, Header::read(src)?)
    }

    /// As [`Schema::read`], with the header already read (and checked) from
    /// `src`: what is allocated is what that header says, so a caller that
    /// weighed it (the sizes of the id and descriptors) gets no more, even
    /// from a file that changes between the two reads.
    ///
    /// # Errors
    ///
    /// As [`Schema::read`].
    pub fn read_after(src: &(impl ReadAt + ?Sized), header: Header) -> Result<Self> {
        let id = read_id(src, &header)?;
        let stats = read_descriptors(src, &header)?;
        let by_name = index_names(&stats)?;
        let data_size = check_data_block(&header, &stats)?;
        // At most MAX_NUM_DESC descriptors, checked by Header::validate.
        let ids = (0u32..)
            .zip(&stats)
            .map(|(index, d)| StatId {
                index,
                word: d.offset / 8,
                len: d.size,
            })
            .collect();
        let layout = layout_of(&stats);
        Ok(Self {
            header,
            id,
            table: Arc::new(Table {
                stats,
                ids,
                by_name,
                data_size,
                layout,
            }),
        })
    }

    /// Makes this schema share `other`'s descriptors if they are the same
    /// (compared in full, not by [`Schema::layout`]'s fingerprint), and says
    /// whether they now are shared. A reader of many fds then keeps one copy
    /// per layout, and [`Schema::shares_descriptors`] tells in O(1) that a
    /// [`StatId`] of one is the same stat in the other. The header and id
    /// string stay this file's own.
    pub fn share_descriptors(&mut self, other: &Schema) -> bool {
        if self.shares_descriptors(other) {
            return true;
        }
        if self.table.layout != other.table.layout || self.table.stats != other.table.stats {
            return false;
        }
        self.table = Arc::clone(&other.table);
        true
    }

    /// Whether the two schemas share their descriptors (see
    /// [`Schema::share_descriptors`]): an id of one is then valid in the other.
    pub fn shares_descriptors(&self, other: &Schema) -> bool {
        Arc::ptr_eq(&self.table, &other.table)
    }

    /// Like [`Schema::read`], and fails on the first [`Warning`] as the kernel selftest would.
    ///
    /// # Errors
    ///
    /// Those of [`Schema::read`], and [`Error::Unsupported`].
    pub fn read_strict(src: &(impl ReadAt + ?Sized)) -> Result<Self> {
        let schema = Self::read(src)?;
        match schema.warnings().into_iter().next() {
            Some(warning) => Err(Error::Unsupported(warning)),
            None => Ok(schema),
        }
    }

    /// A fingerprint of the descriptors (names, flags, exponents, sizes,
    /// offsets, bucket sizes, in order): schemas with the same one have the
    /// same stats at the same places, as every vCPU of one kernel does, so a
    /// reader of many fds can look at one schema per layout.
    pub fn layout(&self) -> u64 {
        self.table.layout
    }

    /// The header as read.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The id string, e.g. `kvm-1234` or `kvm-1234/vcpu-0`.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// VM or vCPU, from the id string.
    pub fn target(&self) -> Target {
        Target::from_id(&self.id)
    }

    /// All descriptors, in file order.
    pub fn stats(&self) -> &[Descriptor] {
        &self.table.stats
    }

    /// Number of stats.
    pub fn len(&self) -> usize {
        self.table.stats.len()
    }

    /// True if the file declares no stats.
    pub fn is_empty(&self) -> bool {
        self.table.stats.is_empty()
    }

    /// The stat called `name`, in O(1).
    pub fn find(&self, name: &str) -> Option<StatId> {
        self.table
            .by_name
            .get(name)
            .and_then(|&i| self.table.ids.get(i))
            .copied()
    }

    /// The stat at position `index` of [`Schema::stats`].
    pub fn stat_id(&self, index: usize) -> Option<StatId> {
        self.table.ids.get(index).copied()
    }

    /// The descriptor of `id`; `None` for an id of another schema that is out of range.
    pub fn get(&self, id: StatId) -> Option<&Descriptor> {
        self.table.stats.get(id.index())
    }

    /// Every stat with its descriptor, in file order.
    pub fn iter(&self) -> impl Iterator<Item = (StatId, &Descriptor)> + '_ {
        self.table.ids.iter().copied().zip(&self.table.stats)
    }

    /// Bytes of the data block the descriptors use (largest `offset + size * 8`); a sample
    /// reads this much.
    pub fn data_size(&self) -> u64 {
        self.table.data_size
    }

    /// What the schema uses that this library does not know (see [`crate::strict`]).
    pub fn warnings(&self) -> Vec<Warning> {
        strict::warnings(&self.table.stats)
    }
}

fn read_block(
    src: &(impl ReadAt + ?Sized),
    block: &'static str,
    offset: u64,
    buf: &mut [u8],
) -> Result<()> {
    let got = read_full_at(src, buf, offset).map_err(|source| Error::Read {
        block,
        offset,
        source,
    })?;
    if got < buf.len() {
        return Err(Error::Truncated {
            block,
            offset,
            wanted: buf.len() as u64,
            got: got as u64,
        });
    }
    Ok(())
}

fn read_id(src: &(impl ReadAt + ?Sized), header: &Header) -> Result<String> {
    // name_size is capped at 1 MiB by Header::validate.
    let mut bytes = vec![0u8; header.name_size as usize];
    read_block(src, "id", header.id_offset.into(), &mut bytes)?;
    let Some(nul) = bytes.iter().position(|&b| b == 0) else {
        return Err(Error::IdNotTerminated);
    };
    let id = std::str::from_utf8(&bytes[..nul]).map_err(|_| Error::IdNotUtf8)?;
    if !crate::descriptor::printable(id) {
        return Err(Error::IdNotPrintable);
    }
    if !id.starts_with("kvm") {
        return Err(Error::IdPrefix { id: id.to_owned() });
    }
    Ok(id.to_owned())
}

fn read_descriptors(src: &(impl ReadAt + ?Sized), header: &Header) -> Result<Vec<Descriptor>> {
    let stride = header.desc_stride();
    let per_chunk = (DESC_CHUNK_BYTES / stride).max(1);
    let total = u64::from(header.num_desc);
    let mut stats = Vec::with_capacity(header.num_desc as usize);
    // At most max(64 KiB, one descriptor of 16 + 1 MiB) bytes.
    let mut chunk = vec![0u8; block_len(per_chunk.min(total) * stride)?];
    let mut first = 0;
    while first < total {
        let count = per_chunk.min(total - first);
        let bytes = &mut chunk[..block_len(count * stride)?];
        let offset = u64::from(header.desc_offset) + first * stride;
        read_chunk(src, header, offset, bytes)?;
        for raw in bytes.chunks_exact(block_len(stride)?) {
            let index = stats.len();
            let desc =
                Descriptor::from_bytes(raw).map_err(|source| stat_error(index, "", source))?;
            desc.validate()
                .map_err(|source| stat_error(index, &desc.name, source))?;
            stats.push(desc);
        }
        first += count;
    }
    Ok(stats)
}

/// A length in the file as a buffer length. The header's caps keep every
/// length read here to a few MiB, so this fails only where `usize` is narrower.
fn block_len(bytes: u64) -> Result<usize> {
    usize::try_from(bytes).map_err(|_| Error::TooLarge {
        field: "descriptor block length",
        value: bytes,
        limit: u64::try_from(usize::MAX).unwrap_or(u64::MAX),
    })
}

fn read_chunk(
    src: &(impl ReadAt + ?Sized),
    header: &Header,
    offset: u64,
    bytes: &mut [u8],
) -> Result<()> {
    read_block(src, "descriptors", offset, bytes).map_err(|e| match e {
        // Report the whole block, not the chunk, so the numbers match the header.
        Error::Truncated {
            got, offset: at, ..
        } => Error::Truncated {
            block: "descriptors",
            offset: header.desc_offset.into(),
            wanted: header.desc_range().end - header.desc_range().start,
            got: at - u64::from(header.desc_offset) + got,
        },
        other => other,
    })
}

fn stat_error(index: usize, name: &str, source: crate::error::StatError) -> Error {
    Error::Stat {
        index,
        name: name.to_owned(),
        source,
    }
}

fn index_names(stats: &[Descriptor]) -> Result<HashMap<String, usize>> {
    let mut by_name = HashMap::with_capacity(stats.len());
    for (index, desc) in stats.iter().enumerate() {
        if let Some(&first) = by_name.get(&desc.name) {
            return Err(Error::DuplicateName {
                name: desc.name.clone(),
                first,
                second: index,
            });
        }
        by_name.insert(desc.name.clone(), index);
    }
    Ok(by_name)
}

/// Checks that no two stats share bytes and that the data block overlaps neither the id nor
/// the descriptors; returns the data block's size.
fn check_data_block(header: &Header, stats: &[Descriptor]) -> Result<u64> {
    let mut order: Vec<&Descriptor> = stats.iter().collect();
    order.sort_by_key(|d| d.offset);
    for pair in order.windows(2) {
        if let [a, b] = pair {
            if a.data_range().end > b.data_range().start {
                return Err(Error::StatsOverlap {
                    first: a.name.clone(),
                    second: b.name.clone(),
                });
            }
        }
    }
    let data_size = stats.iter().map(|d| d.data_range().end).max().unwrap_or(0);
    let data = ("data", header.data_range(data_size));
    check_disjoint(("id", header.id_range()), data.clone())?;
    check_disjoint(("descriptors", header.desc_range()), data)?;
    Ok(data_size)
}

#[cfg(test)]
#[path = "schema_tests.rs"]
mod tests;

/// [`Schema::layout`]'s fingerprint (FNV-1a over each descriptor's fields).
fn layout_of(stats: &[Descriptor]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h = (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
        }
    };
    for d in stats {
        eat(d.name.as_bytes());
        eat(&[0]);
        eat(&d.flags.to_le_bytes());
        eat(&d.exponent.to_le_bytes());
        eat(&d.size.to_le_bytes());
        eat(&d.offset.to_le_bytes());
        eat(&d.bucket_size.to_le_bytes());
    }
    h
}
