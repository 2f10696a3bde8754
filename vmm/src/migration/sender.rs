//! The source's pre-copy policy: passes while the guest runs, then
//! stop-and-copy, on the `migration` thread. Which pages each pass sends and
//! when to stop are decided here; the [`PageWriter`] (`writer.rs`) puts them
//! on the stream (runs, sections, zero pages, counters, pacing).
//!
//! Pass 0 sends every page: pages the host never backed (or that map the
//! zero page) as zero runs without reading them, the rest read and sent as
//! zero or normal. Each later pass sends what the dirty log says was written
//! since the previous sync. When what is left would fit the downtime limit at
//! the send rate measured over the last pass (or the round limit is reached),
//! the guest is held paused, the vCPUs' state is taken, and the last dirty
//! pages, the state and the trailer go out. Whatever fails before the
//! trailer, the hold is released and the guest runs on here; once the whole
//! stream was sent, a failure without a refusal (no answer, a late or cut
//! COMPLETED) leaves it paused until `cont`: the destination may run it.
//! Only the destination's `completed` reply moves the source to
//! `postmigrate`. The stop has a deadline for the whole, beside the bounds
//! on silence ([`stop_stall`], `Precopy::stop_whole`).

use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use zerocopy::IntoBytes;

use super::converge::Converge;
use super::device;
use super::format::{self, Kind, PassRecord, Writer};
use super::handle::Migration;
use super::source::Source;
use super::transport::{self, Conn, Uri};
use super::writer::{self, Control, Counts, PageWriter};
use crate::backing::{self as pages, Backing};
use crate::dirty::{self, Bitmap};
use crate::messages::{RunRequest, RunStateError, VmEvent};
use crate::protocol::events::{EventKind, MigrationPass};
use crate::protocol::migration::{GuestProgress, GuestStall, VcpuProgress, VcpuStall};
use crate::protocol::migration::{RamStats, Status};
use crate::units::saturating_u64;
use crate::vcpu::snapshot::{Snapshot, SnapshotRequest};
use crate::vcpu::stall::{Baseline, Period, Stall};
use crate::vcpu::{progress, VcpuShared};
use crate::wire;

/// How long the main loop and the vCPUs get to pause, and each vCPU to give its state.
const PAUSE_LIMIT: Duration = Duration::from_secs(5);
/// While the guest runs (pre-copy): how long the destination may go without
/// reading any of the stream, or without answering READY.
const PRECOPY_STALL: Duration = Duration::from_secs(30);
/// While the guest is held paused: the least time the destination may go
/// without reading or answering (see [`stop_stall`]).
const STOP_STALL_FLOOR: Duration = Duration::from_secs(5);
/// Guest RAM the destination checksums per second, at least, when
/// `x-check-ram` asks it to before it answers.
const CHECK_RAM_RATE: u64 = 1 << 30;
/// How many times what the stop's bytes take at the last pass's rate the
/// destination may take to read them, beyond [`stop_stall`] (see
/// [`Precopy::stop_whole`]).
const STOP_SLACK: u32 = 4;
/// All told, how long a reply may take to come whole once its first byte
/// did, outside the stop (a refusal after a failed write, a reply out of turn).
const REPLY_WHOLE: Duration = Duration::from_secs(1);

/// How long the destination may go without reading the stream or answering
/// while the guest is held paused: ten times `downtime-limit`, at least
/// [`STOP_STALL_FLOOR`], plus a second per GiB of RAM with `x-check-ram`.
pub(crate) fn stop_stall(p: &crate::protocol::migration::Parameters, memory: u64) -> Duration {
    let limit = Duration::from_millis(p.downtime_limit.saturating_mul(10)).max(STOP_STALL_FLOOR);
    limit + check_ram_time(p, memory)
}

/// The time allowed to checksum guest RAM on one side, with `x-check-ram`.
fn check_ram_time(p: &crate::protocol::migration::Parameters, memory: u64) -> Duration {
    if p.x_check_ram {
        Duration::from_secs(memory.div_ceil(CHECK_RAM_RATE))
    } else {
        Duration::ZERO
    }
}

/// Why a migration failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Connecting to the destination failed.
    #[error(transparent)]
    Connect(#[from] transport::Error),
    /// Writing the stream or reading the destination's reply failed.
    #[error("sending the stream")]
    Stream(#[from] format::Error),
    /// The destination answered REFUSED; its message is given.
    #[error("the destination refused the stream: {0}")]
    Refused(String),
    /// The destination answered something other than what the stream's
    /// step waits for (its code, when, and its message, if any).
    #[error("the destination answered {} {when}{}", reply_name(*code), if message.is_empty() { String::new() } else { format!(": {message}") })]
    OutOfTurn {
        /// The reply's code.
        code: u32,
        /// When it came, in words.
        when: &'static str,
        /// Its message (the peer's text, made printable).
        message: String,
    },
    /// The destination closed the connection, saying nothing (what it was
    /// to do then, and the socket's error).
    #[error(
        "the destination closed the connection (it exited, or was stopped) when it was to {0}"
    )]
    Gone(&'static str, #[source] std::io::Error),
    /// Subscribing to or syncing the dirty log failed.
    #[error("dirty tracking")]
    Dirty(#[from] dirty::Error),
    /// Reading the page map for pass 0 failed.
    #[error("reading the page map")]
    Pages(#[from] pages::Error),
    /// Reading a guest page failed (page number given).
    #[error("reading guest RAM at page {0}")]
    Read(u64, #[source] vm_memory::GuestMemoryError),
    /// The main loop refused the hold request, or did not answer it in time.
    #[error("pausing the guest")]
    Pause(#[source] RunStateError),
    /// The vCPU threads did not all park in time after the hold.
    #[error("the vCPUs did not pause within {0:?}")]
    PauseTimeout(Duration),
    /// A parked vCPU thread did not send its state in time (index, limit).
    #[error("vCPU {0} did not give its state within {1:?}")]
    SnapshotTimeout(usize, Duration),
    /// A vCPU thread could not read its state (index given).
    #[error("reading vCPU {0}'s state")]
    Snapshot(usize, #[source] crate::vcpu::snapshot::Error),
    /// A vCPU thread had ended before its state was read (index, how it ended).
    #[error("vCPU {0}'s thread ended ({1})")]
    VcpuFinished(usize, Box<crate::vcpu::Outcome>),
    /// A vCPU's state could not be encoded for the wire.
    #[error(transparent)]
    Device(#[from] device::Error),
    /// `migrate_cancel` stopped it.
    #[error("cancelled")]
    Cancelled,
    /// The destination made no progress for too long (what it did not do, how long).
    #[error("the destination did not {0} for {limit}", limit = crate::units::format_duration(*.1))]
    Unresponsive(&'static str, Duration),
    /// The destination made progress, but too slowly to finish within a
    /// whole deadline (what it did not finish, the deadline).
    #[error("the destination did not {0} within {limit} all told (it went on, too slowly)", limit = crate::units::format_duration(*.1))]
    TooSlow(&'static str, Duration),
    /// KVM's list of MSRs to save could not be read.
    #[error("reading KVM's MSR list")]
    MsrList(#[source] kvm_ioctls::Error),
}

impl From<writer::Error> for Error {
    fn from(e: writer::Error) -> Self {
        match e {
            writer::Error::Stream(e) => Error::Stream(e),
            writer::Error::Read(page, e) => Error::Read(page, e),
            writer::Error::Cancelled => Error::Cancelled,
        }
    }
}

/// A reply's code as the protocol names it.
fn reply_name(code: u32) -> String {
    match code {
        format::REPLY_READY => "READY".into(),
        format::REPLY_COMPLETED => "COMPLETED".into(),
        format::REPLY_REFUSED => "REFUSED".into(),
        other => format!("with code {other}, which no reply has"),
    }
}

/// The longest a migration waits in `setup` for the VMM's calibration of
/// the cost per fault (`readiness::calibrate`).
const CALIBRATION_WAIT: Duration = Duration::from_secs(10);

/// The migration thread's body: migrate, then settle the source's state.
pub(crate) fn run(m: &Arc<Migration>, uri: &Uri, src: &Source) {
    // A migration with dirty-limit took the limits over as it started
    // (`Migration::start`, before this baseline) and lifts them at its end.
    let owns_limits = m.owns_limits();
    // In a VMM's first seconds its cost per fault may still be being
    // measured: priced at the default, a migration's stall read 0.11 s of
    // a 0.54 s loss on a host whose faults cost 30-40 us. Waited for (in
    // `setup`, a cancel ends the wait), as a readiness window waits.
    let waited = crate::vcpu::stall::wait_for_calibration(CALIBRATION_WAIT, &|| !m.cancelled());
    if waited >= Duration::from_millis(1) {
        log::info!("migration: waited {waited:?} for this host's cost per fault to be measured");
    }
    let mut p = Precopy::new(m, src, Baseline::start(&src.vcpus));
    let result = p.migrate(uri);
    let held = p.held;
    let trailer_sent = p.trailer_sent;
    // A failure once the whole stream was written: what the peer on a unix
    // socket never took of it, once the connection is shut (after which no
    // answer reaches this side). Said, not acted on: a kvmscope destination
    // with bytes still queued never read the trailer and cannot run the
    // guest, but a relay (socat, an ssh-forwarded socket) may still pass
    // them on to one that does, so the guest stays paused for `cont`.
    let unread = match &result {
        Err(_) if trailer_sent => m.shut_with_unread().filter(|&b| b > 0),
        _ => None,
    };
    m.set_conn(None);
    if let Some(observed) = p.observed.take() {
        let stall = guest_stall(&observed.end());
        m.update(|i| i.x_guest_stall = Some(stall));
    }
    if let Some(progress) = p.guest_progress() {
        m.update(|i| i.x_guest_progress = Some(progress));
    }
    // The throttle is lifted here, whatever the outcome, before the guest runs on.
    if let Some(c) = p.converge.take() {
        m.update(|i| c.report(i));
    }
    drop(p);
    if owns_limits {
        // Every limit lifted, whatever the outcome, before the guest runs on.
        src.dirty_limits.end_migration();
    }
    match result {
        Ok(()) => {
            // Postmigrate first, so that releasing the hold does not resume.
            let _ = run_state(&src.main, RunRequest::Postmigrate);
            let _ = run_state(&src.main, RunRequest::Release);
            let total = m.elapsed_ms();
            m.update(|i| {
                i.x_vm_state = Some("postmigrate".into());
                i.total_time = Some(total);
            });
            m.set_status(Status::Completed);
        }
        Err(e) => {
            // The whole stream sent and no answer in time: the destination
            // may hold it all and run the guest (its answer lost or late; a
            // refusal, or a connection it closed without answering, says it
            // does not). The guest stays paused here, as a user's `stop`
            // leaves it, for whoever drives the migration to `cont` once the
            // destination is known not to run it (QEMU's pre-copy leaves the
            // source paused).
            // A COMPLETED whose message was cut is one the destination may
            // act on too (it read as a refusal, and the guest ran on here).
            let uncertain = trailer_sent
                && matches!(
                    e,
                    Error::Unresponsive(..)
                        | Error::TooSlow(..)
                        | Error::Stream(format::Error::ReplyCut {
                            code: format::REPLY_COMPLETED,
                            ..
                        })
                );
            if held {
                if uncertain {
                    if let Err(r) = run_state(&src.main, RunRequest::Pause) {
                        log::error!("migration: keeping the guest paused: {r}");
                    }
                }
                if let Err(r) = run_state(&src.main, RunRequest::Release) {
                    log::error!("migration: resuming the guest after a failure: {r}");
                }
            }
            let (status, desc) = match (m.cancelled(), &e) {
                (true, _) | (_, Error::Cancelled) => (Status::Cancelled, "cancelled".to_string()),
                _ if uncertain => (
                    Status::Failed,
                    format!(
                        "{}: the whole stream was sent and the destination may be running the guest{}; it stays paused here (`cont` resumes it once the destination is known not to)",
                        crate::error_chain(&e),
                        unread.map_or(String::new(), |queued| format!(
                            " (the peer on the socket never took its last {queued} bytes, kernel accounting, before the connection was shut: a kvmscope destination listening there itself cannot run it, one behind a relay such as socat or ssh still may)"
                        ))
                    ),
                ),
                _ => (Status::Failed, crate::error_chain(&e)),
            };
            log::warn!("migration {}: {desc}", status.name());
            let total = m.elapsed_ms();
            m.update(|i| {
                // As QEMU's: `error-desc` only with `failed`.
                i.error_desc = (status == Status::Failed).then_some(desc);
                i.total_time = Some(total);
            });
            m.set_status(status);
        }
    }
}

/// Asks the main loop for a run-state change and waits for its answer.
fn run_state(main: &Sender<VmEvent>, request: RunRequest) -> Result<(), RunStateError> {
    let (tx, rx) = channel();
    main.send(VmEvent::Control(request, tx))
        .map_err(|_| RunStateError::ShuttingDown)?;
    rx.recv_timeout(PAUSE_LIMIT)
        .map_err(|_| RunStateError::NoAnswer {
            request,
            limit: PAUSE_LIMIT,
        })?
}

/// The pre-copy policy: which pages each pass sends, when to stop, and
/// the hold of the guest; the [`PageWriter`] puts the pages on the stream.
struct Precopy<'a> {
    m: &'a Migration,
    src: &'a Source,
    w: Option<PageWriter<'a, Conn>>,
    /// What `query-migrate` shows; the page counts are the writer's, copied
    /// in as each section goes out.
    ram: RamStats,
    /// The guest is held paused (the hold must be released on failure).
    held: bool,
    pass: u64,
    /// Wire bytes per second over the last pass.
    last_rate: f64,
    /// How long a write or the reply may wait now, and whether a reply is awaited.
    stall: Duration,
    awaiting_reply: bool,
    /// The whole stream, trailer included, was written: from here the
    /// destination may complete and run the guest whatever reaches us.
    trailer_sent: bool,
    /// The stop's expected downtime at the last sync, ms: what
    /// `query-migrate` shows and what the stop test decides on.
    expected: u64,
    /// Dirty pages at the previous sync, to see whether passes shrink.
    prev_dirty: Option<u64>,
    /// Whether the last pass was said not to converge (`x-not-converging`).
    not_converging: bool,
    /// The round limit in force when it forced the stop, if it did.
    forced_by_rounds: Option<u64>,
    /// The pass in progress, for live `remaining` and `mbps`.
    live: PassProgress,
    /// The vCPUs' time outside the guest before the dirty log is taken.
    baseline: Option<Baseline>,
    /// What the migration has cost the guest since it took the dirty log.
    observed: Option<Period>,
    /// The auto-converge throttle, with the capability on (lifted when dropped).
    converge: Option<Converge>,
    /// Each vCPU's progress rate, as its guest counts it, before the migration.
    progress_before: Vec<Option<f64>>,
    /// Its progress since pre-copy started.
    progress: Option<progress::Period>,
}

/// The pass in progress: pages it sends, and the pages sent before it, its
/// start and the wire bytes before it.
#[derive(Clone, Copy)]
struct PassProgress {
    pages: u64,
    from: (u64, Instant, u64),
}

impl<'a> Precopy<'a> {
    fn new(m: &'a Migration, src: &'a Source, baseline: Baseline) -> Self {
        Precopy {
            m,
            src,
            w: None,
            ram: RamStats {
                total: src.memory(),
                page_size: format::PAGE_SIZE,
                ..RamStats::default()
            },
            held: false,
            pass: 0,
            last_rate: 0.0,
            stall: PRECOPY_STALL,
            awaiting_reply: false,
            trailer_sent: false,
            expected: 0,
            prev_dirty: None,
            not_converging: false,
            forced_by_rounds: None,
            live: PassProgress {
                pages: 0,
                from: (0, Instant::now(), 0),
            },
            baseline: Some(baseline),
            observed: None,
            converge: None,
            progress_before: src.vcpus.iter().map(|v| v.progress_per_second()).collect(),
            progress: None,
        }
    }

    /// `x-guest-progress` now.
    fn guest_progress(&self) -> Option<GuestProgress> {
        let p = self.progress.as_ref()?;
        let figures = p.figures(&progress_counts(&self.src.vcpus));
        let vcpus = figures
            .iter()
            .enumerate()
            .filter_map(|(cpu_index, f)| {
                Some(VcpuProgress {
                    cpu_index,
                    units: f.done?,
                    per_second: f.per_second.unwrap_or(0.0),
                    before_per_second: f.before_per_second,
                })
            })
            .collect();
        Some(GuestProgress { vcpus })
    }

    fn writer(&mut self) -> Result<&mut PageWriter<'a, Conn>, Error> {
        self.w.as_mut().ok_or(Error::Cancelled)
    }

    fn wire_bytes(&self) -> u64 {
        self.w.as_ref().map_or(0, PageWriter::bytes)
    }

    fn pages_sent(&self) -> u64 {
        self.w.as_ref().map_or(0, |w| w.counts().pages())
    }

    /// Migrates; a write that fails because the destination hung up is
    /// explained by the destination's refusal when it sent one.
    fn migrate(&mut self, uri: &Uri) -> Result<(), Error> {
        let what = |awaiting_reply| {
            if awaiting_reply {
                "answer"
            } else {
                "read the stream"
            }
        };
        match self.stream(uri) {
            Err(Error::Stream(format::Error::Io(e)))
                if !self.m.cancelled() && super::transport::past_deadline(&e).is_some() =>
            {
                let limit = super::transport::past_deadline(&e).map_or(Duration::ZERO, |p| p.0);
                Err(Error::TooSlow(what(self.awaiting_reply), limit))
            }
            Err(Error::Stream(format::Error::Io(e)))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) && !self.m.cancelled() =>
            {
                Err(Error::Unresponsive(what(self.awaiting_reply), self.stall))
            }
            Err(Error::Stream(format::Error::Io(e))) if !self.m.cancelled() => {
                match self.w.as_mut().map(|w| read_refusal(w.inner())) {
                    Some(Some(why)) => Err(Error::Refused(why)),
                    // Said as what happened: "Broken pipe (os error 32)"
                    // named no one.
                    _ if matches!(
                        e.kind(),
                        std::io::ErrorKind::BrokenPipe
                            | std::io::ErrorKind::ConnectionReset
                            | std::io::ErrorKind::UnexpectedEof
                    ) =>
                    {
                        Err(Error::Gone(what(self.awaiting_reply), e))
                    }
                    _ => Err(Error::Stream(format::Error::Io(e))),
                }
            }
            // The stream's end where a reply was awaited: a destination that
            // closed cleanly, saying nothing.
            Err(Error::Stream(format::Error::Truncated(what_cut)))
                if what_cut == format::REPLY_WHAT && !self.m.cancelled() =>
            {
                let eof = std::io::Error::from(std::io::ErrorKind::UnexpectedEof);
                Err(Error::Gone(what(self.awaiting_reply), eof))
            }
            other => other,
        }
    }

    fn stream(&mut self, uri: &Uri) -> Result<(), Error> {
        let started = self.m.elapsed_ms();
        let m = self.m;
        let conn = match Conn::connect(uri, &|| m.cancelled()) {
            Err(super::transport::Error::ConnectCancelled(_)) => return Err(Error::Cancelled),
            other => other?,
        };
        let connected = self.m.elapsed_ms();
        self.set_stall(&conn, PRECOPY_STALL)?;
        self.m.set_conn(conn.try_clone().ok());
        self.w = Some(PageWriter::new(Writer::start(conn)?, &self.src.mem));
        self.section(Kind::Config, &[self.src.config.as_bytes()])?;
        // READY, whole, within the stall limit of the config's end: one
        // that trickles in holds the migration no longer than silence would.
        self.writer()?.inner().set_whole_deadline(PRECOPY_STALL);
        self.expect_reply(format::REPLY_READY)?;
        self.writer()?.inner().clear_whole_deadline();
        let ready = self.m.elapsed_ms();
        self.observed = self.baseline.take().map(Baseline::begin);
        self.converge = self.m.mechanism().map(|mechanism| {
            Converge::new(
                mechanism,
                &self.src.vcpus,
                Some(self.src.dirty_limits.clone()),
                &self.m.parameters(),
            )
        });
        // Nothing is protected yet: pass 0 arms each range just before it
        // reads it (`dirty::Consumer::arm`), so that logging starts without
        // a stall and the guest's faults spread over the pass.
        let consumer = self.src.dirty.subscribe_unarmed()?;
        let setup = self.m.elapsed_ms();
        log::debug!(
            "migration setup: from {started} ms, connected at {connected} ms, destination ready at {ready} ms, logging on at {setup} ms"
        );
        self.m.update(|i| i.setup_time = Some(setup));
        self.progress = Some(progress::Period::begin(
            progress_counts(&self.src.vcpus),
            std::mem::take(&mut self.progress_before),
        ));
        self.m.set_status(Status::Active);
        let runs = match crate::memory::region(&self.src.mem) {
            Some(ram) => pages::classify(ram)?,
            None => Vec::new(),
        };
        self.send_plan(&runs)?;
        let mut dirty = self.pass_and_sync(&runs, Pass::First, &consumer)?;
        while !self.fits(&dirty) {
            dirty = self.pass_and_sync(&data_runs(&dirty), Pass::Dirty, &consumer)?;
        }
        self.stop_and_copy(dirty, consumer)
    }

    /// Sends one pass, then syncs the dirty log: the pages to send next.
    /// `runs` are the pass's pages; where the log arms by range, the first
    /// pass sends them as each range reads when armed, a range of
    /// [`dirty::protect::CHUNK_PAGES`] at a time (otherwise `runs`, taken
    /// after logging began, hold).
    fn pass_and_sync(
        &mut self,
        runs: &[(u64, u64, Backing)],
        pass: Pass,
        consumer: &dirty::Consumer,
    ) -> Result<Bitmap, Error> {
        let (t0, bytes0, pages0) = (Instant::now(), self.wire_bytes(), self.pages_sent());
        let pages = runs.iter().map(|r| r.1).sum();
        self.live = PassProgress {
            pages,
            from: (pages0, t0, bytes0),
        };
        if pass == Pass::First && consumer.arms_by_range() {
            let mut first = 0;
            while first < pages {
                let n = dirty::protect::CHUNK_PAGES.min(pages - first);
                self.send_runs(&consumer.arm(first, n)?)?;
                first += n;
            }
        } else {
            self.send_runs(runs)?;
        }
        self.end_pass(pages0)?;
        let dirty = consumer.take()?;
        let secs = t0.elapsed().as_secs_f64().max(1e-6);
        self.last_rate = (self.wire_bytes() - bytes0) as f64 / secs;
        self.pass += 1;
        let sent = self.pages_sent() - pages0;
        let r = &mut self.ram;
        r.dirty_sync_count += 1;
        r.remaining = dirty.count() * format::PAGE_SIZE;
        r.dirty_pages_rate = saturating_u64(dirty.count() as f64 / secs);
        r.mbps = self.last_rate * 8.0 / 1e6;
        r.pages_per_second = saturating_u64(sent as f64 / secs);
        let (dirtied, pass_bytes) = (
            dirty.count() * format::PAGE_SIZE,
            self.wire_bytes() - bytes0,
        );
        let params = self.m.parameters();
        if let Some(c) = self.converge.as_mut() {
            c.after_sync(dirtied, pass_bytes, &params);
        }
        let expected = self.expected_ms(dirty.count());
        log::debug!(
            "migration: pass {} sent {sent} pages in {:.0} ms ({:.1} MB/s); {} dirty at its sync, a {expected} ms stop",
            self.pass - 1,
            secs * 1e3,
            self.last_rate / 1e6,
            dirty.count()
        );
        let note = self.convergence_note(dirty.count(), expected);
        self.not_converging = note.is_some();
        self.expected = expected;
        self.prev_dirty = Some(dirty.count());
        let ram = self.ram.clone();
        let stall = self.observed.as_mut().map(|o| guest_stall(&o.stall()));
        let progress = self.guest_progress();
        self.m.update(|i| {
            i.ram = Some(ram);
            i.expected_downtime = Some(expected);
            i.x_not_converging = note;
            i.x_guest_stall = stall;
            i.x_guest_progress = progress;
            if let Some(c) = &self.converge {
                c.report(i);
            }
        });
        self.m
            .event(EventKind::MigrationPass(MigrationPass { pass: self.pass }));
        Ok(dirty)
    }

    /// Tells the destination which ranges pass 0 sends with data, so that it
    /// can back them while the pages travel (at most the section's limit;
    /// the rest is backed as it arrives).
    fn send_plan(&mut self, runs: &[(u64, u64, Backing)]) -> Result<(), Error> {
        let max = format::payload_len(Kind::Plan, format::MAX_PLAN_SECTION)?
            / size_of::<format::PlanRange>();
        let plan: Vec<u8> = runs
            .iter()
            .filter(|r| r.2 == Backing::Data)
            .take(max)
            .flat_map(|&(first, count, _)| format::PlanRange { first, count }.as_bytes().to_vec())
            .collect();
        if !plan.is_empty() {
            self.section(Kind::Plan, &[&plan])?;
        }
        Ok(())
    }

    fn end_pass(&mut self, pages_before: u64) -> Result<(), Error> {
        let record = PassRecord {
            pass: self.pass,
            pages: self.pages_sent() - pages_before,
        };
        self.section(Kind::Pass, &[record.as_bytes()])?;
        // A refusal sent mid-stream ends the migration at the pass, not
        // after the stop it would otherwise still make the guest pay.
        self.nothing_said_out_of_turn()
    }

    /// Between READY and the trailer the destination has nothing to say:
    /// a reply there is read (without waiting) and ends the migration, a
    /// refusal with its reason, anything else as out of turn.
    fn nothing_said_out_of_turn(&mut self) -> Result<(), Error> {
        let w = self.writer()?;
        let mut byte = [0u8; 1];
        let flags = rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT;
        match rustix::net::recv(&*w.inner(), &mut byte, flags) {
            Ok((0, _)) | Err(_) => return Ok(()),
            Ok(_) => {}
        }
        match w.inner().within(REPLY_WHOLE, format::read_reply) {
            Err(format::Error::Io(e)) if super::transport::past_deadline(&e).is_some() => {
                Err(Error::Refused(format!(
                    "its reply came out of turn and was not whole within {}",
                    crate::units::format_duration(REPLY_WHOLE)
                )))
            }
            Ok((format::REPLY_REFUSED, why)) => Err(Error::Refused(why)),
            Ok((code, why)) => Err(Error::OutOfTurn {
                code,
                when: "before the stream was whole",
                message: why,
            }),
            Err(e) => Err(e.into()),
        }
    }

    /// Whether to stop now: the stop, with what is left at the last pass's
    /// rate, fits the downtime limit (`wire::stop_fits`), or the round
    /// limit is reached.
    /// A stop the round limit forces where the downtime limit would not
    /// have stopped is noted (`forced_by_rounds`).
    fn fits(&mut self, dirty: &Bitmap) -> bool {
        let p = self.m.parameters();
        let fits = wire::stop_fits(self.expected, dirty.count(), p.downtime_limit);
        let rounds = p.x_max_rounds != 0 && self.pass >= p.x_max_rounds;
        self.forced_by_rounds = (rounds && !fits).then_some(p.x_max_rounds);
        fits || rounds
    }

    /// How long the stop may take, all told, from the last sync of the dirty
    /// log to COMPLETED, with `pages` to send: its silence bound `stall`
    /// (which holds the destination's RAM checksum), the source's own
    /// checksum, and [`STOP_SLACK`] times what its bytes take at the rate the
    /// last pass ran, or at `max-bandwidth` if lower.
    /// `queued`: bytes written before and still in the socket, which go first.
    fn stop_whole(&self, stall: Duration, pages: u64, queued: u64) -> Duration {
        let p = self.m.parameters();
        let mut rate = self.last_rate;
        if p.max_bandwidth > 0 {
            rate = rate.min(p.max_bandwidth as f64);
        }
        let sending = Duration::from_millis(self.stop_ms_at(pages, rate))
            + Duration::from_secs_f64(queued as f64 / rate.max(1.0));
        stall + check_ram_time(&p, self.src.memory()) + sending * STOP_SLACK
    }

    /// The stop's expected downtime with `dirty` pages left, ms.
    fn expected_ms(&self, dirty: u64) -> u64 {
        self.stop_ms_at(dirty, self.last_rate)
    }

    /// What a stop with `pages` to send takes at `rate` bytes/s, ms.
    fn stop_ms_at(&self, pages: u64, rate: f64) -> u64 {
        let vcpus = &self.src.vcpus;
        let extra = vcpus.iter().map(|v| v.state_extra_bytes()).sum();
        expected_ms(pages, vcpus.len() as u64, extra, rate)
    }

    /// Why the passes are not converging, while they are not.
    fn convergence_note(&self, dirty: u64, expected: u64) -> Option<String> {
        let limit = self.m.parameters().downtime_limit;
        let stalled = passes_stalled(self.prev_dirty, dirty, self.not_converging);
        (stalled && expected > limit).then(|| {
            let mib = |b: f64| b / 1048576.0;
            format!(
                "passes stop shrinking at {dirty} pages: during each pass the guest dirties \
                 again about as many pages as the link sends in it ({} pages/s, {:.1} MiB/s, \
                 against {:.1} MiB/s sent); a {expected} ms stop, over the {limit} ms \
                 downtime limit",
                self.ram.dirty_pages_rate,
                mib(self.ram.dirty_pages_rate as f64 * format::PAGE_SIZE as f64),
                mib(self.last_rate),
            )
        })
    }

    /// Holds the guest paused, takes the vCPUs' state, sends the last dirty
    /// pages, the state and the trailer, and waits for `completed`.
    fn stop_and_copy(&mut self, dirty: Bitmap, consumer: dirty::Consumer) -> Result<(), Error> {
        let stopped = Instant::now();
        let step = |what: &str| log::debug!("migration: {what} at {:?}", stopped.elapsed());
        match run_state(&self.src.main, RunRequest::Hold) {
            Ok(()) => self.held = true,
            // Unanswered, the hold may still be taken (requests are taken
            // in order): released as a taken one is, after it.
            Err(e @ RunStateError::NoAnswer { .. }) => {
                self.held = true;
                return Err(Error::Pause(e));
            }
            Err(e) => return Err(Error::Pause(e)),
        }
        let stall = stop_stall(&self.m.parameters(), self.src.memory());
        if let Some(w) = self.w.take() {
            let set = self.set_stall(w.get_ref(), stall);
            self.w = Some(w);
            set?;
        }
        if !crate::vcpu::wait_parked(&self.src.vcpus, PAUSE_LIMIT) {
            return Err(Error::PauseTimeout(PAUSE_LIMIT));
        }
        step("vCPUs parked");
        if let Some(p) = self.progress.as_mut() {
            p.end(progress_counts(&self.src.vcpus));
        }
        self.m.set_status(Status::Device);
        self.ram.precopy_bytes = self.wire_bytes();
        let snapshots = self.snapshots()?;
        step("vCPU state read");
        // The last look: should the migration fail from here and the guest
        // run on, what it wrote during pre-copy does not fault again.
        let mut last = consumer.finish(|w| std::mem::replace(&mut w.pages, Bitmap::new(0)))?;
        last.or(&dirty);
        step("dirty log synced");
        // From here to COMPLETED, one deadline for the whole: a destination
        // that reads or answers a byte at a time holds the paused guest no
        // longer than one that says nothing.
        let queued = self.writer()?.get_ref().unsent();
        let whole = self.stop_whole(stall, last.count(), queued);
        self.writer()?.inner().set_whole_deadline(whole);
        let pages0 = self.pages_sent();
        self.send_runs(&data_runs(&last))?;
        self.end_pass(pages0)?;
        step("last pages sent");
        if self.m.parameters().x_check_ram {
            // In the stop, before the commit: a cancel is still taken.
            let crc32 = super::digest::ram_crc32(&self.src.mem, &|| self.m.cancelled())
                .ok_or(Error::Cancelled)?;
            self.m.update(|i| i.x_ram_crc32 = Some(crc32));
            let record = format::DigestRecord { crc32, reserved: 0 };
            self.section(Kind::Digest, &[record.as_bytes()])?;
        }
        for s in &snapshots {
            let payload = device::encode(s)?;
            self.section(Kind::Vcpu, &[&payload])?;
        }
        // A destination that answered before the stream was whole (a
        // COMPLETED for a stream it did not read: it was believed, and the
        // guest stopped here for good) is refused now, and the guest runs on.
        self.nothing_said_out_of_turn()?;
        // Past here the destination may complete and run the guest: a
        // `migrate_cancel` is no longer taken (one that came first is).
        if !self.m.commit() {
            return Err(Error::Cancelled);
        }
        self.writer()?.finish()?;
        self.trailer_sent = true;
        step("trailer sent");
        self.ram.downtime_bytes = self.wire_bytes() - self.ram.precopy_bytes;
        self.ram.transferred = self.wire_bytes();
        self.ram.remaining = 0;
        self.expect_reply(format::REPLY_COMPLETED)?;
        step("destination completed");
        let downtime = crate::units::millis(stopped.elapsed());
        let ram = self.ram.clone();
        // A stop the round limit forced, over the downtime limit, says so
        // in the final record (it read as any completed migration).
        let p = self.m.parameters();
        let forced = self
            .forced_by_rounds
            .filter(|_| downtime > p.downtime_limit)
            .map(|rounds| {
                format!(
                    "the stop was forced by x-max-rounds {rounds} after {} passes: a {downtime} ms downtime, over the {} ms downtime limit",
                    self.pass, p.downtime_limit
                )
            });
        self.m.update(|i| {
            i.downtime = Some(downtime);
            i.ram = Some(ram);
            i.x_not_converging = forced;
        });
        Ok(())
    }

    /// Every vCPU's state, read by its own parked thread.
    fn snapshots(&self) -> Result<Vec<Snapshot>, Error> {
        let mut waiting = Vec::new();
        for v in &self.src.vcpus {
            if let crate::vcpu::VcpuState::Finished(how) = v.state() {
                return Err(Error::VcpuFinished(v.index, Box::new(how)));
            }
            let (tx, rx) = channel();
            v.request_snapshot(SnapshotRequest {
                msr_list: self.src.msr_list.clone(),
                reply: tx,
            });
            waiting.push((v.index, rx));
        }
        waiting
            .into_iter()
            .map(|(i, rx)| match rx.recv_timeout(PAUSE_LIMIT) {
                Ok(Ok(s)) => Ok(s),
                Ok(Err(e)) => Err(Error::Snapshot(i, e)),
                Err(_) => Err(Error::SnapshotTimeout(i, PAUSE_LIMIT)),
            })
            .collect()
    }

    /// Bounds how long a write or a reply may wait on the destination.
    fn set_stall(&mut self, conn: &Conn, stall: Duration) -> Result<(), Error> {
        self.stall = stall;
        conn.set_write_timeout(Some(stall))
            .and_then(|()| conn.set_read_timeout(Some(stall)))
            .map_err(|e| Error::Stream(format::Error::Io(e)))
    }

    fn expect_reply(&mut self, code: u32) -> Result<(), Error> {
        self.awaiting_reply = true;
        let w = self.writer()?;
        let reply = format::read_reply(w.inner());
        self.awaiting_reply = reply.is_err();
        match reply? {
            (c, _) if c == code => Ok(()),
            (format::REPLY_REFUSED, why) => Err(Error::Refused(why)),
            (c, why) => Err(Error::OutOfTurn {
                code: c,
                when: if code == format::REPLY_READY {
                    "where READY was due"
                } else {
                    "where COMPLETED was due"
                },
                message: why,
            }),
        }
    }

    /// Writes a section other than RAM, paced.
    fn section(&mut self, kind: Kind, parts: &[&[u8]]) -> Result<(), Error> {
        let w = self.w.as_mut().ok_or(Error::Cancelled)?;
        let mut ctl = Live {
            m: self.m,
            ram: &mut self.ram,
            pass: self.live,
        };
        Ok(w.section(kind, parts, &mut ctl)?)
    }

    /// Sends runs of pages through the writer, publishing the counters
    /// after each section.
    fn send_runs(&mut self, runs: &[(u64, u64, Backing)]) -> Result<(), Error> {
        let w = self.w.as_mut().ok_or(Error::Cancelled)?;
        let mut ctl = Live {
            m: self.m,
            ram: &mut self.ram,
            pass: self.live,
        };
        Ok(w.send_runs(runs, &mut ctl)?)
    }
}

/// Which pass [`Precopy::pass_and_sync`] sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// Pass 0: every page, each range armed for logging just before it is read.
    First,
    /// A later pass: the pages dirtied during the one before.
    Dirty,
}

/// What the writer asks of the migration between sections: cancel,
/// `max-bandwidth`, and the counters `query-migrate` shows as sections go.
struct Live<'p> {
    m: &'p Migration,
    ram: &'p mut RamStats,
    pass: PassProgress,
}

impl Control for Live<'_> {
    fn cancelled(&self) -> bool {
        self.m.cancelled()
    }

    fn max_bandwidth(&self) -> u64 {
        self.m.parameters().max_bandwidth
    }

    fn section_sent(&mut self, c: &Counts) {
        let r = &mut *self.ram;
        (r.normal, r.duplicate, r.normal_bytes) = (c.normal, c.duplicate, c.normal_bytes);
        r.transferred = c.bytes;
        if self.m.status().status == Some(Status::Active) {
            // All of it pre-copy so far (QEMU counts `precopy-bytes` as they go).
            r.precopy_bytes = c.bytes;
            let (pages0, t0, bytes0) = self.pass.from;
            let done = c.pages() - pages0;
            r.remaining = self.pass.pages.saturating_sub(done) * format::PAGE_SIZE;
            let secs = t0.elapsed().as_secs_f64().max(1e-6);
            r.mbps = (c.bytes - bytes0) as f64 * 8.0 / secs / 1e6;
        }
        let ram = r.clone();
        self.m.update(|i| i.ram = Some(ram));
    }
}

/// Every vCPU's progress count now, as its guest keeps it.
fn progress_counts(vcpus: &[Arc<VcpuShared>]) -> Vec<Option<u64>> {
    vcpus.iter().map(|v| v.guest_progress()).collect()
}

/// A stall as `query-migrate` reports it.
fn guest_stall(stall: &Stall) -> GuestStall {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    GuestStall {
        total_ms: ms(stall.total()),
        waited_ms: stall.total_waited().map(ms),
        vcpus: stall
            .vcpus
            .iter()
            .enumerate()
            .map(|(cpu_index, d)| VcpuStall {
                cpu_index,
                ms: ms(*d),
                waited_ms: stall.waited(cpu_index).map(ms),
            })
            .collect(),
    }
}

/// A dirty set as runs of pages to read.
fn data_runs(dirty: &Bitmap) -> Vec<(u64, u64, Backing)> {
    dirty
        .runs()
        .into_iter()
        .map(|(f, n)| (f, n, Backing::Data))
        .collect()
}

/// The stop's expected downtime, ms, were it to begin now with `pages`
/// dirty: the bytes it sends (pages, the vCPUs' state with `state_extra`
/// bytes beyond idle ones', the trailer) at `rate` bytes/s, and the costs
/// beyond the bytes, counted as the readiness model counts them (`crate::wire`).
fn expected_ms(pages: u64, vcpus: u64, state_extra: u64, rate: f64) -> u64 {
    let bytes = wire::stop_bytes(pages, vcpus, state_extra);
    wire::whole_ms(wire::stop_seconds(
        bytes,
        rate,
        vcpus,
        &wire::Costs::default(),
    ))
}

/// After a failed write: the destination's refusal, if it sent one before
/// closing (read with a short timeout).
fn read_refusal(conn: &mut Conn) -> Option<String> {
    conn.set_read_timeout(Some(REPLY_WHOLE)).ok()?;
    match conn.within(REPLY_WHOLE, format::read_reply) {
        Ok((format::REPLY_REFUSED, why)) => Some(why),
        _ => None,
    }
}

/// Whether passes have stopped shrinking: a pass that left `dirty` pages
/// after one that left `prev` shrank by less than a tenth (at that pace the
/// stop would take dozens of passes to fit). Once said (`noted`), it holds
/// until a pass halves what is left: a dirty set that wobbles by a few
/// percent from pass to pass is not said to converge and then not, pass
/// after pass.
fn passes_stalled(prev: Option<u64>, dirty: u64, noted: bool) -> bool {
    let Some(prev) = prev.filter(|&p| p > 0) else {
        return false;
    };
    let (dirty, prev) = (u128::from(dirty), u128::from(prev));
    dirty * 10 >= prev * 9 || noted && dirty * 2 > prev
}

#[cfg(test)]
#[path = "sender_tests.rs"]
mod tests;
