//! The control protocol's wire types, shared by the server (`control`) and
//! the clients (`client`): QEMU's QMP, with stats fds riding on replies.
//!
//! ```text
//!  client                                   server
//!    |  <------------- greeting {"QMP": {version, capabilities, kvmscope}}
//!    |  {"execute":"qmp_capabilities"} --->   negotiation mode: only this
//!    |  <------------- {"return": {}}         command is served
//!    |  {"execute": NAME, "arguments": {..}, "id": X} --->   command mode
//!    |  <------------- {"return": .., "id": X}  (+ fds, SCM_RIGHTS)
//!    |                 or {"error": {"class", "desc"}, "id": X}
//!    |  <------------- {"event": NAME, "data": .., "timestamp": ..}  any time
//! ```
//!
//! The server reads a stream of JSON values (no newline needed between them,
//! and a value may span lines: [`framing`]) and answers each with one line,
//! in order. Before `qmp_capabilities` every other command is refused with
//! `CommandNotFound`, as QEMU does; a second `qmp_capabilities` is an error.
//!
//! Versioning: [`PROTOCOL_VERSION`] (in the greeting's `kvmscope` member) is
//! bumped when a reply or request changes shape in a way an existing client
//! would notice; additions (a new command, a new reply member) do not bump it.
//! docs/PROTOCOL.md is the reference, with every difference from QEMU.

pub mod dirty_rate;
pub mod events;
pub mod framing;
pub mod guest;
pub(crate) mod migration;
pub use migration::MAX_DOWNTIME_LIMIT_MS;
pub mod readiness;
pub(crate) mod reply;
pub mod request;
pub mod samples;
pub mod vm;

pub use reply::{ErrorClass, Event, Greeting, Message, QmpError};
pub use request::{Command, Request, RequestError, StatsTarget, VcpuRef, VcpuSelector};

/// Version of the protocol in the greeting. 2: QMP negotiation, QEMU's error
/// classes and greeting, streamed JSON framing.
pub(crate) const PROTOCOL_VERSION: u32 = 2;
