//! The events the server sends, typed: [`EventKind`] is the one list of
//! event names and their data (docs/PROTOCOL.md, "Events"). The server makes
//! an [`Event`] from one ([`Event::of`]); a client reads one back from an
//! event line ([`Event::kind`]), with events of a newer server left as `None`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::migration::Status;
use super::reply::Event;
use super::samples::SampleRecord;

/// `READINESS_PROGRESS`'s data: how far a readiness scan got, in pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScanProgress {
    /// Pages scanned so far.
    pub done: u64,
    /// Pages to scan.
    pub total: u64,
}

/// `MIGRATION`'s data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigrationChange {
    /// The migration's new status.
    pub status: Status,
}

/// `MIGRATION_PASS`'s data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigrationPass {
    /// The pass that ended (its dirty log synced), from 1.
    pub pass: u64,
}

/// `SHUTDOWN`'s data, as QEMU's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShutdownInfo {
    /// Whether the guest caused it (QEMU's rule: the guest's causes).
    pub guest: bool,
    /// QEMU's `ShutdownCause`.
    pub reason: ShutdownCause,
}

impl ShutdownInfo {
    /// The event for `reason`, `guest` as QEMU sets it.
    pub fn of(reason: ShutdownCause) -> ShutdownInfo {
        let guest = matches!(
            reason,
            ShutdownCause::GuestShutdown | ShutdownCause::GuestPanic
        );
        ShutdownInfo { guest, reason }
    }
}

/// Why the VMM stops, in QEMU's `ShutdownCause` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ShutdownCause {
    /// A client sent `quit`.
    HostQmpQuit,
    /// SIGINT, SIGTERM or SIGHUP.
    HostSignal,
    /// The VM could not go on: a guest fault the VMM cannot handle, a KVM
    /// error, a boot deadline missed.
    HostError,
    /// The guest reported a panic.
    GuestPanic,
    /// The guest's work ended (a VMM that serves nobody stops then).
    GuestShutdown,
}

/// `SAMPLES_DROPPED`'s data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SamplesDropped {
    /// Samples the subscriber will not get.
    pub count: u64,
}

/// Every event, with its data. The serde and strum names are the wire names.
#[derive(
    Debug, Clone, PartialEq, Serialize, Deserialize, strum::VariantNames, strum::IntoStaticStr,
)]
#[serde(tag = "event", content = "data", rename_all = "SCREAMING_SNAKE_CASE")]
#[strum(serialize_all = "SCREAMING_SNAKE_CASE")]
pub enum EventKind {
    /// The guest stopped running (no data, as QEMU's).
    Stop,
    /// The guest runs again (no data).
    Resume,
    /// A sampler tick, to `subscribe-samples` clients.
    Sample(SampleRecord),
    /// A subscriber fell behind the ring.
    SamplesDropped(SamplesDropped),
    /// A `query-readiness` scan's progress, before its reply.
    ReadinessProgress(ScanProgress),
    /// A migration's status changed.
    Migration(MigrationChange),
    /// A pre-copy pass ended.
    MigrationPass(MigrationPass),
    /// The VMM is stopping: the last event before the connection closes.
    Shutdown(ShutdownInfo),
}

impl EventKind {
    /// The wire name.
    pub fn name(&self) -> &'static str {
        self.into()
    }

    /// Every wire name.
    pub fn names() -> &'static [&'static str] {
        <EventKind as strum::VariantNames>::VARIANTS
    }
}

impl Event {
    /// The event `kind`, stamped now.
    pub(crate) fn of(kind: &EventKind) -> Event {
        let data = match serde_json::to_value(kind) {
            Ok(Value::Object(mut m)) => m.remove("data").unwrap_or(Value::Null),
            _ => Value::Null,
        };
        Event::new(kind.name(), data)
    }

    /// The event's name, as sent.
    pub fn name(&self) -> &str {
        &self.event
    }

    /// The event, typed; `Ok(None)` for an event this build does not know
    /// (from a newer server).
    ///
    /// # Errors
    /// A known event whose data has another shape.
    pub fn kind(&self) -> Result<Option<EventKind>, serde_json::Error> {
        if !EventKind::names().contains(&self.event.as_str()) {
            return Ok(None);
        }
        let mut tagged = serde_json::Map::new();
        tagged.insert("event".into(), Value::String(self.event.clone()));
        tagged.insert("data".into(), self.data.clone());
        serde_json::from_value(Value::Object(tagged)).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Message;
    use serde_json::json;

    fn line_of(kind: &EventKind) -> Value {
        serde_json::from_slice(&Message::Event(Event::of(kind)).to_line()).unwrap()
    }

    #[test]
    fn serde_and_strum_agree_on_every_name() {
        let kinds = [
            EventKind::Stop,
            EventKind::Resume,
            EventKind::SamplesDropped(SamplesDropped { count: 1 }),
            EventKind::ReadinessProgress(ScanProgress { done: 1, total: 2 }),
            EventKind::Migration(MigrationChange {
                status: Status::Completed,
            }),
            EventKind::MigrationPass(MigrationPass { pass: 3 }),
        ];
        for kind in kinds {
            let line = line_of(&kind);
            assert_eq!(line["event"], kind.name(), "{line}");
            assert!(EventKind::names().contains(&kind.name()));
            let back: Event = serde_json::from_value(line).unwrap();
            assert_eq!(back.kind().unwrap(), Some(kind));
        }
    }

    #[test]
    fn events_keep_their_wire_shapes() {
        let stop = line_of(&EventKind::Stop);
        assert!(stop.get("data").is_none() && stop["timestamp"]["seconds"].is_u64());
        let progress = line_of(&EventKind::ReadinessProgress(ScanProgress {
            done: 5,
            total: 9,
        }));
        assert_eq!(progress["data"], json!({"done": 5, "total": 9}));
        // What migration/mod.rs sends for a status change.
        let migration = Event::new("MIGRATION", json!({ "status": Status::Failed.name() }));
        assert_eq!(
            migration.kind().unwrap(),
            Some(EventKind::Migration(MigrationChange {
                status: Status::Failed
            }))
        );
        let pass = Event::new("MIGRATION_PASS", json!({ "pass": 2 }));
        assert_eq!(
            pass.kind().unwrap(),
            Some(EventKind::MigrationPass(MigrationPass { pass: 2 }))
        );
    }

    #[test]
    fn unknown_events_are_none_and_bad_data_an_error() {
        let newer = Event::new("BLOCK_JOB_COMPLETED", json!({"device": "x"}));
        assert_eq!(newer.kind().unwrap(), None);
        let bad = Event::new("READINESS_PROGRESS", json!({"done": "half"}));
        assert!(bad.kind().is_err());
    }
}
