//! Unit tests of `mapped.rs`.

use super::*;
use crate::builder::{every_kind, StatsFileBuilder};
use crate::{Base, StatType, Unit};

fn read(bytes: &[u8]) -> Mapped {
    let schema = Schema::read(bytes).unwrap();
    let mut sample = Sample::new(&schema);
    sample.read_from(bytes, &schema).unwrap();
    Mapped::from_sample(&schema, &sample)
}

#[test]
fn page_counts_add_up_to_bytes_by_page_size() {
    let bytes = StatsFileBuilder::new("kvm-1")
        .stat(
            "pages_4k",
            StatType::Instant,
            Unit::None,
            Base::Pow10,
            0,
            &[3],
        )
        .stat(
            "pages_2m",
            StatType::Instant,
            Unit::None,
            Base::Pow10,
            0,
            &[2],
        )
        .stat(
            "pages_1g",
            StatType::Instant,
            Unit::None,
            Base::Pow10,
            0,
            &[1],
        )
        .build();
    let m = read(&bytes);
    assert_eq!((m.pages_4k, m.pages_2m, m.pages_1g), (3, 2, 1));
    assert_eq!(m.bytes(), 3 * 4096 + 2 * (2 << 20) + (1 << 30));
    assert_eq!(m.to_json()["bytes"], m.bytes());
}

#[test]
fn stats_the_file_lacks_read_as_zero() {
    // every_kind has pages_4k (12) but no pages_2m or pages_1g.
    let m = read(&every_kind().build());
    assert_eq!(
        m,
        Mapped {
            pages_4k: 12,
            ..Mapped::default()
        }
    );
}

#[test]
fn hostile_counts_saturate_instead_of_wrapping() {
    let m = Mapped {
        pages_4k: u64::MAX,
        pages_2m: u64::MAX,
        pages_1g: 1,
    };
    assert_eq!(m.bytes(), u64::MAX);
}
