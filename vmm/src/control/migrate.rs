//! The migration commands, with QEMU's names and shapes: `migrate`,
//! `migrate-set-parameters`, `query-migrate-parameters`, `query-migrate`,
//! `migrate_cancel`; their events (`MIGRATION`, `MIGRATION_PASS`) go to every
//! client. Arguments are serde-typed here; `request.rs` only routes the names.

use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::commands::Outcome;
use super::request::ErrorClass;
use super::Context;
use crate::migration::{SetParameters, Uri};

/// The command names this module answers.
pub const NAMES: [&str; 5] = [
    "migrate",
    "migrate-set-parameters",
    "query-migrate-parameters",
    "query-migrate",
    "migrate_cancel",
];

/// A migration command with its checked arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MigrateCommand {
    /// Start migrating to `uri` (`unix:PATH` or `tcp:HOST:PORT`).
    Migrate {
        uri: String,
    },
    SetParameters(SetParameters),
    QueryParameters,
    Query,
    Cancel,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MigrateArgs {
    uri: String,
    /// QEMU's; migrations always run detached here.
    #[serde(default)]
    #[allow(dead_code)]
    detach: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NoArgs {}

fn typed<T: for<'de> Deserialize<'de>>(
    args: Map<String, Value>,
) -> Result<T, (ErrorClass, String)> {
    serde_json::from_value(Value::Object(args))
        .map_err(|e| (ErrorClass::InvalidArgument, format!("arguments: {e}")))
}

/// Parses a migration command's arguments.
///
/// # Errors
/// `InvalidArgument` for a missing, unknown or mistyped member.
pub fn parse(name: &str, args: Map<String, Value>) -> Result<MigrateCommand, (ErrorClass, String)> {
    Ok(match name {
        "migrate" => MigrateCommand::Migrate {
            uri: typed::<MigrateArgs>(args)?.uri,
        },
        "migrate-set-parameters" => MigrateCommand::SetParameters(typed(args)?),
        "query-migrate-parameters" => {
            typed::<NoArgs>(args).map(|_| MigrateCommand::QueryParameters)?
        }
        "query-migrate" => typed::<NoArgs>(args).map(|_| MigrateCommand::Query)?,
        _ => typed::<NoArgs>(args).map(|_| MigrateCommand::Cancel)?,
    })
}

fn fail(class: ErrorClass, desc: String) -> Outcome {
    Outcome::Error(class, desc)
}

/// Runs a migration command.
pub fn execute(ctx: &Context, command: MigrateCommand) -> Outcome {
    let Some((m, source)) = &ctx.migration else {
        return fail(
            ErrorClass::GenericError,
            "this VMM cannot migrate (no migration handle)".into(),
        );
    };
    let value = |v: Result<Value, serde_json::Error>| match v {
        Ok(v) => Outcome::Return(v, Vec::new()),
        Err(e) => fail(ErrorClass::GenericError, e.to_string()),
    };
    match command {
        MigrateCommand::Migrate { uri } => match uri.parse::<Uri>() {
            Err(e) => fail(ErrorClass::InvalidArgument, e.to_string()),
            Ok(uri) => match m.start(uri, source.clone()) {
                Ok(()) => Outcome::Return(json!({}), Vec::new()),
                Err(e) => fail(ErrorClass::GenericError, crate::error_chain(&e)),
            },
        },
        MigrateCommand::SetParameters(p) => match m.set_parameters(p) {
            Ok(()) => Outcome::Return(json!({}), Vec::new()),
            Err(e) => fail(ErrorClass::InvalidArgument, e.to_string()),
        },
        MigrateCommand::QueryParameters => value(serde_json::to_value(m.parameters())),
        MigrateCommand::Query => value(serde_json::to_value(m.status())),
        MigrateCommand::Cancel => {
            m.cancel();
            Outcome::Return(json!({}), Vec::new())
        }
    }
}

/// Event lines for every client: what the migration queued since the last call.
pub fn event_lines(ctx: &Context) -> Vec<Vec<u8>> {
    let Some((m, _)) = &ctx.migration else {
        return Vec::new();
    };
    m.take_events()
        .into_iter()
        .map(|(name, data)| super::events::line(&super::events::event(name, data)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    #[test]
    fn migrate_needs_a_uri_and_nothing_unknown() {
        assert_eq!(
            parse("migrate", args(json!({"uri": "unix:/tmp/x"}))).unwrap(),
            MigrateCommand::Migrate {
                uri: "unix:/tmp/x".into()
            }
        );
        assert!(parse("migrate", args(json!({}))).is_err());
        assert!(parse("migrate", args(json!({"uri": "unix:/x", "blk": true}))).is_err());
    }

    #[test]
    fn set_parameters_takes_qemus_names() {
        let c = parse(
            "migrate-set-parameters",
            args(json!({"max-bandwidth": 125000000, "downtime-limit": 30})),
        )
        .unwrap();
        assert_eq!(
            c,
            MigrateCommand::SetParameters(SetParameters {
                max_bandwidth: Some(125_000_000),
                downtime_limit: Some(30),
                x_max_rounds: None,
                x_check_ram: None,
            })
        );
        let e = parse("migrate-set-parameters", args(json!({"max-bandwidth": -1}))).unwrap_err();
        assert_eq!(e.0, ErrorClass::InvalidArgument);
    }
}
