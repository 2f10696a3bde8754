//! The control plane: a Unix socket speaking QEMU's QMP (wire types in
//! `crate::protocol`) that hands out stats fds (SCM_RIGHTS) and drives the
//! guest, served by one `control` thread.
//!
//! - [`commands`]: what each command does against the VM;
//! - [`deferred`]: replies that come later (`guest-command` with `wait`, `query-readiness`);
//! - [`outcome`]: what a command gives the plane (shared by the two above);
//! - [`plane`]: the event-manager subscriber (listener, clients, timers);
//! - [`deadlines`]: client deadlines and eviction;
//! - [`connection`]: one client's framed input and fd-carrying output queue;
//! - [`socket`]: the socket file (mode 0600, never clobbering a live socket);
//! - [`scm`](crate::scm) (beside this module, shared with the clients):
//!   sending and receiving fds, peer credentials.
//!
//! The protocol, with examples and limits, is in docs/PROTOCOL.md.

pub mod commands;
pub(crate) mod connection;
pub(crate) mod deadlines;
pub(crate) mod deferred;
pub(crate) mod events;
pub(crate) mod migrate;
pub(crate) mod outcome;
pub(crate) mod plane;
pub(crate) mod socket;

use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::thread::JoinHandle;

use std::time::Duration;

use event_manager::{EventManager, SubscriberId, SubscriberOps};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::backend::Backend;
use crate::messages::VmEvent;
use crate::runstate::SharedRunState;
use crate::vcpu::VcpuShared;
use crate::vm::{self, Vm};
use commands::Handler;
use plane::{Plane, PlaneFds};
use socket::SocketFile;

/// Clients served at once. When full, the longest-idle client with nothing
/// outstanding is closed to admit a new one; only if every client is busy is
/// the new one refused.
pub const MAX_CLIENTS: usize = 64;

/// Slots past [`MAX_CLIENTS`] kept for the operator: when every client is busy
/// (none can be evicted), a new client still gets in, to negotiate and ask
/// `query-status`, `query-version` or `quit` only.
pub const RESERVED_CLIENTS: usize = 4;
/// Event bytes (beyond the reply being sent) a client may leave unread
/// before it is dropped.
pub(crate) const MAX_QUEUED_BYTES: usize = 4 << 20;
/// Fds a client may leave unreceived before it is dropped.
pub(crate) const MAX_QUEUED_FDS: usize = 512;

/// The deadlines the control plane holds clients to (see `deadlines`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// From connecting to a successful `qmp_capabilities`.
    pub handshake: Duration,
    /// From the first byte of a request to its last.
    pub request: Duration,
    /// Queued output that does not move for this long drops the client.
    pub send: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            handshake: Duration::from_secs(10),
            request: Duration::from_secs(10),
            send: Duration::from_secs(30),
        }
    }
}

impl Limits {
    /// How often deadlines are checked: often enough to hold each within a
    /// quarter of itself, at most every 10 ms, at least every second.
    pub(crate) fn sweep_period(&self) -> Duration {
        let shortest = self.handshake.min(self.request).min(self.send);
        (shortest / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
    }
}

/// Why the control plane could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `dup` of the VM fd or a vCPU stats fd failed.
    #[error("duplicating a VMM fd")]
    Dup(#[source] std::io::Error),
    /// The socket file could not be set up at its path.
    #[error(transparent)]
    Socket(#[from] socket::Error),
    /// `KVM_GET_STATS_FD` on the VM failed.
    #[error("opening a stats fd")]
    StatsFd(#[from] kvm_stats::ioctl::Error),
    /// A stats fd's header or descriptors could not be read.
    #[error("reading a stats fd")]
    Stats(#[from] kvm_stats::Error),
    /// An eventfd or the deadline timer could not be created, or the listener
    /// could not be made non-blocking.
    #[error("creating the control thread's eventfds and timer")]
    EventFd(#[source] std::io::Error),
    /// The epoll-based event manager could not be made or take a subscriber.
    #[error("setting up the control thread's event manager")]
    EventManager(#[source] event_manager::Error),
    /// The `control` thread could not be spawned.
    #[error("starting the control thread")]
    Spawn(#[source] std::io::Error),
    /// The control thread's epoll loop failed: the socket stopped serving.
    #[error("the control socket stopped serving")]
    Serve(#[source] event_manager::Error),
    /// The control thread panicked.
    #[error("the control thread panicked")]
    Panicked,
    /// The control thread could not be told to stop (it is left running).
    #[error("signalling the control thread to stop")]
    Signal(#[source] std::io::Error),
}

/// What the control thread may reach of the VM: read-only handles, the vCPUs'
/// shared parts, and a channel to the main loop for run-state changes.
pub(crate) struct Context {
    /// Duplicate of the VM fd, only for KVM_GET_STATS_FD.
    pub(crate) vm_fd: File,
    /// Duplicates of the vCPU stats files the VMM opened before the vCPUs first
    /// ran. The control plane hands out copies of these rather than issuing
    /// KVM_GET_STATS_FD on a vCPU fd, which takes the vCPU's mutex and so
    /// waits, for as long as the guest runs, until the vCPU leaves KVM_RUN.
    pub(crate) vcpu_stats: Vec<File>,
    /// Each vCPU's shared part, by index: queues, results, counters, state.
    pub(crate) vcpus: Vec<Arc<VcpuShared>>,
    /// The host's KVM backend, for the greeting and `query-vm`.
    pub(crate) backend: Backend,
    /// Guest RAM in bytes.
    pub(crate) memory: u64,
    /// Whether guest RAM is backed by huge pages.
    pub(crate) hugepages: bool,
    /// To the main loop: `VmEvent::Control` requests.
    pub(crate) main: Sender<VmEvent>,
    /// The sampler's ring, when it runs (for `query-samples` / `subscribe-samples`).
    pub(crate) samples: Option<Arc<crate::sampler::Shared>>,
    /// Guest RAM (a clone keeps the mapping alive while a readiness scan reads it).
    pub(crate) mem: crate::memory::GuestMemory,
    /// Dirty tracking, when the VM was started with a mode (for `query-readiness`).
    pub(crate) dirty: Option<Arc<crate::dirty::DirtyLog>>,
    /// The VM's name (`query-name`, the greeting).
    pub(crate) name: String,
    /// The run state the main loop keeps (`query-status`).
    pub(crate) run_state: Arc<SharedRunState>,
    /// The migration handle and the VM's source side (for `migrate` and friends).
    pub(crate) migration: Option<(Arc<crate::migration::Migration>, crate::migration::Source)>,
}

impl Context {
    /// Gathers the control plane's handles from a VM.
    ///
    /// # Errors
    /// `Dup` if an fd cannot be duplicated.
    pub(crate) fn new(vm: &Vm) -> Result<Context, Error> {
        let vcpu_stats = vm
            .vcpu_stats
            .iter()
            .map(|s| vm::dup_fd(s.file()))
            .collect::<Result<_, _>>()
            .map_err(Error::Dup)?;
        Ok(Context {
            vm_fd: vm::dup_fd(&*vm.fd).map_err(Error::Dup)?,
            vcpu_stats,
            vcpus: vm.vcpus.iter().map(|v| v.shared.clone()).collect(),
            backend: vm.backend.clone(),
            memory: vm.config.memory,
            hugepages: vm.config.hugepages,
            main: vm.event_sender(),
            samples: None,
            mem: vm.mem.clone(),
            dirty: vm.dirty_configured().cloned(),
            name: format!("kvmscope-{}", std::process::id()),
            run_state: Arc::new(SharedRunState::default()),
            migration: None,
        })
    }
}

/// The running control socket; dropping it stops the thread and removes the socket file.
pub(crate) struct Server {
    exit: EventFd,
    stopping: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<(), Error>>>,
    // Held for its Drop, after the thread is joined: the file goes once
    // nobody listens.
    _socket: SocketFile,
}

impl Server {
    /// Binds the socket at `path` and starts the `control` thread.
    ///
    /// # Errors
    /// The socket file cannot be set up (in use, not a socket, ...), or a stats
    /// fd, eventfd, epoll or thread cannot be had.
    pub(crate) fn start(path: &Path, context: Context, limits: Limits) -> Result<Server, Error> {
        let (socket, listener) = SocketFile::bind(path)?;
        listener.set_nonblocking(true).map_err(Error::EventFd)?;
        let new_eventfd = || EventFd::new(EFD_NONBLOCK | libc::EFD_CLOEXEC).map_err(Error::EventFd);
        let exit = new_eventfd()?;
        let (ours_ticks, idle_ticks) = (new_eventfd()?, new_eventfd()?);
        let ours = Arc::new(new_eventfd()?);
        // Every vCPU writes the same watcher (if another server set one first, use that).
        let watcher = context.vcpus.first().map_or(ours.clone(), |v| {
            v.watcher.get_or_init(|| ours.clone()).clone()
        });
        for v in &context.vcpus {
            v.watcher.get_or_init(|| watcher.clone());
        }
        if let Some((m, _)) = &context.migration {
            m.set_wake(watcher.clone());
            m.set_run_state(context.run_state.clone());
        }
        context.run_state.set_wake(watcher.clone());
        // The sampler writes this after every tick, for `subscribe-samples`.
        let ticks = context
            .samples
            .as_ref()
            .map(|s| s.tick_fd.get_or_init(|| Arc::new(ours_ticks)).clone());
        let stopping = Arc::new(AtomicBool::new(false));
        let handler = Handler::new(context, stopping.clone())?;
        let fds = PlaneFds {
            listener,
            exit: exit.try_clone().map_err(Error::EventFd)?,
            watcher,
            ticks: ticks.unwrap_or_else(|| Arc::new(idle_ticks)),
        };
        let plane = Plane::new(fds, handler, limits).map_err(Error::EventFd)?;
        let mut manager = EventManager::new().map_err(Error::EventManager)?;
        let id = manager.add_subscriber(plane);
        let thread = std::thread::Builder::new()
            .name("control".into())
            .spawn(move || serve(manager, id))
            .map_err(Error::Spawn)?;
        log::info!("control socket at {}", socket.path().display());
        Ok(Server {
            exit,
            stopping,
            thread: Some(thread),
            _socket: socket,
        })
    }
}

impl Server {
    /// Stops the thread and says whether it had served to the end: an epoll
    /// failure or a panic on the way is the error (the run reports it).
    ///
    /// # Errors
    /// `Serve`, `Panicked`, or `Signal` if the thread could not be told.
    pub(crate) fn shutdown(mut self) -> Result<(), Error> {
        self.stop_thread()
    }

    fn stop_thread(&mut self) -> Result<(), Error> {
        let Some(thread) = self.thread.take() else {
            return Ok(());
        };
        self.stopping.store(true, Ordering::Release);
        self.exit.write(1).map_err(Error::Signal)?;
        thread.join().map_err(|_| Error::Panicked)?
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Err(e) = self.stop_thread() {
            log::error!("control: {}", crate::error_chain(&e));
        }
    }
}

/// The `control` thread: dispatch events until the exit eventfd fires.
fn serve(mut manager: EventManager<Plane>, id: SubscriberId) -> Result<(), Error> {
    loop {
        if let Err(e) = manager.run() {
            log::error!("control: epoll failed ({e}); the control socket stops serving");
            return Err(Error::Serve(e));
        }
        match manager.subscriber_mut(id) {
            Ok(plane) if !plane.done => {}
            _ => return Ok(()),
        }
    }
}
