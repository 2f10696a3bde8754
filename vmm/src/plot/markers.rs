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
    /// Commands the vCPU started since the change before, none of them seen
    /// at a tick (each over before the next tick), as their first and last
    /// sequence numbers.
    pub(crate) unseen: Option<(u64, u64)>,
}

/// Changes close enough on the chart to share one line and label.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct MarkerGroup {
    pub(crate) time_s: f64,
    /// The command the label leads with (the first vCPU's last in the
    /// group), which colours the line.
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
        // Whether the series saw this vCPU before its first command (a
        // phase of 0): then every command since is in the series.
        let mut from_boot = false;
        for p in points {
            let Some(v) = p.vcpus.get(vcpu) else { continue };
            from_boot |= v.phase == 0;
            if v.phase != last && v.phase != 0 {
                let seq = v.phase >> 8;
                let before = last >> 8;
                changes.push(PhaseChange {
                    time_s: p.time_s,
                    vcpu,
                    seq,
                    code: v.phase & 0xff,
                    // What ran before the series began is not in it.
                    unseen: ((last != 0 || from_boot) && seq > before + 1)
                        .then(|| (before + 1, seq - 1)),
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
            // The colour of the command the label leads with: the first
            // vCPU's last in the group, which it runs from there on.
            let lasting = members.iter().rev().find(|c| c.vcpu == first.vcpu)?;
            Some(MarkerGroup {
                time_s: first.time_s,
                code: lasting.code,
                label: label(&members),
            })
        })
        .collect()
}

/// `v0 #3 dirty`, or `v0-3 #1 touch | v4 #2 read` for several at once. A
/// vCPU that changed more than once in the group is labelled by its last
/// command, the one it runs from there on, with those before it in the
/// group after it (`v0 #2 dirty (after #1 touch)`: a label cut short keeps
/// the command that lasts); commands no tick saw are named by number
/// (`(after #2 between ticks)`: a command over before the next tick, or a
/// `wait`, which the VMM carries out and the guest marks no phase for).
fn label(members: &[&PhaseChange]) -> String {
    // Per vCPU, in order of first appearance: its last change, and what the
    // group saw of it before (commands unseen included).
    let mut per_vcpu: Vec<(usize, &PhaseChange, Vec<String>)> = Vec::new();
    for c in members {
        let unseen = c.unseen.map(|(a, b)| {
            if a == b {
                format!("#{a} between ticks")
            } else {
                format!("#{a}-#{b} between ticks")
            }
        });
        match per_vcpu.iter_mut().find(|(v, _, _)| *v == c.vcpu) {
            Some((_, last, before)) => {
                before.push(format!("#{} {}", last.seq, name_of(last.code)));
                before.extend(unseen);
                *last = c;
            }
            None => per_vcpu.push((c.vcpu, c, unseen.into_iter().collect())),
        }
    }
    let mut parts: Vec<((u64, u64, String), Vec<usize>)> = Vec::new();
    for (vcpu, c, before) in per_vcpu {
        let key = (c.seq, c.code, before.join(", "));
        match parts.iter_mut().find(|(k, _)| *k == key) {
            Some((_, vcpus)) => vcpus.push(vcpu),
            None => parts.push((key, vec![vcpu])),
        }
    }
    parts
        .iter()
        .map(|((seq, code, before), vcpus)| {
            let after = if before.is_empty() {
                String::new()
            } else {
                format!(" (after {before})")
            };
            format!("v{} #{seq} {}{after}", vcpu_list(vcpus), name_of(*code))
        })
        .collect::<Vec<_>>()
        .join(" | ")
}

fn name_of(code: u64) -> String {
    command_name(code).map_or_else(|| format!("cmd {code}"), str::to_string)
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
    fn a_vcpu_that_changed_twice_in_a_group_is_labelled_by_what_it_runs_after() {
        // #1 touch and #2 dirty start a tick apart, then #3 read and #4
        // touch both start and end between two ticks: #5 dirty is seen.
        let pts = [
            point(0.0, &[0]),
            point(1.0, &[marker(1, 1)]),
            point(1.1, &[marker(2, 4)]),
            point(9.0, &[marker(5, 4)]),
        ];
        // A series that begins after the vCPU's first commands does not
        // call them unseen; one that saw it before any does.
        let late = phase_changes(&[&pts[3]], &[0]);
        assert_eq!(late[0].unseen, None);
        let early = phase_changes(&[&pts[0], &pts[3]], &[0]);
        assert_eq!(early[0].unseen, Some((1, 4)));
        let refs: Vec<&Point> = pts.iter().collect();
        let changes = phase_changes(&refs, &[0]);
        let groups = group(&changes, |t| t * 100.0, 12.0);
        let labels: Vec<&str> = groups.iter().map(|g| g.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "v0 #2 dirty (after #1 touch)",
                "v0 #5 dirty (after #3-#4 between ticks)"
            ]
        );
        // The line has the colour of the command that lasts.
        assert_eq!(groups[0].code, 4);
    }

    #[test]
    fn unknown_command_codes_are_labelled_by_number() {
        let c = PhaseChange {
            time_s: 0.0,
            vcpu: 2,
            seq: 9,
            code: 99,
            unseen: None,
        };
        assert_eq!(label(&[&c]), "v2 #9 cmd 99");
    }

    #[test]
    fn vcpu_list_collapses_runs() {
        assert_eq!(vcpu_list(&[3, 0, 1, 2, 5]), "0-3,5");
    }
}
