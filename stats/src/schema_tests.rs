//! Schema parsing on synthetic files: valid layouts, and one test per malformed case, each
//! asserting the error variant and the field it names.

use super::*;
use crate::builder::{every_kind, StatsFileBuilder};
use crate::error::StatError;
use crate::flags::{Base, StatType, Unit};
use crate::header::{MAX_DATA_SIZE, MAX_NAME_SIZE, MAX_NUM_DESC};

fn parse(bytes: &[u8]) -> Result<Schema> {
    Schema::read(bytes)
}

fn with_header(b: &StatsFileBuilder, edit: impl FnOnce(&mut Header)) -> Vec<u8> {
    let mut header = b.layout();
    edit(&mut header);
    b.build_with(header)
}

fn with_stat(edit: impl FnOnce(&mut Descriptor)) -> Result<Schema> {
    let mut b = every_kind();
    if let Some((desc, _)) = b.stats.get_mut(1) {
        edit(desc);
    }
    parse(&b.build())
}

fn stat_error(result: Result<Schema>) -> Option<(usize, StatError)> {
    match result {
        Err(Error::Stat { index, source, .. }) => Some((index, source)),
        _ => None,
    }
}

// ---- valid files ----

#[test]
fn parse_accepts_every_type_and_unit() {
    let schema = parse(&every_kind().build()).expect("valid file");
    assert_eq!(schema.id(), "kvm-4242/vcpu-3");
    assert_eq!(schema.target(), Target::Vcpu(3));
    assert_eq!(schema.len(), 12);
    assert!(schema.warnings().is_empty());
    let kinds: Vec<_> = schema.stats().iter().map(|d| (d.kind, d.unit)).collect();
    assert!(kinds.contains(&(StatType::Log2Histogram, Unit::Seconds)));
    assert!(kinds.contains(&(StatType::LinearHistogram, Unit::Boolean)));
    assert!(kinds.contains(&(StatType::Peak, Unit::Boolean)));
    assert!(kinds.contains(&(StatType::Cumulative, Unit::Cycles)));
    assert!(kinds.contains(&(StatType::Instant, Unit::Bytes)));
}

#[test]
fn parse_decodes_descriptor_fields() {
    let schema = parse(&every_kind().build()).expect("valid file");
    let id = schema.find("wait_lin_hist").expect("stat present");
    let d = schema.get(id).expect("descriptor");
    assert_eq!(
        (d.kind, d.unit, d.base),
        (StatType::LinearHistogram, Unit::Seconds, Base::Pow10)
    );
    assert_eq!((d.exponent, d.size, d.bucket_size), (-6, 4, 250));
    let pages = schema
        .get(schema.find("guest_pages").expect("present"))
        .expect("descriptor");
    assert_eq!((pages.base, pages.exponent), (Base::Pow2, 12));
}

#[test]
fn find_returns_every_stat_and_none_for_unknown_names() {
    let schema = parse(&every_kind().build()).expect("valid file");
    for (index, desc) in schema.stats().iter().enumerate() {
        assert_eq!(schema.find(&desc.name).map(StatId::index), Some(index));
    }
    assert_eq!(schema.find("no_such_stat"), None);
}

#[test]
fn equal_descriptors_are_shared_and_others_are_not() {
    let mut vcpu1 = every_kind();
    vcpu1.id = "kvm-4242/vcpu-1".to_owned();
    let first = parse(&every_kind().build()).expect("valid file");
    let mut second = parse(&vcpu1.build()).expect("valid file");
    assert!(!second.shares_descriptors(&first));
    assert!(second.share_descriptors(&first));
    assert!(second.shares_descriptors(&first) && first.shares_descriptors(&second));
    // The file's own header and id string stay its own.
    assert_eq!(second.id(), "kvm-4242/vcpu-1");
    let id = first.find("wait_lin_hist").expect("present");
    assert_eq!(second.get(id), first.get(id));
    // One field differs (every other the same): not shared, fingerprint or not.
    let mut other = every_kind();
    if let Some((d, _)) = other.stats.get_mut(1) {
        d.exponent = -6;
    }
    let mut third = parse(&other.build()).expect("valid file");
    assert!(!third.share_descriptors(&first));
    assert!(!third.shares_descriptors(&first));
    let ns = first.find("halt_wait_ns").expect("present");
    assert_ne!(third.get(ns), first.get(ns));
}

#[test]
fn parse_accepts_blocks_in_any_order() {
    let b = every_kind();
    let needed = b
        .stats
        .iter()
        .map(|(d, _)| d.data_range().end)
        .max()
        .unwrap_or(0);
    let bytes = with_header(&b, |h| {
        h.data_offset = 24;
        h.desc_offset = u32::try_from(24 + needed).expect("a small file");
        h.id_offset = h.desc_offset + 12 * (16 + h.name_size);
    });
    let schema = parse(&bytes).expect("reordered blocks are valid");
    assert_eq!(schema.len(), 12);
}

#[test]
fn parse_accepts_zero_descriptors() {
    let schema = parse(&StatsFileBuilder::new("kvm-1").build()).expect("empty file");
    assert!(schema.is_empty());
    assert_eq!(schema.data_size(), 0);
    assert_eq!(schema.target(), Target::Vm);
}

#[test]
fn parse_reads_descriptors_larger_than_one_chunk() {
    let mut b = StatsFileBuilder::new("kvm-1");
    b.name_size = 40_000;
    for i in 0..5 {
        b = b.counter(&format!("counter_{i}"), i);
    }
    let schema = parse(&b.build()).expect("large names are valid");
    assert_eq!(schema.find("counter_4").map(StatId::index), Some(4));
}

#[test]
fn parse_keeps_unknown_type_unit_and_base_as_warnings() {
    let mut b = every_kind();
    b = b.counter("future", 1);
    if let Some((d, _)) = b.last_mut() {
        d.flags = 0x3_0257;
        (d.kind, d.unit, d.base) = (StatType::Unknown(7), Unit::Unknown(5), Base::Unknown(2));
    }
    let schema = parse(&b.build()).expect("unknown fields are kept");
    let d = schema.stats().last().expect("stat present");
    assert_eq!(
        (d.kind, d.unit, d.base),
        (StatType::Unknown(7), Unit::Unknown(5), Base::Unknown(2))
    );
    let warnings = schema.warnings();
    assert_eq!(warnings.len(), 4);
    assert!(matches!(
        &warnings[3],
        Warning::UnknownFlagBits { bits: 0x3_0000, .. }
    ));
}

#[test]
fn read_strict_rejects_unknown_unit() {
    let mut b = every_kind().counter("future", 1);
    if let Some((d, _)) = b.last_mut() {
        d.flags = Unit::Unknown(6).to_flags();
    }
    let result = Schema::read_strict(b.build().as_slice());
    assert!(matches!(
        result,
        Err(Error::Unsupported(Warning::UnknownUnit { value: 0x60, .. }))
    ));
}

// ---- malformed header ----

#[test]
fn parse_rejects_short_header() {
    let bytes = every_kind().build();
    let result = parse(&bytes[..10]);
    assert!(matches!(
        result,
        Err(Error::Truncated {
            block: "header",
            got: 10,
            wanted: 24,
            ..
        })
    ));
}

#[test]
fn parse_rejects_nonzero_header_flags() {
    let bytes = with_header(&every_kind(), |h| h.flags = 2);
    assert!(matches!(
        parse(&bytes),
        Err(Error::NonZero {
            field: "flags",
            value: 2
        })
    ));
}

#[test]
fn parse_rejects_name_size_over_cap_before_reading_names() {
    let header = Header {
        name_size: MAX_NAME_SIZE + 1,
        ..every_kind().layout()
    };
    // Only the 24 header bytes exist: the cap must fire before the id is read.
    let result = parse(&header.to_bytes());
    assert!(matches!(
        result,
        Err(Error::TooLarge { field: "name_size", value, limit }) if value == u64::from(MAX_NAME_SIZE) + 1 && limit == u64::from(MAX_NAME_SIZE)
    ));
}

#[test]
fn parse_rejects_name_size_too_small_for_an_id() {
    let bytes = with_header(&every_kind(), |h| h.name_size = 3);
    assert!(matches!(
        parse(&bytes),
        Err(Error::TooSmall {
            field: "name_size",
            value: 3,
            ..
        })
    ));
}

#[test]
fn parse_rejects_num_desc_over_cap_before_reading_descriptors() {
    let header = Header {
        num_desc: MAX_NUM_DESC + 1,
        ..every_kind().layout()
    };
    let result = parse(&header.to_bytes());
    assert!(matches!(
        result,
        Err(Error::TooLarge {
            field: "num_desc",
            value: 1025,
            ..
        })
    ));
}

#[test]
fn parse_rejects_misaligned_id_offset() {
    let bytes = with_header(&every_kind(), |h| h.id_offset = 28);
    assert!(matches!(
        parse(&bytes),
        Err(Error::Misaligned {
            field: "id_offset",
            value: 28
        })
    ));
}

#[test]
fn parse_rejects_misaligned_desc_offset() {
    let bytes = with_header(&every_kind(), |h| h.desc_offset = 13);
    assert!(matches!(
        parse(&bytes),
        Err(Error::Misaligned {
            field: "desc_offset",
            value: 13
        })
    ));
}

#[test]
fn parse_rejects_misaligned_data_offset() {
    let bytes = with_header(&every_kind(), |h| h.data_offset += 4);
    assert!(matches!(
        parse(&bytes),
        Err(Error::Misaligned {
            field: "data_offset",
            ..
        })
    ));
}

#[test]
fn parse_rejects_desc_offset_inside_header() {
    let bytes = with_header(&every_kind(), |h| h.desc_offset = 16);
    assert!(matches!(
        parse(&bytes),
        Err(Error::InsideHeader {
            field: "desc_offset",
            value: 16
        })
    ));
}

#[test]
fn parse_rejects_data_offset_inside_header() {
    let bytes = with_header(&every_kind(), |h| h.data_offset = 8);
    assert!(matches!(
        parse(&bytes),
        Err(Error::InsideHeader {
            field: "data_offset",
            value: 8
        })
    ));
}

#[test]
fn parse_rejects_id_overlapping_descriptors() {
    let bytes = with_header(&every_kind(), |h| h.id_offset = h.desc_offset + 64);
    assert!(matches!(
        parse(&bytes),
        Err(Error::Overlap {
            first: "id",
            second: "descriptors",
            ..
        })
    ));
}

#[test]
fn parse_rejects_data_overlapping_descriptors() {
    let bytes = with_header(&every_kind(), |h| h.data_offset = h.desc_offset + 128);
    assert!(matches!(
        parse(&bytes),
        Err(Error::Overlap {
            first: "descriptors",
            second: "data",
            ..
        })
    ));
}

#[test]
fn parse_rejects_data_overlapping_id() {
    let b = every_kind();
    let bytes = with_header(&b, |h| {
        h.data_offset = 24;
        h.id_offset = 64;
        h.desc_offset = 4096;
    });
    assert!(matches!(
        parse(&bytes),
        Err(Error::Overlap {
            first: "id",
            second: "data",
            ..
        })
    ));
}

#[test]
fn parse_rejects_id_past_end_of_file() {
    let b = every_kind();
    let mut bytes = b.build();
    let header = Header {
        id_offset: u32::try_from(bytes.len() + 8).expect("a small file"),
        ..b.layout()
    };
    bytes[..24].copy_from_slice(&header.to_bytes());
    assert!(matches!(
        parse(&bytes),
        Err(Error::Truncated {
            block: "id",
            got: 0,
            wanted: 48,
            ..
        })
    ));
}

#[test]
fn parse_rejects_truncated_descriptors() {
    let b = every_kind();
    let cut = b.layout().desc_offset as usize + 100;
    let bytes = b.build();
    let result = parse(&bytes[..cut]);
    assert!(matches!(
        result,
        Err(Error::Truncated {
            block: "descriptors",
            got: 100,
            wanted: 768,
            ..
        })
    ));
}

#[test]
fn parse_rejects_id_without_nul() {
    let mut b = every_kind();
    b.id = "k".repeat(60);
    let mut bytes = b.build();
    bytes[24..72].fill(b'k');
    assert!(matches!(parse(&bytes), Err(Error::IdNotTerminated)));
}

#[test]
fn parse_rejects_id_without_kvm_prefix() {
    let mut b = every_kind();
    b.id = "qemu-1".into();
    assert!(matches!(parse(&b.build()), Err(Error::IdPrefix { id }) if id == "qemu-1"));
}

#[test]
fn parse_rejects_non_utf8_id() {
    let mut bytes = every_kind().build();
    bytes[24..28].copy_from_slice(b"kvm\xff");
    assert!(matches!(parse(&bytes), Err(Error::IdNotUtf8)));
}

// ---- malformed descriptors ----

#[test]
fn parse_rejects_stat_name_without_nul() {
    let mut bytes = every_kind().build();
    let start = every_kind().layout().desc_offset as usize + 64 + 16;
    bytes[start..start + 48].fill(b'a');
    let err = stat_error(parse(&bytes));
    assert_eq!(err, Some((1, StatError::NameNotTerminated)));
}

#[test]
fn parse_rejects_empty_stat_name() {
    let err = stat_error(with_stat(|d| d.name.clear()));
    assert_eq!(err, Some((1, StatError::NameEmpty)));
}

#[test]
fn parse_rejects_non_utf8_stat_name() {
    let mut bytes = every_kind().build();
    let start = every_kind().layout().desc_offset as usize + 16;
    bytes[start] = 0xff;
    assert_eq!(stat_error(parse(&bytes)), Some((0, StatError::NameNotUtf8)));
}

#[test]
fn parse_rejects_zero_size_stat() {
    let err = stat_error(with_stat(|d| d.size = 0));
    assert_eq!(err, Some((1, StatError::ZeroSize)));
}

#[test]
fn parse_rejects_misaligned_stat_offset() {
    let err = stat_error(with_stat(|d| d.offset += 4));
    assert!(matches!(
        err,
        Some((
            1,
            StatError::Misaligned {
                field: "offset",
                ..
            }
        ))
    ));
}

#[test]
fn parse_rejects_linear_histogram_without_bucket_size() {
    let mut b = every_kind();
    if let Some((d, _)) = b.get_mut("wait_lin_hist") {
        d.bucket_size = 0;
    }
    let err = stat_error(parse(&b.build()));
    assert!(matches!(
        err,
        Some((
            _,
            StatError::BucketSize {
                value: 0,
                kind: StatType::LinearHistogram
            }
        ))
    ));
}

#[test]
fn parse_rejects_bucket_size_on_scalar() {
    let err = stat_error(with_stat(|d| d.bucket_size = 10));
    assert!(matches!(
        err,
        Some((
            1,
            StatError::BucketSize {
                value: 10,
                kind: StatType::Cumulative
            }
        ))
    ));
}

#[test]
fn parse_rejects_positive_exponent_for_seconds() {
    let err = stat_error(with_stat(|d| d.exponent = 3));
    assert_eq!(
        err,
        Some((
            1,
            StatError::ExponentSign {
                unit: Unit::Seconds,
                exponent: 3
            }
        ))
    );
}

#[test]
fn parse_rejects_negative_exponent_for_bytes() {
    let mut b = every_kind();
    if let Some((d, _)) = b.get_mut("guest_bytes") {
        d.exponent = -1;
    }
    let err = stat_error(parse(&b.build()));
    assert!(matches!(
        err,
        Some((
            _,
            StatError::ExponentSign {
                unit: Unit::Bytes,
                exponent: -1
            }
        ))
    ));
}

#[test]
fn parse_rejects_nonzero_exponent_for_boolean() {
    let mut b = every_kind();
    if let Some((d, _)) = b.get_mut("blocking") {
        d.exponent = 1;
    }
    let err = stat_error(parse(&b.build()));
    assert!(matches!(
        err,
        Some((
            _,
            StatError::ExponentSign {
                unit: Unit::Boolean,
                exponent: 1
            }
        ))
    ));
}

#[test]
fn parse_rejects_boolean_log2_histogram() {
    let b = every_kind().stat(
        "flag_hist",
        StatType::Log2Histogram,
        Unit::Boolean,
        Base::Pow10,
        0,
        &[1, 2],
    );
    assert!(matches!(
        stat_error(parse(&b.build())),
        Some((12, StatError::BooleanLog2Histogram))
    ));
}

#[test]
fn parse_rejects_boolean_linear_histogram_with_three_buckets() {
    let b = every_kind().stat(
        "flag_hist",
        StatType::LinearHistogram,
        Unit::Boolean,
        Base::Pow10,
        0,
        &[1, 2, 3],
    );
    let err = stat_error(parse(&b.build()));
    assert_eq!(err, Some((12, StatError::BooleanBuckets { size: 3 })));
}

#[test]
fn parse_rejects_stat_past_data_size_cap() {
    let mut b = every_kind();
    if let Some((d, values)) = b.stats.get_mut(1) {
        d.offset = u32::MAX - 7;
        values.clear();
    }
    let err = stat_error(parse(&b.build()));
    assert!(matches!(
        err,
        Some((
            1,
            StatError::OutsideData {
                limit: MAX_DATA_SIZE,
                ..
            }
        ))
    ));
}

#[test]
fn parse_rejects_duplicate_names() {
    let b = every_kind().counter("exits", 5);
    assert!(matches!(
        parse(&b.build()),
        Err(Error::DuplicateName { name, first: 0, second: 12 }) if name == "exits"
    ));
}

#[test]
fn parse_rejects_overlapping_stats() {
    let mut b = every_kind();
    if let Some((d, _)) = b.get_mut("halt_wait_hist") {
        d.offset = 0;
    }
    assert!(matches!(parse(&b.build()), Err(Error::StatsOverlap { .. })));
}

#[test]
fn schemas_of_the_same_stats_share_a_layout_whatever_their_id() {
    let file = |id: &str| {
        StatsFileBuilder::new(id)
            .counter("exits", 1)
            .counter("halts", 2)
    };
    let a = parse(&file("kvm-1/vcpu-0").build()).unwrap();
    let b = parse(&file("kvm-1/vcpu-1").build()).unwrap();
    assert_eq!(a.layout(), b.layout());
    let other = parse(
        &StatsFileBuilder::new("kvm-1")
            .counter("halts", 2)
            .counter("exits", 1)
            .build(),
    )
    .unwrap();
    assert_ne!(
        a.layout(),
        other.layout(),
        "the same names elsewhere are another layout"
    );
}

/// The schema is what the header given says, whatever the file's own
/// header says by now (a file that changed between two reads).
#[test]
fn read_after_takes_the_header_it_is_given() {
    use crate::builder::StatsFileBuilder;
    let b = StatsFileBuilder::new("kvm-1")
        .counter("a", 1)
        .counter("b", 2);
    let bytes = b.build();
    let mut fewer = b.layout();
    fewer.num_desc = 1;
    let schema = Schema::read_after(&bytes[..], fewer).unwrap();
    assert_eq!(schema.len(), 1);
    assert!(schema.find("a").is_some() && schema.find("b").is_none());
}
