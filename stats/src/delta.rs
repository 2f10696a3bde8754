//! The change between two samples of one stats fd: deltas and per-second rates for
//! cumulative stats, bucket deltas for histograms, instant and peak values as they are.

#![forbid(unsafe_code)]

use std::time::Duration;

use crate::flags::{StatType, Unit};
use crate::sample::Sample;
use crate::schema::{Schema, StatId};

/// What one stat did between two samples.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// A cumulative stat: how much it grew, and per second. A decrease (which the format
    /// forbids; see [`crate::check::check_monotonic`]) reads as 0.
    Cumulative {
        /// `newer - older`, raw units.
        delta: u64,
        /// `delta` per second of elapsed time; `None` if no time elapsed.
        per_second: Option<f64>,
    },
    /// An instant stat: its newer value.
    Instant(u64),
    /// A peak stat: its newer value.
    Peak(u64),
    /// A boolean stat (instant or peak): its newer value.
    Boolean(bool),
    /// A histogram: how much each bucket grew (a decrease reads as 0).
    Histogram(Vec<u64>),
    /// A stat of unknown type: its newer raw values.
    Unknown(Vec<u64>),
}

/// Per-stat changes between two samples, in schema order.
#[derive(Debug, Clone, PartialEq)]
pub struct Delta {
    /// Time between the samples' timestamps (zero if `newer` is not newer).
    pub elapsed: Duration,
    /// One change per stat, indexed like [`Schema::stats`].
    pub changes: Vec<Change>,
}

impl Delta {
    /// The change of one stat.
    pub fn get(&self, id: StatId) -> Option<&Change> {
        self.changes.get(id.index())
    }

    /// `delta` of a cumulative stat (booleans and levels: `None`).
    pub fn cumulative(&self, id: StatId) -> Option<u64> {
        match self.get(id)? {
            Change::Cumulative { delta, .. } => Some(*delta),
            _ => None,
        }
    }
}

/// Computes per-stat changes from `older` to `newer`, two samples of the same schema.
pub fn delta(schema: &Schema, older: &Sample, newer: &Sample) -> Delta {
    let elapsed = newer
        .timestamp()
        .saturating_duration_since(older.timestamp());
    let changes = schema
        .iter()
        .map(|(id, desc)| {
            change(
                desc.kind,
                desc.unit,
                older.values(id),
                newer.values(id),
                elapsed,
            )
        })
        .collect();
    Delta { elapsed, changes }
}

fn change(kind: StatType, unit: Unit, older: &[u64], newer: &[u64], elapsed: Duration) -> Change {
    let now = newer.first().copied().unwrap_or(0);
    let before = older.first().copied().unwrap_or(0);
    match kind {
        StatType::Instant | StatType::Peak if unit == Unit::Boolean => Change::Boolean(now != 0),
        StatType::Instant => Change::Instant(now),
        StatType::Peak => Change::Peak(now),
        StatType::Cumulative => {
            let delta = now.saturating_sub(before);
            let secs = elapsed.as_secs_f64();
            let per_second = (secs > 0.0).then(|| delta as f64 / secs);
            Change::Cumulative { delta, per_second }
        }
        StatType::LinearHistogram | StatType::Log2Histogram => {
            let old = older.iter().copied().chain(std::iter::repeat(0));
            Change::Histogram(
                newer
                    .iter()
                    .zip(old)
                    .map(|(n, o)| n.saturating_sub(o))
                    .collect(),
            )
        }
        StatType::Unknown(_) => Change::Unknown(newer.to_vec()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cumulative_change_has_delta_and_rate() {
        let c = change(
            StatType::Cumulative,
            Unit::None,
            &[10],
            &[40],
            Duration::from_secs(2),
        );
        assert_eq!(
            c,
            Change::Cumulative {
                delta: 30,
                per_second: Some(15.0)
            }
        );
    }

    #[test]
    fn cumulative_change_without_elapsed_time_has_no_rate() {
        let c = change(
            StatType::Cumulative,
            Unit::None,
            &[10],
            &[11],
            Duration::ZERO,
        );
        assert_eq!(
            c,
            Change::Cumulative {
                delta: 1,
                per_second: None
            }
        );
    }

    #[test]
    fn decreasing_cumulative_reads_as_zero() {
        let c = change(
            StatType::Cumulative,
            Unit::None,
            &[10],
            &[4],
            Duration::from_secs(1),
        );
        assert_eq!(
            c,
            Change::Cumulative {
                delta: 0,
                per_second: Some(0.0)
            }
        );
    }

    #[test]
    fn instant_and_peak_report_newer_value() {
        assert_eq!(
            change(StatType::Instant, Unit::None, &[9], &[3], Duration::ZERO),
            Change::Instant(3)
        );
        assert_eq!(
            change(StatType::Peak, Unit::None, &[3], &[9], Duration::ZERO),
            Change::Peak(9)
        );
        assert_eq!(
            change(StatType::Peak, Unit::Boolean, &[0], &[1], Duration::ZERO),
            Change::Boolean(true)
        );
    }

    #[test]
    fn histogram_change_is_per_bucket() {
        let c = change(
            StatType::Log2Histogram,
            Unit::None,
            &[1, 2, 3],
            &[1, 5, 4],
            Duration::ZERO,
        );
        assert_eq!(c, Change::Histogram(vec![0, 3, 1]));
    }
}
