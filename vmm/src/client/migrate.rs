//! `kvmscope migrate`: sets the migration parameters, starts `migrate` on a
//! running VMM, shows its progress (a bar on a terminal) and ends with a
//! report shaped like QEMU's `info migrate`, or the final `query-migrate`
//! as JSON. A stop request (`MigrateConfig::stop`: the binary's SIGINT or
//! SIGTERM) cancels the migration and reports it.

use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Duration;

use super::predict::Predicted;
use super::{Client, Error};
use crate::protocol::migration::{
    Capability, MigrationInfo, Parameters, SetParameters, Status, VcpuSet,
};
use crate::protocol::reply::RunState;

/// `kvmscope migrate --converge`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Converge {
    /// The intervention the prediction says is needed, from the start (none
    /// if it converges as it is): on a ring VM the dirty limit per vCPU
    /// that converges at the least vCPU time taken from the guest
    /// (`dirty-limit`, `vcpu-dirty-limit`, `x-vcpu-dirty-limit-at-start`),
    /// which slows only the vCPUs that dirty faster; otherwise the smallest auto-converge throttle
    /// (`cpu-throttle-initial`, `x-cpu-throttle-at-start`) of the vCPUs that
    /// write (`x-cpu-throttle-vcpus`), stepping up from there by QEMU's
    /// 10 % if the guest still dirties too fast.
    Auto,
    /// QEMU's auto-converge: blind steps, QEMU's (20 %, then +10 %; a
    /// `cpu-throttle-initial` or `-increment` set before is replaced).
    AutoConverge,
    /// QEMU's dirty-limit: every vCPU limited to `vcpu-dirty-limit` once the
    /// guest dirties too fast (a ring VM only).
    DirtyLimit,
    /// No throttle.
    Off,
}

/// `downtime-limit` where nobody set one (QEMU's default too).
pub const DEFAULT_MAX_DOWNTIME: Duration =
    Duration::from_millis(Parameters::DEFAULT_DOWNTIME_LIMIT_MS);

/// How often the progress is polled.
const POLL: Duration = Duration::from_millis(100);

/// The most any request but a readiness one may take before this client
/// gives up on a VMM that does not answer (they are answered at once).
const REQUEST_LIMIT: Duration = Duration::from_secs(30);

/// How the caller hears of a request to stop (the binary: SIGINT/SIGTERM/SIGHUP,
/// through `signals`, a layer above this one).
#[derive(Debug, Clone, Copy)]
pub struct Stop {
    /// The signal taken, if one was.
    pub pending: fn() -> Option<i32>,
    /// Whether the next one should end the process at once, saying
    /// `Some(why)`, or be left for `pending` to tell (`None`).
    pub exit_on_next: fn(Option<&'static str>),
    /// Whether one that comes while an earlier one is pending should end
    /// the process at once, saying `Some(why)`.
    pub exit_on_second: fn(Option<&'static str>),
}

/// What the client says as a second signal ends it once its migration ran.
const ENDS_WITHOUT_WAITING: &str =
    "this client ends without waiting for the migration's end (query-migrate on the source tells it)";

/// What `kvmscope migrate` does.
#[derive(Debug, Clone)]
pub struct MigrateConfig {
    /// The source VMM's control socket.
    pub socket: PathBuf,
    /// `unix:PATH` or `tcp:HOST:PORT` of a `kvmscope run --incoming`.
    pub to: String,
    /// `max-bandwidth`, bytes per second (0: unlimited); `None` leaves the
    /// VMM's (the CLI always gives one: a command line says the whole
    /// migration).
    pub bandwidth: Option<u64>,
    /// `downtime-limit`; `None` leaves the VMM's.
    pub max_downtime: Option<Duration>,
    /// `x-max-rounds` (0: no limit); `None` leaves the VMM's.
    pub max_rounds: Option<u64>,
    /// Ask `query-readiness` first, and set the prediction against the outcome.
    pub predict: bool,
    /// How to make a migration that would not converge converge; `None`
    /// leaves the VMM's capabilities as they are.
    pub converge: Option<Converge>,
    /// Print the final `query-migrate` (and prediction) as JSON instead of text.
    pub json: bool,
    /// Where a stop request comes from: it cancels the migration once
    /// started; `None`, nothing stops it but its end.
    pub stop: Option<Stop>,
}

/// Runs the migration to its end. Returns whether it completed.
///
/// # Errors
/// A transport failure, or the VMM's error reply as `Remote`.
pub fn migrate(config: &MigrateConfig, out: &mut dyn Write) -> Result<bool, Error> {
    // Nothing to undo until the migration starts: a stop ends the client.
    if let Some(stop) = config.stop {
        (stop.exit_on_next)(Some("no migration was started"));
    }
    let mut client = Client::connect(&config.socket)?;
    // Each request bounded: a VMM that negotiates and goes silent held
    // this client for ever (a readiness request gets its own, longer one).
    client.bound_each_request(REQUEST_LIMIT);
    can_start(&mut client)?;
    client.migrate_set_parameters(SetParameters {
        max_bandwidth: config.bandwidth,
        downtime_limit: config.max_downtime.map(crate::units::millis),
        x_max_rounds: config.max_rounds,
        ..SetParameters::default()
    })?;
    let params = client.query_migrate_parameters()?;
    let limit = params.downtime_limit;
    let mut predicted = if config.predict || config.converge == Some(Converge::Auto) {
        Some(predict_first(
            &mut client,
            &params,
            config.json || !config.predict,
            out,
        )?)
    } else {
        None
    };
    let mut converged = None;
    // The prediction is of the migration with no throttle, while one may set in.
    let mut unthrottled = config.converge.is_some_and(|how| how != Converge::Off);
    if let Some(how) = config.converge {
        let (throttled, set) = converge(&mut client, how, predicted.as_ref(), config.json, out)?;
        converged = Some(set);
        if let (Some(p), Some(t)) = (predicted.as_mut(), throttled) {
            // The migration that runs is the throttled one: its prediction is the one to check.
            let text = std::mem::take(&mut p.text);
            *p = Predicted { text, ..t };
            unthrottled = false;
        }
    }
    if !config.predict {
        predicted = None;
    }
    // From here a signal is the migration's to answer: cancel it. A second
    // ends the client even while the VMM keeps it from hearing the first (a
    // request that waits on a VMM that does not answer).
    if let Some(stop) = config.stop {
        (stop.exit_on_next)(None);
        (stop.exit_on_second)(Some(ENDS_WITHOUT_WAITING));
    }
    let pending = || config.stop.and_then(|s| (s.pending)());
    if let Some(sig) = pending() {
        crate::say!("kvmscope migrate: signal {sig} before the migration began: none started");
        return Ok(false);
    }
    client.migrate(&config.to)?;
    let bar = std::io::stderr().is_terminal().then(progress_bar);
    // Without a terminal (a log), a line per pass and per status instead.
    let mut logged = None;
    let mut cancelled = false;
    let info = loop {
        let info = client.query_migrate()?;
        match &bar {
            Some(bar) => show(bar, &info, predicted.as_ref()),
            None => {
                let now = (info.status, info.ram.as_ref().map(|r| r.dirty_sync_count));
                if logged != Some(now) {
                    crate::say!("{}", pass_line(&info));
                    logged = Some(now);
                }
            }
        }
        if info.status.is_none_or(Status::is_final) {
            break info;
        }
        // A signal (Ctrl-C) cancels the migration, as `virsh migrate` does:
        // left running, it would go on costing the guest its tracking with
        // nobody watching. The report then says `cancelled`.
        // Not once the guest is stopped and its last pages go: a cancel then
        // could end the source's side before the destination's answer came
        // (the source runs its guest on, and so could the destination).
        let stopping = info.status == Some(Status::Device);
        if let Some(sig) = pending().filter(|_| !cancelled) {
            let said = if stopping {
                format!("kvmscope migrate: signal {sig}: too late to cancel (the guest is stopped and its last pages are going); a second signal ends this client, not the migration")
            } else {
                format!("kvmscope migrate: signal {sig}: cancelling the migration; a second signal ends this client")
            };
            match &bar {
                Some(bar) => bar.suspend(|| crate::say!("{said}")),
                None => crate::say!("{said}"),
            }
            if !stopping {
                client.execute("migrate_cancel", serde_json::json!({}))?;
            }
            cancelled = true;
            // A VMM that never answers cannot hold the client past a second one.
            if let Some(stop) = config.stop {
                (stop.exit_on_next)(Some(ENDS_WITHOUT_WAITING));
            }
        }
        std::thread::sleep(POLL);
    };
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    if config.json {
        let mut v = serde_json::to_value(&info).map_err(|e| Error::BadReply(e.to_string()))?;
        if let Some(p) = &predicted {
            v["x-predicted"] = super::predict::to_json(p, &info, limit);
        }
        if let Some(set) = converged {
            v["x-converge"] = set;
        }
        writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&v).unwrap_or_default()
        )?;
    } else {
        write!(out, "{}", info_migrate(&info))?;
        if let Some(p) = &predicted {
            write!(out, "{}", super::predict::table(p, &info, limit))?;
            // `x-cpu-throttled` comes once a throttle or limit was set.
            if unthrottled && info.x_cpu_throttled.is_some() {
                writeln!(out, "  (predicted without a throttle; this migration was throttled as it went (auto-converge or dirty-limit stepping in blindly), which the model does not predict: the rows say what the throttle changed, not how right the model was)")?;
            }
        }
    }
    Ok(info.status == Some(Status::Completed))
}

/// Refuses what the VMM would refuse to start (`migrate`'s own checks)
/// before anything is set: a bandwidth or throttle changed for a migration
/// that never starts stays changed, and one that is running would take it.
fn can_start(client: &mut Client) -> Result<(), Error> {
    // The run state first: a destination's incoming migration is `setup`
    // or `active` too, and is no migration of its own.
    match client.query_status()?.status {
        RunState::Postmigrate => {
            return Err(Error::CannotMigrate(
                "the guest has migrated away (postmigrate)".into(),
            ))
        }
        RunState::Inmigrate => {
            return Err(Error::CannotMigrate(
                "it is a migration destination whose guest has not arrived (inmigrate)".into(),
            ))
        }
        _ => {}
    }
    match client.query_migrate()?.status.filter(|s| !s.is_final()) {
        Some(s) => Err(Error::CannotMigrate(format!(
            "a migration is already {}",
            s.name()
        ))),
        None => Ok(()),
    }
}

/// What `--converge` sets: the capabilities, the parameters, and the
/// prediction of the throttled migration when the plan comes from one.
struct Plan {
    auto_converge: bool,
    dirty_limit: bool,
    parameters: SetParameters,
    predicted: Option<Predicted>,
    said: Option<String>,
}

impl Plan {
    fn of(how: Converge, predicted: Option<&Predicted>) -> Plan {
        // Every vCPU, and nothing from the start, unless the model's plan
        // says otherwise: what an earlier `--converge auto` set does not
        // carry over.
        let neither_at_start = SetParameters {
            x_cpu_throttle_at_start: Some(false),
            x_cpu_throttle_vcpus: Some(VcpuSet::default()),
            x_vcpu_dirty_limit_at_start: Some(false),
            x_vcpu_dirty_limit_vcpus: Some(VcpuSet::default()),
            ..SetParameters::default()
        };
        // Auto-converge on: QEMU's steps (20 %, then +10 %), which the
        // model's plan starts from its own throttle.
        let qemu = Parameters::default();
        let plan = |auto_converge, dirty_limit| Plan {
            auto_converge,
            dirty_limit,
            parameters: if auto_converge {
                SetParameters {
                    cpu_throttle_initial: Some(qemu.cpu_throttle_initial),
                    cpu_throttle_increment: Some(qemu.cpu_throttle_increment),
                    ..neither_at_start
                }
            } else {
                neither_at_start
            },
            predicted: None,
            said: None,
        };
        if how != Converge::Auto {
            return plan(how == Converge::AutoConverge, how == Converge::DirtyLimit);
        }
        let Some(p) = predicted else {
            return plan(true, false);
        };
        if let Some((mb, vcpus, limited)) = &p.dirty_limit {
            // A list the VMM could not have sent: every vCPU.
            let set = VcpuSet::try_from(vcpus.clone()).unwrap_or_default();
            return Plan {
                parameters: SetParameters {
                    vcpu_dirty_limit: Some(*mb),
                    x_vcpu_dirty_limit_at_start: Some(true),
                    x_vcpu_dirty_limit_vcpus: Some(set),
                    ..neither_at_start
                },
                predicted: Some((**limited).clone()),
                said: Some(format!("a dirty limit of {mb} MB/s from the start on {set}, the vCPUs that dirty faster; the others are not limited (of the dirty limits the model finds converging, the one that takes the least vCPU time from the guest)")),
                ..plan(false, true)
            };
        }
        if let Some((pct, vcpus, throttled)) = &p.converge {
            // A list the VMM could not have sent: every vCPU.
            let set = VcpuSet::try_from(vcpus.clone()).unwrap_or_default();
            return Plan {
                parameters: SetParameters {
                    cpu_throttle_initial: Some(*pct),
                    cpu_throttle_increment: Some(qemu.cpu_throttle_increment),
                    x_cpu_throttle_at_start: Some(true),
                    x_cpu_throttle_vcpus: Some(set),
                    ..neither_at_start
                },
                predicted: Some((**throttled).clone()),
                said: Some(format!("auto-converge at {pct} % from the start on {set} (the smallest throttle the model finds converging without auto-converge stepping further, on the vCPUs its window saw write; it takes their dirtying to be bound by their CPU: a guest that paces its writes keeps its rate until the throttle leaves it less time than it needs, and the migration then takes longer than predicted, docs/MIGRATION.md)")),
                ..plan(true, false)
            };
        }
        if p.converges {
            return Plan {
                said: Some("no throttle needed (it converges as it is)".into()),
                ..plan(false, false)
            };
        }
        Plan {
            said: Some("no throttle up to 99 % makes it converge; auto-converge steps every vCPU from QEMU's 20 %, as QEMU does".into()),
            ..plan(true, false)
        }
    }
}

/// `--converge`: sets the capabilities and parameters the plan says; the
/// throttled prediction when one was set, and what was set (`--json`'s
/// `x-converge`: the throttle or limit it started with, to set against the
/// one the migration ends with).
fn converge(
    client: &mut Client,
    how: Converge,
    predicted: Option<&Predicted>,
    json: bool,
    out: &mut dyn Write,
) -> Result<(Option<Predicted>, serde_json::Value), Error> {
    let plan = Plan::of(how, predicted);
    if let Some(said) = plan.said.as_ref().filter(|_| !json) {
        writeln!(out, "--converge auto: {said}")?;
    }
    let set = serde_json::json!({
        "capabilities": {"auto-converge": plan.auto_converge, "dirty-limit": plan.dirty_limit},
        "parameters": plan.parameters,
        "said": plan.said,
    });
    client.migrate_set_parameters(plan.parameters)?;
    // Both in one request: the VMM refuses them on together.
    client.migrate_set_capabilities(&[
        (Capability::AutoConverge, plan.auto_converge),
        (Capability::DirtyLimit, plan.dirty_limit),
    ])?;
    Ok((plan.predicted, set))
}

/// `--predict`: the readiness prediction for the link just set (its
/// `max-bandwidth`, 0 unlimited), printed unless the output is JSON.
fn predict_first(
    client: &mut Client,
    params: &Parameters,
    json: bool,
    out: &mut dyn Write,
) -> Result<super::predict::Predicted, Error> {
    let memory = client.greeting.qmp.kvmscope.vm.memory;
    client.bound_each_request(super::readiness::request_limit(memory, None, true));
    let predicted = super::predict::ask(client, params.max_bandwidth);
    client.bound_each_request(REQUEST_LIMIT);
    let predicted = predicted?;
    if !json {
        write!(out, "{}", predicted.text)?;
        out.flush()?;
    }
    Ok(predicted)
}

/// The bar: how much of guest RAM the destination has as it is now (RAM
/// less what is left to send: it falls back at each pass by what the guest
/// dirtied during the last), until the first pass has begun only the status.
fn progress_bar() -> indicatif::ProgressBar {
    // Length 0 until the first pass gives RAM's size.
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(waiting_style());
    bar
}

fn waiting_style() -> indicatif::ProgressStyle {
    indicatif::ProgressStyle::with_template("{prefix:>9} {msg}")
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner())
}

fn passes_style() -> indicatif::ProgressStyle {
    indicatif::ProgressStyle::with_template(
        "{prefix:>9} [{bar:30}] {bytes}/{total_bytes} of RAM up to date {msg}",
    )
    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
    .progress_chars("=> ")
}

/// One line for a log: the status, and the pass with its figures once there is one.
fn pass_line(info: &MigrationInfo) -> String {
    let status = info.status.map_or("none", Status::name);
    let Some(r) = &info.ram else {
        return format!("kvmscope migrate: {status}");
    };
    format!(
        "kvmscope migrate: {status}, pass {}: {} on the wire, {} left to send, {:.0} Mbit/s{}",
        r.dirty_sync_count,
        indicatif::HumanBytes(r.transferred),
        indicatif::HumanBytes(r.remaining),
        r.mbps,
        info.x_not_converging.as_ref().map_or(String::new(), |n| {
            format!(
                "; not converging: {}",
                crate::units::peer_text(n.as_bytes(), 500)
            )
        }),
    )
}

fn show(
    bar: &indicatif::ProgressBar,
    info: &MigrationInfo,
    predicted: Option<&super::predict::Predicted>,
) {
    let status = info.status.map_or("none", Status::name);
    bar.set_prefix(status);
    let Some(r) = &info.ram else {
        bar.set_message("(no pass begun yet)");
        return;
    };
    if bar.length() == Some(0) {
        bar.set_style(passes_style());
    }
    bar.set_length(r.total.max(1));
    bar.set_position(r.total.saturating_sub(r.remaining));
    let of = |p: &super::predict::Predicted| {
        format!(
            " (predicted {} passes, {})",
            p.dirty_sync_count,
            indicatif::HumanBytes(p.transferred)
        )
    };
    bar.set_message(format!(
        "| pass {} | {} on the wire{} | {:.0} Mbit/s{}",
        r.dirty_sync_count,
        indicatif::HumanBytes(r.transferred),
        predicted.map_or(String::new(), of),
        r.mbps,
        info.x_not_converging
            .as_ref()
            .map_or(String::new(), |_| " | not converging".into()),
    ));
}

/// The report, shaped like QEMU's `info migrate` (sizes in kbytes).
pub(crate) fn info_migrate(info: &MigrationInfo) -> String {
    let mut s = String::new();
    let status = info.status.map_or("none", Status::name);
    let _ = writeln!(s, "Migration status: {status}");
    let ms = |name: &str, v: Option<u64>, s: &mut String| {
        if let Some(v) = v {
            let _ = writeln!(s, "{name}: {v} ms");
        }
    };
    ms("total time", info.total_time, &mut s);
    ms("expected downtime", info.expected_downtime, &mut s);
    ms("downtime", info.downtime, &mut s);
    ms("setup", info.setup_time, &mut s);
    if let Some(r) = &info.ram {
        let kb = |b: u64| b / 1024;
        let lines = [
            ("transferred ram", format!("{} kbytes", kb(r.transferred))),
            ("throughput", format!("{:.2} mbps", r.mbps)),
            ("remaining ram", format!("{} kbytes", kb(r.remaining))),
            ("total ram", format!("{} kbytes", kb(r.total))),
            ("duplicate", format!("{} pages", r.duplicate)),
            ("normal", format!("{} pages", r.normal)),
            ("normal bytes", format!("{} kbytes", kb(r.normal_bytes))),
            ("dirty sync count", r.dirty_sync_count.to_string()),
            ("page size", format!("{} kbytes", kb(r.page_size))),
            ("dirty pages rate", format!("{} pages", r.dirty_pages_rate)),
            ("precopy ram", format!("{} kbytes", kb(r.precopy_bytes))),
            ("downtime ram", format!("{} kbytes", kb(r.downtime_bytes))),
        ];
        for (name, v) in lines {
            let _ = writeln!(s, "{name}: {v}");
        }
    }
    // The VMM's words, shown on the user's terminal.
    if let Some(e) = &info.error_desc {
        let _ = writeln!(s, "error: {}", crate::units::peer_text(e.as_bytes(), 1000));
    }
    if let Some(n) = &info.x_not_converging {
        let _ = writeln!(
            s,
            "not converging: {}",
            crate::units::peer_text(n.as_bytes(), 500)
        );
    }
    let per_vcpu = |s: &mut String, what: &str, g: &crate::protocol::migration::GuestStall| {
        let per: Vec<String> = g.vcpus.iter().map(|v| format!("{:.0}", v.ms)).collect();
        let _ = writeln!(
            s,
            "{what}: {:.0} ms (per vCPU ms: {}){}",
            g.total_ms,
            per.join(", "),
            crate::protocol::migration::waited_note(g.waited_ms)
        );
    };
    if let Some(g) = &info.x_guest_stall {
        per_vcpu(&mut s, "guest stall (dirty tracking)", g);
    }
    if let Some(p) = info.cpu_throttle_percentage {
        let _ = writeln!(s, "cpu throttle percentage: {p}");
    }
    // QEMU's microseconds, with seconds beside them: at a limit of a few
    // MB/s a ring of 65,536 pages takes minutes.
    let secs = |us: u64| us as f64 / 1e6;
    if let Some(t) = info.dirty_limit_throttle_time_per_round {
        let said = if t == 0 {
            "no vCPU slept for its limit over its last period, or none has ended yet".to_string()
        } else {
            format!("{:.1} s", secs(t))
        };
        let _ = writeln!(
            s,
            "dirty-limit throttle time per round: {t} us ({said}; QEMU's figure: the longest any vCPU slept per ring's worth of pages it dirtied over its last period, not time the guest lost: that is the vCPU time throttled below)",
        );
    }
    if let Some(t) = info.dirty_limit_ring_full_time {
        let _ = writeln!(
            s,
            "dirty-limit ring full time: {t} us ({:.1} s; QEMU's figure: how long a ring would take to fill at the mean dirty rate, an estimate, not time spent)",
            secs(t)
        );
    }
    if let Some(g) = &info.x_cpu_throttled {
        per_vcpu(&mut s, "vCPU time throttled", g);
    }
    if let Some(g) = &info.x_guest_progress {
        let per: Vec<String> = g.vcpus.iter().map(progress_line).collect();
        let _ = writeln!(
            s,
            "guest progress (units/s, its own count): {}",
            per.join("; ")
        );
    }
    s
}

/// One vCPU's progress: `vCPU 1 3003/s of 3100/s before (96.9 %)`.
fn progress_line(v: &crate::protocol::migration::VcpuProgress) -> String {
    let mut line = format!("vCPU {} {:.0}/s", v.cpu_index, v.per_second);
    if let Some(b) = v.before_per_second {
        let _ = write!(line, " of {b:.0}/s before");
    }
    if let Some(pct) = v.percent_of_before() {
        let _ = write!(line, " ({pct:.1} %)");
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::migration::{
        GuestProgress, GuestStall, RamStats, VcpuProgress, VcpuStall,
    };

    #[test]
    fn the_report_reads_like_info_migrate() {
        let info = MigrationInfo {
            status: Some(Status::Completed),
            total_time: Some(120),
            downtime: Some(3),
            ram: Some(RamStats {
                transferred: 37 << 20,
                normal: 283,
                duplicate: 4_198_330,
                page_size: 4096,
                ..RamStats::default()
            }),
            x_guest_stall: Some(GuestStall {
                total_ms: 52.0,
                waited_ms: Some(20.0),
                vcpus: vec![
                    VcpuStall {
                        cpu_index: 0,
                        ms: 40.0,
                        waited_ms: Some(8.0),
                    },
                    VcpuStall {
                        cpu_index: 1,
                        ms: 12.0,
                        waited_ms: Some(12.0),
                    },
                ],
            }),
            cpu_throttle_percentage: Some(40),
            x_cpu_throttled: Some(GuestStall {
                total_ms: 300.0,
                waited_ms: None,
                vcpus: vec![VcpuStall {
                    cpu_index: 0,
                    ms: 300.0,
                    waited_ms: None,
                }],
            }),
            x_guest_progress: Some(GuestProgress {
                vcpus: vec![
                    VcpuProgress {
                        cpu_index: 0,
                        units: 900,
                        per_second: 450.0,
                        before_per_second: Some(900.0),
                    },
                    VcpuProgress {
                        cpu_index: 1,
                        units: 10,
                        per_second: 5.0,
                        before_per_second: None,
                    },
                ],
            }),
            ..MigrationInfo::default()
        };
        let text = info_migrate(&info);
        assert!(
            text.contains(
                "cpu throttle percentage: 40\nvCPU time throttled: 300 ms (per vCPU ms: 300)\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("guest stall (dirty tracking): 52 ms (per vCPU ms: 40, 12); of it, 20 ms waiting for a CPU beyond the usual (the host's contention)\n"),
            "{text}"
        );
        assert!(text.contains(
            "guest progress (units/s, its own count): vCPU 0 450/s of 900/s before (50.0 %); vCPU 1 5/s\n"
        ));
        assert!(text.starts_with("Migration status: completed\ntotal time: 120 ms\n"));
        assert!(text.contains("downtime: 3 ms\n"));
        assert!(text.contains("duplicate: 4198330 pages\nnormal: 283 pages\n"));
        assert!(text.contains("transferred ram: 37888 kbytes\n"));
    }
}
