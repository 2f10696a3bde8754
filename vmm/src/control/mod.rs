//! The control plane: a Unix socket speaking QMP-like JSON lines that hands out
//! stats fds (SCM_RIGHTS) and drives the guest, served by one `control` thread.

use std::fs::File;
use std::path::Path;
use std::sync::mpsc::Sender;
use std::sync::Arc;

use crate::backend::Backend;
use crate::vcpu::{VcpuShared, VmEvent};
use crate::vm::{self, Vm};

/// Why the control plane could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("duplicating the VM fd")]
    Dup(#[source] std::io::Error),
}

/// What the control thread may reach of the VM: read-only handles, the vCPUs'
/// shared parts, and a channel to the main loop for run-state changes.
pub struct Context {
    /// Duplicate of the VM fd, only for KVM_GET_STATS_FD.
    pub vm_fd: File,
    /// Duplicates of the vCPU fds, only for KVM_GET_STATS_FD.
    pub vcpu_fds: Vec<File>,
    pub vcpus: Vec<Arc<VcpuShared>>,
    pub backend: Backend,
    pub memory: u64,
    pub hugepages: bool,
    /// To the main loop: `VmEvent::Control` requests.
    pub main: Sender<VmEvent>,
    /// The sampler's ring, when it runs (for `query-samples` / `subscribe-samples`).
    pub samples: Option<Arc<crate::sampler::Shared>>,
}

impl Context {
    /// Gathers the control plane's handles from a VM.
    ///
    /// # Errors
    /// `Dup` if an fd cannot be duplicated.
    pub fn new(vm: &Vm) -> Result<Context, Error> {
        let vcpu_fds = vm
            .vcpu_fds
            .iter()
            .map(vm::dup_fd)
            .collect::<Result<_, _>>()
            .map_err(Error::Dup)?;
        Ok(Context {
            vm_fd: vm::dup_fd(&vm.fd).map_err(Error::Dup)?,
            vcpu_fds,
            vcpus: vm.vcpus.iter().map(|v| v.shared.clone()).collect(),
            backend: vm.backend.clone(),
            memory: vm.config.memory,
            hugepages: vm.config.hugepages,
            main: vm.event_sender(),
            samples: None,
        })
    }
}

/// The running control socket; dropping it stops the thread and removes the socket file.
pub struct Server {
    _context: Context,
}

impl Server {
    /// Binds the socket at `path` and starts the `control` thread.
    ///
    /// # Errors
    /// Not implemented yet.
    pub fn start(_path: &Path, context: Context) -> Result<Server, Error> {
        Ok(Server { _context: context })
    }
}
