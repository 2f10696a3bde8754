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

use std::collections::BTreeMap;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kvm_stats::{Sample, StatsFd};
use rustix::fs::inotify;
use serde_json::json;

use crate::client::{self, Client};
use crate::lock;

/// Longest time between two scans of the socket directories.
pub(crate) const RESCAN: Duration = Duration::from_millis(500);
/// How long a socket that failed to attach is left alone.
pub(crate) const RETRY_AFTER: Duration = Duration::from_secs(5);

/// Why a VMM could not be attached.
#[derive(Debug, thiserror::Error)]
enum AttachError {
    /// Its guest has left it: not read, and not shown as down.
    #[error("its guest migrated away (postmigrate)")]
    MigratedAway,
    /// Talking to it failed.
    #[error(transparent)]
    Client(#[from] client::Error),
}

/// One VM the exporter reads: its stats fds, parsed once, and their samples.
pub(crate) struct Target {
    /// The VM's name (`kvmscope run --name`), from the greeting.
    pub(crate) name: String,
    /// The VMM's pid, from the greeting.
    pub(crate) pid: u32,
    /// Guest RAM, bytes.
    pub(crate) memory: u64,
    /// The KVM backend the VMM reported (`pvm`, `vmx`, `svm`).
    pub(crate) backend: String,
    /// Its page labels (`vm`, `pid`, `socket`), made once.
    pub(crate) labels: String,
    /// The VM stats fd and its latest sample.
    pub(crate) vm: (StatsFd, Sample),
    /// Each vCPU's stats fd and latest sample, by index.
    pub(crate) vcpus: Vec<(StatsFd, Sample)>,
    /// The control connection, kept open to learn when the VMM goes.
    client: Client,
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

/// The running discovery thread; dropping it stops the thread.
pub(crate) struct Watcher {
    stop: Arc<Mutex<bool>>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        *lock(&self.stop) = true;
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
    let stop = Arc::new(Mutex::new(false));
    let stopping = stop.clone();
    let thread = std::thread::Builder::new()
        .name("exporter-watch".into())
        .spawn(move || Discovery::new(sources, registry).run(&stopping))?;
    Ok(Watcher {
        stop,
        thread: Some(thread),
    })
}

type Attached = (PathBuf, Result<Target, AttachError>);

struct Discovery {
    sources: Sources,
    registry: Arc<Mutex<Registry>>,
    pending: BTreeMap<PathBuf, Instant>,
    results: (Sender<Attached>, Receiver<Attached>),
    inotify: Option<rustix::fd::OwnedFd>,
}

impl Discovery {
    fn new(sources: Sources, registry: Arc<Mutex<Registry>>) -> Discovery {
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
            results: channel(),
            inotify,
        }
    }

    fn run(mut self, stop: &Mutex<bool>) {
        while !*lock(stop) {
            self.collect_attached();
            self.check_attached();
            self.attach_new();
            self.wait_for_change();
        }
    }

    /// Sleeps until a watched directory changes, or [`RESCAN`] passes.
    fn wait_for_change(&self) {
        let Some(fd) = &self.inotify else {
            std::thread::sleep(RESCAN);
            return;
        };
        let mut fds = [rustix::event::PollFd::new(fd, rustix::event::PollFlags::IN)];
        let timeout = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: i64::try_from(RESCAN.as_nanos()).unwrap_or(500_000_000),
        };
        if rustix::event::poll(&mut fds, Some(&timeout)).unwrap_or(0) > 0 {
            // Drain the events: any change means "rescan".
            let mut buf = [0u8; 4096];
            while rustix::io::read(fd, &mut buf).is_ok_and(|n| n > 0) {}
        }
    }

    /// The sockets there are now: every socket in the directories, and the
    /// named ones.
    fn candidates(&self) -> Vec<PathBuf> {
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
        found
    }

    fn attach_new(&mut self) {
        let now = Instant::now();
        for path in self.candidates() {
            let reg = lock(&self.registry);
            let recently_failed = reg
                .failures
                .get(&path)
                .is_some_and(|f| now.duration_since(f.at) < RETRY_AFTER);
            if reg.targets.contains_key(&path) || recently_failed {
                continue;
            }
            drop(reg);
            if self.pending.contains_key(&path) {
                continue;
            }
            self.pending.insert(path.clone(), now);
            let (tx, timeout) = (self.results.0.clone(), self.sources.attach_timeout);
            let spawned = std::thread::Builder::new()
                .name("exporter-attach".into())
                .spawn(move || {
                    let result = attach(&path, timeout);
                    let _ = tx.send((path, result));
                });
            if let Err(e) = spawned {
                log::warn!("exporter: cannot start an attach thread: {e}");
            }
        }
    }

    fn collect_attached(&mut self) {
        while let Ok((path, result)) = self.results.1.try_recv() {
            self.pending.remove(&path);
            let mut reg = lock(&self.registry);
            match result {
                Ok(target) => {
                    log::info!(
                        "exporter: reading VM {:?} (pid {}, {} vCPUs) from {}",
                        target.name,
                        target.pid,
                        target.vcpus.len(),
                        path.display()
                    );
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

    /// Drops VMs whose VMM has gone, whose socket is gone, or whose guest
    /// migrated away; forgets failures of sockets that are gone.
    fn check_attached(&mut self) {
        let mut reg = lock(&self.registry);
        let mut gone = Vec::new();
        for (path, t) in reg.targets.iter_mut() {
            if let Some(why) = departed(path, t) {
                gone.push((path.clone(), why));
            }
        }
        for (path, why) in gone {
            log::info!("exporter: dropping {}: {why}", path.display());
            reg.targets.remove(&path);
        }
        reg.failures.retain(|path, _| path.exists());
    }
}

/// Why an attached VM is no longer read, if it is not.
fn departed(path: &Path, t: &mut Target) -> Option<String> {
    if !path.exists() {
        return Some("its socket is gone".into());
    }
    match t.client.take_events() {
        Err(client::Error::Closed) => Some("the VMM closed the connection".into()),
        Err(e) => Some(crate::error_chain(&e)),
        // Source and destination both see a migration complete; only the
        // source is left without a guest (`postmigrate`).
        Ok(events)
            if events
                .iter()
                .any(|e| e["event"] == "MIGRATION" && e["data"]["status"] == "completed") =>
        {
            match migrated_away(&mut t.client) {
                Ok(true) => Some("its guest migrated away".into()),
                Ok(false) => None,
                Err(e) => Some(crate::error_chain(&e)),
            }
        }
        Ok(_) => None,
    }
}

/// Whether the VMM's guest has left it (`query-status` says `postmigrate`).
fn migrated_away(client: &mut Client) -> Result<bool, client::Error> {
    let (status, _) = client.execute("query-status", json!({}))?;
    Ok(status["status"] == "postmigrate")
}

/// Connects to one VMM, reads its greeting, and takes its stats fds.
fn attach(path: &Path, timeout: Duration) -> Result<Target, AttachError> {
    let mut client = Client::connect_within(path, timeout)?;
    if migrated_away(&mut client)? {
        return Err(AttachError::MigratedAway);
    }
    let vm = client.greeting.qmp.kvmscope.vm.clone();
    let (_, vm_files) = client.execute("get-stats-fd", json!({"target": "vm"}))?;
    let (_, vcpu_files) =
        client.execute("get-stats-fd", json!({"target": "vcpu", "vcpu": "all"}))?;
    let open = |files: Vec<std::fs::File>| -> Result<Vec<(StatsFd, Sample)>, client::Error> {
        files
            .into_iter()
            .map(|f| {
                let fd = StatsFd::new(f)?;
                let sample = fd.new_sample();
                Ok((fd, sample))
            })
            .collect()
    };
    let vm_stats = open(vm_files)?
        .into_iter()
        .next()
        .ok_or_else(|| client::Error::BadReply("get-stats-fd for the VM carried no fd".into()))?;
    Ok(Target {
        labels: super::vm_labels(&vm.name, vm.pid, path),
        name: vm.name,
        pid: vm.pid,
        memory: vm.memory,
        backend: vm.backend,
        vm: vm_stats,
        vcpus: open(vcpu_files)?,
        client,
    })
}
