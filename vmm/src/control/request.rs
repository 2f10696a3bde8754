//! Parsing one request line of the control protocol into a typed [`Request`].
//!
//! Pure code: no I/O and no VM, so every rule is unit-tested here and a property
//! test feeds it arbitrary lines. Shape checks (JSON, types, unknown or missing
//! members) happen here; checks that need the VM (is vCPU 7 there?) happen when
//! the command runs. A line is `{"execute": NAME, "arguments": {...}, "id": ANY}`
//! with `arguments` and `id` optional, as in QEMU's QMP.

use serde_json::{Map, Value};

/// The error classes replies carry (`{"error": {"class": ..., "desc": ...}}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The line is not JSON, not an object, or lacks `execute`.
    ParseError,
    /// No command has that name.
    CommandNotFound,
    /// An argument is missing, unexpected or of the wrong type or value.
    InvalidArgument,
    /// A vCPU index the VM does not have.
    VcpuNotFound,
    /// A line longer than the limit; the connection is then closed.
    LineTooLong,
    /// The client limit is reached; the connection is then closed.
    TooManyClients,
    /// The peer's uid is neither ours nor root's; the connection is then closed.
    PermissionDenied,
    /// The command was well formed but failed (a KVM call, the VM stopping...).
    GenericError,
}

impl ErrorClass {
    /// The class as it appears on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::ParseError => "ParseError",
            ErrorClass::CommandNotFound => "CommandNotFound",
            ErrorClass::InvalidArgument => "InvalidArgument",
            ErrorClass::VcpuNotFound => "VcpuNotFound",
            ErrorClass::LineTooLong => "LineTooLong",
            ErrorClass::TooManyClients => "TooManyClients",
            ErrorClass::PermissionDenied => "PermissionDenied",
            ErrorClass::GenericError => "GenericError",
        }
    }
}

/// A request that could not be parsed, with the `id` when one could be read.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestError {
    pub id: Option<Value>,
    pub class: ErrorClass,
    pub desc: String,
}

/// Which vCPUs a `get-stats-fd` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VcpuSelector {
    One(usize),
    All,
}

/// What a stats request is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatsTarget {
    Vm,
    Vcpu,
}

/// A command with its checked arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// QMP's capability negotiation; accepted at any time and does nothing.
    QmpCapabilities,
    QueryCommands,
    QueryVm,
    /// `vcpu` is `None` for the VM target.
    GetStatsFd {
        target: StatsTarget,
        vcpu: Option<VcpuSelector>,
    },
    QueryStats {
        target: StatsTarget,
        names: Option<Vec<String>>,
        vcpus: Option<Vec<usize>>,
    },
    QueryStatsSchemas {
        target: Option<StatsTarget>,
    },
    QueryExits {
        vcpus: Option<Vec<usize>>,
    },
    GuestCommand {
        vcpu: usize,
        command: String,
        wait: bool,
    },
    QueryGuest {
        vcpus: Option<Vec<usize>>,
    },
    /// The sampler's points after `since`, at most `max` of them (newest kept).
    QuerySamples {
        since: u64,
        max: Option<u64>,
    },
    /// Stream a `SAMPLE` event per sampler tick to this client.
    SubscribeSamples {
        since: Option<u64>,
    },
    UnsubscribeSamples,
    /// Measure migration readiness (deferred: the reply comes when done).
    QueryReadiness(ReadinessArgs),
    Pause,
    Resume,
    Quit,
}

/// Arguments of `query-readiness`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadinessArgs {
    pub scan: bool,
    /// `None`: 1 s when the VM has dirty logging, else no dirty-rate window.
    pub calc_time: Option<std::time::Duration>,
    /// Bytes per second.
    pub bandwidth: u64,
    pub max_downtime: std::time::Duration,
}

/// Longest dirty-rate window or downtime a request may ask for.
pub const MAX_SECONDS: f64 = 600.0;

/// Every command name, in the order `query-commands` lists them.
pub const COMMANDS: [&str; 16] = [
    "qmp_capabilities",
    "query-commands",
    "query-vm",
    "get-stats-fd",
    "query-stats",
    "query-stats-schemas",
    "query-exits",
    "guest-command",
    "query-guest",
    "query-samples",
    "subscribe-samples",
    "unsubscribe-samples",
    "query-readiness",
    "pause",
    "resume",
    "quit",
];

/// One parsed request line.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub id: Option<Value>,
    pub command: Command,
}

/// Parses one line (without its newline; a trailing `\r` is allowed).
///
/// # Errors
/// A [`RequestError`] saying what is wrong, carrying the request's `id` when
/// the line was an object with one.
pub fn parse(line: &[u8]) -> Result<Request, RequestError> {
    let fail = |class, desc: String| RequestError {
        id: None,
        class,
        desc,
    };
    let value: Value = serde_json::from_slice(line)
        .map_err(|e| fail(ErrorClass::ParseError, format!("the line is not JSON: {e}")))?;
    let Value::Object(mut top) = value else {
        return Err(fail(
            ErrorClass::ParseError,
            "a request must be a JSON object".into(),
        ));
    };
    let id = top.remove("id");
    let with_id = |class, desc: String| RequestError {
        id: id.clone(),
        class,
        desc,
    };
    let name = match top.remove("execute") {
        Some(Value::String(name)) => name,
        Some(_) => {
            return Err(with_id(
                ErrorClass::ParseError,
                "'execute' must be a string".into(),
            ))
        }
        None => {
            return Err(with_id(
                ErrorClass::ParseError,
                "a request needs an 'execute' member naming the command".into(),
            ))
        }
    };
    let arguments = match top.remove("arguments") {
        None => Map::new(),
        Some(Value::Object(map)) => map,
        Some(_) => {
            return Err(with_id(
                ErrorClass::ParseError,
                "'arguments' must be an object".into(),
            ))
        }
    };
    if let Some(key) = top.keys().next() {
        return Err(with_id(
            ErrorClass::ParseError,
            format!("member '{key}' is unexpected (a request has execute, arguments and id)"),
        ));
    }
    let command =
        parse_command(&name, Args::new(arguments)).map_err(|(class, desc)| with_id(class, desc))?;
    Ok(Request { id, command })
}

type ArgError = (ErrorClass, String);

fn parse_command(name: &str, mut a: Args) -> Result<Command, ArgError> {
    let command = match name {
        "qmp_capabilities" => {
            // QMP clients send `enable`; nothing to enable here.
            a.take("enable");
            Command::QmpCapabilities
        }
        "query-commands" => Command::QueryCommands,
        "query-vm" => Command::QueryVm,
        "get-stats-fd" => get_stats_fd(&mut a)?,
        "query-stats" => query_stats(&mut a)?,
        "query-stats-schemas" => Command::QueryStatsSchemas {
            target: a.target("target")?,
        },
        "query-exits" => Command::QueryExits {
            vcpus: a.indexes("vcpus")?,
        },
        "guest-command" => Command::GuestCommand {
            vcpu: a.index("vcpu")?.ok_or_else(|| Args::missing("vcpu"))?,
            command: a
                .string("command")?
                .ok_or_else(|| Args::missing("command"))?,
            wait: a.boolean("wait")?.unwrap_or(false),
        },
        "query-guest" => Command::QueryGuest {
            vcpus: a.indexes("vcpus")?,
        },
        "query-samples" => Command::QuerySamples {
            since: a.count("since")?.unwrap_or(0),
            max: a.count("max")?,
        },
        "subscribe-samples" => Command::SubscribeSamples {
            since: a.count("since")?,
        },
        "unsubscribe-samples" => Command::UnsubscribeSamples,
        "query-readiness" => query_readiness(&mut a)?,
        "pause" => Command::Pause,
        "resume" => Command::Resume,
        "quit" => Command::Quit,
        other => {
            let shown: String = other.chars().take(64).collect();
            return Err((
                ErrorClass::CommandNotFound,
                format!("the command '{shown}' does not exist (see query-commands)"),
            ));
        }
    };
    a.finish()?;
    Ok(command)
}

fn get_stats_fd(a: &mut Args) -> Result<Command, ArgError> {
    let target = a.target("target")?.ok_or_else(|| Args::missing("target"))?;
    let vcpu = match target {
        StatsTarget::Vm => None,
        StatsTarget::Vcpu => Some(a.selector("vcpu")?.unwrap_or(VcpuSelector::All)),
    };
    Ok(Command::GetStatsFd { target, vcpu })
}

fn query_stats(a: &mut Args) -> Result<Command, ArgError> {
    let target = a.target("target")?.ok_or_else(|| Args::missing("target"))?;
    let names = a.strings("names")?;
    let vcpus = a.indexes("vcpus")?;
    if target == StatsTarget::Vm && vcpus.is_some() {
        return Err(invalid("'vcpus' only goes with target 'vcpu'".into()));
    }
    Ok(Command::QueryStats {
        target,
        names,
        vcpus,
    })
}

fn query_readiness(a: &mut Args) -> Result<Command, ArgError> {
    let seconds = |a: &mut Args,
                   key: &str,
                   default: f64,
                   zero_ok: bool|
     -> Result<std::time::Duration, ArgError> {
        let v = a.number(key)?.unwrap_or(default);
        let ok = v.is_finite() && v <= MAX_SECONDS && (v > 0.0 || (zero_ok && v == 0.0));
        match ok {
            true => Ok(std::time::Duration::from_secs_f64(v)),
            false => Err(Args::wrong(
                key,
                &format!(
                    "a number of seconds from {} to {MAX_SECONDS}",
                    if zero_ok { "0" } else { "above 0" }
                ),
            )),
        }
    };
    let scan = a.boolean("scan")?.unwrap_or(false);
    let calc_time = match a.0.contains_key("calc-time") {
        true => Some(seconds(a, "calc-time", 1.0, true)?),
        false => None,
    };
    let max_downtime = seconds(a, "max-downtime", 0.3, false)?;
    let bandwidth = a.number("bandwidth")?.unwrap_or(1.25e9);
    if !(bandwidth.is_finite() && (1.0..=1e13).contains(&bandwidth)) {
        return Err(Args::wrong("bandwidth", "bytes per second, from 1 to 1e13"));
    }
    Ok(Command::QueryReadiness(ReadinessArgs {
        scan,
        calc_time,
        bandwidth: bandwidth as u64,
        max_downtime,
    }))
}

fn invalid(desc: String) -> ArgError {
    (ErrorClass::InvalidArgument, desc)
}

/// The `arguments` object, consumed member by member so that leftovers can be reported.
struct Args(Map<String, Value>);

impl Args {
    fn new(map: Map<String, Value>) -> Self {
        Args(map)
    }

    fn take(&mut self, key: &str) -> Option<Value> {
        self.0.remove(key)
    }

    fn missing(key: &str) -> ArgError {
        invalid(format!("argument '{key}' is missing"))
    }

    fn wrong(key: &str, expected: &str) -> ArgError {
        invalid(format!("argument '{key}' must be {expected}"))
    }

    fn finish(self) -> Result<(), ArgError> {
        match self.0.keys().next() {
            Some(key) => Err(invalid(format!("argument '{key}' is unexpected"))),
            None => Ok(()),
        }
    }

    fn string(&mut self, key: &str) -> Result<Option<String>, ArgError> {
        match self.take(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(Self::wrong(key, "a string")),
        }
    }

    fn boolean(&mut self, key: &str) -> Result<Option<bool>, ArgError> {
        match self.take(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(b)),
            Some(_) => Err(Self::wrong(key, "true or false")),
        }
    }

    fn number(&mut self, key: &str) -> Result<Option<f64>, ArgError> {
        match self.take(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| Self::wrong(key, "a number")),
        }
    }

    fn count(&mut self, key: &str) -> Result<Option<u64>, ArgError> {
        match self.take(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| Self::wrong(key, "a whole number")),
        }
    }

    fn index(&mut self, key: &str) -> Result<Option<usize>, ArgError> {
        self.take(key)
            .map(|v| as_index(&v).ok_or_else(|| Self::wrong(key, "a vCPU index (a whole number)")))
            .transpose()
    }

    fn target(&mut self, key: &str) -> Result<Option<StatsTarget>, ArgError> {
        match self.take(key) {
            None => Ok(None),
            Some(Value::String(s)) if s == "vm" => Ok(Some(StatsTarget::Vm)),
            Some(Value::String(s)) if s == "vcpu" => Ok(Some(StatsTarget::Vcpu)),
            Some(_) => Err(Self::wrong(key, "\"vm\" or \"vcpu\"")),
        }
    }

    fn selector(&mut self, key: &str) -> Result<Option<VcpuSelector>, ArgError> {
        match self.take(key) {
            None => Ok(None),
            Some(Value::String(s)) if s == "all" => Ok(Some(VcpuSelector::All)),
            Some(v) => as_index(&v)
                .map(|i| Some(VcpuSelector::One(i)))
                .ok_or_else(|| Self::wrong(key, "a vCPU index or \"all\"")),
        }
    }

    fn indexes(&mut self, key: &str) -> Result<Option<Vec<usize>>, ArgError> {
        let expected = "a list of vCPU indexes";
        match self.take(key) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(as_index)
                .collect::<Option<_>>()
                .map(Some)
                .ok_or_else(|| Self::wrong(key, expected)),
            Some(_) => Err(Self::wrong(key, expected)),
        }
    }

    fn strings(&mut self, key: &str) -> Result<Option<Vec<String>>, ArgError> {
        let expected = "a list of stat names";
        match self.take(key) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .into_iter()
                .map(|v| match v {
                    Value::String(s) => Some(s),
                    _ => None,
                })
                .collect::<Option<_>>()
                .map(Some)
                .ok_or_else(|| Self::wrong(key, expected)),
            Some(_) => Err(Self::wrong(key, expected)),
        }
    }
}

fn as_index(v: &Value) -> Option<usize> {
    v.as_u64().and_then(|n| usize::try_from(n).ok())
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;
