//! Live migration between two kvmscope processes: pre-copy over a unix or
//! TCP socket, counted with QEMU's names (`query-migrate`).
//!
//! - [`format`](mod@format): the versioned stream (headers, sections, trailer);
//! - [`transport`]: `unix:PATH` and `tcp:HOST:PORT`, connecting, and a
//!   connection with its deadlines (silence, and the whole);
//! - [`inbound`]: the destination's listener and its watched reads (idle
//!   deadline, whole deadlines, stop);
//! - [`crate::backing`] (outside: dirty tracking uses it too): which pages
//!   the host ever backed (page map), zero checks;
//! - [`writer`]: the page writer: runs, batching into sections, zero pages,
//!   counters, pacing to `max-bandwidth`;
//! - [`sender`]: the source's pre-copy policy (passes, the stop test, the
//!   hold), stop-and-copy and recovery, driving the writer;
//! - [`source`]: what the source needs of its VM;
//! - [`handshake`]: the destination's wait for its source (every peer's header at once);
//! - [`receiver`]: the destination's state machine;
//! - [`watch`]: the destination's main thread while the stream loads;
//! - [`device`]: vCPU state on the wire;
//! - [`digest`]: the RAM CRC-32 that `x-check-ram` compares;
//! - [`handle`]: the [`Migration`] handle the control socket drives, its
//!   parameters, status and events;
//! - this file: the re-exports, and [`Migration::start`], which spawns the
//!   sender (here, so that no child file names an item of this one).
//!
//! The stream, the states and what happens on failure are in docs/MIGRATION.md.

pub(crate) mod converge;
pub(crate) mod device;
pub(crate) mod digest;
pub mod format;
pub(crate) mod handle;
pub mod handshake;
pub(crate) mod inbound;
pub(crate) mod prefetch;
pub mod receiver;
pub(crate) mod sender;
pub(crate) mod source;
pub(crate) mod transport;
pub(crate) mod watch;
pub(crate) mod writer;

use std::sync::Arc;

pub use handle::Error;
pub(crate) use handle::Migration;
pub(crate) use source::Source;
pub use transport::Uri;

pub use crate::protocol::migration::{MigrationInfo, Parameters, RamStats, SetParameters, Status};

impl Migration {
    /// Starts migrating `source`'s guest to `uri` on a `migration` thread.
    ///
    /// # Errors
    /// One is running or done, this is a destination, or no thread could start.
    pub(crate) fn start(self: &Arc<Self>, uri: Uri, source: Source) -> Result<(), Error> {
        self.begin(&uri, source.memory())?;
        // With dirty-limit the migration owns the limits from here (standalone
        // changes refused, as in QEMU) until its end, whatever the outcome;
        // a standalone limit's stall period ends here, before the migration's
        // baseline, so that each fault counts once.
        let limits = self.owns_limits().then(|| source.dirty_limits.clone());
        if let Some(l) = &limits {
            l.begin_migration();
        }
        let me = self.clone();
        std::thread::Builder::new()
            .name("migration".into())
            .spawn(move || sender::run(&me, &uri, &source))
            .map(|_| ())
            .map_err(|e| {
                if let Some(l) = &limits {
                    l.end_migration();
                }
                self.update(|i| i.status = Some(Status::Failed));
                Error::Spawn(e)
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_migrate_uses_qemus_member_names() {
        let info = MigrationInfo {
            status: Some(Status::Active),
            ram: Some(RamStats {
                normal_bytes: 4096,
                dirty_sync_count: 2,
                ..RamStats::default()
            }),
            setup_time: Some(3),
            ..MigrationInfo::default()
        };
        let v = serde_json::to_value(&info).unwrap();
        assert_eq!(v["status"], "active");
        assert_eq!(v["setup-time"], 3);
        assert_eq!(v["ram"]["normal-bytes"], 4096);
        assert_eq!(v["ram"]["dirty-sync-count"], 2);
        assert!(v.get("downtime").is_none());
    }
}
