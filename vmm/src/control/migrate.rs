//! The migration commands, with QEMU's names and shapes: `migrate`,
//! `migrate-set-parameters`, `query-migrate-parameters`,
//! `migrate-set-capabilities`, `query-migrate-capabilities`, `query-migrate`,
//! `migrate_cancel` (wire types in `protocol::migration`); their events
//! (`MIGRATION`, `MIGRATION_PASS`) go to every client past negotiation.

use serde_json::json;

use super::context::Context;
use super::outcome::Outcome;
use crate::migration::Uri;
use crate::protocol::{Command, Event, Message};

/// Runs a migration command (any other command is an internal error).
pub(crate) fn execute(ctx: &Context, command: Command) -> Outcome {
    let Some((m, source)) = &ctx.migration else {
        return Outcome::generic("this VMM cannot migrate (no migration handle)");
    };
    match command {
        Command::Migrate(a) => match (a.refused(), a.uri.parse::<Uri>()) {
            (Some(why), _) => Outcome::generic(why),
            (None, Err(e)) => Outcome::generic(e.to_string()),
            (None, Ok(uri)) => match m.start(uri, source.clone()) {
                Ok(()) => Outcome::ret(json!({})),
                Err(e) => Outcome::generic(crate::error_chain(&e)),
            },
        },
        Command::MigrateSetParameters(p) => match m.set_parameters(p, source.vcpus.len()) {
            Ok(()) => Outcome::ret(json!({})),
            Err(e) => Outcome::generic(e.to_string()),
        },
        Command::QueryMigrateParameters(_) => Outcome::ret(m.parameters()),
        Command::MigrateSetCapabilities(c) => {
            match m.set_capabilities(&c, source.dirty_limits.ring().is_some()) {
                Ok(()) => Outcome::ret(json!({})),
                Err(e) => Outcome::generic(e.to_string()),
            }
        }
        Command::QueryMigrateCapabilities(_) => Outcome::ret(m.capabilities()),
        Command::QueryMigrate(_) => Outcome::ret(m.status()),
        Command::MigrateCancel(_) => {
            // As QEMU's, it answers {} whatever it could do: past the
            // trailer the migration completes (or fails) on its own.
            if !m.cancel_unless_committed() {
                log::info!("migrate_cancel: not taken, the migration's trailer is sent");
            }
            Outcome::ret(json!({}))
        }
        other => Outcome::generic(format!("{} is not a migration command", other.name())),
    }
}

/// Event lines for every client: what the migration queued since the last
/// call, each with the run state's change count when it was queued.
pub(crate) fn event_lines(ctx: &Context) -> Vec<(u64, Vec<u8>)> {
    let Some((m, _)) = &ctx.migration else {
        return Vec::new();
    };
    m.take_events()
        .into_iter()
        .map(|(stamp, kind)| (stamp, Message::Event(Event::of(&kind)).to_line()))
        .collect()
}

#[cfg(test)]
mod tests {
    use crate::protocol::migration::{MigrateArgs, SetParameters};
    use crate::protocol::request::parse;
    use crate::protocol::Command;

    fn command(line: &str) -> Result<Command, String> {
        parse(line.as_bytes())
            .map(|r| r.command)
            .map_err(|e| e.desc)
    }

    #[test]
    fn migrate_needs_a_uri_and_nothing_unknown() {
        assert_eq!(
            command(r#"{"execute": "migrate", "arguments": {"uri": "unix:/tmp/x"}}"#),
            Ok(Command::Migrate(MigrateArgs {
                uri: "unix:/tmp/x".into(),
                detach: None,
                blk: None,
                inc: None,
                resume: None,
            }))
        );
        assert!(command(r#"{"execute": "migrate"}"#).is_err());
        assert!(
            command(r#"{"execute": "migrate", "arguments": {"uri": "unix:/x", "bogus": 1}}"#)
                .is_err()
        );
    }

    #[test]
    fn migrate_takes_libvirts_arguments_and_refuses_what_it_cannot_do() {
        let args = |line: &str| match command(line) {
            Ok(Command::Migrate(a)) => a,
            other => panic!("{other:?}"),
        };
        // As libvirt sends it with QEMU 7.2.
        let libvirt = args(
            r#"{"execute": "migrate", "arguments": {"detach": true, "blk": false, "inc": false, "uri": "unix:/x"}}"#,
        );
        assert_eq!(libvirt.refused(), None);
        let blk = args(r#"{"execute": "migrate", "arguments": {"uri": "unix:/x", "blk": true}}"#);
        assert!(blk.refused().is_some_and(|e| e.contains("'blk'")));
        let resume =
            args(r#"{"execute": "migrate", "arguments": {"uri": "unix:/x", "resume": true}}"#);
        assert_eq!(
            resume.refused(),
            Some("Cannot resume if there is no paused migration")
        );
    }

    #[test]
    fn set_parameters_and_cancel_take_qemus_names() {
        let c = command(
            r#"{"execute": "migrate-set-parameters", "arguments": {"max-bandwidth": 125000000, "downtime-limit": 30}}"#,
        );
        assert_eq!(
            c,
            Ok(Command::MigrateSetParameters(SetParameters {
                max_bandwidth: Some(125_000_000),
                downtime_limit: Some(30),
                ..SetParameters::default()
            }))
        );
        let e =
            command(r#"{"execute": "migrate-set-parameters", "arguments": {"max-bandwidth": -1}}"#)
                .unwrap_err();
        assert!(e.contains("max-bandwidth"), "{e}");
        assert!(command(r#"{"execute": "migrate_cancel"}"#).is_ok());
        assert!(command(r#"{"execute": "query-migrate"}"#).is_ok());
    }
}
