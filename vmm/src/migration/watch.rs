//! What keeps a destination stoppable while the stream loads: the load runs
//! on a `migration-in` thread, and the main thread answers termination
//! signals and the control plane meanwhile (`quit` stops the load, other
//! run-state changes are refused while `inmigrate`). The loading thread's
//! reads ([`Watched`](super::transport::Watched)) see the stop within a
//! [`TICK`](super::transport::TICK).

use std::sync::Arc;
use std::time::Duration;

use super::handle::Migration;
use super::receiver::{Error, Incoming};
use crate::messages::{RunRequest, RunStateError, VmEvent};
use crate::vm::Vm;

/// Loads `stream` into `vm` on a `migration-in` thread while this (main)
/// thread takes the VM's events: a termination signal or `quit` stops the
/// load within a [`TICK`](super::transport::TICK), `migrate_cancel` too (through `m`), and other
/// run-state requests are refused (the guest is not here yet).
///
/// # Errors
/// As [`Incoming::finish`]; `Stopped` when told to stop.
pub(crate) fn load(stream: Incoming, vm: &mut Vm, m: &Arc<Migration>) -> Result<(), Error> {
    let mem = vm.mem.clone();
    let done = vm.event_sender();
    let ours = m.clone();
    let worker = std::thread::Builder::new()
        .name("migration-in".into())
        .spawn(move || {
            let mut stream = stream;
            let received = stream.receive(&mem, &ours);
            let _ = done.send(VmEvent::Loaded);
            (stream, received)
        })
        .map_err(Error::Spawn)?;
    while !worker.is_finished() {
        match vm.next_event(Duration::from_secs(1)) {
            Some(VmEvent::Loaded) => break,
            Some(VmEvent::Signal(sig)) => m.stop_incoming(format!("signal {sig}")),
            Some(VmEvent::Control(RunRequest::Quit, reply)) => {
                m.stop_incoming("quit".into());
                let _ = reply.send(Ok(()));
            }
            Some(VmEvent::Control(_, reply)) => {
                let _ = reply.send(Err(RunStateError::Inmigrate));
            }
            _ => {}
        }
    }
    let (stream, received) = worker
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
    stream.finish(vm, m, received)
}
