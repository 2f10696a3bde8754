//! Builds stats files in memory: for tests, fuzz seeds, benchmarks, and for users who want
//! to test their own stats consumers without KVM.
//!
//! [`StatsFileBuilder::build`] lays the blocks out as the kernel does (header, id,
//! descriptors, data, each 8-byte aligned); [`StatsFileBuilder::build_with`] writes them at
//! the offsets of a header you supply, valid or not, to make malformed files.

#![forbid(unsafe_code)]

use crate::descriptor::Descriptor;
use crate::flags::{Base, StatType, Unit};
use crate::header::{Header, HEADER_LEN, HEADER_SIZE};

/// An in-memory stats file under construction.
#[derive(Debug, Clone)]
pub struct StatsFileBuilder {
    /// The id string.
    pub id: String,
    /// `name_size` of the header.
    pub name_size: u32,
    /// Descriptors with their values, in file order. Fields are public so tests can break them.
    pub stats: Vec<(Descriptor, Vec<u64>)>,
}

impl StatsFileBuilder {
    /// An empty file with the kernel's `name_size` of 48.
    pub fn new(id: &str) -> Self {
        Self {
            id: id.to_owned(),
            name_size: 48,
            stats: Vec::new(),
        }
    }

    /// Adds a stat after the previous one in the data block; `size` is `values.len()`, and a
    /// linear histogram gets `bucket_size` 1 (change it with [`StatsFileBuilder::last_mut`]).
    pub fn stat(
        mut self,
        name: &str,
        kind: StatType,
        unit: Unit,
        base: Base,
        exponent: i16,
        values: &[u64],
    ) -> Self {
        let offset = self
            .stats
            .iter()
            .map(|(d, _)| d.data_range().end)
            .max()
            .unwrap_or(0);
        let desc = Descriptor {
            name: name.to_owned(),
            flags: kind.to_flags() | unit.to_flags() | base.to_flags(),
            kind,
            unit,
            base,
            exponent,
            size: u16::try_from(values.len()).unwrap_or(u16::MAX),
            offset: u32::try_from(offset).unwrap_or(u32::MAX),
            bucket_size: u32::from(kind == StatType::LinearHistogram),
        };
        self.stats.push((desc, values.to_vec()));
        self
    }

    /// A plain cumulative counter.
    pub fn counter(self, name: &str, value: u64) -> Self {
        self.stat(
            name,
            StatType::Cumulative,
            Unit::None,
            Base::Pow10,
            0,
            &[value],
        )
    }

    /// The last stat added, to adjust its descriptor or values.
    pub fn last_mut(&mut self) -> Option<&mut (Descriptor, Vec<u64>)> {
        self.stats.last_mut()
    }

    /// The descriptor and values of the stat called `name`.
    pub fn get_mut(&mut self, name: &str) -> Option<&mut (Descriptor, Vec<u64>)> {
        self.stats.iter_mut().find(|(d, _)| d.name == name)
    }

    /// The header [`StatsFileBuilder::build`] writes: id after the header, descriptors after
    /// the id, data after the descriptors, each offset rounded up to 8.
    pub fn layout(&self) -> Header {
        let name_size = u64::from(self.name_size);
        let id_offset = HEADER_SIZE;
        let desc_offset = align8(id_offset + name_size);
        let stride = 16 + name_size;
        let data_offset = align8(desc_offset + stride * self.stats.len() as u64);
        let to_u32 = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
        Header {
            flags: 0,
            name_size: self.name_size,
            num_desc: to_u32(self.stats.len() as u64),
            id_offset: to_u32(id_offset),
            desc_offset: to_u32(desc_offset),
            data_offset: to_u32(data_offset),
        }
    }

    /// The file, laid out as [`StatsFileBuilder::layout`] says.
    pub fn build(&self) -> Vec<u8> {
        self.build_with(self.layout())
    }

    /// The file with `header` written as given and each block written at the header's
    /// offsets; where blocks overlap, the later of data, descriptors, id, header wins.
    /// A stat's values are zero-padded to its `size`, unless it has none: then the file is
    /// not extended for it (to build a descriptor pointing far away). Descriptors past
    /// `num_desc` are left out; values past a descriptor's `size` too.
    pub fn build_with(&self, header: Header) -> Vec<u8> {
        let mut out = vec![0u8; HEADER_LEN];
        let listed = &self.stats[..self.stats.len().min(header.num_desc as usize)];
        for (desc, values) in listed {
            let bytes: Vec<u8> = values
                .iter()
                .take(desc.size.into())
                .flat_map(|v| v.to_ne_bytes())
                .collect();
            let at = u64::from(header.data_offset) + u64::from(desc.offset);
            put(&mut out, at, &bytes);
            if !values.is_empty() {
                grow(
                    &mut out,
                    u64::from(header.data_offset) + desc.data_range().end,
                );
            }
        }
        let name_size = header.name_size as usize;
        let stride = 16 + name_size as u64;
        for (i, (desc, _)) in listed.iter().enumerate() {
            let at = u64::from(header.desc_offset) + i as u64 * stride;
            put(&mut out, at, &desc.to_bytes(name_size));
        }
        let mut id = vec![0u8; name_size];
        let len = self.id.len().min(name_size.saturating_sub(1));
        id[..len].copy_from_slice(&self.id.as_bytes()[..len]);
        put(&mut out, header.id_offset.into(), &id);
        // The header goes last so that blocks placed over it cannot hide its fields.
        out[..HEADER_LEN].copy_from_slice(&header.to_bytes());
        out
    }
}

/// A valid file with every type and unit the format knows, shaped like a vCPU's.
pub fn every_kind() -> StatsFileBuilder {
    use StatType::*;
    let b = StatsFileBuilder::new("kvm-4242/vcpu-3")
        .counter("exits", 1000)
        .stat(
            "halt_wait_ns",
            Cumulative,
            Unit::Seconds,
            Base::Pow10,
            -9,
            &[1_250_000_000],
        )
        .stat("pages_4k", Instant, Unit::None, Base::Pow10, 0, &[12])
        .stat(
            "guest_bytes",
            Instant,
            Unit::Bytes,
            Base::Pow2,
            0,
            &[3 << 20],
        )
        .stat("guest_pages", Instant, Unit::Bytes, Base::Pow2, 12, &[256])
        .stat(
            "tsc_cycles",
            Cumulative,
            Unit::Cycles,
            Base::Pow10,
            0,
            &[123_456_789],
        )
        .stat("max_rmap", Peak, Unit::None, Base::Pow10, 0, &[7])
        .stat("blocking", Instant, Unit::Boolean, Base::Pow10, 0, &[1])
        .stat("ever_nested", Peak, Unit::Boolean, Base::Pow10, 0, &[0])
        .stat(
            "halt_wait_hist",
            Log2Histogram,
            Unit::Seconds,
            Base::Pow10,
            -9,
            &[0, 1, 2, 0, 5, 0, 0, 1],
        )
        .stat(
            "wait_lin_hist",
            LinearHistogram,
            Unit::Seconds,
            Base::Pow10,
            -6,
            &[3, 0, 2, 1],
        )
        .stat(
            "mode_hist",
            LinearHistogram,
            Unit::Boolean,
            Base::Pow10,
            0,
            &[4, 6],
        );
    with_bucket_size(b, "wait_lin_hist", 250)
}

fn with_bucket_size(mut b: StatsFileBuilder, name: &str, bucket_size: u32) -> StatsFileBuilder {
    if let Some((desc, _)) = b.get_mut(name) {
        desc.bucket_size = bucket_size;
    }
    b
}

fn align8(v: u64) -> u64 {
    v.div_ceil(8) * 8
}

fn grow(out: &mut Vec<u8>, end: u64) {
    let end = usize::try_from(end).unwrap_or(usize::MAX);
    if out.len() < end {
        out.resize(end, 0);
    }
}

fn put(out: &mut Vec<u8>, at: u64, bytes: &[u8]) {
    let Ok(at) = usize::try_from(at) else {
        return;
    };
    if bytes.is_empty() {
        return;
    }
    grow(out, (at + bytes.len()) as u64);
    out[at..at + bytes.len()].copy_from_slice(bytes);
}
