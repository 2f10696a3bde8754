//! The destination (`kvmscope run --incoming URI`): waits for one source,
//! checks its VM against this VMM's options, loads RAM and vCPU state, and
//! answers `completed` only once the trailer's checksum and counts agree and
//! the state is in the vCPUs; only then does the caller start the guest.
//!
//! States: `Config` (header and config; refused on a mismatch) → `Ram`
//! (RAM and pass sections) → `Device` (one section per vCPU, no more RAM)
//! → `End` (trailer checked, state restored, `completed` sent). Anything
//! else, at any point, is refused with the reason, and nothing runs here.

use std::time::{Duration, Instant};

use vm_memory::{Bytes, GuestAddress};
use zerocopy::{FromBytes, TryFromBytes};

use super::device;
use super::format::{self, ConfigRecord, Kind, PageRun, PassRecord, Reader, RunKind};
use super::handle::Migration;
use super::handshake::{self, HEADER_WAIT};
use super::inbound::{halt_of, Halt, Listener, Stop, Watched};
use super::prefetch::{populate, Prefetch};
use super::transport::{self, Uri};
use crate::backing::Backing;
use crate::dirty::{Bitmap, DirtyMode};
use crate::memory::GuestMemory;
use crate::protocol::migration::{RamStats, Status};
use crate::vcpu::snapshot::Snapshot;
use crate::vm::{Vm, VmConfig};

/// Why an incoming migration failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Listening on the URI failed.
    #[error(transparent)]
    Transport(#[from] transport::Error),
    /// No source came: the wait failed, was stopped, or a source's header was refused.
    #[error(transparent)]
    Handshake(#[from] handshake::Error),
    /// The source went silent, or the destination was told to stop.
    #[error(transparent)]
    Halted(Halt),
    /// The `migration-in` thread could not be started.
    #[error("starting the migration-in thread")]
    Spawn(#[source] std::io::Error),
    /// The stream is malformed, truncated or corrupt, or the connection failed.
    #[error("reading the stream")]
    Stream(#[from] format::Error),
    /// The reply to the source (which one) could not be sent.
    #[error("answering the source ({0})")]
    Reply(&'static str, #[source] format::Error),
    /// The stream's VM differs from an option this VMM was given.
    #[error("the stream's VM has {what} {theirs}, but this VMM was given {ours}")]
    Mismatch {
        /// What differs, as the message names it (`memory`, `vCPUs`, ...).
        what: &'static str,
        /// The stream's value, printed.
        theirs: String,
        /// This VMM's value, printed as its option.
        ours: String,
    },
    /// The stream's VM is one no VMM of this build can be (the guest ABI's bounds).
    #[error("the stream's VM has {what} {theirs}, but this VMM takes {allowed}")]
    Unsupported {
        /// What is out of bounds (`memory of`, `vCPUs:`).
        what: &'static str,
        /// The stream's value, printed.
        theirs: String,
        /// What this VMM takes, printed.
        allowed: String,
    },
    /// A vCPU section could not be decoded.
    #[error(transparent)]
    Device(#[from] device::Error),
    /// The trailer came after a number of vCPU sections other than the VM's vCPUs.
    #[error("the stream carries {got} vCPU sections for a VM of {want} vCPUs")]
    VcpuCount {
        /// vCPU sections received.
        got: usize,
        /// vCPUs in the stream's config.
        want: usize,
    },
    /// A vCPU section names an index already received or out of range.
    #[error("the stream carries vCPU {0} twice or for a VM without it")]
    VcpuIndex(u32),
    /// Writing a received page into guest RAM failed (page number given).
    #[error("writing guest RAM at page {0}")]
    Write(u64, #[source] vm_memory::GuestMemoryError),
    /// KVM refused a vCPU's received state.
    #[error("loading the vCPUs' state")]
    Restore(#[source] crate::vm::Error),
    /// The first section is not the config.
    #[error("the stream does not start with its config section (it starts with a {0} section)")]
    NoConfig(&'static str),
    /// Pass 0 ended without a run for every page (a source sends each
    /// page of pass 0 as data or in a zero run, in order).
    #[error("the stream's pass 0 gave {covered} of the VM's {pages} pages: a source sends every page in it, as data or in a zero run")]
    Pass0Short {
        /// Pages the runs of pass 0 gave.
        covered: u64,
        /// Pages of the VM.
        pages: u64,
    },
    /// A run of pass 0 starts below where the one before it ended (in
    /// another section: within one, [`format::Error::RunOrder`]).
    #[error("pass 0's run at page {first} comes after one that ends at page {after} (a source sends pass 0's pages in order)")]
    Pass0Order {
        /// Its first page.
        first: u64,
        /// One past the last page of the run before it.
        after: u64,
    },
    /// A vCPU section, the digest or the trailer came before pass 0 ended:
    /// the guest's RAM never came.
    #[error("{0} came before the stream's pass 0 ended: the guest's RAM never came")]
    NoRam(&'static str),
}

/// A load in progress: what has arrived so far.
struct Loading {
    pages: u64,
    ram: RamStats,
    /// Pages that may hold something (boot writes, earlier normal runs).
    written: Bitmap,
    snapshots: Vec<Snapshot>,
    buf: Vec<u8>,
    /// Backs pass 0's planned ranges; stopped and joined when dropped.
    prefetch: Option<Prefetch>,
    /// When the last pass section arrived (for the debug log of the stop).
    last_pass: std::time::Instant,
    /// When the stream's RAM began (for the debug log of each pass).
    started: std::time::Instant,
    /// The stream's bytes at the end of the last two pass sections: the
    /// source stopped its guest after the one before the last (the last
    /// pass is sent in the stop), so what came after that is its
    /// `downtime-bytes`.
    pass_ends: (u64, u64),
    /// The last pass section's number: passes come in ascending order.
    last_pass_number: Option<u64>,
    /// A RAM section has come (a plan must come before the first).
    ram_seen: bool,
    /// The digest has come (once, after the last RAM and before the vCPUs).
    digest_seen: bool,
    /// Pass 0's runs so far, while it lasts (`None` once its pass section
    /// has come): they go up across its sections and must give every page.
    pass0: Option<Frontier>,
}

/// How far pass 0's runs have come: the end of the last run, and the pages
/// the runs gave (every page, once pass 0 ends).
#[derive(Debug, Default)]
struct Frontier {
    after: u64,
    covered: u64,
}

impl Loading {
    /// The counters after a section, as the source counts them:
    /// `transferred`, the stream so far (`bytes`); the rates as averages
    /// over the `elapsed_ms` since the source connected; at the `end`, what
    /// came after pre-copy as `downtime-bytes`.
    fn count(&mut self, bytes: u64, elapsed_ms: u64, end: bool) {
        let r = &mut self.ram;
        r.transferred = bytes;
        let secs = elapsed_ms.max(1) as f64 / 1e3;
        r.mbps = bytes as f64 * 8.0 / secs / 1e6;
        r.pages_per_second = crate::units::saturating_u64((r.normal + r.duplicate) as f64 / secs);
        if end {
            r.downtime_bytes = bytes.saturating_sub(r.precopy_bytes);
        }
    }
}

/// What `run --incoming` was given; `None` members come from the stream.
#[derive(Debug, Clone)]
pub struct IncomingConfig {
    /// Where to listen for the one source (`--incoming`).
    pub uri: Uri,
    /// `--memory` in bytes, if given: the stream's must match.
    pub memory: Option<u64>,
    /// `--vcpus`, if given: the stream's must match.
    pub vcpus: Option<usize>,
    /// `Some(true)` when `--hugepages` was given.
    pub hugepages: Option<bool>,
    /// `--dirty-log`, if given: the stream's mode must match.
    pub dirty_log: Option<DirtyMode>,
    /// `--incoming-idle-timeout`: the source that sends nothing this long,
    /// once it has sent its header, is dropped and the migration fails.
    pub idle_timeout: Duration,
}

impl IncomingConfig {
    /// The VM to build before the stream arrives, as QEMU's `-incoming`
    /// builds its machine first: where `--memory` and `--vcpus` were both
    /// given, `base` with them, and with `--hugepages` and `--dirty-log` as
    /// given (none where not). A stream whose VM differs in what was not
    /// given gets a VM built for it (`Incoming::vm_config`).
    pub(crate) fn ahead(&self, base: &VmConfig) -> Option<VmConfig> {
        Some(VmConfig {
            memory: self.memory?,
            vcpus: self.vcpus?,
            hugepages: self.hugepages.unwrap_or(false),
            dirty_log: self.dirty_log,
            ..base.clone()
        })
    }
}

/// `--incoming-idle-timeout`'s default: far above any pause of a live
/// source (its stop-and-copy, a slow pass), short enough that a dead one is
/// noticed.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// The error a failed read carries, if a [`Watched`] read gave up: as
/// [`Error::Halted`].
fn explain(e: Error) -> Error {
    match e {
        Error::Stream(format::Error::Io(io)) => match halt_of(&io) {
            Some(halt) => Error::Halted(halt.clone()),
            None => Error::Stream(format::Error::Io(io)),
        },
        other => other,
    }
}

/// A source that connected and whose VM this VMM can take.
pub(crate) struct Incoming {
    reader: Reader<Watched>,
    config: ConfigRecord,
}

fn mode_of(c: &ConfigRecord) -> Option<DirtyMode> {
    match c.dirty_mode {
        format::DIRTY_BITMAP => Some(DirtyMode::Bitmap),
        format::DIRTY_RING => Some(DirtyMode::Ring(c.ring_entries)),
        _ => None,
    }
}

fn mode_name(m: Option<DirtyMode>) -> String {
    m.map_or("no dirty log".into(), |m| format!("dirty log {m}"))
}

/// A VM's size and tracking, as a log line names them.
pub(crate) fn describe(c: &VmConfig) -> String {
    let pages = if c.hugepages { ", huge pages" } else { "" };
    format!(
        "{}, {} vCPU(s), {}{pages}",
        crate::units::format_bytes(c.memory),
        c.vcpus,
        mode_name(c.dirty_log)
    )
}

/// Checks the stream's VM against what this VMM was given.
///
/// # Errors
/// `Mismatch` naming the first difference and both values.
pub(crate) fn check(c: &ConfigRecord, given: &IncomingConfig) -> Result<(), Error> {
    let differ = |what, theirs: String, ours: String| Error::Mismatch { what, theirs, ours };
    let undefined = |what, value: u32| {
        Error::Stream(format::Error::Field {
            what,
            value: value.into(),
        })
    };
    if ![format::DIRTY_NONE, format::DIRTY_BITMAP, format::DIRTY_RING].contains(&c.dirty_mode) {
        return Err(undefined("dirty_mode", c.dirty_mode));
    }
    if c.hugepages > 1 {
        return Err(undefined("hugepages", c.hugepages));
    }
    if u64::from(c.page_size) != format::PAGE_SIZE {
        return Err(differ(
            "page size",
            c.page_size.to_string(),
            format::PAGE_SIZE.to_string(),
        ));
    }
    if c.guest_abi != crate::abi::ABI_VERSION {
        return Err(differ(
            "guest ABI",
            c.guest_abi.to_string(),
            crate::abi::ABI_VERSION.to_string(),
        ));
    }
    if let Some(m) = given.memory.filter(|&m| m != c.memory) {
        return Err(differ(
            "memory of",
            format!(
                "{} ({} bytes)",
                crate::units::format_bytes(c.memory),
                c.memory
            ),
            format!("--memory {} ({m} bytes)", crate::units::format_bytes(m)),
        ));
    }
    if let Some(v) = given.vcpus.filter(|&v| v as u64 != u64::from(c.vcpus)) {
        return Err(differ(
            "vCPUs:",
            c.vcpus.to_string(),
            format!("--vcpus {v}"),
        ));
    }
    if given.hugepages == Some(true) && c.hugepages == 0 {
        return Err(differ(
            "RAM",
            "without huge pages".into(),
            "--hugepages".into(),
        ));
    }
    if let Some(d) = given.dirty_log.filter(|&d| Some(d) != mode_of(c)) {
        return Err(differ(
            "dirty tracking:",
            mode_name(mode_of(c)),
            format!("--dirty-log {d}"),
        ));
    }
    if c.vcpus == 0 || u64::from(c.vcpus) > crate::abi::MAX_VCPUS {
        return Err(Error::Unsupported {
            what: "vCPUs:",
            theirs: c.vcpus.to_string(),
            allowed: format!("1 to {} (the guest ABI)", crate::abi::MAX_VCPUS),
        });
    }
    crate::memory::check_size(c.memory).map_err(|e| Error::Unsupported {
        what: "memory of",
        theirs: format!("{} bytes", c.memory),
        allowed: format!("what the guest ABI allows ({e})"),
    })
}

/// The config section, which must come first, checked against `given`.
fn read_config(
    reader: &mut Reader<Watched>,
    given: &IncomingConfig,
) -> Result<ConfigRecord, Error> {
    let (kind, len) = reader.section()?;
    if kind != Kind::Config {
        return Err(Error::NoConfig(kind.name()));
    }
    format::expect_len(kind, len, size_of::<ConfigRecord>() as u64)?;
    let config: ConfigRecord = reader.read_obj("the config section")?;
    check(&config, given)?;
    Ok(config)
}

impl Incoming {
    /// Listens at the URI, takes one source ([`handshake`]), reads and
    /// checks its VM: the config must follow the header within
    /// [`HEADER_WAIT`]. A mismatch is told to the source and returned.
    /// `stop` ends the wait (a termination signal).
    ///
    /// # Errors
    /// The connection, the stream's start, a mismatch, or `stop`.
    pub(crate) fn accept(
        given: &IncomingConfig,
        m: &Migration,
        stop: &Stop,
    ) -> Result<Incoming, Error> {
        let listener = Listener::bind(&given.uri)?;
        m.set_incoming(&given.uri);
        log::info!("waiting for a migration stream on {}", given.uri);
        let (conn, header) = handshake::wait(&listener, &given.uri.to_string(), stop)?;
        m.stream_began();
        drop(listener);
        let watched = Watched::new(conn, header.bytes(), given.idle_timeout, stop.clone())
            .map_err(format::Error::Io)?;
        let mut reader = Reader::start(watched)?;
        reader
            .inner()
            .set_deadline(Instant::now(), HEADER_WAIT, "its config");
        match read_config(&mut reader, given) {
            Ok(config) => {
                reader.inner().clear_deadline();
                log::debug!(
                    "migration stream: header and config read at {} ms",
                    m.elapsed_ms()
                );
                Ok(Incoming { reader, config })
            }
            Err(e) => {
                let e = explain(e);
                let _ = format::write_reply(
                    reader.inner(),
                    format::REPLY_REFUSED,
                    &crate::error_chain(&e),
                );
                Err(e)
            }
        }
    }

    /// The VM to build: `base` with the stream's size, vCPUs, huge pages and dirty mode.
    pub(crate) fn vm_config(&self, base: &VmConfig) -> VmConfig {
        VmConfig {
            memory: self.config.memory,
            vcpus: self.config.vcpus as usize,
            hugepages: self.config.hugepages != 0,
            dirty_log: mode_of(&self.config),
            ..base.clone()
        }
    }

    /// Tells the source why this VMM cannot take its guest.
    pub(crate) fn refuse(mut self, why: &dyn std::error::Error) {
        let _ = format::write_reply(
            self.reader.inner(),
            format::REPLY_REFUSED,
            &crate::error_chain(why),
        );
    }

    /// Reads the stream into `mem` (the RAM of a VM built from
    /// [`vm_config`](Incoming::vm_config), not started): the vCPUs' states,
    /// for [`finish`](Incoming::finish). Runs on the `migration-in` thread
    /// ([`watch::load`](super::watch::load)).
    ///
    /// # Errors
    /// A malformed or corrupt stream, a silent source, or a stop.
    pub(crate) fn receive(
        &mut self,
        mem: &GuestMemory,
        m: &Migration,
    ) -> Result<Vec<Snapshot>, Error> {
        self.receive_inner(mem, m).map_err(explain)
    }

    /// Puts the received state in `vm`'s vCPUs and tells the source it is
    /// done; on an error (or a stop asked for meanwhile) the source is told
    /// why, keeps its guest, and nothing of `vm` must run.
    ///
    /// # Errors
    /// What [`receive`](Incoming::receive) returned, a state KVM refuses, or a stop.
    pub(crate) fn finish(
        mut self,
        vm: &mut Vm,
        m: &Migration,
        received: Result<Vec<Snapshot>, Error>,
    ) -> Result<(), Error> {
        let result = match (received, m.incoming_stop()) {
            (_, Some(why)) => Err(Error::Halted(Halt::Stopped(why))),
            (Ok(snapshots), None) => self.restore(vm, snapshots),
            (Err(e), None) => Err(e),
        };
        let (code, message) = match &result {
            Ok(()) => (format::REPLY_COMPLETED, String::new()),
            Err(e) => (format::REPLY_REFUSED, crate::error_chain(e)),
        };
        let sent = format::write_reply(self.reader.inner(), code, &message);
        match (result, sent) {
            (Ok(()), Ok(())) => {
                let total = m.elapsed_ms();
                m.update(|i| i.total_time = Some(total));
                m.set_status(Status::Completed);
                Ok(())
            }
            (Ok(()), Err(e)) => Err(Self::failed(m, Error::Reply("completed", e))),
            (Err(e), _) => Err(Self::failed(m, e)),
        }
    }

    fn failed(m: &Migration, e: Error) -> Error {
        m.update(|i| i.error_desc = Some(crate::error_chain(&e)));
        m.set_status(Status::Failed);
        e
    }

    fn receive_inner(&mut self, mem: &GuestMemory, m: &Migration) -> Result<Vec<Snapshot>, Error> {
        format::write_reply(self.reader.inner(), format::REPLY_READY, "")
            .map_err(|e| Error::Reply("ready", e))?;
        let setup = m.elapsed_ms();
        m.update(|i| i.setup_time = Some(setup));
        log::debug!("migration stream: ready (VM built) at {setup} ms");
        m.set_status(Status::Active);
        let pages = self.config.memory / format::PAGE_SIZE;
        let mut l = Loading {
            pages,
            ram: RamStats {
                total: self.config.memory,
                page_size: format::PAGE_SIZE,
                ..RamStats::default()
            },
            written: Bitmap::new(pages),
            snapshots: Vec::new(),
            buf: Vec::new(),
            prefetch: None,
            last_pass: Instant::now(),
            started: Instant::now(),
            pass_ends: (0, 0),
            last_pass_number: None,
            ram_seen: false,
            digest_seen: false,
            pass0: Some(Frontier::default()),
        };
        // A zero run must clear what this VMM wrote before the stream (boot
        // structures, mailboxes): the pages backed now, present or swapped out
        // (the page map, as the source reads it; mincore would miss a page
        // swapped out). The rest read as zero already, and writing zeros there
        // would only fault memory in (2,000 faults in the stop's path for a
        // 512 MiB guest). Without the page map, everything below the arena,
        // where boot writes go.
        match crate::memory::region(mem).map(|r| crate::backing::classify(r)) {
            Some(Ok(runs)) => runs
                .iter()
                .filter(|(_, _, b)| *b == Backing::Data)
                .for_each(|&(first, count, _)| {
                    (first..first + count).for_each(|p| l.written.set(p))
                }),
            _ => (0..crate::abi::ARENA_BASE / format::PAGE_SIZE).for_each(|p| l.written.set(p)),
        }
        loop {
            let (kind, len) = self.reader.section()?;
            let end = kind == Kind::End;
            if end {
                if l.pass0.is_some() {
                    return Err(Error::NoRam("the trailer"));
                }
                self.reader.finish(len)?;
            } else {
                self.load_section(kind, len, mem, m, &mut l)?;
            }
            l.count(self.reader.bytes, m.elapsed_ms(), end);
            let r = l.ram.clone();
            m.update(|i| i.ram = Some(r));
            if end {
                break;
            }
        }
        log::debug!(
            "migration: trailer checked {:?} after the last pass",
            l.last_pass.elapsed()
        );
        // Every page came as data or as a zero run (pass 0 covers them all):
        // what is left set holds data (a popcount: microseconds, in the stop).
        m.set_loaded_pages(l.written.count());
        Ok(std::mem::take(&mut l.snapshots))
    }

    /// One section of the `Ram` and `Device` states (module docs).
    fn load_section(
        &mut self,
        kind: Kind,
        len: u64,
        mem: &GuestMemory,
        m: &Migration,
        l: &mut Loading,
    ) -> Result<(), Error> {
        match kind {
            Kind::Ram if l.snapshots.is_empty() && !l.digest_seen => {
                l.ram_seen = true;
                l.buf.resize(format::payload_len(kind, len)?, 0);
                self.reader.read_exact(&mut l.buf, "a RAM section")?;
                let normal = l.ram.normal;
                let end = load_ram(
                    &l.buf,
                    mem,
                    l.pages,
                    &mut l.written,
                    &mut l.ram,
                    l.pass0.as_mut(),
                )?;
                if let Some(p) = &l.prefetch {
                    p.loaded(end, l.ram.normal - normal);
                }
            }
            // Before pass 0's record, so before any vCPU section or digest.
            Kind::Plan if l.prefetch.is_none() && !l.ram_seen && l.last_pass_number.is_none() => {
                l.buf.resize(format::payload_len(kind, len)?, 0);
                self.reader.read_exact(&mut l.buf, "the plan")?;
                l.prefetch = Some(Prefetch::start(mem, plan(&l.buf, l.pages)?));
            }
            Kind::Pass => {
                format::expect_len(kind, len, size_of::<PassRecord>() as u64)?;
                let record: PassRecord = self.reader.read_obj("a pass section")?;
                if let Some(last) = l.last_pass_number.filter(|&last| record.pass <= last) {
                    return Err(format::Error::PassOrder {
                        pass: record.pass,
                        last,
                    }
                    .into());
                }
                l.last_pass_number = Some(record.pass);
                if let Some(f) = l.pass0.take().filter(|f| f.covered != l.pages) {
                    return Err(Error::Pass0Short {
                        covered: f.covered,
                        pages: l.pages,
                    });
                }
                // Every planned page has arrived: what the prefetch has not
                // backed yet came as zero runs, which need no memory; left
                // running, it would only compete with the passes and the stop.
                if let Some(p) = &l.prefetch {
                    p.stop();
                }
                // The source syncs its log once before each pass after the
                // first: its `dirty-sync-count` is the pass's number.
                l.ram.dirty_sync_count = record.pass;
                l.pass_ends = (l.pass_ends.1, self.reader.bytes);
                l.last_pass = std::time::Instant::now();
                log::debug!(
                    "migration: pass {} loaded {:?} after the stream began",
                    record.pass,
                    l.started.elapsed()
                );
            }
            Kind::Vcpu if l.pass0.is_some() => return Err(Error::NoRam("a vCPU section")),
            Kind::Digest if l.pass0.is_some() => return Err(Error::NoRam("the RAM digest")),
            Kind::Vcpu => {
                if l.snapshots.is_empty() {
                    m.set_status(Status::Device);
                    l.ram.precopy_bytes = l.pass_ends.0;
                }
                l.buf.resize(format::payload_len(kind, len)?, 0);
                self.reader.read_exact(&mut l.buf, "a vCPU section")?;
                let snapshot = device::decode(&l.buf)?;
                // Refused as it comes, not at the trailer: each is up to
                // 4 MiB held until the restore.
                let index = snapshot.index;
                if index >= self.config.vcpus as usize
                    || l.snapshots.iter().any(|s| s.index == index)
                {
                    return Err(Error::VcpuIndex(u32::try_from(index).unwrap_or(u32::MAX)));
                }
                l.snapshots.push(snapshot);
            }
            Kind::Digest if !l.digest_seen && l.snapshots.is_empty() => {
                l.digest_seen = true;
                format::expect_len(kind, len, size_of::<format::DigestRecord>() as u64)?;
                let d: format::DigestRecord = self.reader.read_obj("the RAM digest")?;
                // Seconds for a big guest: a stop asked for meanwhile ends it.
                let stop = self.reader.inner().stop();
                let ours = super::digest::ram_crc32(mem, &|| stop().is_some())
                    .ok_or_else(|| Error::Halted(Halt::Stopped(stop().unwrap_or_default())))?;
                m.update(|i| i.x_ram_crc32 = Some(ours));
                if ours != d.crc32 {
                    let e = format::Error::Digest {
                        theirs: d.crc32,
                        ours,
                    };
                    return Err(e.into());
                }
            }
            other => return Err(format::Error::Order(other.name()).into()),
        }
        Ok(())
    }

    fn restore(&self, vm: &mut Vm, mut snapshots: Vec<Snapshot>) -> Result<(), Error> {
        let started = Instant::now();
        let want = vm.config.vcpus;
        if snapshots.len() != want {
            return Err(Error::VcpuCount {
                got: snapshots.len(),
                want,
            });
        }
        snapshots.sort_by_key(|s| s.index);
        for (i, s) in snapshots.iter().enumerate() {
            if s.index != i {
                return Err(Error::VcpuIndex(u32::try_from(s.index).unwrap_or(u32::MAX)));
            }
        }
        let restored = vm.restore_vcpus(&snapshots).map_err(Error::Restore);
        log::debug!("migration: vCPU state loaded in {:?}", started.elapsed());
        restored
    }
}

/// The runs of a RAM section, checked: each inside `pages` pages of RAM, a
/// count above zero, a known kind, and a normal run's bytes all there.
///
/// # Errors
/// The first run that breaks a rule.
pub(crate) fn runs(payload: &[u8], pages: u64) -> Result<Vec<(PageRun, &[u8])>, format::Error> {
    let mut out = Vec::new();
    let mut b = payload;
    // Runs go up within a section, as a source writes them: so a section's
    // runs cover each page once, and the zero runs' work is bounded by RAM.
    let mut after = 0;
    while !b.is_empty() {
        let Some(head) = b.get(..size_of::<PageRun>()) else {
            return Err(format::Error::Length {
                what: "RAM",
                len: payload.len() as u64,
                need: payload.len() as u64 + size_of::<PageRun>() as u64,
            });
        };
        // A run's header is whole here: only its kind can be invalid.
        let run = PageRun::try_read_from_bytes(head).map_err(|_| {
            format::Error::RunKind(u32::from_ne_bytes([head[12], head[13], head[14], head[15]]))
        })?;
        let rest = &b[size_of::<PageRun>()..];
        b = rest;
        let end = run.first.checked_add(u64::from(run.count));
        if run.count == 0 {
            return Err(format::Error::EmptyRun(run.first));
        }
        if end.is_none_or(|e| e > pages) {
            return Err(format::Error::PageRange {
                first: run.first,
                end: end.unwrap_or(u64::MAX),
                pages,
            });
        }
        if run.first < after {
            return Err(format::Error::RunOrder {
                first: run.first,
                after,
            });
        }
        after = end.unwrap_or(u64::MAX);
        let data = match run.kind {
            RunKind::Zero => &b[..0],
            RunKind::Normal => {
                let bytes = usize::try_from(u64::from(run.count) * format::PAGE_SIZE)
                    .ok()
                    .filter(|&n| n <= b.len())
                    // The section is whole (its length was read): the run
                    // claims more than it holds.
                    .ok_or(format::Error::Length {
                        what: "RAM",
                        len: payload.len() as u64,
                        need: (payload.len() - b.len()) as u64
                            + u64::from(run.count) * format::PAGE_SIZE,
                    })?;
                let (data, rest) = b.split_at(bytes);
                b = rest;
                data
            }
        };
        out.push((run, data));
    }
    Ok(out)
}

/// Writes one RAM section's runs into guest RAM. Zero runs write only pages
/// that may hold something (`written`); RAM nothing wrote is zero already.
/// Returns one past the section's last page.
fn load_ram(
    payload: &[u8],
    mem: &GuestMemory,
    pages: u64,
    written: &mut Bitmap,
    ram: &mut RamStats,
    mut pass0: Option<&mut Frontier>,
) -> Result<u64, Error> {
    let zero = [0u8; format::PAGE_BYTES];
    let mut end = 0;
    for (run, data) in runs(payload, pages)? {
        let range = run.first..run.first + u64::from(run.count);
        end = range.end;
        // Pass 0's runs go up across its sections too, so that what they
        // give adds up to every page only where each came.
        if let Some(f) = pass0.as_deref_mut() {
            if run.first < f.after {
                return Err(Error::Pass0Order {
                    first: run.first,
                    after: f.after,
                });
            }
            f.after = range.end;
            f.covered += u64::from(run.count);
        }
        if run.kind == RunKind::Zero {
            for p in written.iter_range(range.start, range.end) {
                write_page(mem, p, &zero)?;
            }
            // Zero now: a later zero run over them writes nothing (each page
            // is written over once for each time data came for it).
            written.unset_run(range.start, u64::from(run.count));
            ram.duplicate += u64::from(run.count);
            continue;
        }
        populate(mem, run.first, data.len() as u64);
        mem.write_slice(data, GuestAddress(run.first * format::PAGE_SIZE))
            .map_err(|e| Error::Write(run.first, e))?;
        range.for_each(|p| written.set(p));
        ram.normal += u64::from(run.count);
        ram.normal_bytes += data.len() as u64;
    }
    Ok(end)
}

/// The ranges of a plan section, each checked to lie inside `pages` pages.
///
/// # Errors
/// A length that is not a whole number of ranges, or a range outside RAM.
pub(crate) fn plan(payload: &[u8], pages: u64) -> Result<Vec<format::PlanRange>, format::Error> {
    let ranges =
        <[format::PlanRange]>::ref_from_bytes(payload).map_err(|_| format::Error::Length {
            what: "plan",
            len: payload.len() as u64,
            need: payload.len() as u64 / 16 * 16,
        })?;
    for r in ranges {
        let end = r.first.checked_add(r.count);
        if end.is_none_or(|e| e > pages) {
            return Err(format::Error::PageRange {
                first: r.first,
                end: end.unwrap_or(u64::MAX),
                pages,
            });
        }
    }
    Ok(ranges.to_vec())
}

fn write_page(mem: &GuestMemory, page: u64, bytes: &[u8]) -> Result<(), Error> {
    mem.write_slice(bytes, GuestAddress(page * format::PAGE_SIZE))
        .map_err(|e| Error::Write(page, e))
}

#[cfg(test)]
#[path = "receiver_tests.rs"]
mod tests;
