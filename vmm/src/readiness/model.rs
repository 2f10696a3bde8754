//! The pre-copy migration model: given what the guest's RAM holds and how fast
//! the guest dirties it, what would kvmscope's own pre-copy migration
//! (`vmm/src/migration/sender.rs`) move, in how many passes, and would it
//! converge? docs/READINESS.md writes the model out.
//!
//! It predicts the stream the sender writes, with `query-migrate`'s names:
//! pass 0 sends every page, non-zero pages in full and zero pages as runs of
//! one 16-byte header each (not a header per page); after every pass the
//! dirty log is synced (`dirty-sync-count`), and when the dirty pages would
//! go out within the downtime limit the guest stops and they go out with the
//! vCPU state and the trailer (the downtime). If passes stop shrinking, it
//! never converges; `x-max-rounds` then forces the stop.

use crate::protocol::migration::Status;
use crate::protocol::readiness::{PredictedMigration, PredictedRam, PredictionReply, RoundFigure};
use crate::units::saturating_u64;
use crate::wire::{
    dirty_pass_bytes, sections, stop_bytes, stop_fits, stop_seconds, whole_ms, Costs,
    DIRTY_PAGE_WIRE, PAGE, PASS_BYTES, RUN_HEADER, SECTION_TARGET, SETUP_BYTES,
};

/// Passes tried before the model gives up (the sender has no cap unless
/// `x-max-rounds` is set, but a guest this close to the link never settles).
pub(crate) const MAX_ROUNDS: usize = 30;

/// What the model needs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Inputs {
    /// Guest RAM pages.
    pub(crate) total_pages: u64,
    /// Pages that must go in full in pass 0 (the rest go as zero runs).
    pub(crate) nonzero_pages: u64,
    /// Pages the guest dirties per second.
    pub(crate) dirty_rate: f64,
    /// How the guest's writes spread over its memory: how many distinct
    /// pages `dirty_rate` makes in a given time.
    pub(crate) growth: Growth,
    /// Pages the host backs (the sender reads each of them in pass 0, zero or
    /// not; `mincore`'s count); `None`: the non-zero pages.
    pub(crate) backed_pages: Option<u64>,
    /// Link bandwidth (`max-bandwidth`), bytes per second; `None`: unlimited,
    /// the costs' local rate.
    pub(crate) bandwidth: Option<f64>,
    /// Longest acceptable stop-and-copy (`downtime-limit`), seconds.
    pub(crate) max_downtime: f64,
    /// vCPUs, whose state goes out in the stop.
    pub(crate) vcpus: u64,
    /// Bytes their state carries beyond [`crate::wire::VCPU_BYTES`] each: queued
    /// commands and kept results (`VcpuShared::state_extra_bytes`).
    pub(crate) state_extra: u64,
    /// `x-max-rounds`: the sender stops after this many passes whatever is
    /// left (0 or `None`: no limit).
    pub(crate) max_rounds: Option<u64>,
    /// vCPU time the guest loses per page it writes after the page was
    /// protected (a write-protection fault, its share of ring-full exits),
    /// seconds, as a dirty-rate window measured it; `None`: not measured.
    pub(crate) stall_per_page: Option<f64>,
    /// vCPUs held to a dirty limit from pre-copy's start, beyond
    /// `dirty_rate` (which then holds only the others'); `None`: none.
    pub(crate) limited: Option<Limited>,
    /// Costs beyond the wire.
    pub(crate) costs: Costs,
}

/// How distinct dirty pages grow with time at a write rate `r`, as a
/// dirty-rate window saw them grow (`report::DirtyRate::growth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Growth {
    /// No working set seen: `r·t`, capped by guest RAM.
    Linear,
    /// Writes spread uniformly over `W` pages: `W·(1 − e^(−r·t/W))`.
    Uniform(u64),
    /// Writes that sweep `W` pages in order: `min(r·t, W)` (every page
    /// written once before any is written again).
    Sequential(u64),
}

impl Growth {
    /// The working set, when one was seen.
    pub(crate) fn working_set(self) -> Option<u64> {
        match self {
            Growth::Linear => None,
            Growth::Uniform(w) | Growth::Sequential(w) => Some(w),
        }
    }

    /// Its name in reports: `linear`, `uniform` or `sequential`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Growth::Linear => "linear",
            Growth::Uniform(_) => "uniform",
            Growth::Sequential(_) => "sequential",
        }
    }

    /// Distinct pages after `writes` writes.
    pub(crate) fn distinct(self, writes: f64) -> f64 {
        match self {
            Growth::Uniform(w) if w > 0 => w as f64 * -(-writes / w as f64).exp_m1(),
            Growth::Sequential(w) => writes.min(w as f64),
            _ => writes,
        }
    }
}

/// What vCPUs held to a dirty limit from pre-copy's start write: each
/// vCPU's token bucket starts full (its burst: 20 ms of its limit) and is
/// first looked at a short run after the limit is set, so in that run a
/// vCPU writes at its unlimited (tracked) rate, `first` pages, and then
/// sleeps off what it took beyond the burst. By `t` seconds into pre-copy the limited vCPUs
/// have written `max(first, burst + rate·t)` pages (all of them new: under
/// a limit each ring entry is a page written since its last harvest).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Limited {
    /// Their limits together, pages/s.
    pub(crate) rate: f64,
    /// Their buckets' bursts together, pages.
    pub(crate) burst: f64,
    /// What they write in their first run at their unlimited rate, pages.
    pub(crate) first: f64,
}

impl Limited {
    /// Pages written by `t` seconds into pre-copy.
    fn by(&self, t: f64) -> f64 {
        if t <= 0.0 {
            0.0
        } else {
            self.first.max(self.burst + self.rate * t)
        }
    }

    /// Pages written between `a` and `b` seconds into pre-copy.
    fn between(&self, a: f64, b: f64) -> u64 {
        saturating_u64((self.by(b) - self.by(a)).max(0.0).ceil())
    }
}

/// One pre-copy pass.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Round {
    /// Pages sent in the pass.
    pub(crate) pages: u64,
    /// Bytes on the wire for them (zero runs cost a header only).
    pub(crate) bytes: u64,
    /// Time to send them at the effective rate.
    pub(crate) seconds: f64,
}

/// The verdict and its numbers, named as `query-migrate` names them.
#[derive(Debug, Clone, PartialEq)]
pub struct Prediction {
    /// Passes sent while the guest runs (pass 0 first): `dirty-sync-count`.
    pub(crate) rounds: Vec<Round>,
    /// The stop-and-copy: the pages dirty at the stop, the vCPU state and the
    /// trailer; forced by `x-max-rounds` when it does not converge.
    pub(crate) stop_and_copy: Option<Round>,
    /// Whether what is dirty after a pass fits the downtime limit before the
    /// passes stop shrinking (or the model gives up).
    pub converges: bool,
    /// Why it converges or not, in words.
    pub(crate) reason: String,
    /// `transferred`: bytes of every pass, setup and stop included.
    pub(crate) total_bytes: u64,
    /// `total-time`, seconds: setup, every pass and the stop.
    pub(crate) total_seconds: f64,
    /// `downtime`, seconds (infinite when it never stops).
    pub(crate) downtime: f64,
    /// `duplicate`: zero pages sent (pass 0's).
    pub(crate) duplicate: u64,
    /// `normal`: pages sent in full, in every pass.
    pub(crate) normal: u64,
    /// The vCPU time the guest would lose to dirty tracking, seconds: each
    /// page it dirties in a pass was protected at the sync before and faults
    /// once (the pages of every later pass and of the stop), at the measured
    /// cost per page. `None` without a measured cost; infinite when it never stops.
    pub(crate) stall: Option<f64>,
}

/// Why the inputs cannot be modelled.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// The bandwidth is not a positive number.
    #[error("bandwidth must be a positive number of bytes per second, not {0}")]
    Bandwidth(f64),
    /// The downtime limit is not a positive number.
    #[error("the downtime limit must be 0 or more seconds, not {0}")]
    Downtime(f64),
    /// The dirty rate is negative or not a number.
    #[error("dirty rate must be zero or more pages per second, not {0}")]
    DirtyRate(f64),
    /// More non-zero pages than guest RAM has.
    #[error("{nonzero} non-zero pages is more than the {total} pages of guest RAM")]
    Pages {
        /// Non-zero pages given.
        nonzero: u64,
        /// Pages of guest RAM.
        total: u64,
    },
}

/// Pass 0's bytes: setup records, every non-zero page in full, zero pages as
/// runs. A section closes its runs, so each section holds about one normal
/// and one zero run.
pub(crate) fn pass0_bytes(total_pages: u64, nonzero_pages: u64) -> u64 {
    let data = nonzero_pages * PAGE;
    let n = data.div_ceil(SECTION_TARGET).max(1);
    let zero_runs = u64::from(nonzero_pages < total_pages) * (n + 1);
    let runs = u64::from(nonzero_pages > 0) * n + zero_runs;
    SETUP_BYTES + data + runs * RUN_HEADER + sections(data) + PASS_BYTES
}

fn check(i: &Inputs) -> Result<(), Error> {
    if let Some(b) = i.bandwidth.filter(|b| !(b.is_finite() && *b > 0.0)) {
        return Err(Error::Bandwidth(b));
    }
    // 0 is a limit: the sender then stops only when nothing is dirty.
    if !(i.max_downtime.is_finite() && i.max_downtime >= 0.0) {
        return Err(Error::Downtime(i.max_downtime));
    }
    if !(i.dirty_rate.is_finite() && i.dirty_rate >= 0.0) {
        return Err(Error::DirtyRate(i.dirty_rate));
    }
    if i.nonzero_pages > i.total_pages {
        return Err(Error::Pages {
            nonzero: i.nonzero_pages,
            total: i.total_pages,
        });
    }
    Ok(())
}

impl Inputs {
    /// Bytes per second the sender achieves: the limit, or the local rate
    /// when that is slower or there is none.
    pub(crate) fn rate(&self) -> f64 {
        let local = self.costs.local_rate;
        self.bandwidth.map_or(local, |b| b.min(local))
    }

    fn round(&self, pages: u64, bytes: u64) -> Round {
        Round {
            pages,
            bytes,
            seconds: bytes as f64 / self.rate(),
        }
    }

    /// Pages dirty after `seconds` of the guest running.
    fn dirtied(&self, seconds: f64) -> u64 {
        let distinct = self.growth.distinct(self.dirty_rate * seconds);
        saturating_u64(distinct.ceil()).min(self.total_pages)
    }

    /// Pages dirty at the sync after a pass from `a` to `b` seconds into
    /// pre-copy: the rate's over its length, and the limited vCPUs'.
    fn dirtied_between(&self, a: f64, b: f64) -> u64 {
        let limited = self.limited.map_or(0, |l| l.between(a, b));
        self.dirtied(b - a)
            .saturating_add(limited)
            .min(self.total_pages)
    }

    /// Pass 0's time: its bytes at the rate, or reading every backed page at
    /// the local rate when that is longer (zero-filled RAM is read, not sent).
    fn pass0(&self) -> Round {
        let mut r = self.round(
            self.total_pages,
            pass0_bytes(self.total_pages, self.nonzero_pages),
        );
        let backed = self
            .backed_pages
            .unwrap_or(self.nonzero_pages)
            .max(self.nonzero_pages);
        r.seconds = r
            .seconds
            .max((backed * PAGE) as f64 / self.costs.local_rate);
        r
    }

    /// The sender's stop test after a sync ([`stop_fits`]), at the link's rate.
    fn fits(&self, dirty: u64) -> bool {
        stop_fits(self.stop_ms(dirty), dirty, self.limit_ms())
    }

    /// `downtime-limit` in whole milliseconds, as the sender has it.
    fn limit_ms(&self) -> u64 {
        saturating_u64((self.max_downtime * 1e3).round())
    }

    /// The stop's downtime with `dirty` pages left, in whole milliseconds
    /// (rounded up), as the sender counts its `expected-downtime`.
    fn stop_ms(&self, dirty: u64) -> u64 {
        whole_ms(self.stop(dirty).1)
    }

    /// The stop: the last dirty pages (as a pass), the vCPUs and the
    /// trailer; its downtime.
    fn stop(&self, dirty: u64) -> (Round, f64) {
        let bytes = stop_bytes(dirty, self.vcpus, self.state_extra);
        let r = self.round(dirty, bytes);
        let downtime = stop_seconds(bytes, self.rate(), self.vcpus, &self.costs);
        (r, downtime)
    }
}

/// Runs the model.
///
/// # Errors
/// Inputs that make no sense (non-positive bandwidth or downtime, negative or
/// NaN rate, more non-zero pages than pages).
pub(crate) fn predict(i: &Inputs) -> Result<Prediction, Error> {
    check(i)?;
    let mut rounds = vec![i.pass0()];
    let limit = i.max_rounds.filter(|&r| r > 0);
    let mut elapsed = rounds[0].seconds;
    let mut dirty = i.dirtied_between(0.0, elapsed);
    let mut diverged: Option<String> = None;
    let (converges, reason) = loop {
        let done = rounds.len() as u64;
        if i.fits(dirty) {
            let (stop_ms, limit_ms) = (i.stop_ms(dirty), i.limit_ms());
            if stop_ms > limit_ms {
                // Nothing dirty, and the stop alone is over the limit: the
                // sender stops anyway, and the limit is not met.
                let why = format!("nothing is dirty after {done} pass(es), but the stop alone (the vCPUs' state and the stop's costs) takes {stop_ms} ms, over the {limit_ms} ms downtime limit");
                break (false, why);
            }
            let why = format!(
                "the last {dirty} dirty page(s) fit the {limit_ms} ms downtime after {done} pass(es)"
            );
            break (true, why);
        }
        let shrank = rounds.len() < 2 || dirty < rounds[rounds.len() - 1].pages;
        if diverged.is_none() && (!shrank || rounds.len() >= MAX_ROUNDS) {
            diverged = Some(not_converging(i, dirty, done));
        }
        // The sender goes on until the round limit forces the stop (or for ever).
        match (diverged.take(), limit) {
            (why, Some(l)) if done >= l => {
                break (false, why.unwrap_or_else(|| not_converging(i, dirty, done)))
            }
            (Some(why), None) => break (false, why),
            (why, _) => diverged = why,
        }
        let next = i.round(dirty, dirty_pass_bytes(dirty));
        rounds.push(next);
        dirty = i.dirtied_between(elapsed, elapsed + next.seconds);
        elapsed += next.seconds;
    };
    let forced = !converges && (dirty == 0 || limit.is_some_and(|l| rounds.len() as u64 >= l));
    let stop = (converges || forced).then(|| i.stop(dirty));
    let pre_bytes: u64 = rounds.iter().map(|r| r.bytes).sum();
    let pre_seconds: f64 = rounds.iter().map(|r| r.seconds).sum();
    let sent: u64 = rounds.iter().skip(1).map(|r| r.pages).sum();
    let duplicate = i.total_pages - i.nonzero_pages;
    let faults = sent + stop.map_or(0, |s| s.0.pages);
    let stall = match i.stall_per_page {
        Some(c) if stop.is_some() => Some(c * faults as f64),
        Some(_) => Some(f64::INFINITY),
        // No cost per page known (the window saw no write), but nothing to
        // pay for: a guest that dirties nothing takes no fault.
        None if stop.is_some() && faults == 0 => Some(0.0),
        None => None,
    };
    Ok(Prediction {
        stall,
        total_bytes: pre_bytes + stop.map_or(0, |s| s.0.bytes),
        total_seconds: i.costs.setup + pre_seconds + stop.map_or(f64::INFINITY, |s| s.1),
        downtime: stop.map_or(f64::INFINITY, |s| s.1),
        normal: i.nonzero_pages + sent + stop.map_or(0, |s| s.0.pages),
        duplicate,
        stop_and_copy: stop.map(|s| s.0),
        rounds,
        converges,
        reason,
    })
}

/// Why the passes do not converge, in words.
fn not_converging(i: &Inputs, dirty: u64, done: u64) -> String {
    let (alone, limit_ms) = (i.stop_ms(0), i.limit_ms());
    if alone > limit_ms {
        return format!("the stop alone (the vCPUs' state and the stop's costs) takes {alone} ms, over the {limit_ms} ms downtime limit: the sender stops only when nothing is dirty, and then over the limit; {dirty} pages are dirty after {done} pass(es)");
    }
    let mib = |b: f64| b / 1048576.0;
    let dirty_bytes = i.dirty_rate * DIRTY_PAGE_WIRE as f64;
    let ms = i.stop_ms(dirty);
    if dirty_bytes >= i.rate() {
        format!("the guest dirties {:.1} MiB/s (the model's {:.0} pages/s), at least the {:.1} MiB/s link: passes stop shrinking at {dirty} pages (a {ms} ms stop, over the {limit_ms} ms downtime)", mib(dirty_bytes), i.dirty_rate, mib(i.rate()))
    } else {
        format!("after {done} passes {dirty} pages are still dirty (a {ms} ms stop, over the {limit_ms} ms downtime): the guest dirties {:.1} MiB/s (the model's {:.0} pages/s), too close to the {:.1} MiB/s link", mib(dirty_bytes), i.dirty_rate, mib(i.rate()))
    }
}

/// Milliseconds, rounded; `None` when infinite.
fn ms(seconds: f64) -> Option<u64> {
    seconds
        .is_finite()
        .then(|| saturating_u64((seconds * 1e3).round()))
}

impl Prediction {
    /// Whether the migration ends: a stop comes (it converges, or
    /// `x-max-rounds` forces one); otherwise its passes go on for ever.
    pub(crate) fn ends(&self) -> bool {
        self.stop_and_copy.is_some()
    }

    /// `dirty-sync-count`: one sync after every pass sent while the guest runs.
    pub(crate) fn dirty_sync_count(&self) -> u64 {
        self.rounds.len() as u64
    }

    /// The prediction as the report carries it: the model's rounds, and
    /// `migrate` holding the figures under `query-migrate`'s names (times in
    /// ms, as it gives them).
    pub(crate) fn to_reply(&self) -> PredictionReply {
        let r = |r: &Round| RoundFigure {
            pages: r.pages,
            bytes: r.bytes,
            seconds: r.seconds,
        };
        let finite = |v: f64| Some(v).filter(|v| v.is_finite());
        let ends = self.ends();
        PredictionReply {
            converges: self.converges,
            reason: self.reason.clone(),
            rounds: self.rounds.iter().map(r).collect(),
            stop_and_copy: self.stop_and_copy.as_ref().map(r),
            total_bytes: self.total_bytes,
            total_seconds: finite(self.total_seconds),
            downtime_seconds: finite(self.downtime),
            guest_stall_seconds: self.stall.and_then(finite),
            migrate: PredictedMigration {
                status: if ends {
                    Status::Completed
                } else {
                    Status::Active
                },
                x_converges: self.converges,
                total_time: ms(self.total_seconds),
                downtime: ms(self.downtime),
                x_guest_stall_ms: self.stall.and_then(ms),
                ram: PredictedRam {
                    transferred: self.total_bytes,
                    duplicate: self.duplicate,
                    normal: self.normal,
                    normal_bytes: self.normal * PAGE,
                    dirty_sync_count: self.dirty_sync_count(),
                },
            },
        }
    }
}

#[cfg(test)]
#[path = "model_tests.rs"]
mod tests;
