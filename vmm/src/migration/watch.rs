//! What keeps a destination stoppable while it waits for its source and
//! while the stream loads: the wait and the load run on a `migration-in`
//! thread, and the main thread answers termination signals and the control
//! plane meanwhile (`quit` stops them, other run-state changes are refused
//! while `inmigrate`). The thread's waits and reads
//! ([`Watched`](super::inbound::Watched)) see the stop within a
//! [`TICK`](super::transport::TICK).

use std::sync::Arc;
use std::time::Duration;

use super::handle::Migration;
use super::inbound::Stop;
use super::receiver::{Error, Incoming, IncomingConfig};
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
    let ours = m.clone();
    let (stream, received) = on_the_side(vm, m, move || {
        let mut stream = stream;
        let received = stream.receive(&mem, &ours);
        (stream, received)
    })?;
    stream.finish(vm, m, received)
}

/// Waits for a source on a `migration-in` thread while this (main) thread
/// takes the events of `vm`, a VM built ahead whose control socket already
/// serves: `quit` or a termination signal stops the wait (through `m`, which
/// `stop` reads), other run-state requests are refused.
///
/// # Errors
/// As [`Incoming::accept`].
pub(crate) fn accept(
    given: &IncomingConfig,
    vm: &mut Vm,
    m: &Arc<Migration>,
    stop: &Stop,
) -> Result<Incoming, Error> {
    let (given, ours, stop) = (given.clone(), m.clone(), stop.clone());
    on_the_side(vm, m, move || Incoming::accept(&given, &ours, &stop))?
}

/// Runs `work` on a `migration-in` thread and answers `vm`'s events on this
/// one until it ends; returns what it returned.
fn on_the_side<T: Send + 'static>(
    vm: &mut Vm,
    m: &Arc<Migration>,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Error> {
    let done = vm.event_sender();
    let worker = std::thread::Builder::new()
        .name("migration-in".into())
        .spawn(move || {
            let out = work();
            let _ = done.send(VmEvent::Loaded);
            out
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
    Ok(worker
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
}
