//! A QEMU monitor's replies as the exporter takes them: typed, and each list
//! bounded while it is read.
//!
//! They are read straight off the reply line (`Client::call_as`), never as a
//! JSON tree first: a tree takes up to some 30 times its line's bytes (8 MiB
//! of `[0,0,...]` was 250 MB), these shapes about what the reply says. A list
//! keeps at most its bound of items and counts the rest without keeping them,
//! so the reader can refuse a reply over a bound naming its size, or leave
//! the rest out, having kept no more than the bound; a part of a reply the
//! exporter does not read is skipped unkept. A reply of another shape (a
//! string where QEMU has a number) fails the read, naming why.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

/// The most stats taken of one target, in a schema or a reply (KVM has
/// about 40 of a VM and 70 of a vCPU).
pub(crate) const MAX_STATS: usize = 512;
/// The most vCPUs read of one VM (`--qmp-vcpus`): KVM's most on x86.
pub(crate) const MAX_VCPUS: usize = 4096;
/// The most buckets of a histogram: a log2 histogram of u64 values has 65.
pub(crate) const MAX_BUCKETS: usize = 65;
/// The most values (a stat's one, a histogram's buckets) kept of one
/// reply: QEMU 7.2 gives about 140 a vCPU, so this reads some 1,800 vCPUs.
/// Past it the rest of the reply is counted, not kept (and the exporter
/// leaves the vCPUs out): hundreds of thousands of tiny stats took 470 MB.
pub(crate) const MAX_VALUES: usize = 1 << 18;
/// The most bytes kept of one reply's stats (as [`StatsResult::kept`]
/// counts them): a stat of one bucket, `{"name":"a","value":[0]}`, keeps
/// some 128 bytes for its 25, so values alone bound it loosely. QEMU 7.2's
/// stats of 1,800 vCPUs keep about 6 MB.
pub(crate) const MAX_KEPT_BYTES: usize = 16 << 20;
/// The most targets a schema lists (QEMU has `vm`, `vcpu` and
/// `cryptodev`).
const MAX_TARGETS: usize = 16;

/// A list of which at most `N` items are kept, in order; `len` counts all
/// that the reply had.
#[derive(Debug)]
pub(crate) struct AtMost<T, const N: usize> {
    pub(crate) items: Vec<T>,
    pub(crate) len: usize,
}

impl<T, const N: usize> AtMost<T, N> {
    /// Whether the reply had more than `N`.
    pub(crate) fn over(&self) -> bool {
        self.len > N
    }
}

impl<T, const N: usize> Default for AtMost<T, N> {
    fn default() -> Self {
        AtMost {
            items: Vec::new(),
            len: 0,
        }
    }
}

/// Takes a list's first `N` items and counts the rest unkept.
fn at_most<'de, T: Deserialize<'de>, const N: usize, A: SeqAccess<'de>>(
    seq: A,
) -> Result<AtMost<T, N>, A::Error> {
    at_most_while(seq, |_| true).map(|(list, _)| list)
}

/// Takes a list's first `N` items, or fewer: once `more` says no of an
/// item (kept), the rest are counted unkept too; and whether it did.
fn at_most_while<'de, T: Deserialize<'de>, const N: usize, A: SeqAccess<'de>>(
    mut seq: A,
    mut more: impl FnMut(&T) -> bool,
) -> Result<(AtMost<T, N>, bool), A::Error> {
    // Not the peer's size hint: it would size the vector.
    let mut out = AtMost::default();
    let mut stopped = false;
    loop {
        if out.len < N && !stopped {
            let Some(item) = seq.next_element()? else {
                break;
            };
            stopped = !more(&item);
            out.items.push(item);
        } else if seq.next_element::<IgnoredAny>()?.is_none() {
            break;
        }
        out.len += 1;
    }
    out.items.shrink_to_fit();
    Ok((out, stopped))
}

impl<'de, T: Deserialize<'de>, const N: usize> Deserialize<'de> for AtMost<T, N> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct List<T, const N: usize>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>, const N: usize> Visitor<'de> for List<T, N> {
            type Value = AtMost<T, N>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                at_most(seq)
            }
        }
        d.deserialize_seq(List(PhantomData))
    }
}

/// `query-name`'s return.
#[derive(Debug, Deserialize)]
pub(crate) struct NameInfo {
    pub(crate) name: Option<String>,
}

/// A stats target as a schema or a reply names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Target {
    Vm,
    Vcpu,
    /// One this exporter does not read (`cryptodev`).
    #[serde(other)]
    Other,
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(match self {
            Target::Vm => "vm",
            Target::Vcpu => "vcpu",
            Target::Other => "another",
        })
    }
}

/// `query-stats-schemas`' return.
pub(crate) type Schemas = AtMost<SchemaTarget, MAX_TARGETS>;

/// One target's schema.
#[derive(Debug, Deserialize)]
pub(crate) struct SchemaTarget {
    pub(crate) target: Target,
    #[serde(default)]
    pub(crate) stats: AtMost<StatSchema, MAX_STATS>,
}

/// One stat's schema entry, QEMU's `StatsSchemaValue`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) struct StatSchema {
    pub(crate) name: String,
    #[serde(rename = "type")]
    pub(crate) kind: StatKind,
    pub(crate) unit: Option<StatUnit>,
    pub(crate) base: Option<i64>,
    pub(crate) exponent: Option<i64>,
    pub(crate) bucket_size: Option<u64>,
}

/// A stat's type, QEMU's `StatsType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum StatKind {
    Cumulative,
    Instant,
    Peak,
    LinearHistogram,
    Log2Histogram,
    /// One this exporter does not know: the stat is left out.
    #[serde(other)]
    Other,
}

/// A stat's unit, QEMU's `StatsUnit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum StatUnit {
    Bytes,
    Seconds,
    Cycles,
    Boolean,
    /// One this exporter does not know: read as no unit.
    #[serde(other)]
    Other,
}

/// `query-stats`' return: one result per provider and vCPU, the first
/// [`MAX_VCPUS`] kept until their values pass [`MAX_VALUES`] or their bytes
/// [`MAX_KEPT_BYTES`] (the result that passes is kept; the rest counted).
#[derive(Debug, Default)]
pub(crate) struct StatsResults {
    pub(crate) items: Vec<StatsResult>,
    /// How many the reply listed.
    pub(crate) len: usize,
    /// Whether results were left unkept for the values or bytes they
    /// would add.
    pub(crate) cut: bool,
}

impl StatsResults {
    /// Whether the reply listed more than [`MAX_VCPUS`].
    pub(crate) fn over(&self) -> bool {
        self.len > MAX_VCPUS
    }
}

impl<'de> Deserialize<'de> for StatsResults {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct List;
        impl<'de> Visitor<'de> for List {
            type Value = StatsResults;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of stats results")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<StatsResults, A::Error> {
                let (mut values, mut bytes) = (0, 0);
                let (list, cut) = at_most_while(seq, |r: &StatsResult| {
                    let (v, b) = r.kept();
                    values += v;
                    bytes += b;
                    values <= MAX_VALUES && bytes <= MAX_KEPT_BYTES
                })?;
                let AtMost::<_, MAX_VCPUS> { items, len } = list;
                Ok(StatsResults { items, len, cut })
            }
        }
        d.deserialize_seq(List)
    }
}

/// One provider's stats of the VM or of one vCPU, QEMU's `StatsResult`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) struct StatsResult {
    pub(crate) provider: Option<String>,
    pub(crate) qom_path: Option<String>,
    #[serde(default)]
    pub(crate) stats: AtMost<Stat, MAX_STATS>,
}

impl StatsResult {
    /// The values its stats keep (each stat at least one), and about the
    /// bytes it keeps: its parts, and each heap block as an allocator
    /// rounds it.
    pub(crate) fn kept(&self) -> (usize, usize) {
        let block = |n: usize| if n == 0 { 0 } else { n.div_ceil(16) * 16 + 16 };
        let text = |t: &Option<String>| t.as_ref().map_or(0, |t| block(t.len()));
        let own = size_of::<StatsResult>() + text(&self.provider) + text(&self.qom_path);
        self.stats
            .items
            .iter()
            .fold((0, own), |(values, bytes), s| {
                let name = s.name.as_ref().map_or(0, |n| block(n.len()));
                let (n, list) = match &s.value {
                    StatValue::List(b) => {
                        let n = b.counts.as_ref().map_or(0, |c| c.len());
                        (n.max(1), block(size_of::<Buckets>()) + block(8 * n))
                    }
                    _ => (1, 0),
                };
                (values + n, bytes + size_of::<Stat>() + name + list)
            })
    }
}

/// One stat of a reply; one without a name is skipped. (Kept small: a
/// reply may hold hundreds of thousands.)
#[derive(Debug, Deserialize)]
pub(crate) struct Stat {
    pub(crate) name: Option<Box<str>>,
    #[serde(default)]
    pub(crate) value: StatValue,
}

/// A stat's value as QEMU sent it.
#[derive(Debug, Default)]
pub(crate) enum StatValue {
    /// An unsigned integer.
    Count(u64),
    /// A boolean (counted as 0 or 1).
    Flag(bool),
    /// A list (a histogram's buckets).
    List(Box<Buckets>),
    /// Anything else: a negative or fractional number, a string, an object,
    /// nothing at all.
    #[default]
    Other,
}

/// A histogram's buckets as a reply lists them.
#[derive(Debug)]
pub(crate) struct Buckets {
    /// The first [`MAX_BUCKETS`], or `None` where one of those is not an
    /// unsigned integer.
    pub(crate) counts: Option<Box<[u64]>>,
    /// How many the reply listed.
    pub(crate) len: usize,
}

/// One item of a list: `Some` for an unsigned integer, `None` for any other
/// value (skipped unkept).
struct Item(Option<u64>);

impl<'de> Deserialize<'de> for StatValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ValueVisitor;
        impl<'de> Visitor<'de> for ValueVisitor {
            type Value = StatValue;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a stat's value")
            }
            fn visit_u64<E>(self, v: u64) -> Result<StatValue, E> {
                Ok(StatValue::Count(v))
            }
            fn visit_bool<E>(self, v: bool) -> Result<StatValue, E> {
                Ok(StatValue::Flag(v))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<StatValue, A::Error> {
                let items: AtMost<Item, MAX_BUCKETS> = at_most(seq)?;
                Ok(StatValue::List(Box::new(Buckets {
                    counts: items.items.into_iter().map(|i| i.0).collect(),
                    len: items.len,
                })))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<StatValue, A::Error> {
                skip_map(map).map(|()| StatValue::Other)
            }
            fn visit_i64<E>(self, _: i64) -> Result<StatValue, E> {
                Ok(StatValue::Other)
            }
            fn visit_f64<E>(self, _: f64) -> Result<StatValue, E> {
                Ok(StatValue::Other)
            }
            fn visit_str<E>(self, _: &str) -> Result<StatValue, E> {
                Ok(StatValue::Other)
            }
            fn visit_unit<E>(self) -> Result<StatValue, E> {
                Ok(StatValue::Other)
            }
        }
        d.deserialize_any(ValueVisitor)
    }
}

impl<'de> Deserialize<'de> for Item {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // A list inside the list is read as a value and dropped.
        StatValue::deserialize(d).map(|v| match v {
            StatValue::Count(n) => Item(Some(n)),
            _ => Item(None),
        })
    }
}

/// Reads an object to its end, keeping nothing.
fn skip_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
    Ok(())
}

/// `query-cpus-fast`'s return.
pub(crate) type Cpus = AtMost<CpuInfo, MAX_VCPUS>;

/// One vCPU of `query-cpus-fast`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) struct CpuInfo {
    pub(crate) qom_path: Option<String>,
    /// Signed, so that a negative index leaves its vCPU out rather than
    /// failing the reply (as it did before these were typed).
    pub(crate) cpu_index: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_keeps_its_bound_and_counts_the_rest() {
        let list: AtMost<u64, 3> = serde_json::from_str("[1, 2, 3, 4, {\"a\": [5]}]").unwrap();
        assert_eq!((list.items, list.len), (vec![1, 2, 3], 5));
        let short: AtMost<u64, 3> = serde_json::from_str("[7]").unwrap();
        assert!(!short.over());
        assert!(serde_json::from_str::<AtMost<u64, 3>>("7").is_err());
        // Items within the bound are typed; past it, anything is skipped.
        assert!(serde_json::from_str::<AtMost<u64, 3>>("[1, \"x\"]").is_err());
    }

    #[test]
    fn stat_values_say_what_they_are_without_failing_the_reply() {
        let stats: AtMost<Stat, 8> = serde_json::from_str(
            r#"[{"name": "a", "value": 7}, {"name": "b", "value": true},
                {"name": "c", "value": [1, -1, 2.5, "x", [3], {"y": 4}, null]},
                {"name": "d", "value": -3}, {"name": "e", "value": {"z": [1]}},
                {"name": "f"}, {"value": 1}]"#,
        )
        .unwrap();
        let v: Vec<_> = stats.items.iter().map(|s| &s.value).collect();
        assert!(matches!(v[0], StatValue::Count(7)));
        assert!(matches!(v[1], StatValue::Flag(true)));
        let StatValue::List(list) = v[2] else {
            panic!("{:?}", v[2])
        };
        assert_eq!(list.len, 7);
        assert_eq!(list.counts, None, "only unsigned integers count");
        assert!(matches!(v[3], StatValue::Other));
        assert!(matches!(v[4], StatValue::Other));
        assert!(matches!(v[5], StatValue::Other));
        assert_eq!(stats.items[6].name, None);
        let fine: Stat = serde_json::from_str(r#"{"name": "h", "value": [0, 3]}"#).unwrap();
        let StatValue::List(b) = fine.value else {
            panic!("{:?}", fine.value)
        };
        assert_eq!(b.counts.as_deref(), Some(&[0, 3][..]));
    }

    /// A reply's results are kept while their values are within the bound
    /// and counted past it; the count of vCPUs stays whole.
    #[test]
    fn results_past_the_values_bound_are_counted_not_kept() {
        // Stats without a name keep the fewest bytes: the values' bound cuts.
        let stats: Vec<_> = (0..500).map(|i| serde_json::json!({"value": i})).collect();
        let result = serde_json::json!({"provider": "kvm", "qom-path": "/p", "stats": stats});
        let n = MAX_VALUES / 500 + 3;
        let list = serde_json::Value::Array(vec![result; n]).to_string();
        let r: StatsResults = serde_json::from_str(&list).unwrap();
        assert!(r.cut);
        assert!(!r.over());
        assert_eq!(r.len, n);
        assert_eq!(
            r.items.len(),
            MAX_VALUES / 500 + 1,
            "kept up to the first past the bound"
        );
        let few: StatsResults = serde_json::from_str("[{\"stats\": []}, {}]").unwrap();
        assert_eq!((few.items.len(), few.len, few.cut), (2, 2, false));
    }

    /// A reply of stats that keep more than they say (one bucket each, a
    /// name) is cut by the bytes it keeps before its values' bound.
    #[test]
    fn results_past_the_bytes_bound_are_counted_not_kept() {
        let stats: Vec<_> = (0..512)
            .map(|i| serde_json::json!({"name": format!("s{i}"), "value": [0]}))
            .collect();
        let result = serde_json::json!({"provider": "kvm", "stats": stats});
        let (values, bytes) = serde_json::from_value::<StatsResult>(result.clone())
            .unwrap()
            .kept();
        assert_eq!(values, 512);
        assert!(bytes > 512 * 100, "{bytes}");
        let n = MAX_KEPT_BYTES / bytes + 2;
        assert!(
            n * values < MAX_VALUES,
            "the values' bound is not what cuts"
        );
        let list = serde_json::Value::Array(vec![result; n]).to_string();
        let r: StatsResults = serde_json::from_str(&list).unwrap();
        assert!(r.cut);
        assert_eq!(r.len, n);
        assert_eq!(r.items.len(), MAX_KEPT_BYTES / bytes + 1);
    }

    #[test]
    fn schema_targets_this_exporter_does_not_read_are_other() {
        let s: Schemas = serde_json::from_str(
            r#"[{"target": "cryptodev", "provider": "cryptodev-builtin", "stats": []},
                {"target": "vcpu", "stats": [{"name": "exits", "type": "cumulative", "exponent": 0}]}]"#,
        )
        .unwrap();
        assert_eq!(s.items[0].target, Target::Other);
        assert_eq!(s.items[1].target, Target::Vcpu);
        assert_eq!(s.items[1].stats.items[0].kind, StatKind::Cumulative);
    }
}
