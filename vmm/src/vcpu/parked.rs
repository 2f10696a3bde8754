//! A parked vCPU thread's side of a snapshot: where its command loop stands,
//! turned into the VMM state that travels ([`VmmState`]) on the source, and
//! that state turned back into the loop's position and the shared inbox on
//! the destination. The KVM side is `snapshot`'s; the thread calls both.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use kvm_ioctls::VcpuFd;

use super::shared::{
    map_runs, with_spec_lens, CommandResult, VcpuShared, VcpuState, MAX_QUEUED_COMMANDS,
    RESULTS_KEPT,
};
use super::snapshot::{self, micros, Current, Error, ResultRecord, Site, Snapshot, VmmState};
use crate::workload::SpecError;

/// Where a parked vCPU thread stands, for its snapshot.
#[derive(Clone, Copy)]
pub(super) enum Where {
    Guest,
    NextCommand,
    Wait,
}

/// The command the guest runs: sequence, spec, start time.
pub(super) type Running = (u64, String, Instant);
/// A VMM-side `wait`: sequence, spec, start, deadline.
pub(super) type Waiting = (u64, String, Instant, Option<Instant>);

/// The VMM's state of a vCPU parked at `at`, running `current` or in
/// `waiting`.
pub(super) fn vmm_state(
    at: Where,
    current: Option<&Running>,
    waiting: Option<&Waiting>,
    shared: &VcpuShared,
) -> VmmState {
    let now = Instant::now();
    let (site, current) = match (at, waiting) {
        (Where::Wait, Some((seq, command, started, deadline))) => (
            Site::Wait {
                remaining_us: deadline.map(|d| micros(d.saturating_duration_since(now))),
            },
            Some(Current {
                seq: *seq,
                command: command.clone(),
                elapsed_us: micros(now.saturating_duration_since(*started)),
            }),
        ),
        (Where::Wait | Where::NextCommand, _) => (Site::NextCommand, None),
        (Where::Guest, _) => (
            Site::Guest,
            current.map(|(seq, command, started)| Current {
                seq: *seq,
                command: command.clone(),
                elapsed_us: micros(now.saturating_duration_since(*started)),
            }),
        ),
    };
    let (reasons, devices) = shared.counters.labeled();
    let inbox = shared.lock();
    VmmState {
        site,
        current,
        queue: map_runs(inbox.queue(), |c| Ok::<_, Infallible>(c.to_string()))
            .unwrap_or_else(|e| match e {}),
        next_seq: inbox.next_seq,
        results: inbox
            .results
            .iter()
            .map(|r| ResultRecord {
                seq: r.seq,
                command: r.command.clone(),
                status: r.status.clone(),
                values: r.values,
                host_time_us: micros(r.host_time),
            })
            .collect(),
        phase: shared.phase.load(Ordering::Relaxed),
        booted: shared.first_exit.get().is_some(),
        reasons,
        devices,
    }
}

/// Where a restored vCPU's loop picks up.
pub(super) struct Resumed {
    /// The command the guest was running.
    pub(super) current: Option<Running>,
    /// The `wait` the source's thread was in.
    pub(super) waiting: Option<Waiting>,
    /// Where the source's thread stood.
    pub(super) site: Site,
    /// The MSRs KVM refused.
    pub(super) refused: Vec<u32>,
}

/// Loads a snapshot into a vCPU whose thread has not started (a migration's
/// destination): KVM's state into `fd`, the VMM's into `shared`.
///
/// # Errors
/// A KVM call failed, or a queued command does not parse.
pub(super) fn resume(fd: &VcpuFd, shared: &VcpuShared, s: &Snapshot) -> Result<Resumed, Error> {
    let index = shared.index;
    within_queue_limit(index, &s.vmm.queue)?;
    check_state(&s.vmm).map_err(|why| Error::State(index, why))?;
    // Each run of equal entries parsed and sized once.
    let queue = map_runs(s.vmm.queue.iter(), |spec| {
        crate::workload::parse_sequence(spec)
            .map(with_spec_lens)
            .map_err(|e| Error::Queue(index, (*spec).clone(), e.to_string()))
    })?;
    let refused = snapshot::restore(fd, index, &s.kvm)?;
    let now = Instant::now();
    let started = |c: &Current| {
        now.checked_sub(Duration::from_micros(c.elapsed_us))
            .unwrap_or(now)
    };
    let v = &s.vmm;
    let mut resumed = Resumed {
        current: None,
        waiting: None,
        site: v.site,
        refused,
    };
    match (v.site, &v.current) {
        (Site::Guest, Some(c)) => {
            resumed.current = Some((c.seq, c.command.clone(), started(c)));
        }
        (Site::Wait { remaining_us }, Some(c)) => {
            let deadline = remaining_us.map(|us| now + Duration::from_micros(us));
            resumed.waiting = Some((c.seq, c.command.clone(), started(c), deadline));
        }
        _ => {}
    }
    shared.counters.restore(&v.reasons, &v.devices);
    shared.phase.store(v.phase, Ordering::Relaxed);
    if v.booted {
        let _ = shared.first_exit.set(now);
    }
    let mut inbox = shared.lock();
    inbox.set_queue(queue.into_iter().flatten().collect());
    inbox.next_seq = v.next_seq;
    inbox.results = v
        .results
        .iter()
        .map(|r| CommandResult {
            seq: r.seq,
            command: r.command.clone(),
            status: r.status.clone(),
            values: r.values,
            host_time: Duration::from_micros(r.host_time_us),
        })
        .collect();
    inbox.state = match (v.site, &v.current) {
        (Site::Guest, Some(c)) => VcpuState::Running {
            seq: c.seq,
            command: c.command.clone(),
        },
        (Site::Guest, None) => VcpuState::Booting,
        _ => VcpuState::Waiting,
    };
    Ok(resumed)
}

/// Highest command number a migrated vCPU may go on from, and most exits
/// its counters may hold in all: numbers stay exact in a JSON double, leave
/// room to count on (a counter at 2^64-1 wrapped at its next exit), and no
/// guest comes near them.
const MAX_COUNT: u64 = 1 << 53;

/// The VMM-side values of a migrated vCPU that its source could have sent:
/// results no more than a vCPU keeps, each numbered below the next command's
/// number, which is at most [`MAX_COUNT`], and exit counters whose sum is
/// at most that too.
fn check_state(v: &VmmState) -> Result<(), String> {
    if v.results.len() > RESULTS_KEPT {
        return Err(format!(
            "{} results, over the {RESULTS_KEPT} a vCPU keeps",
            v.results.len()
        ));
    }
    if v.next_seq == 0 || v.next_seq > MAX_COUNT {
        return Err(format!(
            "next command number {} is outside 1..={MAX_COUNT}",
            v.next_seq
        ));
    }
    let numbered = v
        .results
        .iter()
        .map(|r| r.seq)
        .chain(v.current.as_ref().map(|c| c.seq));
    if let Some(seq) = numbered.into_iter().find(|&seq| seq >= v.next_seq) {
        return Err(format!(
            "command {seq} is numbered at or past the next command's number {}",
            v.next_seq
        ));
    }
    let mut counts = v.reasons.iter().chain(&v.devices).map(|(_, n)| *n);
    let sum = counts.try_fold(0u64, u64::checked_add);
    if sum.is_none_or(|sum| sum > MAX_COUNT) {
        return Err(format!("its exit counters add up past {MAX_COUNT}"));
    }
    if let Some(c) = &v.current {
        check_current(v.site, &c.command)?;
    }
    Ok(())
}

/// The command in progress is one command where the vCPU stands: a `wait`
/// in a VMM-side wait, a guest command in the guest (a source sends what
/// it ran; `query-guest` shows it and the result is recorded under it).
fn check_current(site: Site, spec: &str) -> Result<(), String> {
    let shown: String = spec.chars().take(64).collect();
    let one = match crate::workload::parse_sequence(spec) {
        Ok(commands) if commands.len() == 1 => commands.into_iter().next(),
        Ok(commands) => {
            return Err(format!(
                "the command in progress '{shown}' is {} commands, not one",
                commands.len()
            ))
        }
        Err(e) => {
            return Err(format!(
                "the command in progress '{shown}' does not parse: {e}"
            ))
        }
    };
    let waits = matches!(one, Some(crate::workload::Command::Wait { .. }));
    match site {
        Site::Wait { .. } if !waits => Err(format!(
            "a VMM-side wait whose command in progress is '{shown}', not a wait"
        )),
        Site::Guest if waits => Err(format!(
            "the guest runs '{shown}', which the VMM runs, not the guest"
        )),
        _ => Ok(()),
    }
}

/// Refuses a migrated queue of more than [`MAX_QUEUED_COMMANDS`],
/// counted before parsing: a stream's entry could hold thousands of
/// commands (`;`-separated), each parsed into memory of its own.
fn within_queue_limit(index: usize, queue: &[String]) -> Result<(), Error> {
    let commands: usize = queue
        .iter()
        .map(|spec| spec.matches([';', '\n']).count() + 1)
        .sum();
    if commands > MAX_QUEUED_COMMANDS {
        return Err(Error::Queue(
            index,
            format!("{commands} commands"),
            SpecError::TooMany(commands, MAX_QUEUED_COMMANDS).to_string(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vcpu::RESULTS_KEPT;
    use crate::workload::parse_sequence;

    /// What a source sends passes; each value no source sends is refused
    /// naming it.
    #[test]
    fn a_migrated_state_no_source_sends_is_refused_naming_what_is_wrong() {
        let shared = VcpuShared::new(0);
        shared.counters.restore(&[("io_out".into(), 5)], &[]);
        let good = vmm_state(Where::NextCommand, None, None, &shared);
        assert_eq!(check_state(&good), Ok(()));
        let result = |seq| ResultRecord {
            seq,
            command: "touch size=4K".into(),
            status: "ok".into(),
            values: [0; 3],
            host_time_us: 1,
        };
        let mut cases: Vec<(VmmState, &str)> = Vec::new();
        let mut s = good.clone();
        s.results = (1..=RESULTS_KEPT as u64 + 1).map(result).collect();
        s.next_seq = RESULTS_KEPT as u64 + 2;
        cases.push((s, "257 results, over the 256 a vCPU keeps"));
        let mut s = good.clone();
        s.next_seq = u64::MAX;
        cases.push((s, "next command number 18446744073709551615 is outside"));
        let mut s = good.clone();
        s.next_seq = 0;
        cases.push((s, "next command number 0 is outside"));
        let mut s = good.clone();
        s.results = vec![result(7)];
        s.next_seq = 7;
        cases.push((
            s,
            "command 7 is numbered at or past the next command's number 7",
        ));
        let mut s = good.clone();
        s.reasons = vec![("io_out".into(), u64::MAX), ("hlt".into(), 11)];
        cases.push((s, "its exit counters add up past 9007199254740992"));
        // One counter at the top: its next exit would wrap it.
        let mut s = good.clone();
        s.reasons = vec![("io_out".into(), u64::MAX)];
        cases.push((s, "its exit counters add up past"));
        // The command in progress: one, where the vCPU stands.
        let running = |site, command: &str| {
            let mut s = good.clone();
            s.site = site;
            s.current = Some(Current {
                seq: 0,
                command: command.into(),
                elapsed_us: 5,
            });
            s
        };
        let wait = Site::Wait {
            remaining_us: Some(10),
        };
        for (site, command) in [(Site::Guest, "touch size=4K"), (wait, "wait for=10ms")] {
            assert_eq!(check_state(&running(site, command)), Ok(()), "{command}");
        }
        cases.extend([
            (
                running(Site::Guest, "rm -rf /"),
                "the command in progress 'rm -rf /' does not parse: ",
            ),
            (
                running(Site::Guest, "touch size=4K; touch size=4K"),
                "the command in progress 'touch size=4K; touch size=4K' is 2 commands, not one",
            ),
            (
                running(Site::Guest, "wait for=1s"),
                "the guest runs 'wait for=1s', which the VMM runs, not the guest",
            ),
            (
                running(wait, "touch size=4K"),
                "a VMM-side wait whose command in progress is 'touch size=4K', not a wait",
            ),
        ]);
        for (state, says) in cases {
            let e = check_state(&state).unwrap_err();
            assert!(e.starts_with(says), "{e}");
        }
    }

    #[test]
    fn specs_are_sized_as_they_are_shown_once_per_run() {
        let text = "touch size=4K; touch size=4K; read size=64M; touch size=4K; exits count=2";
        let sized = with_spec_lens(parse_sequence(text).unwrap());
        for (c, len) in &sized {
            assert_eq!(*len, c.to_string().len(), "{c}");
        }
        assert_eq!(sized.len(), 5);
    }

    #[test]
    fn a_vcpus_state_estimate_follows_its_encoded_queue_and_results() {
        let shared = VcpuShared::new(0);
        let json = |s: &VcpuShared| {
            let state = vmm_state(Where::NextCommand, None, None, s);
            serde_json::to_vec(&state).unwrap().len() as f64
        };
        let idle = json(&shared);
        assert_eq!(shared.state_extra_bytes(), 0);
        let mixed = "read size=64M; dirty ws=64M rate=max for=2s seed=7; touch offset=1M size=4K stride=2; wait for=10ms; exits count=5";
        let mut queue = Vec::new();
        for _ in 0..4000 {
            queue.extend(parse_sequence(mixed).unwrap());
        }
        shared.push_commands(queue).unwrap();
        {
            let mut inbox = shared.lock();
            for seq in 0..RESULTS_KEPT as u64 {
                inbox.results.push_back(CommandResult {
                    seq: 1000 + seq,
                    command: "dirty ws=64M rate=max for=2s seed=7".into(),
                    status: "ok".into(),
                    values: [seq * 52_113, 16_384, 2_412_345_678],
                    host_time: Duration::from_micros(2_001_234),
                });
            }
        }
        let (est, actual) = (shared.state_extra_bytes() as f64, json(&shared) - idle);
        assert!(
            (est - actual).abs() <= actual * 0.05,
            "estimated {est} bytes, encoded {actual}"
        );
        // Commands taken off the queue leave the estimate.
        let results = shared.state_extra_bytes();
        while shared.lock().pop_command().is_some() {}
        let left = shared.state_extra_bytes() as f64;
        let actual = json(&shared) - idle;
        assert!(
            left < results as f64 / 10.0 && (left - actual).abs() <= actual * 0.05,
            "{left} against {actual}"
        );
    }

    #[test]
    fn a_migrated_queue_past_the_limit_is_refused_counted_in_commands_not_entries() {
        let one = "exits count=1".to_string();
        let full = vec![one.clone(); MAX_QUEUED_COMMANDS];
        within_queue_limit(0, &full).unwrap();
        // One entry over, or one entry holding many commands.
        let over = vec![one.clone(); MAX_QUEUED_COMMANDS + 1];
        let packed = vec![vec!["exits count=1"; MAX_QUEUED_COMMANDS + 1].join("; ")];
        for queue in [over, packed] {
            let e = within_queue_limit(3, &queue).unwrap_err().to_string();
            assert!(
                e.contains("vCPU 3")
                    && e.contains(&format!("at most {MAX_QUEUED_COMMANDS} may be queued")),
                "{e}"
            );
        }
    }

    #[test]
    fn a_run_of_equal_items_is_mapped_once_and_order_is_kept() {
        let mut calls = 0;
        let items = ["a", "a", "a", "b", "a", "a"];
        let out = map_runs(items.iter(), |s| {
            calls += 1;
            Ok::<_, Infallible>(s.to_uppercase())
        })
        .unwrap_or_else(|e| match e {});
        assert_eq!(out, ["A", "A", "A", "B", "A", "A"]);
        assert_eq!(calls, 3);
    }

    #[test]
    fn the_first_error_stops_the_mapping() {
        let items = ["1", "1", "x", "2"];
        let mut calls = 0;
        let out = map_runs(items.iter(), |s| {
            calls += 1;
            s.parse::<u32>()
        });
        assert!(out.is_err());
        assert_eq!(calls, 2);
    }
}
