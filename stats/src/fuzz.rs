//! The fuzz body, shared by the cargo-fuzz target (`fuzz/fuzz_targets/parse_stats.rs`) and
//! by `cargo test`, which runs it over the seed corpus in `fuzz/corpus/parse_stats/`.
//!
//! It treats the input as a whole stats file: parses the schema, and if that succeeds checks
//! the schema's invariants, samples it, and drives every consumer of a sample. Any panic is a
//! bug: malformed input must come back as an [`crate::Error`].

#![forbid(unsafe_code)]

use crate::descriptor::Descriptor;
use crate::filter::NameFilter;
use crate::header::{HEADER_SIZE, MAX_DATA_SIZE, MAX_NAME_SIZE, MAX_NUM_DESC};
use crate::sample::Sample;
use crate::schema::Schema;
use crate::{check, delta, format, json};

/// Parses `data` as a stats file and exercises everything that reads the result. Returns the
/// parse outcome so tests can tell accepted inputs from rejected ones.
///
/// # Errors
///
/// The parse or sample error, as [`Schema::read`] and [`Sample::read_from`] give it.
///
/// # Panics
///
/// If an accepted schema breaks an invariant (see [`assert_invariants`]): that is a bug.
pub fn parse_and_sample(data: &[u8]) -> crate::Result<()> {
    let schema = Schema::read(data)?;
    assert_invariants(&schema, data.len() as u64);
    let _ = schema.warnings();
    let mut sample = Sample::new(&schema);
    sample.read_from(data, &schema)?;
    for (id, desc) in schema.iter() {
        let value = sample.value(&schema, id);
        let _ = value.in_unit(desc);
        let _ = format::value(desc, &value);
        assert_eq!(sample.values(id).len(), usize::from(desc.size));
    }
    let _ = check::validate_sample(&schema, &sample);
    let copy = sample.clone();
    let _ = check::check_monotonic(&schema, &copy, &sample);
    let d = delta::delta(&schema, &copy, &sample);
    let filter = NameFilter::all();
    let _ = format::table(&schema, &sample, &filter);
    let _ = format::delta_table(&schema, &d, &filter);
    let _ = json::query_stats([(&schema, &sample)], &filter);
    let _ = json::query_stats_schemas([&schema]);
    Ok(())
}

/// Checks, independently of the parser, what every accepted schema must satisfy.
///
/// # Panics
///
/// On the first broken invariant.
pub fn assert_invariants(schema: &Schema, file_len: u64) {
    let h = schema.header();
    assert_eq!(h.flags, 0, "header flags");
    assert!(
        h.name_size <= MAX_NAME_SIZE && h.num_desc <= MAX_NUM_DESC,
        "caps"
    );
    for offset in [h.id_offset, h.desc_offset, h.data_offset] {
        assert!(
            offset % 8 == 0 && u64::from(offset) >= HEADER_SIZE,
            "offset {offset}"
        );
    }
    // An empty descriptor block (num_desc == 0) may point anywhere: nothing is read there.
    let desc = h.desc_range();
    assert!(
        desc.is_empty() || desc.end <= file_len,
        "descriptors inside the file"
    );
    assert!(h.id_range().end <= file_len, "id inside the file");
    assert!(schema.id().starts_with("kvm") && schema.id().len() < h.name_size as usize);
    assert_eq!(schema.len(), h.num_desc as usize);
    assert!(schema.data_size() <= MAX_DATA_SIZE && schema.data_size() % 8 == 0);
    for (index, (id, desc)) in schema.iter().enumerate() {
        assert_descriptor(desc, h.name_size, schema.data_size());
        assert_eq!(id.index(), index);
        assert_eq!(
            schema.find(&desc.name),
            Some(id),
            "lookup of {:?}",
            desc.name
        );
    }
    let mut ranges: Vec<_> = schema.stats().iter().map(Descriptor::data_range).collect();
    ranges.sort_by_key(|r| r.start);
    assert!(
        ranges.windows(2).all(|w| w[0].end <= w[1].start),
        "stats overlap"
    );
    let data = h.data_range(schema.data_size());
    for other in [h.id_range(), h.desc_range()] {
        let disjoint = data.is_empty()
            || other.is_empty()
            || data.end <= other.start
            || other.end <= data.start;
        assert!(disjoint, "data block overlaps {other:?}");
    }
}

fn assert_descriptor(desc: &Descriptor, name_size: u32, data_size: u64) {
    assert!(
        !desc.name.is_empty() && desc.name.len() < name_size as usize,
        "name"
    );
    assert!(!desc.name.contains('\0'), "name with NUL");
    assert!(desc.size != 0 && desc.offset % 8 == 0, "size/offset");
    assert!(
        desc.data_range().end <= data_size,
        "values past the data block"
    );
    assert_eq!(desc.validate(), Ok(()), "descriptor rules");
}
