//! Property tests: mutated stats files (bit flips, truncation, random header and descriptor
//! fields) never make the parser panic, and whatever it accepts satisfies the schema's
//! invariants ([`kvm_stats::fuzz::assert_invariants`], called by the fuzz body). Random
//! valid files parse back to what was built.

use kvm_stats::builder::{every_kind, StatsFileBuilder};
use kvm_stats::{fuzz, Base, Sample, Schema, StatType, Unit};
use proptest::prelude::*;

fn base_file() -> Vec<u8> {
    every_kind().build()
}

fn write_u32(bytes: &mut [u8], at: usize, value: u32) {
    if let Some(slot) = bytes.get_mut(at..at + 4) {
        slot.copy_from_slice(&value.to_ne_bytes());
    }
}

/// A u32 that is usually near the interesting edges, sometimes anything.
fn field_value() -> impl Strategy<Value = u32> {
    prop_oneof![
        0u32..2048,
        Just(u32::MAX),
        Just(1 << 20),
        Just((1 << 20) + 1),
        Just(1024),
        Just(1025),
        any::<u32>(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn bit_flips_never_panic(flips in prop::collection::vec((any::<prop::sample::Index>(), 0u8..8), 1..8)) {
        let mut bytes = base_file();
        for (index, bit) in flips {
            let i = index.index(bytes.len());
            bytes[i] ^= 1 << bit;
        }
        let _ = fuzz::parse_and_sample(&bytes);
    }

    #[test]
    fn truncation_never_panics_and_fails_before_the_end(len in 0usize..2000) {
        let bytes = base_file();
        let cut = len.min(bytes.len());
        let result = fuzz::parse_and_sample(&bytes[..cut]);
        prop_assert_eq!(result.is_ok(), cut == bytes.len());
    }

    #[test]
    fn random_header_fields_never_panic(fields in prop::collection::vec((0usize..6, field_value()), 1..4)) {
        let mut bytes = base_file();
        for (field, value) in fields {
            write_u32(&mut bytes, field * 4, value);
        }
        let _ = fuzz::parse_and_sample(&bytes);
    }

    #[test]
    fn random_descriptor_fields_never_panic(
        edits in prop::collection::vec((0usize..12, 0usize..4, field_value()), 1..4)
    ) {
        let b = every_kind();
        let desc_offset = b.layout().desc_offset as usize;
        let mut bytes = b.build();
        for (desc, word, value) in edits {
            write_u32(&mut bytes, desc_offset + desc * 64 + word * 4, value);
        }
        let _ = fuzz::parse_and_sample(&bytes);
    }

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = fuzz::parse_and_sample(&bytes);
    }

    #[test]
    fn random_valid_files_parse_back(stats in prop::collection::vec(valid_stat(), 0..40)) {
        let mut b = StatsFileBuilder::new("kvm-99/vcpu-1");
        for (i, (kind, unit, base, exponent, values, bucket_size)) in stats.iter().enumerate() {
            b = b.stat(&format!("s{i}"), *kind, *unit, *base, *exponent, values);
            if let Some((d, _)) = b.last_mut() {
                d.bucket_size = *bucket_size;
            }
        }
        let bytes = b.build();
        let schema = Schema::read(bytes.as_slice()).map_err(|e| TestCaseError::fail(e.to_string()))?;
        fuzz::assert_invariants(&schema, bytes.len() as u64);
        let mut sample = Sample::new(&schema);
        sample.read_from(bytes.as_slice(), &schema).map_err(|e| TestCaseError::fail(e.to_string()))?;
        for (i, (_, _, _, _, values, _)) in stats.iter().enumerate() {
            let id = schema.find(&format!("s{i}")).ok_or_else(|| TestCaseError::fail("missing"))?;
            prop_assert_eq!(sample.values(id), values.as_slice());
        }
    }
}

type StatSpec = (StatType, Unit, Base, i16, Vec<u64>, u32);

/// A stat that follows every rule of the format.
fn valid_stat() -> impl Strategy<Value = StatSpec> {
    let kind = prop_oneof![
        Just(StatType::Cumulative),
        Just(StatType::Instant),
        Just(StatType::Peak),
        Just(StatType::LinearHistogram),
        Just(StatType::Log2Histogram),
    ];
    let unit = prop_oneof![
        Just(Unit::None),
        Just(Unit::Bytes),
        Just(Unit::Seconds),
        Just(Unit::Cycles)
    ];
    let base = prop_oneof![Just(Base::Pow10), Just(Base::Pow2)];
    (kind, unit, base, 0i16..20, 1usize..40, 1u32..1000).prop_flat_map(
        |(kind, unit, base, exp, n, bucket)| {
            let exponent = if unit == Unit::Seconds { -exp } else { exp };
            let len = if kind.is_histogram() { n } else { 1 };
            let bucket_size = if kind == StatType::LinearHistogram {
                bucket
            } else {
                0
            };
            prop::collection::vec(any::<u64>(), len)
                .prop_map(move |values| (kind, unit, base, exponent, values, bucket_size))
        },
    )
}
