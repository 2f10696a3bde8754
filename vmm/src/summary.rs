//! What a run did, from KVM's stats and our own counters: the end-of-run report
//! of `kvmscope run`, as text or JSON.

use std::fmt::Write as _;
use std::time::Duration;

use kvm_stats::{Mapped, Sample, StatType, StatsFd};

use crate::backend::Backend;
use crate::protocol::guest::CommandResultReply;
use crate::units::format_bytes;
use crate::vcpu::{CommandResult, Outcome, Registers};

/// One vCPU's part of the summary.
#[derive(Debug, Clone)]
pub struct VcpuSummary {
    /// The vCPU's index.
    pub index: usize,
    /// How its run ended (`None`: it did not report).
    pub outcome: Option<Outcome>,
    /// Growth of each cumulative KVM stat that moved, plus `exits`, by name.
    pub kvm: Vec<(String, u64)>,
    /// Our own counters (see `ExitCounters::to_json`).
    pub ours: serde_json::Value,
    /// Results of the commands it ran, in order.
    pub results: Vec<CommandResult>,
    /// The command it was running when the run stopped (sequence number and
    /// spec): it has no result.
    pub interrupted: Option<(u64, String)>,
    /// Commands queued that never started.
    pub not_started: usize,
}

/// The report of a run.
#[derive(Debug, Clone)]
pub struct Summary {
    /// The KVM backend that ran the guest.
    pub(crate) backend: Backend,
    /// Guest RAM, bytes.
    pub(crate) memory: u64,
    /// Whether guest RAM asked for transparent huge pages.
    pub(crate) hugepages: bool,
    /// Wall time of the run, from the vCPUs' start (the start-up before
    /// it is in the two figures below, which count from process start).
    pub(crate) elapsed: Duration,
    /// From process start to the first guest port write (the guest's first instruction is earlier still).
    pub(crate) to_first_exit: Option<Duration>,
    /// From process start to the first command completed.
    pub(crate) to_first_done: Option<Duration>,
    /// Mapped guest memory before the vCPUs started.
    pub before: Mapped,
    /// Mapped guest memory at the end.
    pub after: Mapped,
    /// Each vCPU's part.
    pub vcpus: Vec<VcpuSummary>,
    /// A termination signal ended the run.
    pub(crate) signal: Option<i32>,
    /// A control-socket client's `quit` ended the run.
    pub(crate) quit: bool,
    /// The guest had migrated to a destination (postmigrate): what its
    /// vCPUs were running goes on there.
    pub(crate) migrated: bool,
    /// vCPUs that did not stop in time.
    pub stuck: Vec<usize>,
    /// What went wrong besides the guest (e.g. the sampler's export failed).
    pub warnings: Vec<String>,
    /// The guest did not check in within the boot deadline.
    pub boot_timeout: Option<BootTimeout>,
}

/// A guest that did not check in (its first port write) within the deadline.
#[derive(Debug, Clone)]
pub struct BootTimeout {
    /// The deadline that passed.
    pub limit: Duration,
    /// The vCPUs that had not checked in, with their registers when their
    /// thread stopped (`None` if it did not stop in time to read them).
    pub vcpus: Vec<(usize, Option<Registers>)>,
}

impl BootTimeout {
    /// `the guest did not check in within 5 s: vCPU 0 (rip=… …)`, one line per vCPU.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "the guest did not check in within {} s (no first port write)",
            self.limit.as_secs_f64()
        );
        for (i, registers) in &self.vcpus {
            match registers {
                Some(r) => {
                    let _ = write!(s, "\n  vCPU {i} registers: {r}");
                }
                None => {
                    let _ = write!(
                        s,
                        "\n  vCPU {i}: registers not read (its thread did not stop)"
                    );
                }
            }
        }
        s
    }

    fn to_json(&self) -> serde_json::Value {
        let vcpus: Vec<_> = self
            .vcpus
            .iter()
            .map(|(i, r)| serde_json::json!({"index": i, "registers": r.map(|r| r.to_string())}))
            .collect();
        serde_json::json!({"limit_s": self.limit.as_secs_f64(), "vcpus": vcpus})
    }
}

/// Cumulative KVM stats that grew between two samples (`exits` always listed).
pub(crate) fn kvm_growth(stats: &StatsFd, before: &Sample, after: &Sample) -> Vec<(String, u64)> {
    stats
        .schema()
        .iter()
        .filter(|(_, d)| d.kind == StatType::Cumulative && d.size == 1)
        .map(|(id, d)| (d.name.clone(), after.u64(id).saturating_sub(before.u64(id))))
        .filter(|(name, delta)| *delta > 0 || name == "exits")
        .collect()
}

/// A short description of how a vCPU ended.
pub(crate) fn describe_outcome(o: Option<&Outcome>) -> String {
    match o {
        None => "still running".into(),
        Some(Outcome::Stopped) => "stopped".into(),
        Some(Outcome::GuestPanic { message, registers }) => {
            format!("guest panic: {message}\n      registers: {registers}")
        }
        Some(Outcome::Fault { fault, registers }) => {
            format!("guest fault: {fault}\n      registers: {registers}")
        }
        Some(Outcome::Error(e)) => format!("VMM error: {}", crate::error_chain(e)),
    }
}

impl Summary {
    /// The first vCPU failure, as an error message naming the vCPU.
    pub fn failure(&self) -> Option<String> {
        self.vcpus.iter().find_map(|v| match &v.outcome {
            Some(Outcome::Stopped) | None => None,
            o => Some(format!(
                "vCPU {}: {}",
                v.index,
                describe_outcome(o.as_ref())
            )),
        })
    }

    /// The summary for people.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "kvmscope run: {} vCPU(s), {} guest RAM{}, backend {}",
            self.vcpus.len(),
            format_bytes(self.memory),
            if self.hugepages { " (huge pages)" } else { "" },
            self.backend.describe()
        );
        let us = |d: Option<Duration>| {
            d.map_or("-".into(), |d| format!("{:.2} ms", d.as_secs_f64() * 1e3))
        };
        let _ = writeln!(
            s,
            "time: {:.3} s run (from the vCPUs' start); from process start, {} to the first guest exit, {} to the first command done",
            self.elapsed.as_secs_f64(),
            us(self.to_first_exit),
            us(self.to_first_done)
        );
        let m = |m: &Mapped| {
            format!(
                "4k={} 2m={} 1g={} ({})",
                m.pages_4k,
                m.pages_2m,
                m.pages_1g,
                format_bytes(m.bytes())
            )
        };
        let _ = writeln!(
            s,
            "mapped pages: before {}\n              after  {}",
            m(&self.before),
            m(&self.after)
        );
        for v in &self.vcpus {
            let _ = writeln!(
                s,
                "vcpu{}: {}",
                v.index,
                describe_outcome(v.outcome.as_ref())
            );
            let kvm: Vec<String> = v.kvm.iter().map(|(n, d)| format!("{n}={d}")).collect();
            let _ = writeln!(s, "  kvm stats (growth): {}", kvm.join(" "));
            let ours: Vec<String> = ["reasons", "devices"]
                .iter()
                .flat_map(|k| v.ours[k].as_object().into_iter().flatten())
                .filter(|(_, n)| n.as_u64() != Some(0))
                .map(|(k, n)| format!("{k}={n}"))
                .collect();
            let _ = writeln!(
                s,
                "  our exit counters: total={} {}",
                v.ours["total"],
                ours.join(" ")
            );
            for r in &v.results {
                let command = command_of(r);
                let _ = writeln!(
                    s,
                    "  #{:<3} {:<48} {:<4} {} in {:.2} ms{}",
                    r.seq,
                    r.command,
                    r.status,
                    labelled(r, command.as_ref()),
                    r.host_time.as_secs_f64() * 1e3,
                    command
                        .as_ref()
                        .and_then(|c| short_of_rate(r, c))
                        .unwrap_or_default()
                );
            }
            if let Some((seq, command)) = &v.interrupted {
                let why = match self.migrated {
                    true => "migrated: it goes on at the destination",
                    false => "interrupted: the run stopped",
                };
                let _ = writeln!(s, "  #{seq:<3} {command:<48} {why}");
            }
            if v.not_started > 0 {
                let _ = writeln!(s, "  {} queued command(s) not started", v.not_started);
            }
        }
        if self.migrated {
            let _ = writeln!(s, "the guest migrated to its destination (postmigrate)");
        }
        if let Some(sig) = self.signal {
            let _ = writeln!(s, "stopped by signal {sig}");
        }
        if self.quit {
            let _ = writeln!(s, "stopped by quit (a control-socket client)");
        }
        if !self.stuck.is_empty() {
            let _ = writeln!(s, "vCPUs that did not stop in time: {:?}", self.stuck);
        }
        if let Some(b) = &self.boot_timeout {
            let _ = writeln!(s, "{}", b.describe());
        }
        s
    }

    /// The summary as JSON.
    pub fn to_json(&self) -> serde_json::Value {
        let ms = |d: Option<Duration>| d.map(|d| d.as_secs_f64() * 1e3);
        let vcpus: Vec<_> = self
            .vcpus
            .iter()
            .map(|v| {
                let kvm: serde_json::Map<_, _> = v
                    .kvm
                    .iter()
                    .map(|(n, d)| (n.clone(), (*d).into()))
                    .collect();
                let results: Vec<_> = v.results.iter().map(result_json).collect();
                serde_json::json!({
                    "index": v.index, "outcome": describe_outcome(v.outcome.as_ref()),
                    "failed": !matches!(v.outcome, Some(Outcome::Stopped)),
                    "kvm": kvm, "ours": v.ours, "commands": results,
                    "interrupted": v.interrupted.as_ref().map(|(seq, command)| serde_json::json!({"seq": seq, "command": command})),
                    "not_started": v.not_started,
                })
            })
            .collect();
        serde_json::json!({
            "backend": self.backend.to_json(), "memory": self.memory, "hugepages": self.hugepages,
            "elapsed_s": self.elapsed.as_secs_f64(),
            "startup_ms": { "to_first_exit": ms(self.to_first_exit), "to_first_command_done": ms(self.to_first_done) },
            "mapped": { "before": self.before.to_json(), "after": self.after.to_json() },
            "vcpus": vcpus, "signal": self.signal, "quit": self.quit, "migrated": self.migrated, "stuck": self.stuck, "warnings": self.warnings,
            "boot_timeout": self.boot_timeout.as_ref().map(BootTimeout::to_json),
        })
    }
}

/// One command result as JSON.
pub(crate) fn result_json(r: &CommandResult) -> serde_json::Value {
    serde_json::to_value(result_reply(r)).unwrap_or_default()
}

/// A command result as the protocol carries it.
pub(crate) fn result_reply(r: &CommandResult) -> CommandResultReply {
    CommandResultReply {
        seq: r.seq,
        command: r.command.clone(),
        status: r.status.clone(),
        values: r.values,
        host_time_s: r.host_time.as_secs_f64(),
    }
}

/// The command a result is for, read back from its spec.
fn command_of(r: &crate::vcpu::CommandResult) -> Option<crate::workload::Command> {
    let mut commands = crate::workload::parse_sequence(&r.command).ok()?;
    (commands.len() == 1).then(|| commands.remove(0))
}

/// A result's three words under their names for its command
/// ([`Command::result_names`](crate::workload::Command::result_names)),
/// `values=[...]` for one without names.
fn labelled(r: &crate::vcpu::CommandResult, command: Option<&crate::workload::Command>) -> String {
    match command.and_then(crate::workload::Command::result_names) {
        Some(names) => names
            .iter()
            .zip(r.values)
            .filter(|(n, _)| !n.is_empty())
            .map(|(n, v)| format!("{n}={v}"))
            .collect::<Vec<_>>()
            .join(" "),
        None => format!("values={:?}", r.values),
    }
}

/// For a paced `dirty` that wrote well under its rate (a vCPU that got too
/// little of a busy host's CPU): what it wrote per second against what was
/// asked, as a note after its line.
fn short_of_rate(
    r: &crate::vcpu::CommandResult,
    command: &crate::workload::Command,
) -> Option<String> {
    let crate::workload::Command::Dirty { rate, .. } = command else {
        return None;
    };
    let secs = r.host_time.as_secs_f64();
    let done = r.values[0] as f64 / secs;
    (r.status == "ok" && *rate > 0 && secs > 0.0 && done < 0.9 * *rate as f64).then(|| {
        format!(
            " (wrote {done:.0} pages/s of the {rate}/s asked: the vCPU got too little CPU, was paused meanwhile (a pause, a migration), or ran its command in pieces)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vcpu::CommandResult;

    fn result(command: &str, values: [u64; 3], ms: u64) -> CommandResult {
        CommandResult {
            seq: 1,
            command: command.into(),
            status: "ok".into(),
            values,
            host_time: Duration::from_millis(ms),
        }
    }

    #[test]
    fn a_results_words_are_named_for_its_command() {
        let dirty = result(
            "dirty offset=0 ws=4194304 rate=2000/s for=1s seed=1",
            [2000, 9, 650],
            1000,
        );
        let label = |r: &CommandResult| labelled(r, command_of(r).as_ref());
        assert_eq!(label(&dirty), "writes=2000 ticks=9 distinct=650");
        let touch = result("touch offset=0 size=4096", [1, 5, 0], 1);
        assert_eq!(label(&touch), "pages=1 ticks=5");
        let wait = result("wait for=1s", [0, 0, 0], 1000);
        assert_eq!(label(&wait), "values=[0, 0, 0]");
    }

    #[test]
    fn a_paced_writer_well_under_its_rate_is_said_to_be() {
        let short_of_rate = |r: &CommandResult| short_of_rate(r, &command_of(r).unwrap());
        let short = result(
            "dirty offset=0 ws=16777216 rate=2000/s for=2s seed=1",
            [72, 9, 72],
            2000,
        );
        let note = short_of_rate(&short).expect("72 writes in 2 s of 2000/s");
        assert!(
            note.contains("wrote 36 pages/s of the 2000/s asked"),
            "{note}"
        );
        let paced = result(
            "dirty offset=0 ws=16777216 rate=2000/s for=2s seed=1",
            [3990, 9, 3000],
            2000,
        );
        assert_eq!(short_of_rate(&paced), None);
        let max = result(
            "dirty offset=0 ws=16777216 rate=max for=2s seed=1",
            [5, 9, 5],
            2000,
        );
        assert_eq!(short_of_rate(&max), None, "max asks for no rate");
    }
}
