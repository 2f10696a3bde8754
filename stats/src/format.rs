//! Human-readable tables: values in scaled units (`1.25 s`, `3.00 MiB`), histograms as their
//! non-empty buckets (`n=8 [1ns,2ns)=1 [8ns,..)=7`).

#![forbid(unsafe_code)]

use std::fmt::Write;

use crate::delta::{Change, Delta};
use crate::descriptor::Descriptor;
use crate::filter::NameFilter;
use crate::flags::{Base, Unit};
use crate::sample::Sample;
use crate::schema::Schema;
use crate::value::{Bucket, Value};

/// A reader's own text for some stats' raw scalar values, where it knows
/// more than the format says (a file whose `*_at_ns` stats are wall-clock
/// instants, which the format can only call seconds); `None` leaves a
/// value to its unit.
pub type Shown<'a> = &'a dyn Fn(&Descriptor, u64) -> Option<String>;

/// One line per selected stat: name, then value in its unit.
pub fn table(schema: &Schema, sample: &Sample, filter: &NameFilter) -> String {
    table_with(schema, sample, filter, &|_, _| None)
}

/// [`table`], with the scalars `shown` has a text for shown that way.
pub fn table_with(schema: &Schema, sample: &Sample, filter: &NameFilter, shown: Shown) -> String {
    let rows = filter
        .select(schema)
        .into_iter()
        .filter_map(|id| {
            let desc = schema.get(id)?;
            let value = sample.value(schema, id);
            let text = match value {
                Value::Scalar(raw) => shown(desc, raw),
                _ => None,
            };
            Some((
                desc.name.as_str(),
                text.unwrap_or_else(|| self::value(desc, &value)),
            ))
        })
        .collect::<Vec<_>>();
    render(&rows)
}

/// One line per selected stat of a [`Delta`]: growth and rate of cumulative stats, current
/// value of the others, bucket growth of histograms.
pub fn delta_table(schema: &Schema, delta: &Delta, filter: &NameFilter) -> String {
    delta_table_with(schema, delta, filter, &|_, _| None)
}

/// [`delta_table`], with the current values of instant and peak stats that
/// `shown` has a text for shown that way.
pub fn delta_table_with(
    schema: &Schema,
    delta: &Delta,
    filter: &NameFilter,
    shown: Shown,
) -> String {
    let rows = filter
        .select(schema)
        .into_iter()
        .filter_map(|id| {
            let desc = schema.get(id)?;
            let now = delta.get(id)?;
            let text = match now {
                Change::Instant(raw) | Change::Peak(raw) => shown(desc, *raw),
                _ => None,
            };
            Some((
                desc.name.as_str(),
                text.unwrap_or_else(|| change(desc, now)),
            ))
        })
        .collect::<Vec<_>>();
    render(&rows)
}

fn render(rows: &[(&str, String)]) -> String {
    let width = rows.iter().map(|(name, _)| name.len()).max().unwrap_or(0);
    let mut out = String::new();
    for (name, text) in rows {
        // Writing to a String cannot fail.
        let _ = writeln!(out, "{name:<width$}  {text}");
    }
    out
}

/// A typed value in its unit, as the table shows it.
pub fn value(desc: &Descriptor, value: &Value) -> String {
    match value {
        Value::Scalar(raw) => scalar(desc, *raw),
        Value::Boolean(b) => b.to_string(),
        Value::Histogram(buckets) => histogram(desc, buckets),
        Value::Unknown(raw) => format!("{raw:?} (unknown type)"),
    }
}

fn change(desc: &Descriptor, change: &Change) -> String {
    match change {
        Change::Cumulative { delta, per_second } => {
            let rate = per_second.map_or_else(String::new, |r| {
                format!(
                    " ({}/s)",
                    in_unit(desc.unit, r * desc.scale().unwrap_or(1.0), " ")
                )
            });
            format!("+{}{rate}", scalar(desc, *delta))
        }
        Change::Instant(raw) | Change::Peak(raw) => scalar(desc, *raw),
        Change::Boolean(b) => b.to_string(),
        Change::Histogram(deltas) => {
            let buckets = crate::value::buckets(desc, deltas);
            format!("+{}", histogram(desc, &buckets))
        }
        Change::Unknown(raw) => format!("{raw:?} (unknown type)"),
    }
}

/// A raw scalar in its unit: plain count, `1.25 s`, `3.00 MiB`, `12345 cycles`.
pub fn scalar(desc: &Descriptor, raw: u64) -> String {
    if let (Unit::None, 0) = (desc.unit, desc.exponent) {
        return raw.to_string();
    }
    let Some(scale) = desc.scale() else {
        return format!("{raw} (unknown base {})", desc.base.to_flags() >> 8);
    };
    if desc.base == Base::Pow10 && desc.exponent == 0 && desc.unit == Unit::Cycles {
        return format!("{raw} cycles");
    }
    match desc.unit {
        Unit::Unknown(u) => format!("{raw} (unknown unit {u})"),
        unit => in_unit(unit, raw as f64 * scale, " "),
    }
}

/// A number already in `unit`, with a readable prefix.
fn in_unit(unit: Unit, x: f64, sep: &str) -> String {
    match unit {
        Unit::Seconds => seconds(x, sep),
        Unit::Bytes => bytes(x, sep),
        Unit::Cycles => format!("{}{sep}cycles", number(x)),
        Unit::None | Unit::Boolean | Unit::Unknown(_) => number(x),
    }
}

/// Integers (up to float noise from scaling) without decimals, others with two.
fn number(x: f64) -> String {
    let rounded = x.round();
    if (x - rounded).abs() <= 1e-9 * x.abs().max(1.0) && rounded.abs() < 1e15 {
        format!("{rounded:.0}")
    } else {
        format!("{x:.2}")
    }
}

fn seconds(x: f64, sep: &str) -> String {
    let abs = x.abs();
    if abs == 0.0 {
        format!("0{sep}s")
    } else if abs < 1e-6 {
        format!("{}{sep}ns", number(x * 1e9))
    } else if abs < 1e-3 {
        format!("{:.2}{sep}us", x * 1e6)
    } else if abs < 1.0 {
        format!("{:.2}{sep}ms", x * 1e3)
    } else {
        format!("{x:.2}{sep}s")
    }
}

fn bytes(x: f64, sep: &str) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if x.abs() < 1024.0 {
        return format!("{}{sep}B", number(x));
    }
    let mut v = x / 1024.0;
    let mut unit = 0;
    while v.abs() >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.2}{sep}{}", UNITS[unit])
}

/// `n=<total>` then each non-empty bucket as `[lower,upper)=count`.
fn histogram(desc: &Descriptor, buckets: &[Bucket]) -> String {
    let total = buckets
        .iter()
        .fold(0u64, |acc, b| acc.saturating_add(b.count));
    let mut out = format!("n={total}");
    for b in buckets.iter().filter(|b| b.count > 0) {
        let lower = bound(desc, b.lower);
        let upper = b.upper.map_or_else(|| "..".to_owned(), |u| bound(desc, u));
        let _ = write!(out, " [{lower},{upper})={}", b.count);
    }
    out
}

fn bound(desc: &Descriptor, raw: u64) -> String {
    match (desc.unit, desc.scale()) {
        (Unit::None | Unit::Boolean | Unit::Unknown(_), _) | (_, None) => raw.to_string(),
        (unit, Some(scale)) => in_unit(unit, raw as f64 * scale, ""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flags::StatType;

    fn desc(unit: Unit, base: Base, exponent: i16) -> Descriptor {
        Descriptor {
            name: "x".into(),
            flags: unit.to_flags() | base.to_flags(),
            kind: StatType::Cumulative,
            unit,
            base,
            exponent,
            size: 1,
            offset: 0,
            bucket_size: 0,
        }
    }

    #[test]
    fn nanoseconds_show_as_seconds() {
        assert_eq!(
            scalar(&desc(Unit::Seconds, Base::Pow10, -9), 1_250_000_000),
            "1.25 s"
        );
        assert_eq!(
            scalar(&desc(Unit::Seconds, Base::Pow10, -9), 1_500),
            "1.50 us"
        );
        assert_eq!(scalar(&desc(Unit::Seconds, Base::Pow10, -9), 15), "15 ns");
    }

    #[test]
    fn bytes_show_with_binary_prefixes() {
        assert_eq!(scalar(&desc(Unit::Bytes, Base::Pow2, 0), 512), "512 B");
        assert_eq!(
            scalar(&desc(Unit::Bytes, Base::Pow2, 0), 3 << 20),
            "3.00 MiB"
        );
        assert_eq!(
            scalar(&desc(Unit::Bytes, Base::Pow2, 12), 1 << 18),
            "1.00 GiB"
        );
    }

    #[test]
    fn counts_and_cycles_show_plain() {
        assert_eq!(scalar(&desc(Unit::None, Base::Pow10, 0), 12), "12");
        assert_eq!(
            scalar(&desc(Unit::Cycles, Base::Pow10, 0), 12345),
            "12345 cycles"
        );
    }

    #[test]
    fn histogram_shows_non_empty_buckets() {
        let mut d = desc(Unit::Seconds, Base::Pow10, -9);
        d.kind = StatType::Log2Histogram;
        d.size = 3;
        let buckets = crate::value::buckets(&d, &[0, 2, 5]);
        assert_eq!(histogram(&d, &buckets), "n=7 [1ns,2ns)=2 [2ns,..)=5");
    }

    #[test]
    fn a_readers_own_text_replaces_only_the_scalars_it_names() {
        let bytes = crate::builder::StatsFileBuilder::new("kvmscope-1")
            .stat(
                "at_ns",
                StatType::Instant,
                Unit::Seconds,
                Base::Pow10,
                -9,
                &[7],
            )
            .stat(
                "took_ns",
                StatType::Instant,
                Unit::Seconds,
                Base::Pow10,
                -9,
                &[7],
            )
            .counter("exits", 7)
            .build();
        let schema = Schema::read(bytes.as_slice()).unwrap();
        let mut sample = Sample::new(&schema);
        sample.read_from(bytes.as_slice(), &schema).unwrap();
        let shown =
            |d: &Descriptor, raw: u64| (d.name == "at_ns").then(|| format!("instant {raw}"));
        let all = NameFilter::all();
        let text = table_with(&schema, &sample, &all, &shown);
        let lines: Vec<&str> = text.lines().map(str::trim_end).collect();
        assert_eq!(lines, ["at_ns    instant 7", "took_ns  7 ns", "exits    7"]);
        assert_eq!(
            table(&schema, &sample, &all).lines().next(),
            Some("at_ns    7 ns")
        );
        let delta = crate::delta(&schema, &sample, &sample);
        let text = delta_table_with(&schema, &delta, &all, &shown);
        let lines: Vec<&str> = text.lines().map(str::trim_end).collect();
        assert_eq!(
            lines,
            ["at_ns    instant 7", "took_ns  7 ns", "exits    +0"]
        );
    }
}
