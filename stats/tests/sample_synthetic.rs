//! Sampling and everything built on samples (values, deltas, checks, table, JSON, filter),
//! on synthetic stats files: no KVM needed.

use kvm_stats::builder::{every_kind, StatsFileBuilder};
use kvm_stats::check::{self, check_monotonic, validate_sample};
use kvm_stats::{
    delta, format, json, Bucket, Change, Error, NameFilter, Sample, Schema, StatId, Value,
};

fn schema_of(bytes: &[u8]) -> Schema {
    Schema::read(bytes).expect("valid synthetic file")
}

fn sample_of(schema: &Schema, bytes: &[u8]) -> Sample {
    let mut sample = Sample::new(schema);
    sample
        .read_from(bytes, schema)
        .expect("data block readable");
    sample
}

fn id(schema: &Schema, name: &str) -> StatId {
    schema.find(name).expect("stat present")
}

fn with_value(name: &str, values: &[u64]) -> Vec<u8> {
    let mut b = every_kind();
    if let Some((_, v)) = b.get_mut(name) {
        *v = values.to_vec();
    }
    b.build()
}

#[test]
fn sample_reads_scalars_and_histograms() {
    let bytes = every_kind().build();
    let schema = schema_of(&bytes);
    let sample = sample_of(&schema, &bytes);
    assert_eq!(sample.u64(id(&schema, "exits")), 1000);
    assert_eq!(
        sample.values(id(&schema, "halt_wait_hist")),
        &[0, 1, 2, 0, 5, 0, 0, 1]
    );
    assert_eq!(
        sample.value(&schema, id(&schema, "blocking")),
        Value::Boolean(true)
    );
    let Value::Histogram(buckets) = sample.value(&schema, id(&schema, "wait_lin_hist")) else {
        panic!("not a histogram");
    };
    assert_eq!(
        buckets[1],
        Bucket {
            lower: 250,
            upper: Some(500),
            count: 0
        }
    );
    assert_eq!(
        buckets[3],
        Bucket {
            lower: 750,
            upper: None,
            count: 1
        }
    );
}

#[test]
fn sample_scales_to_base_units() {
    let bytes = every_kind().build();
    let schema = schema_of(&bytes);
    let sample = sample_of(&schema, &bytes);
    assert_eq!(
        sample.in_unit(&schema, id(&schema, "halt_wait_ns")),
        Some(1.25)
    );
    assert_eq!(
        sample.in_unit(&schema, id(&schema, "guest_pages")),
        Some(1024.0 * 1024.0)
    );
    assert_eq!(sample.in_unit(&schema, id(&schema, "halt_wait_hist")), None);
}

#[test]
fn sample_rejects_truncated_data_block() {
    let bytes = every_kind().build();
    let schema = schema_of(&bytes);
    let mut sample = Sample::new(&schema);
    let result = sample.read_from(&bytes[..bytes.len() - 8], &schema);
    assert!(matches!(
        result,
        Err(Error::Truncated { block: "data", .. })
    ));
}

#[test]
fn sample_read_reuses_its_buffer() {
    let bytes = every_kind().build();
    let schema = schema_of(&bytes);
    let mut sample = Sample::new(&schema);
    let before = sample.words().as_ptr();
    sample
        .read_from(bytes.as_slice(), &schema)
        .expect("readable");
    sample
        .read_from(bytes.as_slice(), &schema)
        .expect("readable");
    assert_eq!(sample.words().as_ptr(), before);
}

#[test]
fn sample_copy_from_reuses_destination_buffer() {
    let bytes = every_kind().build();
    let schema = schema_of(&bytes);
    let source = sample_of(&schema, &bytes);
    let mut ring_slot = Sample::new(&schema);
    let before = ring_slot.words().as_ptr();
    ring_slot.clone_from(&source);
    assert_eq!(ring_slot.words().as_ptr(), before);
    assert_eq!(ring_slot.words(), source.words());
    assert_eq!(ring_slot.timestamp(), source.timestamp());
}

#[test]
fn foreign_stat_id_reads_as_empty() {
    let big = every_kind().build();
    let small = StatsFileBuilder::new("kvm-1").counter("a", 1).build();
    let (big_schema, small_schema) = (schema_of(&big), schema_of(&small));
    let sample = sample_of(&small_schema, &small);
    let foreign = id(&big_schema, "mode_hist");
    assert!(sample.values(foreign).is_empty());
    assert_eq!(sample.u64(foreign), 0);
    assert_eq!(
        sample.value(&small_schema, foreign),
        Value::Unknown(Vec::new())
    );
}

#[test]
fn delta_gives_cumulative_growth_and_current_levels() {
    let old_bytes = every_kind().build();
    let schema = schema_of(&old_bytes);
    let older = sample_of(&schema, &old_bytes);
    let newer = sample_of(&schema, &with_value("exits", &[1500]));
    let d = delta(&schema, &older, &newer);
    assert_eq!(d.cumulative(id(&schema, "exits")), Some(500));
    assert_eq!(d.get(id(&schema, "pages_4k")), Some(&Change::Instant(12)));
    assert_eq!(d.get(id(&schema, "max_rmap")), Some(&Change::Peak(7)));
    assert_eq!(d.get(id(&schema, "blocking")), Some(&Change::Boolean(true)));
}

#[test]
fn delta_gives_histogram_bucket_growth() {
    let old_bytes = every_kind().build();
    let schema = schema_of(&old_bytes);
    let older = sample_of(&schema, &old_bytes);
    let newer = sample_of(
        &schema,
        &with_value("halt_wait_hist", &[1, 1, 4, 0, 5, 0, 0, 3]),
    );
    let d = delta(&schema, &older, &newer);
    let expected = Change::Histogram(vec![1, 0, 2, 0, 0, 0, 0, 2]);
    assert_eq!(d.get(id(&schema, "halt_wait_hist")), Some(&expected));
}

#[test]
fn validate_sample_accepts_every_kind() {
    let bytes = every_kind().build();
    let schema = schema_of(&bytes);
    assert_eq!(
        validate_sample(&schema, &sample_of(&schema, &bytes)),
        Ok(())
    );
}

#[test]
fn validate_sample_rejects_boolean_of_two() {
    let bytes = with_value("blocking", &[2]);
    let schema = schema_of(&bytes);
    let result = validate_sample(&schema, &sample_of(&schema, &bytes));
    assert_eq!(
        result,
        Err(check::Error::NotBoolean {
            stat: "blocking".into(),
            value: 2
        })
    );
}

#[test]
fn check_monotonic_rejects_decreasing_cumulative() {
    let bytes = every_kind().build();
    let schema = schema_of(&bytes);
    let older = sample_of(&schema, &bytes);
    let newer = sample_of(&schema, &with_value("exits", &[999]));
    let result = check_monotonic(&schema, &older, &newer);
    assert!(
        matches!(result, Err(check::Error::Decreased { ref stat, older: 1000, newer: 999, .. }) if stat == "exits")
    );
}

#[test]
fn check_monotonic_rejects_decreasing_peak() {
    let bytes = every_kind().build();
    let schema = schema_of(&bytes);
    let older = sample_of(&schema, &bytes);
    let newer = sample_of(&schema, &with_value("max_rmap", &[6]));
    let result = check_monotonic(&schema, &older, &newer);
    assert!(matches!(result, Err(check::Error::Decreased { ref stat, .. }) if stat == "max_rmap"));
}

#[test]
fn check_monotonic_accepts_decreasing_instant() {
    let bytes = every_kind().build();
    let schema = schema_of(&bytes);
    let older = sample_of(&schema, &bytes);
    let newer = sample_of(&schema, &with_value("pages_4k", &[3]));
    assert_eq!(check_monotonic(&schema, &older, &newer), Ok(()));
}

#[test]
fn check_monotonic_rejects_swapped_samples() {
    let bytes = every_kind().build();
    let schema = schema_of(&bytes);
    let first = sample_of(&schema, &bytes);
    let second = sample_of(&schema, &bytes);
    if second.timestamp() > first.timestamp() {
        assert_eq!(
            check_monotonic(&schema, &second, &first),
            Err(check::Error::TimeReversed)
        );
    }
}

#[test]
fn table_shows_scaled_units() {
    let bytes = every_kind().build();
    let schema = schema_of(&bytes);
    let table = format::table(&schema, &sample_of(&schema, &bytes), &NameFilter::all());
    let line = |name: &str| {
        table
            .lines()
            .find(|l| l.starts_with(name))
            .map(str::split_whitespace)
    };
    let words = |name: &str| line(name).map(|w| w.skip(1).collect::<Vec<_>>().join(" "));
    assert_eq!(words("halt_wait_ns").as_deref(), Some("1.25 s"));
    assert_eq!(words("pages_4k").as_deref(), Some("12"));
    assert_eq!(words("guest_bytes").as_deref(), Some("3.00 MiB"));
    assert_eq!(words("guest_pages").as_deref(), Some("1.00 MiB"));
    assert_eq!(words("blocking").as_deref(), Some("true"));
    assert_eq!(
        words("halt_wait_hist").as_deref(),
        Some("n=9 [1ns,2ns)=1 [2ns,4ns)=2 [8ns,16ns)=5 [64ns,..)=1")
    );
    assert_eq!(table.lines().count(), 12);
}

#[test]
fn table_honours_name_filter() {
    let bytes = every_kind().build();
    let schema = schema_of(&bytes);
    let filter = NameFilter::names(["exits", "pages_4k", "absent"]);
    let table = format::table(&schema, &sample_of(&schema, &bytes), &filter);
    assert_eq!(table, "exits     1000\npages_4k  12\n");
    let names = schema.iter().map(|(_, d)| d.name.as_str());
    assert_eq!(filter.unmatched(names), vec!["absent"]);
}

#[test]
fn delta_table_shows_growth_and_rate() {
    let bytes = every_kind().build();
    let schema = schema_of(&bytes);
    let older = sample_of(&schema, &bytes);
    let newer = sample_of(&schema, &with_value("exits", &[1500]));
    let d = delta(&schema, &older, &newer);
    let table = format::delta_table(&schema, &d, &NameFilter::names(["exits"]));
    assert!(table.starts_with("exits  +500"), "{table}");
}

#[test]
fn query_stats_is_shaped_like_qemu() {
    let bytes = every_kind().build();
    let schema = schema_of(&bytes);
    let sample = sample_of(&schema, &bytes);
    let filter = NameFilter::names(["exits", "blocking", "halt_wait_hist"]);
    let result = json::query_stats([(&schema, &sample)], &filter);
    let expected = serde_json::json!([{
        "provider": "kvm", "target": "vcpu", "vcpu": 3, "id": "kvm-4242/vcpu-3",
        "stats": [
            {"name": "exits", "value": 1000},
            {"name": "blocking", "value": true},
            {"name": "halt_wait_hist", "value": [0, 1, 2, 0, 5, 0, 0, 1]},
        ]
    }]);
    assert_eq!(result, expected);
}

#[test]
fn query_stats_schemas_is_shaped_like_qemu() {
    let bytes = every_kind().build();
    let schema = schema_of(&bytes);
    let result = json::query_stats_schemas([&schema, &schema]);
    assert_eq!(result.as_array().map(Vec::len), Some(1));
    let stats = &result[0]["stats"];
    let find = |name: &str| {
        stats
            .as_array()
            .and_then(|a| a.iter().find(|s| s["name"] == name))
            .cloned()
    };
    let ns = serde_json::json!({"name": "halt_wait_ns", "type": "cumulative", "unit": "seconds", "base": 10, "exponent": -9});
    assert_eq!(find("halt_wait_ns"), Some(ns));
    let count = serde_json::json!({"name": "exits", "type": "cumulative", "exponent": 0});
    assert_eq!(find("exits"), Some(count));
    let lin = find("wait_lin_hist").unwrap_or_default();
    assert_eq!(
        (&lin["type"], &lin["bucket-size"]),
        (
            &serde_json::json!("linear-histogram"),
            &serde_json::json!(250)
        )
    );
    assert_eq!(result[0]["target"], "vcpu");
}

#[test]
fn json_leaves_out_unknown_types() {
    let mut b = StatsFileBuilder::new("kvm-7")
        .counter("known", 1)
        .counter("future", 2);
    if let Some((d, _)) = b.last_mut() {
        d.flags = 9;
    }
    let bytes = b.build();
    let schema = schema_of(&bytes);
    let sample = sample_of(&schema, &bytes);
    let stats = json::stats_result(&schema, &sample, &NameFilter::all());
    assert_eq!(
        stats["stats"],
        serde_json::json!([{"name": "known", "value": 1}])
    );
    assert_eq!(stats["target"], "vm");
    assert_eq!(sample.values(id(&schema, "future")), &[2]);
}
