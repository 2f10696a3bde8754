//! JSON shaped like QEMU's `query-stats` and `query-stats-schemas` results (qapi/stats.json),
//! so tools written for QEMU's QMP can read it.
//!
//! Differences from QEMU, all additions: each entry carries `"target"` (`"vm"` or `"vcpu"`),
//! `"id"` (the kernel's id string) and, for a vCPU, `"vcpu"` (its index) where QEMU has a
//! `"qom-path"`. Stats whose type, unit or base this library does not know are left out of
//! both results, since QEMU's enums cannot name them (QEMU skips them too); read them with
//! [`crate::Sample::values`]. As in QEMU, `"base"` is present only when `"exponent"` is
//! non-zero, `"unit"` is absent for a plain count, and `"bucket-size"` is present only for
//! linear histograms.

#![forbid(unsafe_code)]

use serde_json::{json, Map, Value as Json};

use crate::descriptor::Descriptor;
use crate::filter::NameFilter;
use crate::flags::{Base, StatType, Unit};
use crate::sample::Sample;
use crate::schema::{Schema, Target};
use crate::value::Value;

/// True if QEMU's enums can describe the stat.
fn representable(desc: &Descriptor) -> bool {
    !matches!(desc.kind, StatType::Unknown(_))
        && !matches!(desc.unit, Unit::Unknown(_))
        && !matches!(desc.base, Base::Unknown(_))
}

fn entry(schema: &Schema, stats: Vec<Json>) -> Json {
    let mut obj = Map::new();
    obj.insert("provider".into(), json!("kvm"));
    obj.insert("target".into(), json!(schema.target().qapi_name()));
    obj.insert("id".into(), json!(schema.id()));
    if let Target::Vcpu(index) = schema.target() {
        obj.insert("vcpu".into(), json!(index));
    }
    obj.insert("stats".into(), Json::Array(stats));
    Json::Object(obj)
}

/// One `StatsResult`: `{"provider":"kvm","target":..,"id":..,["vcpu":N,] "stats":[{"name",
/// "value"}]}`, values as numbers, booleans as `true`/`false`, histograms as arrays of
/// bucket counts.
pub fn stats_result(schema: &Schema, sample: &Sample, filter: &NameFilter) -> Json {
    let stats = filter
        .select(schema)
        .into_iter()
        .filter_map(|id| {
            let desc = schema.get(id).filter(|d| representable(d))?;
            let value = match sample.value(schema, id) {
                Value::Scalar(v) => json!(v),
                Value::Boolean(b) => json!(b),
                Value::Histogram(buckets) => buckets.iter().map(|b| b.count).collect(),
                Value::Unknown(raw) => json!(raw),
            };
            Some(json!({ "name": desc.name, "value": value }))
        })
        .collect();
    entry(schema, stats)
}

/// The result of `query-stats`: an array of [`stats_result`], one per stats fd given (the
/// VM's, then each vCPU's, as the caller orders them).
pub fn query_stats<'a, I>(sources: I, filter: &NameFilter) -> Json
where
    I: IntoIterator<Item = (&'a Schema, &'a Sample)>,
{
    sources
        .into_iter()
        .map(|(schema, sample)| stats_result(schema, sample, filter))
        .collect()
}

/// One `StatsSchemaValue`: `{"name","type","unit"?,"base"?,"exponent","bucket-size"?}`.
pub fn schema_value(desc: &Descriptor) -> Option<Json> {
    if !representable(desc) {
        return None;
    }
    let mut obj = Map::new();
    obj.insert("name".into(), json!(desc.name));
    obj.insert("type".into(), json!(desc.kind.qapi_name()?));
    if let Some(unit) = desc.unit.qapi_name() {
        obj.insert("unit".into(), json!(unit));
    }
    if desc.exponent != 0 {
        obj.insert("base".into(), json!(desc.base.radix()?));
    }
    obj.insert("exponent".into(), json!(desc.exponent));
    if desc.kind == StatType::LinearHistogram {
        obj.insert("bucket-size".into(), json!(desc.bucket_size));
    }
    Some(Json::Object(obj))
}

/// One `StatsSchema`: `{"provider":"kvm","target":..,"id":..,["vcpu":N,] "stats":[..]}`.
pub fn stats_schema(schema: &Schema, filter: &NameFilter) -> Json {
    let stats = schema
        .stats()
        .iter()
        .filter(|d| filter.matches(&d.name))
        .filter_map(schema_value)
        .collect();
    entry(schema, stats)
}

/// The result of `query-stats-schemas`: one [`stats_schema`] per target, as QEMU gives (all
/// vCPUs share a schema, so the first vCPU schema given stands for all), with QEMU's members
/// only (`provider`, `target`, `stats`): the file's `id` and vCPU index are one vCPU's, and
/// the schema is every vCPU's.
pub fn query_stats_schemas<'a, I>(schemas: I) -> Json
where
    I: IntoIterator<Item = &'a Schema>,
{
    let mut seen_vm = false;
    let mut seen_vcpu = false;
    let mut out = Vec::new();
    for schema in schemas {
        let seen = match schema.target() {
            Target::Vm => &mut seen_vm,
            Target::Vcpu(_) => &mut seen_vcpu,
        };
        if !*seen {
            *seen = true;
            let mut entry = stats_schema(schema, &NameFilter::all());
            if let Json::Object(members) = &mut entry {
                members.remove("id");
                members.remove("vcpu");
            }
            out.push(entry);
        }
    }
    Json::Array(out)
}
