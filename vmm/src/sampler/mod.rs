//! The in-process sampler: a `sampler` thread that records mapped guest pages
//! and exit counts over time, cheaply enough to run all the time.
//!
//! It opens its own stats fds (VM and every vCPU) once, and per tick does one
//! `pread` per fd and reads our lock-free counters: it never interrupts a vCPU.
//! Points go into a bounded ring (memory stays flat however long the VM runs),
//! to an export file as they are taken, and to whoever waits for new ones.

pub mod export;
pub mod record;
pub(crate) mod ring;

use std::fs::File;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kvm_stats::{Sample, StatId, StatType, StatsFd};
use serde_json::value::RawValue;

use crate::backend::{self, Backend};
use crate::exits::Reason;
use crate::protocol::samples::{SamplesPage, Subscribed};
use crate::vcpu::VcpuShared;
pub(crate) use record::{Point, SeriesHeader, VcpuPoint};
pub(crate) use ring::Ring;

/// Most points a ring may hold (about 64 B plus 8 B per counter each, so well
/// under a GiB even with many vCPUs).
pub const MAX_CAPACITY: usize = 1_000_000;

/// Shortest interval between ticks (the smallest `--sample-interval` parses to).
pub(crate) const MIN_INTERVAL: Duration = crate::units::Interval::MIN;

/// The VM a sampler records, as its series header names it.
#[derive(Debug, Clone)]
pub struct SampledVm {
    /// The VM's name (`kvmscope run --name`).
    pub name: String,
    /// Guest RAM, bytes.
    pub memory: u64,
}

/// How the sampler runs.
#[derive(Debug, Clone)]
pub struct SamplerConfig {
    /// Time between ticks, at least [`MIN_INTERVAL`].
    pub interval: Duration,
    /// Points kept in the ring.
    pub capacity: usize,
    /// Where to write the series as it is taken (.csv or JSON lines); see
    /// `Sampler::commit_export`.
    pub out: Option<export::Destination>,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            interval: Duration::from_millis(100),
            capacity: 4096,
            out: None,
        }
    }
}

/// Why the sampler could not start or went wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The interval is below [`MIN_INTERVAL`].
    #[error("sample interval {0:?} is below the 1 ms minimum")]
    IntervalTooShort(Duration),
    /// The ring capacity is outside 2 to [`MAX_CAPACITY`].
    #[error("the sample ring holds from 2 to {MAX_CAPACITY} points, not {0}")]
    Capacity(usize),
    /// A stats fd could not be opened.
    #[error("opening a stats fd for the sampler")]
    StatsFd(#[from] kvm_stats::ioctl::Error),
    /// A stats fd could not be read.
    #[error("reading a stats fd")]
    Stats(#[from] kvm_stats::Error),
    /// The samples file could not be written.
    #[error(transparent)]
    Export(#[from] export::Error),
    /// The thread could not be started.
    #[error("starting the sampler thread")]
    Spawn(#[source] std::io::Error),
}

/// What the sampler shares with readers (the control socket, metrics, tests).
pub struct Shared {
    /// What the series is about (written first to every export).
    pub(crate) header: SeriesHeader,
    /// The KVM backend, for readers that label the stats.
    pub(crate) backend: Backend,
    ring: Mutex<Ring>,
    /// Signalled after every tick, and on stop.
    pub(crate) ticked: Condvar,
    /// The latest raw samples, for the metrics page: VM first, then vCPUs.
    latest: Mutex<Vec<Sample>>,
    /// The stats schemas, in the same order as `latest`.
    pub(crate) sources: Vec<StatsFd>,
    stop: Mutex<bool>,
    wake: Condvar,
    /// Written after every tick when set: how the control thread learns of new
    /// points without polling (for `subscribe-samples`).
    pub(crate) tick_fd: std::sync::OnceLock<Arc<vmm_sys_util::eventfd::EventFd>>,
    /// Nanoseconds the most recent tick took (reads, point, export, ring).
    pub last_tick_ns: std::sync::atomic::AtomicU64,
    /// The vCPUs' shared parts, for the figures the metrics page reads off
    /// them (the guest's stall).
    pub(crate) vcpus: Vec<Arc<VcpuShared>>,
}

impl Shared {
    fn ring(&self) -> MutexGuard<'_, Ring> {
        crate::lock(&self.ring)
    }

    /// Points with a sequence number above `since`, oldest first, and how many
    /// such points were already dropped from the ring.
    pub fn since(&self, since: u64) -> (Vec<Point>, u64) {
        self.ring().since(since)
    }

    /// A page of points after `since` (see [`ring::Ring::page`]).
    pub(crate) fn page(&self, since: u64, max: usize, newest: bool) -> ring::Page {
        self.ring().page(since, max, newest)
    }

    /// `query-samples`' return for `page`, serialized point by point and cut
    /// at `max_bytes` of points (at least one): the oldest are kept and `more`
    /// set, or with `newest` the newest are kept and the rest count as dropped.
    ///
    /// # Errors
    /// A point could not be serialized.
    pub(crate) fn page_reply(
        &self,
        page: ring::Page,
        max_bytes: usize,
        newest: bool,
    ) -> Result<Box<RawValue>, serde_json::Error> {
        let mut samples = Vec::new();
        let mut bytes = 0usize;
        let order: Box<dyn Iterator<Item = &Point>> = if newest {
            Box::new(page.points.iter().rev())
        } else {
            Box::new(page.points.iter())
        };
        for p in order {
            let raw = serde_json::value::to_raw_value(&p.to_record(&self.header))?;
            bytes = bytes.saturating_add(raw.get().len() + 1);
            if !samples.is_empty() && bytes > max_bytes {
                break;
            }
            samples.push(raw);
        }
        let cut = (page.points.len() - samples.len()) as u64;
        let (dropped, more) = if newest {
            samples.reverse();
            (page.dropped + cut, page.more)
        } else {
            (page.dropped, page.more || cut > 0)
        };
        serde_json::value::to_raw_value(&SamplesPage {
            header: self.header.to_record(),
            samples,
            dropped,
            more,
            last_seq: self.last_seq(),
        })
    }

    /// `subscribe-samples`' return ([`Subscribed`]) for events after `since`, serialized.
    pub(crate) fn subscribed(&self, since: u64) -> serde_json::Value {
        let reply = Subscribed {
            since,
            header: self.header.to_record(),
        };
        serde_json::to_value(reply).unwrap_or_default()
    }

    /// The newest point's sequence number (0 before the first tick).
    pub fn last_seq(&self) -> u64 {
        self.ring().last_seq()
    }

    /// Waits until a point newer than `seq` exists, the sampler stops, or `timeout`.
    pub fn wait_after(&self, seq: u64, timeout: Duration) -> bool {
        let ring = self.ring();
        let ring = crate::wait_while(&self.ticked, ring, timeout, |r| {
            r.last_seq() <= seq && !r.stopped
        });
        ring.last_seq() > seq
    }

    /// Calls `f` with the latest raw samples (VM first, then vCPUs) and their sources.
    pub(crate) fn with_latest<T>(&self, f: impl FnOnce(&[StatsFd], &[Sample]) -> T) -> T {
        let latest = crate::lock(&self.latest);
        f(&self.sources, &latest)
    }
}

/// The running sampler; dropping it stops the thread (the export is flushed).
pub struct Sampler {
    /// What readers see; it outlives the thread.
    pub shared: Arc<Shared>,
    thread: Option<JoinHandle<Result<(), Error>>>,
    /// The export until it is committed.
    staged: Option<export::Staged>,
}

/// Column plan: which stats each tick reads, resolved once.
struct Plan {
    pages: [Option<StatId>; 3],
    kvm: Vec<StatId>,
    exits: Option<StatId>,
}

fn plan(vm: &StatsFd, vcpu: Option<&StatsFd>) -> (Plan, Vec<String>) {
    let find = |n| vm.schema().find(n);
    let mut names = Vec::new();
    let mut kvm = Vec::new();
    let mut exits = None;
    if let Some(v) = vcpu {
        for (id, d) in v.schema().iter() {
            if d.kind == StatType::Cumulative && d.size == 1 {
                if d.name == "exits" {
                    exits = Some(id);
                }
                names.push(d.name.clone());
                kvm.push(id);
            }
        }
    }
    (
        Plan {
            pages: [find("pages_4k"), find("pages_2m"), find("pages_1g")],
            kvm,
            exits,
        },
        names,
    )
}

impl Sampler {
    /// Opens the sampler's own stats fds from `vm_fd` and `vcpu_fds` and starts
    /// the `sampler` thread.
    ///
    /// # Errors
    /// A bad config, an fd that cannot be opened or read, or the export file.
    pub fn start(
        config: SamplerConfig,
        vm_fd: &File,
        vcpu_fds: &[File],
        vcpus: Vec<Arc<VcpuShared>>,
        vm: SampledVm,
    ) -> Result<Sampler, Error> {
        if config.interval < MIN_INTERVAL {
            return Err(Error::IntervalTooShort(config.interval));
        }
        if !(2..=MAX_CAPACITY).contains(&config.capacity) {
            return Err(Error::Capacity(config.capacity));
        }
        let mut sources = vec![StatsFd::new(kvm_stats::ioctl::get_stats_fd(vm_fd)?)?];
        for fd in vcpu_fds {
            sources.push(StatsFd::new(kvm_stats::ioctl::get_stats_fd(fd)?)?);
        }
        let (plan, kvm_names) = plan(&sources[0], sources.get(1));
        let backend = backend::detect();
        let header = SeriesHeader {
            version: 1,
            name: vm.name,
            backend: backend.to_json(),
            quiet_stats: backend::quiet_stats(&backend)
                .iter()
                .map(|s| s.to_string())
                .collect(),
            vcpus: vcpus.len(),
            memory: vm.memory,
            interval_ms: config.interval.as_secs_f64() * 1e3,
            kvm_stats: kvm_names,
        };
        let (writer, staged) = match &config.out {
            Some(dest) => {
                let (w, s) = export::Writer::create(dest, &header)?;
                (Some(w), Some(s))
            }
            None => (None, None),
        };
        let latest = sources.iter().map(StatsFd::new_sample).collect();
        let shared = Arc::new(Shared {
            header,
            backend,
            ring: Mutex::new(Ring::new(config.capacity)),
            ticked: Condvar::new(),
            latest: Mutex::new(latest),
            sources,
            stop: Mutex::new(false),
            wake: Condvar::new(),
            last_tick_ns: Default::default(),
            tick_fd: std::sync::OnceLock::new(),
            vcpus: vcpus.clone(),
        });
        let worker = Worker::new(shared.clone(), vcpus, plan, writer, config.interval);
        let thread = std::thread::Builder::new()
            .name("sampler".into())
            .spawn(move || worker.run())
            .map_err(Error::Spawn)?;
        Ok(Sampler {
            shared,
            thread: Some(thread),
            staged,
        })
    }

    /// Moves the export into place. Until then the series is written under a
    /// temporary name next to it, and a sampler dropped first leaves any old
    /// file there untouched: call this once the rest of start-up has passed.
    ///
    /// # Errors
    /// The rename failed.
    pub fn commit_export(&mut self) -> Result<(), Error> {
        match self.staged.as_mut() {
            Some(s) => Ok(s.commit()?),
            None => Ok(()),
        }
    }

    /// Stops the thread; returns what ended it if it failed.
    pub fn stop(&mut self) -> Result<(), Error> {
        *crate::lock(&self.shared.stop) = true;
        self.shared.wake.notify_all();
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(result)) => result,
            Some(Err(_)) => Ok(()),
            None => Ok(()),
        }
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            log::warn!("sampler: {e}");
        }
    }
}

/// A vCPU's running totals at a tick, for rates at the next: KVM's
/// `exits`, our exits, the guest's progress.
type Totals = (u64, u64, u64);

/// The thread's side.
struct Worker {
    shared: Arc<Shared>,
    vcpus: Vec<Arc<VcpuShared>>,
    plan: Plan,
    writer: Option<export::Writer>,
    interval: Duration,
    samples: Vec<Sample>,
    prev: Option<(Instant, Vec<Totals>)>,
    started: Instant,
}

impl Worker {
    fn new(
        shared: Arc<Shared>,
        vcpus: Vec<Arc<VcpuShared>>,
        plan: Plan,
        writer: Option<export::Writer>,
        interval: Duration,
    ) -> Self {
        let samples = shared.sources.iter().map(StatsFd::new_sample).collect();
        Worker {
            shared,
            vcpus,
            plan,
            writer,
            interval,
            samples,
            prev: None,
            started: Instant::now(),
        }
    }

    fn run(mut self) -> Result<(), Error> {
        let mut next = Instant::now();
        let result = loop {
            if let Err(e) = self.tick() {
                break Err(e);
            }
            next += self.interval;
            let now = Instant::now();
            if next < now {
                // Behind (a slow disk, a loaded host): skip the missed ticks.
                next = now + self.interval;
            }
            if self.sleep_until(next) {
                // One more at the stop: the series ends with the state the
                // VM stopped in, not at the tick before (a command that ended
                // between them was missing from the last point).
                break self.tick();
            }
        };
        self.shared.ring().stopped = true;
        self.shared.ticked.notify_all();
        let flushed = self
            .writer
            .as_mut()
            .map_or(Ok(()), export::Writer::flush)
            .map_err(Error::from);
        result.and(flushed)
    }

    /// Sleeps until `deadline`; true if told to stop.
    fn sleep_until(&self, deadline: Instant) -> bool {
        let stop = crate::lock(&self.shared.stop);
        let left = deadline.saturating_duration_since(Instant::now());
        let stop = crate::wait_while(&self.shared.wake, stop, left, |s| !*s);
        *stop
    }

    fn tick(&mut self) -> Result<(), Error> {
        let t0 = Instant::now();
        for (fd, sample) in self.shared.sources.iter().zip(self.samples.iter_mut()) {
            fd.read_sample(sample)?;
        }
        self.shared
            .last_tick_ns
            .store(elapsed_ns(t0), Ordering::Relaxed);
        let now = self.samples[0].timestamp();
        let mut point = self.shared.ring().recycle();
        self.fill(&mut point, now);
        if let Some(w) = self.writer.as_mut() {
            w.write(&self.shared.header, &point)?;
        }
        // The raw samples before the point: a reader that sees the new point
        // (the metrics page caches per point) also sees the samples it came from.
        let mut latest = crate::lock(&self.shared.latest);
        for (dst, src) in latest.iter_mut().zip(&self.samples) {
            dst.copy_from(src);
        }
        drop(latest);
        self.shared.ring().push(point);
        if let Some(fd) = self.shared.tick_fd.get() {
            // Fails only if the counter would overflow: it is already set.
            let _ = fd.write(1);
        }
        self.shared.ticked.notify_all();
        self.shared
            .last_tick_ns
            .store(elapsed_ns(t0), Ordering::Relaxed);
        Ok(())
    }

    /// Fills a (recycled) point from the samples just read.
    fn fill(&mut self, p: &mut Point, now: Instant) {
        let vm = &self.samples[0];
        let page = |id: Option<StatId>| id.map_or(0, |id| vm.u64(id));
        p.time_s = now.saturating_duration_since(self.started).as_secs_f64();
        (p.pages_4k, p.pages_2m, p.pages_1g) = (
            page(self.plan.pages[0]),
            page(self.plan.pages[1]),
            page(self.plan.pages[2]),
        );
        p.vcpus.resize_with(self.vcpus.len(), VcpuPoint::default);
        let dt = self
            .prev
            .as_ref()
            .map(|(t, _)| now.saturating_duration_since(*t).as_secs_f64());
        let prev = self.prev.take().map(|(_, v)| v);
        let mut totals = prev.unwrap_or_default();
        totals.resize(self.vcpus.len(), (0, 0, 0));
        for (i, (vp, vcpu)) in p.vcpus.iter_mut().zip(&self.vcpus).enumerate() {
            let s = &self.samples[i + 1];
            vp.phase = vcpu.phase.load(Ordering::Relaxed);
            vp.kvm.clear();
            vp.kvm.extend(self.plan.kvm.iter().map(|&id| s.u64(id)));
            vp.ours.clear();
            vp.ours
                .extend(Reason::ALL.iter().map(|&r| vcpu.counters.reason(r)));
            let exits = self.plan.exits.map_or(0, |id| s.u64(id));
            let ours: u64 = vp.ours.iter().sum();
            let rate = |new: u64, old: u64| {
                dt.filter(|&d| d > 0.0)
                    .map_or(0.0, |d| new.saturating_sub(old) as f64 / d)
            };
            vp.exits_per_s = rate(exits, totals[i].0);
            vp.our_exits_per_s = rate(ours, totals[i].1);
            vp.progress = vcpu.guest_progress().unwrap_or(0);
            vp.progress_per_s = rate(vp.progress, totals[i].2);
            vp.stall_ns = crate::vcpu::stall::shown_ns(vcpu);
            vp.throttled_ns = vcpu.throttle.slept_ns();
            totals[i] = (exits, ours, vp.progress);
        }
        self.prev = Some((now, totals));
    }
}

/// Nanoseconds since `t0` (saturating after 584 years).
fn elapsed_ns(t0: Instant) -> u64 {
    crate::units::nanos(t0.elapsed())
}
