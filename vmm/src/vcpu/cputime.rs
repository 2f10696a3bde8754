//! The guest's stall: the CPU time a vCPU thread spends outside its guest
//! while something observes it (a readiness window, a migration), beyond
//! what it spent so before.
//!
//! The kernel accounts each thread's CPU time as user, system and, inside
//! that, guest time (`/proc/self/task/TID/stat`: `utime`, `stime`,
//! `guest_time`). A vCPU thread that runs its guest accrues guest time; a
//! write-protection fault taken for dirty logging, a ring-full exit and its
//! harvest, a PML-full exit on hardware, all run on the vCPU thread outside
//! the guest, as system (or, for our harvest, user) time. So the time lost
//! is measured, not modelled: `utime + stime − guest_time` over the period,
//! less the rate the same thread spent so before the period (exits the guest
//! takes anyway: port I/O for its commands, halts). A vCPU that sleeps (a
//! guest idle in the VMM, a vCPU held paused) spends no CPU time and so
//! reports no stall; the downtime of a migration is reported apart.
//!
//! The kernel counts these in clock ticks (`USER_HZ`, 100 a second here):
//! a figure is good to about 10 ms per vCPU.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::VcpuShared;

/// A vCPU thread's CPU time outside its guest, at a moment.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reading {
    at: Instant,
    /// `utime + stime − guest_time`.
    outside: Duration,
}

/// Shortest baseline a rate before the period is taken from; over a
/// shorter one (or none), the rate before counts as zero.
const MIN_BASELINE: Duration = Duration::from_millis(50);

/// Clock ticks a second for `/proc` CPU times.
fn ticks_per_second() -> u64 {
    rustix::param::clock_ticks_per_second().max(1)
}

/// `utime + stime − guest_time` of thread `tid` of this process.
pub(crate) fn outside_guest(tid: i32) -> std::io::Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat"))?;
    parse_stat(&stat)
        .map(|ticks| Duration::from_secs_f64(ticks as f64 / ticks_per_second() as f64))
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("/proc/self/task/{tid}/stat: no utime/stime/guest_time"),
            )
        })
}

/// Ticks outside the guest from a `stat` line: fields 14 (`utime`), 15
/// (`stime`) and 43 (`guest_time`), counted after the command name, which
/// is in parentheses and may hold spaces.
fn parse_stat(stat: &str) -> Option<u64> {
    let after = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // `after` starts at field 3 (state).
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    let (utime, stime, guest) = (field(14)?, field(15)?, field(43)?);
    Some((utime + stime).saturating_sub(guest))
}

fn read(v: &VcpuShared) -> Option<Reading> {
    let tid = *v.tid.get()?;
    let at = Instant::now();
    outside_guest(tid)
        .map(|outside| Reading { at, outside })
        .map_err(|e| log::debug!("vCPU {}: {e}", v.index))
        .ok()
}

/// The stall of each vCPU over a period, and in total.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stall {
    /// How long the period has lasted.
    pub period: Duration,
    /// Each vCPU's stall, by index (zero for a vCPU whose time could not be read).
    pub vcpus: Vec<Duration>,
}

impl Stall {
    /// All vCPUs' stall added up.
    pub fn total(&self) -> Duration {
        self.vcpus.iter().sum()
    }

    /// The resolution of each vCPU's figure (one clock tick).
    pub fn resolution() -> Duration {
        Duration::from_secs_f64(1.0 / ticks_per_second() as f64)
    }
}

/// The readings a period's rate before is taken from: taken before the
/// observer starts (a migration: when it starts to connect; a readiness
/// window: a moment before it subscribes).
pub(crate) struct Baseline {
    vcpus: Vec<Arc<VcpuShared>>,
    readings: Vec<Option<Reading>>,
}

impl Baseline {
    /// Reads every vCPU's time outside its guest now.
    pub(crate) fn start(vcpus: &[Arc<VcpuShared>]) -> Baseline {
        Baseline {
            vcpus: vcpus.to_vec(),
            readings: vcpus.iter().map(|v| read(v)).collect(),
        }
    }

    /// Starts the period: each vCPU's rate outside its guest since the
    /// baseline is what it would have spent anyway.
    pub(crate) fn begin(self) -> Period {
        let start = self
            .vcpus
            .iter()
            .zip(&self.readings)
            .map(|(v, before)| {
                let now = read(v)?;
                let rate = before
                    .filter(|b| now.at.saturating_duration_since(b.at) >= MIN_BASELINE)
                    .map_or(0.0, |b| {
                        let spent = now.outside.saturating_sub(b.outside);
                        spent.as_secs_f64() / now.at.saturating_duration_since(b.at).as_secs_f64()
                    });
                Some((now, rate))
            })
            .collect();
        Period {
            vcpus: self.vcpus,
            start,
            started: Instant::now(),
        }
    }
}

/// A period during which something observes the guest; its stall so far
/// from [`Period::stall`].
pub(crate) struct Period {
    vcpus: Vec<Arc<VcpuShared>>,
    /// Per vCPU: the reading at the start and the rate before it.
    start: Vec<Option<(Reading, f64)>>,
    started: Instant,
}

impl Period {
    /// The stall from the start until now: per vCPU, its time outside the
    /// guest less what it would have spent at its rate before.
    pub(crate) fn stall(&self) -> Stall {
        let vcpus = self
            .vcpus
            .iter()
            .zip(&self.start)
            .map(|(v, start)| match (start, read(v)) {
                (Some((s, rate)), Some(n)) => {
                    let spent = n.outside.saturating_sub(s.outside);
                    let usual = n.at.saturating_duration_since(s.at).as_secs_f64() * rate;
                    spent.saturating_sub(Duration::from_secs_f64(usual.max(0.0)))
                }
                _ => Duration::ZERO,
            })
            .collect();
        Stall {
            period: self.started.elapsed(),
            vcpus,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_gives_user_and_system_less_guest_ticks() {
        // A command name with spaces and a parenthesis, as a thread may have.
        let mut fields = vec!["0"; 50];
        fields[14 - 3] = "300";
        fields[15 - 3] = "40";
        fields[43 - 3] = "290";
        let line = format!("1234 (vcpu 0) x) {}", fields.join(" "));
        assert_eq!(parse_stat(&line), Some(50));
        assert_eq!(parse_stat("1234 (vcpu0) R 1 2"), None, "too few fields");
    }

    #[test]
    fn this_threads_time_outside_a_guest_is_its_cpu_time() {
        let tid = rustix::thread::gettid().as_raw_nonzero().get();
        let before = outside_guest(tid).unwrap();
        let t = Instant::now();
        let (mut x, mut spent) = (0u64, Duration::ZERO);
        // Spin until three ticks show (or give up after 20 s of a host too
        // busy to give this thread any): no guest here, so all of it counts.
        while spent < 3 * Stall::resolution() && t.elapsed() < Duration::from_secs(20) {
            for _ in 0..100_000 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            }
            spent = outside_guest(tid).unwrap() - before;
        }
        std::hint::black_box(x);
        assert!(
            spent >= 3 * Stall::resolution(),
            "{spent:?} in {:?}",
            t.elapsed()
        );
        assert!(
            spent <= t.elapsed() + Stall::resolution(),
            "{spent:?} in {:?}",
            t.elapsed()
        );
    }
}
