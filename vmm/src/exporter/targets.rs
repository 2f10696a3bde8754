//! The exporter's VMs: finding control sockets, attaching to each once (its
//! stats fds over `SCM_RIGHTS`), and dropping the ones that go away.
//!
//! One `exporter-watch` thread owns discovery. It rescans the socket
//! directories whenever inotify reports a change in one of them, and at least
//! every [`RESCAN`] otherwise. Each new socket is attached on a thread of its
//! own, bounded by the attach timeout, so a VMM that hangs or speaks garbage
//! delays neither the others nor any scrape. A failed socket is retried after
//! [`RETRY_AFTER`]. Attached VMs are checked on every pass: a closed
//! connection (the VMM exited), a socket file that is gone, or a completed
//! outgoing migration (the guest now runs elsewhere) drops the VM and closes
//! its fds, since a held stats fd keeps the kernel's VM structure alive.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kvm_stats::{Sample, Schema, StatsFd};
use rustix::fd::OwnedFd;
use rustix::fs::inotify;

use super::exit_sums::ExitSums;
use crate::client::{self, Client};
use crate::lock;
use crate::protocol::events::EventKind;
use crate::protocol::migration::Status;
use crate::protocol::reply::RunState;
use crate::protocol::request::StatsProvider;
use crate::protocol::{StatsTarget, VcpuSelector};
use crate::vmmstats::view::View;

/// Longest time between two scans of the socket directories.
pub(crate) const RESCAN: Duration = Duration::from_millis(500);
/// How long a socket that failed to attach is left alone.
pub(crate) const RETRY_AFTER: Duration = Duration::from_secs(5);
/// Attach threads one owner's sockets may hold at once (those given up on
/// included): a user whose sockets hold their attaches past any bound (fds
/// that linger when closed, left unread) holds at most these, and other
/// users' VMs are attached as before.
pub const MAX_ATTACHING_PER_OWNER: usize = 8;

/// Attaches in flight at once, each a thread and a connection: a directory
/// of sockets that accept and say nothing (thousands, say) holds at most
/// this many for an attach timeout each, never a thread per socket. Sockets
/// never tried go before those being tried again.
pub const MAX_ATTACHING: usize = 32;

/// Why a VMM could not be attached.
#[derive(Debug, thiserror::Error)]
enum AttachError {
    /// Its guest has left it: not read, and not shown as down.
    #[error("its guest migrated away (postmigrate)")]
    MigratedAway,
    /// Talking to it failed.
    #[error(transparent)]
    Client(#[from] client::Error),
    /// An fd it handed out is not a KVM stats fd of that kind.
    #[error("an fd it sent as {0} is not one (it is {1:?})")]
    NotStats(String, String),
    /// A stats fd it handed out is open for writing.
    #[error("a {0} fd it sent is open for writing")]
    Writable(String),
    /// Taking its stats fds would leave fewer than [`FD_RESERVE`] free.
    #[error("the exporter's open-file budget is spent: {need} more fds with {open} of {limit} open (raise the hard RLIMIT_NOFILE)")]
    FdBudget {
        /// Stats fds the VM has.
        need: u64,
        /// Fds open now.
        open: u64,
        /// The soft limit.
        limit: u64,
    },
    /// Its stats fds' schemas and data are larger than the exporter keeps per VM.
    #[error("its stats need more than the {0} bytes the exporter keeps per VM")]
    OverBudget(u64),
}

/// One VM the exporter reads: its stats fds, parsed once, and their samples.
pub(crate) struct Target {
    /// The VM's name (`kvmscope run --name`), from the greeting.
    pub(crate) name: String,
    /// The VMM's pid on this host (its socket's peer credentials).
    pub(crate) pid: u32,
    /// Guest RAM, bytes.
    pub(crate) memory: u64,
    /// The KVM backend the VMM reported (`pvm`, `vmx`, `svm`).
    pub(crate) backend: String,
    /// Its page labels (`vm`, `pid`, `socket`), made once.
    pub(crate) labels: String,
    /// Each vCPU's: the VM's and its `vcpu` index, made once.
    pub(crate) vcpu_labels: Vec<String>,
    /// The VM stats fd and its latest sample.
    pub(crate) vm: (StatsFd, Sample),
    /// Each vCPU's stats fd and latest sample, by index.
    pub(crate) vcpus: Vec<(StatsFd, Sample)>,
    /// The socket file's device and inode when attached.
    socket: Option<(u64, u64)>,
    /// The VMM's own stats (provider `kvmscope`): the VM file and each
    /// vCPU's; `None` for a VMM that has none (an older kvmscope).
    pub(crate) own: Option<ProviderStats>,
    /// The control connection, kept open to learn when the VMM goes; out
    /// on a checking thread while one asks the VMM something.
    client: Option<Client>,
}

impl Target {
    /// Every stats file with its latest sample: KVM's (the VM's, then each
    /// vCPU's), then the VMM's own in the same order.
    pub(crate) fn stats_mut(&mut self) -> impl Iterator<Item = &mut (StatsFd, Sample)> {
        let own = self
            .own
            .iter_mut()
            .flat_map(|o| std::iter::once(&mut o.vm).chain(o.vcpus.iter_mut()));
        std::iter::once(&mut self.vm)
            .chain(self.vcpus.iter_mut())
            .chain(own)
    }

    /// Reads KVM's stats files into their samples, one `pread` each. Counts
    /// the files read into `read`.
    ///
    /// # Errors
    /// The first file that cannot be read (the VM is then dropped).
    pub(crate) fn read_kvm(&mut self, read: &mut u64) -> kvm_stats::Result<()> {
        for (fd, sample) in std::iter::once(&mut self.vm).chain(self.vcpus.iter_mut()) {
            *read += 1;
            fd.read_sample(sample)?;
        }
        Ok(())
    }

    /// Asks the CPU to load the data blocks of the VMM's mapped files, so
    /// that [`Target::read_own`] over every VM finds them on the way in.
    /// (Asking for their samples and the exit sums' tables too made no
    /// difference within the benchmark's noise.)
    pub(crate) fn prefetch_own(&self) {
        let Some(own) = &self.own else {
            return;
        };
        let files = std::iter::once(&own.vm).chain(&own.vcpus);
        for (view, (fd, _)) in own.views.iter().zip(files) {
            if let Some(view) = view {
                view.prefetch(fd.schema());
            }
        }
    }

    /// Reads the VMM's own stats files into their samples, through their
    /// mappings where they have one (else with `pread`), and sums their
    /// exit counters. Counts the files read into `read`.
    ///
    /// # Errors
    /// The first file that cannot be read (the VM is then dropped).
    pub(crate) fn read_own(&mut self, read: &mut u64) -> kvm_stats::Result<()> {
        let Some(own) = &mut self.own else {
            return Ok(());
        };
        let views = own
            .views
            .iter()
            .map(Option::as_ref)
            .chain(std::iter::repeat(None));
        let files = std::iter::once(&mut own.vm).chain(own.vcpus.iter_mut());
        for ((fd, sample), view) in files.zip(views) {
            *read += 1;
            match view {
                Some(view) => sample.read_from(view, fd.schema())?,
                None => fd.read_sample(sample)?,
            }
        }
        own.exit_sums.update(&own.vcpus);
        Ok(())
    }
}

/// Makes `target`'s stats files share their descriptors with files of the
/// same layout among `attached` and among its own (every vCPU of one kernel
/// has the same; `Schema::share_descriptors` compares them in full): a host
/// keeps one copy per layout, and the page, which looks up each stat in
/// every file, finds it in one place.
fn share_descriptors(target: &mut Target, attached: &mut Registry) {
    /// The known schema of `schema`'s layout, or none, `schema` then known.
    fn known_like<'a>(known: &'a mut Vec<Schema>, schema: &Schema) -> Option<&'a Schema> {
        match known.iter().position(|k| k.layout() == schema.layout()) {
            Some(at) => known.get(at),
            None => {
                known.push(schema.clone());
                None
            }
        }
    }
    let mut known = Vec::new();
    for t in attached.targets.values_mut().chain(std::iter::once(target)) {
        for (fd, _) in t.stats_mut() {
            if let Some(k) = known_like(&mut known, fd.schema()) {
                fd.share_descriptors(k);
            }
        }
        // The exit sums: a layout of their own, alike in VMMs of one build.
        if let Some(sums) = t.own.as_mut().map(|o| &mut o.exit_sums.schema) {
            if let Some(k) = known_like(&mut known, sums) {
                sums.share_descriptors(k);
            }
        }
    }
}

/// One provider's stats files of a VM (KVM's, or the VMM's own) and their
/// latest samples.
pub(crate) struct ProviderStats {
    /// The VM file.
    pub(crate) vm: (StatsFd, Sample),
    /// Each vCPU's, by index.
    pub(crate) vcpus: Vec<(StatsFd, Sample)>,
    /// The VMM's own files mapped read-only (`vmmstats::view`), the VM's
    /// then each vCPU's: read with no syscall. Empty for KVM's files, and
    /// `None` for a file that cannot be mapped safely (read with `pread`).
    views: Vec<Option<View>>,
    /// The vCPU files' exit counters summed, as of the latest samples (the
    /// VMM's own files; none in KVM's).
    pub(crate) exit_sums: ExitSums,
}

/// A socket the exporter could not attach to, and why.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    /// What went wrong, for the log.
    pub(crate) reason: String,
    /// Whether the page shows it as a VM that is down (`up 0`): not for a
    /// VMM whose guest migrated away, which is nobody's VM any more.
    pub(crate) down: bool,
    /// When it was last tried.
    pub(crate) at: Instant,
}

/// What discovery knows, shared with the page.
#[derive(Default)]
pub(crate) struct Registry {
    /// Attached VMs, by socket path.
    pub(crate) targets: BTreeMap<PathBuf, Target>,
    /// Sockets that failed to attach, by path.
    pub(crate) failures: BTreeMap<PathBuf, Failure>,
}

/// Where to look and how long to wait.
#[derive(Debug, Clone)]
pub(crate) struct Sources {
    /// Directories whose sockets are all VMs.
    pub(crate) dirs: Vec<PathBuf>,
    /// Sockets named one by one.
    pub(crate) sockets: Vec<PathBuf>,
    /// Longest time to connect, read the greeting and get the fds.
    pub(crate) attach_timeout: Duration,
}

/// The running discovery thread; dropping it stops the thread, woken at
/// once from its wait for a change (not at the next rescan).
pub(crate) struct Watcher {
    /// The stop: an eventfd the thread polls beside inotify, as the HTTP
    /// server polls its own.
    stop: OwnedFd,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = rustix::io::write(&self.stop, &1u64.to_ne_bytes());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Starts discovery over `sources`, filling `registry`.
///
/// # Errors
/// The thread could not be started.
pub(crate) fn watch(sources: Sources, registry: Arc<Mutex<Registry>>) -> std::io::Result<Watcher> {
    let flags = rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK;
    let stop = rustix::event::eventfd(0, flags)?;
    let stopping = stop.try_clone()?;
    let answered = rustix::event::eventfd(0, flags)?;
    let thread = std::thread::Builder::new()
        .name("exporter-watch".into())
        .spawn(move || Discovery::new(sources, registry, answered).run(&stopping))?;
    Ok(Watcher {
        stop,
        thread: Some(thread),
    })
}

/// An attach's answer: its socket, its attempt, what it got.
type Attached = (PathBuf, u64, Result<Target, AttachError>);

/// A follow-up check's answer: the client back, and whether its guest left.
type Checked = (PathBuf, Client, Result<bool, client::Error>);

struct Discovery {
    sources: Sources,
    registry: Arc<Mutex<Registry>>,
    /// Attaches in flight (at most [`MAX_ATTACHING`]): when each began, and
    /// its attempt's number (the answer of one given up on is not this
    /// one's).
    pending: BTreeMap<PathBuf, (Instant, u64)>,
    /// The last attempt's number.
    attempts: u64,
    /// The sockets whose attach thread still runs, those given up on too:
    /// at most one thread per socket, and twice [`MAX_ATTACHING`] in all
    /// (a thread stuck past any bound, in a close a peer's fd makes wait,
    /// is not replaced for ever).
    running: Arc<Mutex<HashMap<PathBuf, Option<u32>>>>,
    /// When the directories were last read.
    looked_at: Option<Instant>,
    results: (Sender<Attached>, Receiver<Attached>),
    checks: (Sender<Checked>, Receiver<Checked>),
    inotify: Option<OwnedFd>,
    /// Written by an attach or check thread once its answer is sent: the
    /// wait for a change ends, so that a slot freed is used at once.
    answered: Arc<OwnedFd>,
    /// The sockets the last look at the directories found (a wake for an
    /// answer alone starts the next attaches from these, without reading
    /// thousands of directory entries again).
    seen: Vec<Candidate>,
    /// Whether the directories must be read again before the next attaches.
    stale: bool,
    /// When each socket there now was first found: of one owner's sockets
    /// never tried, the newest goes first (a VM started after a crowd of
    /// its owner's silent sockets does not wait behind them all).
    first_seen: HashMap<PathBuf, Instant>,
}

/// One running attach thread, its socket (and the socket's owner) counted
/// while it lives (a panic included).
struct RunningThread(Arc<Mutex<HashMap<PathBuf, Option<u32>>>>, PathBuf);

impl RunningThread {
    fn count(
        running: &Arc<Mutex<HashMap<PathBuf, Option<u32>>>>,
        path: &Path,
        owner: Option<u32>,
    ) -> RunningThread {
        lock(running).insert(path.to_path_buf(), owner);
        RunningThread(running.clone(), path.to_path_buf())
    }
}

impl Drop for RunningThread {
    fn drop(&mut self) {
        lock(&self.0).remove(&self.1);
    }
}

/// A socket found in a watched directory or named.
struct Candidate {
    path: PathBuf,
    /// Its file's device and inode (`None`: not there).
    id: Option<(u64, u64)>,
    /// The uid that owns the socket file: whoever made it.
    owner: Option<u32>,
}

/// `paths` in turns by owner: the first of each owner's, then the second of
/// each, and so on, each owner's in the order found. One tenant's thousands
/// of sockets that say nothing then hold up another's VM by one attach per
/// turn, not by all of theirs.
fn by_owner_in_turn(paths: Vec<(PathBuf, Option<u32>)>) -> Vec<(PathBuf, Option<u32>)> {
    let mut owners: Vec<(Option<u32>, std::collections::VecDeque<PathBuf>)> = Vec::new();
    for (path, owner) in paths {
        match owners.iter_mut().find(|(o, _)| *o == owner) {
            Some((_, queue)) => queue.push_back(path),
            None => owners.push((owner, std::collections::VecDeque::from([path]))),
        }
    }
    let mut out = Vec::new();
    while owners.iter().any(|(_, q)| !q.is_empty()) {
        out.extend(
            owners
                .iter_mut()
                .filter_map(|(owner, q)| Some((q.pop_front()?, *owner))),
        );
    }
    out
}

/// What ended a wait for a change.
enum Wake {
    /// The exporter is stopping.
    Stop,
    /// A directory changed, or [`RESCAN`] passed.
    Look,
    /// An attach or check thread answered.
    Answered,
}

impl Discovery {
    fn new(sources: Sources, registry: Arc<Mutex<Registry>>, answered: OwnedFd) -> Discovery {
        // Without inotify (no such directory yet, or out of watches) the
        // periodic rescan still finds everything, only later.
        let inotify = inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK)
            .ok()
            .inspect(|fd| {
                let mask = inotify::WatchFlags::CREATE
                    | inotify::WatchFlags::DELETE
                    | inotify::WatchFlags::MOVED_TO
                    | inotify::WatchFlags::MOVED_FROM;
                for dir in &sources.dirs {
                    if let Err(e) = inotify::add_watch(fd, dir, mask) {
                        log::warn!("exporter: not watching {}: {e}", dir.display());
                    }
                }
            });
        Discovery {
            sources,
            registry,
            pending: BTreeMap::new(),
            attempts: 0,
            running: Arc::new(Mutex::new(HashMap::new())),
            looked_at: None,
            results: channel(),
            checks: channel(),
            inotify,
            answered: Arc::new(answered),
            seen: Vec::new(),
            stale: true,
            first_seen: HashMap::new(),
        }
    }

    fn run(mut self, stop: &OwnedFd) {
        loop {
            self.collect_attached();
            self.collect_checks();
            self.check_attached();
            self.attach_new();
            match self.wait_for_change(stop) {
                Wake::Stop => return,
                Wake::Look => self.stale = true,
                Wake::Answered => {}
            }
        }
    }

    /// Sleeps until a watched directory changes, a stop is asked, a thread
    /// answers, or [`RESCAN`] passes.
    fn wait_for_change(&self, stop: &OwnedFd) -> Wake {
        use rustix::event::{PollFd, PollFlags};
        let mut fds = vec![
            PollFd::new(stop, PollFlags::IN),
            PollFd::new(&*self.answered, PollFlags::IN),
        ];
        if let Some(fd) = &self.inotify {
            fds.push(PollFd::new(fd, PollFlags::IN));
        }
        let timeout = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: i64::try_from(RESCAN.as_nanos()).unwrap_or(500_000_000),
        };
        if rustix::event::poll(&mut fds, Some(&timeout)).unwrap_or(0) == 0 {
            return Wake::Look;
        }
        if fds[0].revents().contains(PollFlags::IN) {
            return Wake::Stop;
        }
        let mut count = [0u8; 8];
        let _ = rustix::io::read(&*self.answered, &mut count);
        let changed = fds
            .get(2)
            .is_some_and(|f| f.revents().contains(PollFlags::IN));
        if let Some(fd) = &self.inotify {
            // Drain the events: any change means "rescan".
            let mut buf = [0u8; 4096];
            while rustix::io::read(fd, &mut buf).is_ok_and(|n| n > 0) {}
        }
        if changed {
            Wake::Look
        } else {
            Wake::Answered
        }
    }

    /// The sockets there are now: the named ones, then every socket in the
    /// directories, each socket file once, under the first path that names
    /// it (`vms/a.sock`, `/run/vms/a.sock` and `/run/vms/../vms/a.sock` are one
    /// VM; so are two links to one socket), with its identity.
    fn candidates(&self) -> Vec<Candidate> {
        let mut found: Vec<PathBuf> = self.sources.sockets.clone();
        for dir in &self.sources.dirs {
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_socket()) {
                    found.push(entry.path());
                }
            }
        }
        let mut seen = HashSet::new();
        found
            .into_iter()
            .map(|path| {
                use std::os::unix::fs::MetadataExt;
                let meta = std::fs::metadata(&path).ok();
                Candidate {
                    id: meta.as_ref().map(|m| (m.dev(), m.ino())),
                    owner: meta.as_ref().map(MetadataExt::uid),
                    path,
                }
            })
            // One not there yet (a named socket) is tried, and fails, as named.
            .filter(|c| c.id.is_none_or(|id| seen.insert(id)))
            .collect()
    }

    /// Starts attaching to sockets not attached, not being attached, and
    /// not failed within [`RETRY_AFTER`], at most [`MAX_ATTACHING`] in
    /// flight: those never tried and those due a retry in turn, so that
    /// neither a crowd of new sockets nor one of failing ones keeps the
    /// other waiting, and each kind by owner in turn.
    fn attach_new(&mut self) {
        let now = Instant::now();
        // An attach is bounded by the attach timeout (its connect too); one
        // far past it (a thread that panicked, or a bound this missed)
        // gives its slot back rather than hold it for ever.
        let stuck = 2 * self.sources.attach_timeout + Duration::from_secs(1);
        let given_up: Vec<PathBuf> = self
            .pending
            .iter()
            .filter(|(_, (since, _))| now.duration_since(*since) >= stuck)
            .map(|(path, _)| path.clone())
            .collect();
        for path in given_up {
            self.pending.remove(&path);
            let reason = format!("attaching did not end within {stuck:?}: its slot is given back, and it is tried again {RETRY_AFTER:?} after its thread ends");
            log::warn!("exporter: {}: {reason}", path.display());
            lock(&self.registry).failures.insert(
                path,
                Failure {
                    reason,
                    down: true,
                    at: now,
                },
            );
        }
        let running = lock(&self.running).clone();
        if self.pending.len() >= MAX_ATTACHING || running.len() >= 2 * MAX_ATTACHING {
            return;
        }
        // Read again when one changed, and every RESCAN whatever else wakes
        // the loop (answers alone kept the timeout from ever passing, and a
        // directory without a watch went unread).
        if std::mem::take(&mut self.stale)
            || self
                .looked_at
                .is_none_or(|t| now.duration_since(t) >= RESCAN)
        {
            self.looked_at = Some(now);
            // Read outside the registry's lock: thousands of entries are
            // a while to read, and every scrape takes that lock.
            self.seen = self.candidates();
            let found: HashSet<&PathBuf> = self.seen.iter().map(|c| &c.path).collect();
            self.first_seen.retain(|p, _| found.contains(p));
            for c in &self.seen {
                self.first_seen.entry(c.path.clone()).or_insert(now);
            }
        }
        let (mut fresh, mut again) = (Vec::new(), Vec::new());
        {
            let reg = lock(&self.registry);
            for c in &self.seen {
                let (path, id) = (c.path.clone(), c.id);
                // Attached already, under this path or another for the same file.
                let attached = reg.targets.contains_key(&path)
                    || id.is_some() && reg.targets.values().any(|t| t.socket == id);
                // One thread per socket: one given up on still runs.
                if attached || self.pending.contains_key(&path) || running.contains_key(&path) {
                    continue;
                }
                match reg.failures.get(&path) {
                    None => fresh.push((path, c.owner)),
                    Some(f) if now.duration_since(f.at) >= RETRY_AFTER => {
                        again.push((path, c.owner));
                    }
                    Some(_) => {}
                }
            }
        }
        let room = (MAX_ATTACHING - self.pending.len()).min(2 * MAX_ATTACHING - running.len());
        let mut per_owner: HashMap<Option<u32>, usize> = HashMap::new();
        for owner in running.values() {
            *per_owner.entry(*owner).or_default() += 1;
        }
        // Newest first (stable: found together, in the directory's order).
        fresh.sort_by_key(|(path, _)| std::cmp::Reverse(self.first_seen.get(path).copied()));
        let mut fresh = by_owner_in_turn(fresh).into_iter();
        let mut again = by_owner_in_turn(again).into_iter();
        let turns = std::iter::from_fn(|| match (fresh.next(), again.next()) {
            (None, None) => None,
            (a, b) => Some(a.into_iter().chain(b)),
        })
        .flatten();
        let mut started = 0;
        for (path, owner) in turns {
            if started == room {
                break;
            }
            let held = per_owner.entry(owner).or_default();
            if *held >= MAX_ATTACHING_PER_OWNER {
                continue;
            }
            *held += 1;
            started += 1;
            let (tx, timeout) = (self.results.0.clone(), self.sources.attach_timeout);
            let answered = self.answered.clone();
            let key = path.clone();
            let running = RunningThread::count(&self.running, &path, owner);
            self.attempts += 1;
            let attempt = self.attempts;
            let spawned = std::thread::Builder::new()
                .name("exporter-attach".into())
                .spawn(move || {
                    let result = attach(&path, timeout);
                    // Counted out before the answer wakes the loop.
                    drop(running);
                    let _ = tx.send((path, attempt, result));
                    let _ = rustix::io::write(&*answered, &1u64.to_ne_bytes());
                });
            match spawned {
                Ok(_) => {
                    self.pending.insert(key, (now, attempt));
                }
                Err(e) => {
                    // Tried again at the next look.
                    log::warn!("exporter: cannot start an attach thread: {e}");
                    break;
                }
            }
        }
    }

    fn collect_attached(&mut self) {
        while let Ok((path, attempt, result)) = self.results.1.try_recv() {
            // The answer of an attempt given up on is dropped (its slot,
            // or the attempt after it, is another's).
            if self.pending.get(&path).is_none_or(|&(_, a)| a != attempt) {
                continue;
            }
            self.pending.remove(&path);
            let mut reg = lock(&self.registry);
            match result {
                Ok(target) => {
                    log::info!(
                        "exporter: reading VM {:?} (pid {}, {} vCPU(s)) from {}",
                        target.name,
                        target.pid,
                        target.vcpus.len(),
                        path.display()
                    );
                    let mut target = target;
                    share_descriptors(&mut target, &mut reg);
                    reg.failures.remove(&path);
                    reg.targets.insert(path, target);
                }
                Err(e) => {
                    let down = !matches!(e, AttachError::MigratedAway);
                    let reason = crate::error_chain(&e);
                    if down && reg.failures.get(&path).is_none_or(|f| f.reason != reason) {
                        log::warn!("exporter: skipping {}: {reason}", path.display());
                    }
                    reg.failures.insert(
                        path,
                        Failure {
                            reason,
                            down,
                            at: Instant::now(),
                        },
                    );
                }
            }
        }
    }

    /// Drops VMs whose VMM has gone, whose socket is gone or was replaced,
    /// or whose guest migrated away; forgets failures of sockets that are
    /// gone from a directory (a socket named on the command line stays,
    /// down). Nothing here waits on a VMM: a completed migration's follow-up
    /// question goes out on a thread of its own, with the client taken out of
    /// the registry meanwhile (the page goes on showing the VM).
    fn check_attached(&mut self) {
        let mut reg = lock(&self.registry);
        let mut gone = Vec::new();
        let mut ask = Vec::new();
        for (path, t) in reg.targets.iter_mut() {
            match departed(path, t) {
                Departed::No => {}
                Departed::Yes(why) => gone.push((path.clone(), why)),
                Departed::Ask => {
                    if let Some(client) = t.client.take() {
                        ask.push((path.clone(), client));
                    }
                }
            }
        }
        for (path, why) in gone {
            log::info!("exporter: dropping {}: {why}", path.display());
            reg.targets.remove(&path);
        }
        // A socket named on the command line stays down, retried every
        // RETRY_AFTER and said once, until it comes: forgotten, it was tried
        // again at once and logged twice a second, and left the page.
        let named = &self.sources.sockets;
        let before = reg.failures.len();
        reg.failures
            .retain(|path, _| path.exists() || named.contains(path));
        // A socket gone is no candidate: the directories are read again
        // (the last look would have it tried, and forgotten, at once, over
        // and over).
        if reg.failures.len() != before {
            self.stale = true;
        }
        drop(reg);
        for (path, mut client) in ask {
            let tx = self.checks.0.clone();
            let answered = self.answered.clone();
            let spawned = std::thread::Builder::new()
                .name("exporter-check".into())
                .spawn(move || {
                    let verdict = migrated_away(&mut client);
                    let _ = tx.send((path, client, verdict));
                    let _ = rustix::io::write(&*answered, &1u64.to_ne_bytes());
                });
            if let Err(e) = spawned {
                log::warn!("exporter: cannot start a check thread: {e}");
            }
        }
    }

    /// The answers of follow-up checks: a VM whose guest left is dropped, one
    /// that did not answer in time is dropped too, the others get their
    /// client back.
    fn collect_checks(&mut self) {
        while let Ok((path, client, verdict)) = self.checks.1.try_recv() {
            let mut reg = lock(&self.registry);
            let why = match verdict {
                Ok(true) => "its guest migrated away".to_string(),
                Ok(false) => {
                    if let Some(t) = reg.targets.get_mut(&path) {
                        t.client = Some(client);
                    }
                    continue;
                }
                Err(e) => crate::error_chain(&e),
            };
            if reg.targets.remove(&path).is_some() {
                log::info!("exporter: dropping {}: {why}", path.display());
            }
        }
    }
}

/// What the last look at an attached VM found.
enum Departed {
    /// It is still there.
    No,
    /// It is gone, and why.
    Yes(String),
    /// A migration completed: ask whether its guest left (the source's
    /// `postmigrate`) or arrived.
    Ask,
}

/// Whether an attached VM is still read. Does not block: the connection is
/// read without waiting, at most [`LINE_MAX`] bytes of it.
fn departed(path: &Path, t: &mut Target) -> Departed {
    match socket_id(path) {
        None => return Departed::Yes("its socket is gone".into()),
        Some(id) if t.socket.is_some_and(|was| was != id) => {
            return Departed::Yes("another socket was put at its path".into())
        }
        Some(_) => {}
    }
    let Some(client) = t.client.as_mut() else {
        return Departed::No;
    };
    match client.take_events() {
        Err(client::Error::Closed) => Departed::Yes("the VMM closed the connection".into()),
        Err(e) => Departed::Yes(crate::error_chain(&e)),
        // Source and destination both see a migration complete; only the
        // source is left without a guest (`postmigrate`).
        Ok(events) if events.iter().any(completed_migration) => Departed::Ask,
        Ok(_) => Departed::No,
    }
}

/// Whether an event line says a migration completed.
fn completed_migration(line: &serde_json::Value) -> bool {
    matches!(
        client::event_of(line),
        Ok(Some(EventKind::Migration(m))) if m.status == Status::Completed
    )
}

/// Whether the VMM's guest has left it (`query-status` says `postmigrate`).
fn migrated_away(client: &mut Client) -> Result<bool, client::Error> {
    Ok(client.query_status()?.status == RunState::Postmigrate)
}

/// Longest line the exporter takes from a VMM: its greeting and the replies
/// it asks for (`query-status`, `get-stats-fd`) are a few hundred bytes.
pub(crate) const LINE_MAX: usize = 64 << 10;

/// Schema and data bytes the exporter keeps for one VM, all its stats fds
/// together: KVM's are about 4 KiB of schema and 0.5 KiB of data per fd, so
/// this is over 200 vCPUs' worth.
pub(crate) const VM_STATS_BUDGET: u64 = 1 << 20;

/// Fds kept free for everything but stats fds: sockets being attached, the
/// HTTP server's connections, files the exporter opens.
pub(crate) const FD_RESERVE: u64 = 64;

/// Raises the soft limit on open files to the hard one (each VM holds one
/// stats fd per vCPU and one for the VM: 200 VMs of 4 vCPUs pass the usual
/// soft 1,024); returns the soft limit in force.
pub(crate) fn raise_fd_limit() -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let now = getrlimit(Resource::Nofile);
    let raised = Rlimit {
        current: now.maximum,
        maximum: now.maximum,
    };
    if now.maximum.is_some() && now.current != now.maximum {
        if let Err(e) = setrlimit(Resource::Nofile, raised) {
            log::warn!(
                "exporter: raising the open-file limit to {:?}: {e}",
                now.maximum
            );
        }
    }
    let limit = fd_limit();
    log::info!("exporter: at most {limit} open files");
    limit
}

/// The soft limit on open files in force.
pub(crate) fn fd_limit() -> u64 {
    rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX)
}

/// Fds this process has open.
pub(crate) fn open_fds() -> u64 {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64)
}

/// Connects to one VMM, reads its greeting, and takes its stats fds, all
/// within `timeout`.
fn attach(path: &Path, timeout: Duration) -> Result<Target, AttachError> {
    let bounds = client::Bounds {
        request: timeout,
        line_max: LINE_MAX,
    };
    let mut client = Client::connect_bounded(path, bounds)?;
    if migrated_away(&mut client)? {
        return Err(AttachError::MigratedAway);
    }
    let vm = client.greeting.qmp.kvmscope.vm.clone();
    let (open, limit) = (open_fds(), fd_limit());
    // KVM's stats fds and the VMM's own, one of each for the VM and per vCPU.
    let need = 2 * (vm.vcpus as u64 + 1);
    if open + need + FD_RESERVE > limit {
        return Err(AttachError::FdBudget { need, open, limit });
    }
    let mut budget = VM_STATS_BUDGET;
    let kvm = take_stats(&mut client, None, vm.vcpus, &mut budget, path)?;
    let own = match take_stats(
        &mut client,
        Some(StatsProvider::Kvmscope),
        vm.vcpus,
        &mut budget,
        path,
    ) {
        Ok(own) => Some(own),
        // An older kvmscope refuses the argument: it has no stats of its own.
        Err(AttachError::Client(client::Error::Remote { .. })) => None,
        Err(e) => return Err(e),
    };
    // Follow-up requests (a completed migration's `query-status`) each get
    // the attach timeout, whole; everything above shared one.
    client.bound_each_request(timeout);
    // The pid a `kill` or `top` on this host knows the VMM by.
    let pid = client.vmm_pid();
    warn_if_relayed(path, pid, kvm.vm.0.schema().id());
    let labels = super::labels::vm_labels(&vm.name, Some(pid), path);
    Ok(Target {
        vcpu_labels: super::labels::vcpu_labels(&labels, vm.vcpus),
        labels,
        name: vm.name,
        pid,
        memory: vm.memory,
        backend: vm.backend,
        vm: kvm.vm,
        vcpus: kvm.vcpus,
        own,
        socket: socket_id(path),
        client: Some(client),
    })
}

/// Says when the VM's stats file names another process than the socket's
/// peer: KVM names it `kvm-PID` after the process that made the VM, so a
/// socket whose peer hands out another VMM's fds (a relay, which may also
/// give the VM a name of its own: the greeting's name is what the VMM
/// says) shows here. Only said: in a pid namespace of the exporter's own
/// the two numbers differ for every VMM, and a VMM whose VM was made by a
/// thread other than its first names that thread.
fn warn_if_relayed(path: &Path, peer: u32, stats_id: &str) {
    let made_by = stats_id
        .strip_prefix("kvm-")
        .and_then(|n| n.parse::<u32>().ok());
    if made_by.is_some_and(|n| n != peer) {
        log::warn!(
            "exporter: {}: its VM's stats file is {stats_id:?}, made by another process than the socket's peer (pid {peer}): the peer relays another VMM's stats, or this exporter runs in a pid namespace of its own; the page labels the VM with the peer's pid and the name it gave",
            path.display()
        );
    }
}

/// One provider's stats fds (`get-stats-fd` of the VM and of every vCPU:
/// KVM's, or with `kvmscope` the VMM's own), opened as stats sources, at most
/// the `vcpus` the greeting names (the rest are closed) and within `budget`.
fn take_stats(
    client: &mut Client,
    provider: Option<StatsProvider>,
    vcpus: usize,
    budget: &mut u64,
    path: &Path,
) -> Result<ProviderStats, AttachError> {
    let vm_kind = client::stats::stats_fd_kind(provider, StatsTarget::Vm);
    let vcpu_kind = client::stats::stats_fd_kind(provider, StatsTarget::Vcpu);
    let vm_files = client.get_provider_stats_fd(provider, StatsTarget::Vm, None)?;
    let vcpu_files =
        client.get_provider_stats_fd(provider, StatsTarget::Vcpu, Some(VcpuSelector::All))?;
    let vm_file = vm_files
        .into_iter()
        .next()
        .map(|(_, file)| file)
        .ok_or_else(|| {
            client::Error::BadReply(format!("get-stats-fd for the VM ({vm_kind}) carried no fd"))
        })?;
    let vm = open_stats(vm_file, vm_kind, budget)?;
    if vcpu_files.len() > vcpus {
        log::warn!(
            "exporter: {} sent {} vCPU stats fds ({vcpu_kind}) for the {vcpus} vCPUs its greeting names; closing the rest",
            path.display(),
            vcpu_files.len(),
        );
    }
    let vcpus = vcpu_files
        .into_iter()
        .take(vcpus)
        .map(|(_, f)| open_stats(f, vcpu_kind, budget))
        .collect::<Result<Vec<_>, _>>()?;
    let views = match provider {
        Some(StatsProvider::Kvmscope) => std::iter::once(&vm)
            .chain(&vcpus)
            .map(|(fd, _)| {
                View::of(fd.file(), fd.schema())
                    .map_err(|e| {
                        log::warn!(
                            "exporter: {}: reading its own stats with pread, not mapped: {e}",
                            path.display()
                        );
                    })
                    .ok()
            })
            .collect(),
        _ => Vec::new(),
    };
    let exit_sums = match provider {
        Some(StatsProvider::Kvmscope) => ExitSums::of(&vcpus),
        _ => ExitSums::default(),
    };
    Ok(ProviderStats {
        vm,
        vcpus,
        views,
        exit_sums,
    })
}

/// A received fd as a stats source: it must be the kernel's stats file of
/// the kind expected (`anon_inode:kvm-vm-stats`, `anon_inode:kvm-vcpu-stats:N`)
/// opened read-only, and its schema and data must fit what is left of the
/// VM's `budget`.
fn open_stats(
    file: std::fs::File,
    kind: &str,
    budget: &mut u64,
) -> Result<(StatsFd, Sample), AttachError> {
    let link = client::stats::fd_target(&file);
    if !client::stats::is_stats_kind(&file, &link, kind) {
        return Err(AttachError::NotStats(kind.to_string(), link));
    }
    let mode = rustix::fs::fcntl_getfl(&file)
        .map_err(|e| AttachError::Client(client::Error::Io(e.into())))?;
    if mode & rustix::fs::OFlags::RWMODE != rustix::fs::OFlags::RDONLY {
        return Err(AttachError::Writable(kind.to_string()));
    }
    within_budget(file, budget)
}

/// A stats file whose id, schema and data fit what is left of the VM's
/// `budget` ([`client::stats::within_budget`]).
fn within_budget(file: std::fs::File, budget: &mut u64) -> Result<(StatsFd, Sample), AttachError> {
    let fd = client::stats::within_budget(file, budget).map_err(|e| match e {
        client::stats::Budgeted::Stats(e) => AttachError::Client(e.into()),
        client::stats::Budgeted::Over => AttachError::OverBudget(VM_STATS_BUDGET),
    })?;
    let sample = fd.new_sample();
    Ok((fd, sample))
}

/// The socket file's identity, to notice a new one renamed over it.
fn socket_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn sockets_are_tried_by_owner_in_turn() {
        let p = |s: &str| PathBuf::from(s);
        let found = vec![
            (p("a1"), Some(1000)),
            (p("a2"), Some(1000)),
            (p("a3"), Some(1000)),
            (p("b1"), Some(0)),
            (p("c1"), None),
            (p("b2"), Some(0)),
        ];
        let order: Vec<PathBuf> = by_owner_in_turn(found)
            .into_iter()
            .map(|(p, _)| p)
            .collect();
        assert_eq!(
            order,
            ["a1", "b1", "c1", "a2", "b2", "a3"].map(PathBuf::from)
        );
    }
    use kvm_stats::builder::StatsFileBuilder;

    pub(crate) fn file_of(bytes: &[u8]) -> std::fs::File {
        use std::io::{Seek, Write};
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(bytes).unwrap();
        f.rewind().unwrap();
        f
    }

    #[test]
    fn a_vms_stats_past_its_budget_are_refused_before_they_are_read() {
        // Data claimed 16 MiB away, as a forged fd could: refused on its
        // schema, nothing of the data allocated.
        let mut b = StatsFileBuilder::new("kvm-1").counter("exits", 1);
        let (d, values) = b.last_mut().unwrap();
        (d.offset, d.size) = ((16 << 20) - 8, 1);
        values.clear();
        let mut budget = VM_STATS_BUDGET;
        let refused = within_budget(file_of(&b.build()), &mut budget);
        assert!(
            matches!(refused, Err(AttachError::OverBudget(VM_STATS_BUDGET))),
            "{:?}",
            refused.err()
        );
        // A real-sized one fits, and spends its share of the budget.
        let small = StatsFileBuilder::new("kvm-1").counter("exits", 1).build();
        let mut budget = VM_STATS_BUDGET;
        within_budget(file_of(&small), &mut budget).unwrap();
        assert!(budget < VM_STATS_BUDGET);
        // The budget is for the VM's fds together.
        let mut budget = 32;
        assert!(within_budget(file_of(&small), &mut budget).is_err());
    }

    /// A stats file with id `id` and one counter, `name` = `value`.
    pub(crate) fn one_counter(id: &str, name: &str, value: u64) -> Vec<u8> {
        StatsFileBuilder::new(id).counter(name, value).build()
    }

    /// A VM of KVM's files `vm` and `vcpus`, with no files of its VMM's own.
    pub(crate) fn target(vm: &[u8], vcpus: &[&[u8]]) -> Target {
        let open = |b: &[u8]| within_budget(file_of(b), &mut VM_STATS_BUDGET.clone()).unwrap();
        Target {
            name: "t".into(),
            pid: 1,
            memory: 0,
            backend: "pvm".into(),
            labels: String::new(),
            vcpu_labels: super::super::labels::vcpu_labels("", vcpus.len()),
            vm: open(vm),
            vcpus: vcpus.iter().map(|b| open(b)).collect(),
            socket: None,
            own: None,
            client: None,
        }
    }

    #[test]
    fn files_of_one_layout_share_descriptors_across_vms_and_no_others_do() {
        let vcpu = |i: u32| {
            StatsFileBuilder::new(&format!("kvm-1/vcpu-{i}"))
                .counter("exits", 1)
                .counter("halt_exits", 2)
                .build()
        };
        let (v0, v1) = (vcpu(0), vcpu(1));
        let vm = StatsFileBuilder::new("kvm-1")
            .counter("pages_4k", 3)
            .build();
        let mut reg = Registry::default();
        let mut first = target(&vm, &[&v0, &v1]);
        share_descriptors(&mut first, &mut reg);
        let (a, b) = (first.vcpus[0].0.schema(), first.vcpus[1].0.schema());
        assert!(a.shares_descriptors(b), "one VM's vCPUs");
        assert!(
            !a.shares_descriptors(first.vm.0.schema()),
            "a VM's file is another layout"
        );
        assert_eq!(b.id(), "kvm-1/vcpu-1", "each keeps its own id");
        reg.targets.insert("a".into(), first);
        // A second VM's vCPUs share the first VM's; a vCPU of another kernel
        // (one stat more) does not.
        let other = StatsFileBuilder::new("kvm-2/vcpu-1")
            .counter("exits", 1)
            .counter("halt_exits", 2)
            .counter("new_stat", 0)
            .build();
        let mut second = target(&vm, &[&v0, &other]);
        share_descriptors(&mut second, &mut reg);
        let known = reg.targets["a".as_ref() as &std::path::Path].vcpus[0]
            .0
            .schema();
        assert!(second.vcpus[0].0.schema().shares_descriptors(known));
        assert!(!second.vcpus[1].0.schema().shares_descriptors(known));
        assert!(second
            .vm
            .0
            .schema()
            .shares_descriptors(reg.targets.values().next().unwrap().vm.0.schema()));
    }

    /// Gives `t` its VMM's own files `vm` and `vcpus` (read with `pread`,
    /// not mapped) and their exit sums.
    pub(crate) fn give_own_files(t: &mut Target, vm: &[u8], vcpus: &[&[u8]]) {
        let open = |b: &[u8]| within_budget(file_of(b), &mut VM_STATS_BUDGET.clone()).unwrap();
        let vcpus: Vec<_> = vcpus.iter().map(|b| open(b)).collect();
        let exit_sums = ExitSums::of(&vcpus);
        t.own = Some(ProviderStats {
            vm: open(vm),
            vcpus,
            views: Vec::new(),
            exit_sums,
        });
    }

    #[test]
    fn exit_sums_of_vmms_of_one_build_share_one_layout_and_sum_their_own_vcpus() {
        let own_vcpu = |i: u32, io: u64| {
            StatsFileBuilder::new(&format!("kvmscope-1/vcpu-{i}"))
                .counter("exits_io_out", io)
                .counter("guest_stall_ns", 5)
                .counter("exits_hlt", 1)
                .build()
        };
        let kvm_vcpu = one_counter("kvm-1/vcpu-0", "exits", 1);
        let kvm_vm = one_counter("kvm-1", "pages_4k", 3);
        let own_vm = one_counter("kvmscope-1/vm", "guest_stall_ns", 0);
        let with_own = |io: [u64; 2]| {
            let mut t = target(&kvm_vm, &[&kvm_vcpu, &kvm_vcpu]);
            let vcpus: Vec<_> = (0u32..).zip(io).map(|(i, io)| own_vcpu(i, io)).collect();
            let vcpus: Vec<&[u8]> = vcpus.iter().map(Vec::as_slice).collect();
            give_own_files(&mut t, &own_vm, &vcpus);
            t
        };
        let mut reg = Registry::default();
        let mut first = with_own([3, 4]);
        share_descriptors(&mut first, &mut reg);
        reg.targets.insert("a".into(), first);
        let mut second = with_own([30, 40]);
        share_descriptors(&mut second, &mut reg);
        fn sums(t: &Target) -> &ExitSums {
            &t.own.as_ref().unwrap().exit_sums
        }
        let known = sums(&reg.targets["a".as_ref() as &std::path::Path]);
        assert!(sums(&second).schema.shares_descriptors(&known.schema));
        // Each VM's sums are its own vCPUs', read from its own files.
        let mut read = 0;
        second.read_own(&mut read).unwrap();
        assert_eq!(read, 3, "the VM file and two vCPU files");
        let s = sums(&second);
        let io = s.schema.find("exits_io_out").unwrap();
        let hlt = s.schema.find("exits_hlt").unwrap();
        assert_eq!((s.sample.u64(io), s.sample.u64(hlt)), (70, 2));
        assert!(
            s.schema.find("guest_stall_ns").is_none(),
            "only exit counters"
        );
    }
}
