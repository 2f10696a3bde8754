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
//! - [`limits`]: client counts, queue caps and deadlines;
//! - [`context`]: what the control thread may reach of the VM;
//! - [`error`]: why the control plane could not start;
//! - [`publish`]: the `vmm-stats` thread, which keeps the VMM's own stats
//!   files (provider `kvmscope`) current;
//! - [`dirty_rate`]: QEMU's `calc-dirty-rate`, measured on a thread of its own;
//! - [`scm`](crate::scm) (beside this module, shared with the clients):
//!   sending and receiving fds, peer credentials;
//! - [`socket_file`](crate::socket_file) (beside this module, shared with a
//!   migration destination): the socket file (mode 0600, never clobbering a
//!   live socket or anything that is not a socket).
//!
//! The protocol, with examples and limits, is in docs/PROTOCOL.md.

pub mod commands;
pub(crate) mod connection;
pub(crate) mod context;
pub(crate) mod deadlines;
pub(crate) mod deferred;
pub(crate) mod dirty_rate;
pub(crate) mod error;
pub(crate) mod events;
pub(crate) mod limits;
pub(crate) mod migrate;
pub(crate) mod outcome;
pub(crate) mod plane;
pub(crate) mod publish;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use event_manager::{EventManager, SubscriberId, SubscriberOps};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::socket_file::SocketFile;
use commands::Handler;
use plane::{Plane, PlaneFds};

use crate::protocol::events::ShutdownCause;

pub(crate) use context::Context;
pub use context::Periodic;
pub use error::Error;
pub use limits::{Limits, MAX_CLIENTS, MAX_TOTAL_QUEUED, RESERVED_CLIENTS};

/// The running control socket; dropping it stops the thread and removes the socket file.
pub(crate) struct Server {
    exit: EventFd,
    /// Why the VMM stops, for the `SHUTDOWN` event ([`Server::shutdown`]).
    cause: Arc<Mutex<Option<ShutdownCause>>>,
    stopping: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<(), Error>>>,
    /// The `vmm-stats` thread.
    publisher: Option<publish::Publisher>,
    /// The most guest pages known to hold data at once (readiness).
    mapped_peak: Arc<crate::readiness::MappedPeak>,
    /// `calc-dirty-rate`'s measurement, ended at the stop.
    dirty_rate: Arc<dirty_rate::DirtyRateCalc>,
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
        let publisher = publish::start(publish::Sources {
            stats: context.vmm_stats.clone(),
            vcpus: context.vcpus.clone(),
            migration: context.migration.as_ref().map(|(m, _)| m.clone()),
            // What KVM maps, for the most it has mapped at once (readiness).
            mapped: (context.open_vm_stats()?, context.mapped_peak.clone()),
            run_state: context.run_state.clone(),
        })
        .map_err(Error::Spawn)?;
        let mapped_peak = context.mapped_peak.clone();
        let dirty_rate = context.dirty_rate.clone();
        let handler = Handler::new(context, stopping.clone())?;
        let cause = Arc::new(Mutex::new(None));
        let fds = PlaneFds {
            listener,
            exit: exit.try_clone().map_err(Error::EventFd)?,
            watcher,
            ticks: ticks.unwrap_or_else(|| Arc::new(idle_ticks)),
            cause: cause.clone(),
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
            cause,
            stopping,
            thread: Some(thread),
            publisher: Some(publisher),
            mapped_peak,
            dirty_rate,
            _socket: socket,
        })
    }
}

impl Server {
    /// Notes the pages a migration in left holding data, which KVM maps
    /// only as the guest touches them again: a readiness estimate set
    /// against what KVM maps takes them into account
    /// (`readiness::MappedPeak`; a guest that rewrote half its data read
    /// half its pages mapped, and the prediction sent half).
    pub(crate) fn note_loaded_pages(&self, pages: u64) {
        self.mapped_peak.note_loaded(pages);
    }

    /// Stops the thread and says whether it had served to the end: an epoll
    /// failure or a panic on the way is the error (the run reports it).
    /// With a `cause`, every negotiated client first gets a `SHUTDOWN` event
    /// saying it (none where the VMM did not run a guest: a destination
    /// whose migration failed).
    ///
    /// # Errors
    /// `Serve`, `Panicked`, or `Signal` if the thread could not be told.
    pub(crate) fn shutdown(mut self, cause: Option<ShutdownCause>) -> Result<(), Error> {
        *crate::lock(&self.cause) = cause;
        self.stop_thread()
    }

    fn stop_thread(&mut self) -> Result<(), Error> {
        let Some(thread) = self.thread.take() else {
            return Ok(());
        };
        self.stopping.store(true, Ordering::Release);
        self.publisher = None;
        self.exit.write(1).map_err(Error::Signal)?;
        let served = thread.join().map_err(|_| Error::Panicked);
        // No command can start another now.
        self.dirty_rate.stop();
        served?
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
