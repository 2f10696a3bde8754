//! `kvmscope exporter`: one telemetry agent per host. It finds every kvmscope
//! control socket in its directories, takes each VM's and vCPU's stats fds
//! once (`get-stats-fd`, `SCM_RIGHTS`), parses each schema once, and on every
//! scrape reads each fd with one `pread`: no request goes to any VMM per
//! scrape, and no vCPU leaves the guest for it (docs/EXPORTER.md).
//!
//! Threads: `exporter-watch` (discovery, `targets`), short-lived
//! `exporter-attach` threads (one per new socket, bounded by a timeout), and
//! the HTTP server of `crate::metrics::http`, which renders the page
//! (`page`) on each scrape from every provider (`provider`: kvmscope VMMs in
//! `kvmscope`, QEMU in `qemu`).

pub(crate) mod exit_sums;
pub(crate) mod kvmscope;
pub(crate) mod labels;
pub(crate) mod page;
pub(crate) mod provider;
pub(crate) mod qemu;
pub(crate) mod qemu_reply;
pub(crate) mod targets;

pub use targets::{MAX_ATTACHING, MAX_ATTACHING_PER_OWNER};

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::lock;
use crate::metrics::{http, CONTENT_TYPE};
use targets::{Registry, Sources, Watcher};

/// Where VMs' control sockets live unless told otherwise: `kvmscope run
/// --socket /run/kvmscope/NAME.sock` puts a VM where the exporter looks.
pub const DEFAULT_SOCKET_DIR: &str = "/run/kvmscope";

/// Why the exporter could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The HTTP server could not start.
    #[error(transparent)]
    Http(#[from] http::Error),
    /// The discovery thread could not start.
    #[error("starting the discovery thread")]
    Spawn(#[source] std::io::Error),
    /// A `--stats` pattern that matches nothing sensible (said once: not a
    /// source, whose text the error chain would repeat).
    #[error("--stats {0}")]
    Pattern(kvm_stats::BadPattern),
}

/// How the exporter runs.
#[derive(Debug, Clone)]
pub struct ExporterConfig {
    /// Where to serve `/metrics`.
    pub listen: SocketAddr,
    /// Directories of control sockets (every socket in them is a VM).
    pub dirs: Vec<PathBuf>,
    /// Control sockets named one by one.
    pub sockets: Vec<PathBuf>,
    /// Longest time to attach to one VMM (connect, greeting, fds).
    pub attach_timeout: Duration,
    /// Which KVM stats go on the page.
    pub stats: kvm_stats::NameFilter,
    /// QEMU QMP monitors to read with `query-stats`.
    pub qmp_sockets: Vec<PathBuf>,
    /// How often each QEMU VM's figures are refreshed.
    pub qmp_interval: Duration,
    /// Also read QEMU's vCPU stats (with QEMU before 8.1 each refresh kicks
    /// every vCPU; 8.1 and later read them with `pread`).
    pub qmp_vcpus: bool,
    /// Also show the VMMs' own exit counters per vCPU (they are always
    /// there summed per VM).
    pub vcpu_exits: bool,
}

/// The running exporter; dropping it stops its threads and closes every fd.
pub struct Exporter {
    /// The address the page is served at (the real port when 0 was asked for).
    pub addr: SocketAddr,
    /// What discovery knows (for tests and tools).
    pub(crate) registry: Arc<Mutex<Registry>>,
    _server: http::Server,
    _watcher: Watcher,
}

impl Exporter {
    /// Starts discovery and the HTTP server.
    ///
    /// # Errors
    /// The address cannot be bound, or a thread cannot start.
    pub fn start(config: ExporterConfig) -> Result<Exporter, Error> {
        targets::raise_fd_limit();
        let registry = Arc::new(Mutex::new(Registry::default()));
        let watcher = targets::watch(
            Sources {
                dirs: config.dirs,
                sockets: config.sockets,
                attach_timeout: config.attach_timeout,
            },
            registry.clone(),
        )
        .map_err(Error::Spawn)?;
        let qemu = qemu::poll(
            &config.qmp_sockets,
            config.qmp_interval,
            config.qmp_vcpus,
            config.attach_timeout,
        )
        .map_err(Error::Spawn)?;
        let mut providers: Vec<Box<dyn provider::Provider>> = vec![
            Box::new(kvmscope::KvmscopeVms::new(
                registry.clone(),
                config.vcpu_exits,
            )),
            Box::new(qemu),
        ];
        let filter = config.stats;
        let mut kept = page::Kept::default();
        let render = move || page::render(&mut providers, &mut kept, &filter);
        let server = http::Server::start(
            config.listen,
            "exporter",
            http::Page {
                path: "/metrics",
                content_type: CONTENT_TYPE,
                render: Box::new(render),
            },
        )?;
        Ok(Exporter {
            addr: server.addr,
            registry,
            _server: server,
            _watcher: watcher,
        })
    }

    /// How many VMs are attached now.
    pub fn vms(&self) -> usize {
        lock(&self.registry).targets.len()
    }
}
