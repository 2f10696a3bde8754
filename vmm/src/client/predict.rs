//! `kvmscope migrate --predict`: the readiness prediction asked just before
//! the migration starts, and the predicted figures set against the actual
//! ones of `query-migrate`, field by field, with the error of each.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;
use serde_json::Value;

use super::{Client, Error};
use crate::protocol::migration::{MigrationInfo, Status};
use crate::protocol::readiness::PredictionReply;
use crate::protocol::request::ReadinessRequest;

/// The prediction's figures under `query-migrate`'s names.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Predicted {
    /// `transferred`, bytes.
    pub(crate) transferred: u64,
    pub(crate) duplicate: u64,
    pub(crate) normal: u64,
    pub(crate) dirty_sync_count: u64,
    /// ms; `None` when it never ends.
    pub(crate) total_time: Option<u64>,
    /// ms; `None` when it never stops.
    pub(crate) downtime: Option<u64>,
    /// The guest's stall, ms (`x-guest-stall`'s `total-ms`); `None` without
    /// a dirty-rate window, or when it never stops.
    pub(crate) guest_stall: Option<u64>,
    /// Whether the passes converge before the downtime limit.
    pub(crate) converges: bool,
    /// Why, in words.
    pub(crate) reason: String,
    /// The report's text, for people.
    pub(crate) text: String,
    /// When it does not converge: the smallest auto-converge throttle, %,
    /// that would make it, the vCPUs it throttles, and that migration's
    /// figures.
    pub(crate) converge: Option<(u64, Vec<usize>, Box<Predicted>)>,
    /// When it does not converge on a ring VM: the dirty limit per vCPU,
    /// MB/s, that would make it at the least cost to the guest, and that
    /// migration's figures.
    pub(crate) dirty_limit: Option<(u64, Vec<usize>, Box<Predicted>)>,
}

/// Asks `query-readiness` (with the exact scan, and the VMM's dirty-rate
/// window when it logs dirty pages) for the link `bandwidth` (0: unlimited).
///
/// # Errors
/// A transport failure, the VMM's error reply, or a reply without a prediction.
pub(crate) fn ask(client: &mut Client, bandwidth: u64) -> Result<Predicted, Error> {
    let args = ReadinessRequest {
        scan: true,
        bandwidth: Some(bandwidth as f64),
        ..ReadinessRequest::default()
    };
    let report = client.query_readiness(args, |_| {})?;
    let Some(p) = report.prediction else {
        return Err(Error::BadReply(
            "the readiness report has no prediction".into(),
        ));
    };
    // The VMM's report, shown on the user's terminal.
    let text = crate::units::peer_lines(&report.text, super::readiness::REPORT_WIDTH, 1000);
    let mut predicted = of(p, text);
    predicted.converge = report.converge.map(|c| {
        (
            c.cpu_throttle_percentage,
            c.vcpus,
            Box::new(of(c.prediction, String::new())),
        )
    });
    predicted.dirty_limit = report.converge_dirty_limit.map(|c| {
        (
            c.vcpu_dirty_limit,
            c.vcpus,
            Box::new(of(c.prediction, String::new())),
        )
    });
    Ok(predicted)
}

/// A prediction's figures.
fn of(p: PredictionReply, text: String) -> Predicted {
    let ram = p.migrate.ram;
    Predicted {
        transferred: ram.transferred,
        duplicate: ram.duplicate,
        normal: ram.normal,
        dirty_sync_count: ram.dirty_sync_count,
        total_time: p.migrate.total_time,
        downtime: p.migrate.downtime,
        guest_stall: p.migrate.x_guest_stall_ms,
        converges: p.converges,
        reason: p.reason,
        text,
        converge: None,
        dirty_limit: None,
    }
}

/// Whether a finished migration converged: it completed, and what was dirty
/// at its last sync fitted the downtime limit (not forced by `x-max-rounds`).
pub(crate) fn converged(info: &MigrationInfo, downtime_limit: u64) -> bool {
    info.status == Some(Status::Completed)
        && info.expected_downtime.is_some_and(|e| e <= downtime_limit)
}

/// `(actual - predicted) / actual`, as a percentage; `None` without both.
fn error_pct(predicted: Option<u64>, actual: Option<u64>) -> Option<f64> {
    let (p, a) = (predicted? as f64, actual? as f64);
    Some(if a == 0.0 {
        if p == 0.0 {
            0.0
        } else {
            f64::INFINITY
        }
    } else {
        (p - a) / a * 100.0
    })
}

/// The rows of the comparison: (field, predicted, actual, error %).
pub(crate) fn rows(
    p: &Predicted,
    info: &MigrationInfo,
) -> Vec<(&'static str, Option<u64>, Option<u64>)> {
    let ram = info.ram.clone().unwrap_or_default();
    vec![
        ("transferred", Some(p.transferred), Some(ram.transferred)),
        ("duplicate", Some(p.duplicate), Some(ram.duplicate)),
        ("normal", Some(p.normal), Some(ram.normal)),
        (
            "dirty-sync-count",
            Some(p.dirty_sync_count),
            Some(ram.dirty_sync_count),
        ),
        ("total-time", p.total_time, info.total_time),
        ("downtime", p.downtime, info.downtime),
        (
            "x-guest-stall",
            p.guest_stall,
            info.x_guest_stall
                .as_ref()
                .map(|g| crate::units::saturating_u64(g.total_ms.round())),
        ),
        // The model prices the faults, not the host's contention: the
        // measured stall without its waiting for a CPU, where it was measured.
        (
            "x-guest-stall-tracking",
            p.guest_stall,
            info.x_guest_stall.as_ref().and_then(|g| {
                let waited = g.waited_ms?;
                Some(crate::units::saturating_u64(
                    (g.total_ms - waited).max(0.0).round(),
                ))
            }),
        ),
    ]
}

/// The comparison for people: one line per field, then the verdicts.
pub(crate) fn table(p: &Predicted, info: &MigrationInfo, downtime_limit: u64) -> String {
    let mut s = String::from("predicted vs actual:\n");
    let _ = writeln!(
        s,
        "  {:<28} {:>17} {:>17} {:>10}",
        "field (unit)", "predicted", "actual", "error"
    );
    let cell = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
    for (name, predicted, actual) in rows(p, info) {
        let err = error_pct(predicted, actual).map_or("-".to_string(), |e| format!("{e:+.1} %"));
        let unit = match name {
            "transferred" => "bytes",
            "duplicate" | "normal" => "pages",
            "dirty-sync-count" => "passes",
            _ => "ms",
        };
        let _ = writeln!(
            s,
            "  {:<28} {:>17} {:>17} {err:>10}",
            format!("{name} ({unit})"),
            cell(predicted),
            cell(actual)
        );
    }
    let verdict = |c: bool| if c { "converges" } else { "does not converge" };
    let actual = converged(info, downtime_limit);
    let _ = writeln!(
        s,
        "  {:<28} {:>17} {:>17} {:>10}",
        "verdict",
        verdict(p.converges),
        verdict(actual),
        if p.converges == actual {
            "right"
        } else {
            "WRONG"
        }
    );
    s
}

/// One field of the comparison, as `--json` prints it.
#[derive(Serialize)]
struct FieldFigures {
    predicted: Option<u64>,
    actual: Option<u64>,
    /// Absent figures, or an actual 0 against a predicted one, give null.
    #[serde(rename = "error-percent")]
    error_percent: Option<f64>,
}

/// The predicted and the actual verdict.
#[derive(Serialize)]
struct Verdicts {
    predicted: bool,
    actual: bool,
}

/// `x-predicted`: each field's figures, the verdicts and the model's reason.
#[derive(Serialize)]
struct Comparison {
    fields: BTreeMap<&'static str, FieldFigures>,
    converges: Verdicts,
    reason: String,
}

/// The comparison as JSON (`x-predicted` next to `query-migrate`'s figures).
pub(crate) fn to_json(p: &Predicted, info: &MigrationInfo, downtime_limit: u64) -> Value {
    let fields = rows(p, info)
        .into_iter()
        .map(|(name, predicted, actual)| {
            let figures = FieldFigures {
                predicted,
                actual,
                error_percent: error_pct(predicted, actual).filter(|e| e.is_finite()),
            };
            (name, figures)
        })
        .collect();
    let comparison = Comparison {
        fields,
        converges: Verdicts {
            predicted: p.converges,
            actual: converged(info, downtime_limit),
        },
        reason: p.reason.clone(),
    };
    serde_json::to_value(comparison).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::migration::RamStats;

    fn info(expected: u64) -> MigrationInfo {
        MigrationInfo {
            status: Some(Status::Completed),
            total_time: Some(200),
            downtime: Some(4),
            expected_downtime: Some(expected),
            ram: Some(RamStats {
                transferred: 1_000_000,
                duplicate: 60_000,
                normal: 250,
                dirty_sync_count: 2,
                ..RamStats::default()
            }),
            ..MigrationInfo::default()
        }
    }

    fn predicted() -> Predicted {
        Predicted {
            transferred: 1_100_000,
            duplicate: 60_000,
            normal: 240,
            dirty_sync_count: 1,
            total_time: Some(100),
            downtime: None,
            converges: true,
            ..Predicted::default()
        }
    }

    #[test]
    fn the_table_gives_each_field_its_error_and_dashes_for_no_figure() {
        let t = table(&predicted(), &info(1), 300);
        // Columns named, each field with its unit.
        let header = t.lines().nth(1).unwrap();
        assert_eq!(
            header.split_whitespace().collect::<Vec<_>>(),
            ["field", "(unit)", "predicted", "actual", "error"],
            "{t}"
        );
        assert!(t.contains("transferred (bytes)"), "{t}");
        assert!(t.contains("total-time (ms)"), "{t}");
        assert!(t.contains("+10.0 %"), "{t}");
        assert!(t.contains("-4.0 %"), "{t}");
        assert!(t.contains("-50.0 %"), "{t}");
        assert!(
            t.lines()
                .any(|l| l.contains("downtime") && l.trim_end().ends_with('-')),
            "{t}"
        );
        assert!(t.contains("right"), "{t}");
    }

    #[test]
    fn a_migration_stopped_by_the_round_limit_did_not_converge() {
        assert!(!converged(&info(900), 300));
        assert!(converged(&info(300), 300));
        let t = table(&predicted(), &info(900), 300);
        assert!(t.contains("WRONG"), "{t}");
    }

    #[test]
    fn the_stall_is_set_against_the_measured_one_with_and_without_its_waiting() {
        use crate::protocol::migration::GuestStall;
        let p = Predicted {
            guest_stall: Some(20),
            ..predicted()
        };
        let mut i = info(1);
        i.x_guest_stall = Some(GuestStall {
            total_ms: 143.0,
            waited_ms: Some(124.0),
            vcpus: Vec::new(),
        });
        let j = to_json(&p, &i, 300);
        assert_eq!(j["fields"]["x-guest-stall"]["actual"], 143);
        assert_eq!(j["fields"]["x-guest-stall-tracking"]["actual"], 19);
        assert_eq!(j["fields"]["x-guest-stall-tracking"]["predicted"], 20);
        // Not measured: no figure, not the total.
        i.x_guest_stall.as_mut().unwrap().waited_ms = None;
        let j = to_json(&p, &i, 300);
        assert_eq!(j["fields"]["x-guest-stall-tracking"]["actual"], Value::Null);
    }

    #[test]
    fn the_json_has_predicted_actual_and_error_per_field() {
        let j = to_json(&predicted(), &info(1), 300);
        assert_eq!(j["fields"]["normal"]["predicted"], 240);
        assert_eq!(j["fields"]["normal"]["actual"], 250);
        assert_eq!(j["fields"]["downtime"]["error-percent"], Value::Null);
        assert_eq!(j["converges"]["actual"], true);
    }
}
