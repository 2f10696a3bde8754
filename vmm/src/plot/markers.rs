//! Phase markers: where a vCPU's latest phase marker (`(seq << 8) | command
//! code`, see `abi::PORT_PHASE`) changes between ticks, and the labels drawn there.

use plotters::style::RGBColor;

use crate::abi;
use crate::sampler::record::Point;

/// A vCPU starting a command, as first seen by the sampler.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PhaseChange {
    pub(crate) time_s: f64,
    pub(crate) vcpu: usize,
    pub(crate) seq: u64,
    pub(crate) code: u64,
}

/// Changes close enough on the chart to share one line and label.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct MarkerGroup {
    pub(crate) time_s: f64,
    /// The command of the first change, which colours the line.
    pub(crate) code: u64,
    pub(crate) label: String,
}

pub(crate) use crate::abi::command_name;

/// A colour per command, so a line says what started before it is read.
pub(crate) fn command_color(code: u64) -> RGBColor {
    match code {
        abi::CMD_TOUCH => RGBColor(0x1f, 0x77, 0xb4),
        abi::CMD_TOUCH_ZERO => RGBColor(0x17, 0xbe, 0xcf),
        abi::CMD_READ => RGBColor(0x2c, 0xa0, 0x2c),
        abi::CMD_DIRTY => RGBColor(0xd6, 0x27, 0x28),
        abi::CMD_EXITS => RGBColor(0x94, 0x67, 0xbd),
        abi::CMD_PANIC => RGBColor(0x8c, 0x56, 0x4b),
        abi::CMD_FAULT => RGBColor(0xe3, 0x77, 0xc2),
        _ => RGBColor(0x55, 0x55, 0x55),
    }
}

/// Every tick where one of `vcpus` shows a phase marker other than the one
/// before (0 counts as "before the first"), in time order.
pub(crate) fn phase_changes(points: &[&Point], vcpus: &[usize]) -> Vec<PhaseChange> {
    let mut changes = Vec::new();
    for &vcpu in vcpus {
        let mut last = 0;
        for p in points {
            let Some(v) = p.vcpus.get(vcpu) else { continue };
            if v.phase != last && v.phase != 0 {
                changes.push(PhaseChange {
                    time_s: p.time_s,
                    vcpu,
                    seq: v.phase >> 8,
                    code: v.phase & 0xff,
                });
            }
            last = v.phase;
        }
    }
    changes.sort_by(|a, b| a.time_s.total_cmp(&b.time_s).then(a.vcpu.cmp(&b.vcpu)));
    changes
}

/// Merges changes whose x positions (`x_of`) lie within `min_px` of the
/// group's first into one marker, so labels do not overprint.
pub(crate) fn group(
    changes: &[PhaseChange],
    x_of: impl Fn(f64) -> f64,
    min_px: f64,
) -> Vec<MarkerGroup> {
    let mut groups: Vec<(f64, Vec<&PhaseChange>)> = Vec::new();
    for c in changes {
        let x = x_of(c.time_s);
        match groups.last_mut() {
            Some((x0, members)) if x - *x0 < min_px => members.push(c),
            _ => groups.push((x, vec![c])),
        }
    }
    groups
        .into_iter()
        .filter_map(|(_, members)| {
            let first = members.first()?;
            Some(MarkerGroup {
                time_s: first.time_s,
                code: first.code,
                label: label(&members),
            })
        })
        .collect()
}

/// `v0 #3 dirty`, or `v0-3 #1 touch | v4 #2 read` for several at once.
fn label(members: &[&PhaseChange]) -> String {
    let mut parts: Vec<((u64, u64), Vec<usize>)> = Vec::new();
    for c in members {
        match parts.iter_mut().find(|(key, _)| *key == (c.seq, c.code)) {
            Some((_, vcpus)) => vcpus.push(c.vcpu),
            None => parts.push(((c.seq, c.code), vec![c.vcpu])),
        }
    }
    parts
        .iter()
        .map(|((seq, code), vcpus)| {
            let name = command_name(*code).map_or_else(|| format!("cmd {code}"), str::to_string);
            format!("v{} #{seq} {name}", vcpu_list(vcpus))
        })
        .collect::<Vec<_>>()
        .join(" | ")
}

/// `0`, `0,2`, `0-3`, `0-2,5`: vCPU indexes with runs collapsed.
fn vcpu_list(vcpus: &[usize]) -> String {
    let mut sorted = vcpus.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for v in sorted {
        match runs.last_mut() {
            Some((_, end)) if *end + 1 == v => *end = v,
            _ => runs.push((v, v)),
        }
    }
    runs.iter()
        .map(|&(a, b)| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::record::VcpuPoint;

    fn point(t: f64, phases: &[u64]) -> Point {
        let vcpus = phases
            .iter()
            .map(|&phase| VcpuPoint {
                phase,
                ..VcpuPoint::default()
            })
            .collect();
        Point {
            time_s: t,
            vcpus,
            ..Point::default()
        }
    }

    fn marker(seq: u64, code: u64) -> u64 {
        (seq << 8) | code
    }

    #[test]
    fn phase_changes_skip_phase_zero_and_repeats() {
        let pts = [
            point(0.0, &[0]),
            point(0.1, &[marker(1, 1)]),
            point(0.2, &[marker(1, 1)]),
            point(0.3, &[marker(2, 4)]),
        ];
        let refs: Vec<&Point> = pts.iter().collect();
        let got = phase_changes(&refs, &[0]);
        assert_eq!(
            got.iter()
                .map(|c| (c.time_s, c.seq, c.code))
                .collect::<Vec<_>>(),
            [(0.1, 1, 1), (0.3, 2, 4)]
        );
    }

    #[test]
    fn phase_changes_ignore_vcpus_not_asked_for() {
        let pts = [point(0.0, &[marker(1, 1), marker(1, 3)])];
        let refs: Vec<&Point> = pts.iter().collect();
        let got = phase_changes(&refs, &[1]);
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].vcpu, got[0].code), (1, 3));
    }

    #[test]
    fn group_merges_close_changes_into_one_label() {
        let pts = [
            point(0.0, &[0, 0, 0, 0]),
            point(1.0, &[marker(1, 1); 4]),
            point(
                5.0,
                &[marker(2, 4), marker(1, 1), marker(1, 1), marker(2, 3)],
            ),
        ];
        let refs: Vec<&Point> = pts.iter().collect();
        let changes = phase_changes(&refs, &[0, 1, 2, 3]);
        let groups = group(&changes, |t| t * 100.0, 12.0);
        let labels: Vec<&str> = groups.iter().map(|g| g.label.as_str()).collect();
        assert_eq!(labels, ["v0-3 #1 touch", "v0 #2 dirty | v3 #2 read"]);
    }

    #[test]
    fn unknown_command_codes_are_labelled_by_number() {
        let c = PhaseChange {
            time_s: 0.0,
            vcpu: 2,
            seq: 9,
            code: 99,
        };
        assert_eq!(label(&[&c]), "v2 #9 cmd 99");
    }

    #[test]
    fn vcpu_list_collapses_runs() {
        assert_eq!(vcpu_list(&[3, 0, 1, 2, 5]), "0-3,5");
    }
}
