//! Requests: QMP's envelope `{"execute": NAME, "arguments": {...}, "id": ANY}`
//! and every command with its typed arguments, serde-derived so that the
//! server parses and the clients build requests from the same types.
//!
//! [`Command`] is the one list of commands: its variant names are the wire
//! names (`query-commands` lists them from it), and each variant carries its
//! arguments as a struct that refuses unknown members. Shapes mirror QEMU's
//! QAPI schema where the command is QEMU's (`qapi/stats.json`,
//! `qapi/control.json`, `qapi/machine.json`); docs/PROTOCOL.md lists the
//! additions.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::reply::ErrorClass;

/// A stats target, as QEMU names them (`cryptodev` is accepted and has no stats here).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StatsTarget {
    /// `"vm"`: the VM's stats fd.
    Vm,
    /// `"vcpu"`: each vCPU's stats fd.
    Vcpu,
    /// `"cryptodev"`: QEMU's; accepted, and answered with no stats.
    Cryptodev,
}

/// Who provides statistics (QEMU's `StatsProvider`, plus kvmscope's own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, strum::IntoStaticStr)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
pub(crate) enum StatsProvider {
    /// `"kvm"`: the KVM binary stats fds.
    Kvm,
    /// `"kvmscope"`: the VMM's own stats, in KVM's format (`crate::vmmstats`).
    Kvmscope,
    /// `"cryptodev"`: QEMU's; accepted, and provides nothing here.
    Cryptodev,
}

/// QEMU's `StatsRequest`: one provider, optionally only some stat names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StatsRequest {
    /// The provider asked.
    pub(crate) provider: StatsProvider,
    /// Only these stats, by their KVM names; absent: all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) names: Option<Vec<String>>,
}

/// A vCPU named by its index (kvmscope) or its QOM path (QEMU's way, as
/// `query-cpus-fast` reports it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum VcpuRef {
    /// A vCPU index, as a JSON number.
    Index(usize),
    /// A QOM path as `query-cpus-fast` reports it, as a JSON string.
    QomPath(String),
}

/// Which vCPUs `get-stats-fd` names: one index, or `"all"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Value", into = "Value")]
pub enum VcpuSelector {
    /// One vCPU, a JSON number.
    One(usize),
    /// Every vCPU, the JSON string `"all"`.
    All,
}

impl StatsProvider {
    /// The wire name.
    pub(crate) fn name(self) -> &'static str {
        self.into()
    }
}

impl TryFrom<Value> for VcpuSelector {
    type Error = String;

    fn try_from(v: Value) -> Result<Self, String> {
        match v {
            Value::String(s) if s == "all" => Ok(VcpuSelector::All),
            v => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .map(VcpuSelector::One)
                .ok_or_else(|| format!("expected a vCPU index or \"all\", got {v}")),
        }
    }
}

impl From<VcpuSelector> for Value {
    fn from(s: VcpuSelector) -> Value {
        match s {
            VcpuSelector::One(i) => Value::from(i),
            VcpuSelector::All => Value::from("all"),
        }
    }
}

/// Arguments of a command that takes none.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoArgs {}

/// `qmp_capabilities`: capabilities to enable (this server offers none).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CapabilitiesArgs {
    /// Capabilities to turn on; any (such as `oob`) is refused, as none is offered.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) enable: Vec<String>,
}

/// `get-stats-fd`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GetStatsFdArgs {
    /// Whose stats fds: the VM's or the vCPUs'.
    pub(crate) target: StatsTarget,
    /// KVM's (absent, `kvm`) or the VMM's own (`kvmscope`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) provider: Option<StatsProvider>,
    /// vCPU target only; default `"all"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) vcpu: Option<VcpuSelector>,
}

/// `query-stats`: QEMU's `StatsFilter`, plus kvmscope's `names` and vCPU indexes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueryStatsArgs {
    /// Whose stats: the VM's or the vCPUs'.
    pub(crate) target: StatsTarget,
    /// Providers and their stat names; absent: every provider, every stat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) providers: Option<Vec<StatsRequest>>,
    /// kvmscope: only these stats (QEMU puts names inside `providers`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) names: Option<Vec<String>>,
    /// vCPU target only: indexes or QOM paths.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) vcpus: Option<Vec<VcpuRef>>,
}

/// `query-stats-schemas`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchemasArgs {
    /// Only this provider's schemas; absent: every provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) provider: Option<StatsProvider>,
    /// kvmscope: one target only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) target: Option<StatsTarget>,
}

/// Commands about some vCPUs (all when `vcpus` is absent).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VcpusArgs {
    /// The vCPUs, by index or QOM path; absent: every vCPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) vcpus: Option<Vec<VcpuRef>>,
}

/// `guest-command`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuestCommandArgs {
    /// Index of the vCPU whose queue takes the commands.
    pub(crate) vcpu: usize,
    /// Workload text (docs/GUEST_ABI.md), one or more commands.
    pub(crate) command: String,
    /// Reply only once every command finished, with the results.
    #[serde(default)]
    pub(crate) wait: bool,
}

/// `query-samples`: a page of the sampler's points after `since`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuerySamplesArgs {
    /// Points with a sequence number above this one (default 0: from the oldest kept).
    #[serde(default)]
    pub(crate) since: u64,
    /// At most this many points, the newest (default and cap: the page size).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) max: Option<u64>,
}

/// `subscribe-samples`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubscribeArgs {
    /// Start after this point (default: the newest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) since: Option<u64>,
}

/// `query-readiness` as sent; [`ReadinessArgs`] once checked.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ReadinessRequest {
    /// Also run the exact scan (default false): read every backed page with
    /// the guest paused, counting zero pages; progress comes as
    /// `READINESS_PROGRESS` events before the reply.
    #[serde(default)]
    pub(crate) scan: bool,
    /// Seconds; absent: 1 when the VM has dirty logging, else none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) calc_time: Option<f64>,
    /// Bytes per second, 0 for unlimited (default: the migration parameters'
    /// `max-bandwidth`, 0 unless set, as a migration started now would run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) bandwidth: Option<f64>,
    /// Seconds (default: the migration parameters' `downtime-limit`, 0.3 unless set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) max_downtime: Option<f64>,
}

/// Checked arguments of `query-readiness`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReadinessArgs {
    /// Run the exact scan of every backed page (the guest paused meanwhile).
    pub(crate) scan: bool,
    /// `None`: 1 s when the VM has dirty logging, else no dirty-rate window.
    pub(crate) calc_time: Option<Duration>,
    /// Bytes per second, 0 for unlimited; `None`: the migration parameters'.
    pub(crate) bandwidth: Option<u64>,
    /// The downtime the prediction must fit, as `downtime-limit` takes it
    /// (0 to 2000 s); `None`: the migration parameters' `downtime-limit`.
    pub(crate) max_downtime: Option<Duration>,
}

/// Longest dirty-rate window a request may ask for.
pub const MAX_SECONDS: f64 = 600.0;

/// Fastest link, bytes per second, a `query-readiness` predicts for (80
/// Tbit/s).
pub const MAX_BANDWIDTH: f64 = 1e13;
/// [`MAX_BANDWIDTH`] as a whole number (`max-bandwidth`'s cap).
pub const MAX_BANDWIDTH_BYTES: u64 = 10_000_000_000_000;

/// Every command, with its arguments. The serde and strum names are the wire
/// names; a unit test checks they agree.
#[derive(
    Debug, Clone, PartialEq, Serialize, Deserialize, strum::VariantNames, strum::IntoStaticStr,
)]
#[serde(tag = "execute", content = "arguments", rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
pub enum Command {
    /// QMP's capability negotiation: leaves negotiation mode.
    #[serde(rename = "qmp_capabilities")]
    #[strum(serialize = "qmp_capabilities")]
    QmpCapabilities(CapabilitiesArgs),
    /// Every command's wire name.
    QueryCommands(NoArgs),
    /// QEMU-style version numbers and `kvmscope X.Y.Z` as the package.
    QueryVersion(NoArgs),
    /// The run state (`running`, `paused`, `inmigrate`, `postmigrate`, `shutdown`).
    QueryStatus(NoArgs),
    /// The VM's `--name`.
    QueryName(NoArgs),
    /// QEMU's: whether KVM is there and used (always, here).
    QueryKvm(NoArgs),
    /// Each vCPU's index, QOM path and thread id.
    QueryCpusFast(NoArgs),
    /// kvmscope: the VM's pid, backend, vCPUs, memory layout, guest ABI and stats ids.
    QueryVm(NoArgs),
    /// kvmscope: the VM's or vCPUs' stats fds, passed with SCM_RIGHTS.
    GetStatsFd(GetStatsFdArgs),
    /// Stats values, read by the VMM from the stats fds (QEMU's `StatsResult`s).
    QueryStats(QueryStatsArgs),
    /// The stats' descriptors (QEMU's `StatsSchema`s).
    QueryStatsSchemas(SchemasArgs),
    /// kvmscope: the VMM's own exit counters per vCPU.
    QueryExits(VcpusArgs),
    /// kvmscope: queue workload commands on a vCPU.
    GuestCommand(GuestCommandArgs),
    /// kvmscope: each vCPU's state, queue and last result.
    QueryGuest(VcpusArgs),
    /// kvmscope: a page of the sampler's points.
    QuerySamples(QuerySamplesArgs),
    /// kvmscope: a `SAMPLE` event per sampler tick from now on.
    SubscribeSamples(SubscribeArgs),
    /// kvmscope: stop the `SAMPLE` events.
    UnsubscribeSamples(NoArgs),
    /// kvmscope: the migration readiness report, replied once measured.
    QueryReadiness(ReadinessRequest),
    /// kvmscope's name for QEMU's `stop`.
    Pause(NoArgs),
    /// kvmscope's name for QEMU's `cont`.
    Resume(NoArgs),
    /// QEMU's name: pause the guest.
    Stop(NoArgs),
    /// QEMU's name: resume the guest.
    Cont(NoArgs),
    /// Stop the VMM; the connection closes after the reply.
    Quit(NoArgs),
    /// Start a live migration to `uri` (`unix:PATH`, `tcp:HOST:PORT`).
    Migrate(super::migration::MigrateArgs),
    /// Change some migration parameters; a running migration uses the new values too.
    MigrateSetParameters(super::migration::SetParameters),
    /// The migration parameters in force.
    QueryMigrateParameters(NoArgs),
    /// Turn migration capabilities on or off (not while a migration runs).
    MigrateSetCapabilities(super::migration::SetCapabilities),
    /// Every capability kvmscope knows, with its state.
    QueryMigrateCapabilities(NoArgs),
    /// The migration's status and counters (QEMU's `MigrationInfo`).
    QueryMigrate(NoArgs),
    /// QEMU's name, with an underscore.
    #[serde(rename = "migrate_cancel")]
    #[strum(serialize = "migrate_cancel")]
    MigrateCancel(NoArgs),
    /// Limit the dirty page rate of one vCPU or all (a ring VM; QEMU 8.1+'s).
    SetVcpuDirtyLimit(super::migration::SetDirtyLimitArgs),
    /// Lift the dirty limit of one vCPU or all.
    CancelVcpuDirtyLimit(super::migration::CancelDirtyLimitArgs),
    /// The vCPUs with a dirty limit: limit and current rate, MB/s.
    QueryVcpuDirtyLimit(NoArgs),
    /// QEMU's: start measuring the dirty rate in the background.
    CalcDirtyRate(super::dirty_rate::CalcDirtyRateArgs),
    /// QEMU's: the last dirty-rate measurement, or where it stands.
    QueryDirtyRate(NoArgs),
}

impl Command {
    /// The wire name.
    pub(crate) fn name(&self) -> &'static str {
        self.into()
    }

    /// Every wire name, in declaration order.
    pub fn names() -> &'static [&'static str] {
        <Command as strum::VariantNames>::VARIANTS
    }

    /// True for commands that only read: their reply is all they do, so they
    /// are not run for a client that has already hung up.
    pub(crate) fn is_query(&self) -> bool {
        self.name().starts_with("query-")
    }
}

/// One parsed request.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The client's `id`, any JSON value, echoed in the reply; absent when not sent.
    pub(crate) id: Option<Value>,
    /// The command and its arguments.
    pub(crate) command: Command,
}

/// A request that could not be parsed, with its `id` when one could be read.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestError {
    /// The request's `id`, when the envelope could be read that far.
    pub(crate) id: Option<Value>,
    /// QMP's error class for the reply.
    pub(crate) class: ErrorClass,
    /// The reply's `desc`, in QEMU's words where QEMU has them.
    pub(crate) desc: String,
}

/// Parses one request (a complete JSON value from the framer).
///
/// # Errors
/// A [`RequestError`] in QEMU's words where QEMU has them: the JSON, the
/// envelope, an unknown command (`CommandNotFound`) or bad arguments.
pub fn parse(bytes: &[u8]) -> Result<Request, RequestError> {
    let fail = |desc: String| RequestError {
        id: None,
        class: ErrorClass::GenericError,
        desc,
    };
    let value = strict_value(bytes).map_err(|e| fail(format!("JSON parse error, {e}")))?;
    let Value::Object(mut top) = value else {
        return Err(fail("QMP input must be a JSON object".into()));
    };
    let id = top.remove("id");
    let with_id = |class, desc: String| RequestError {
        id: id.clone(),
        class,
        desc,
    };
    let generic = |desc: &str| with_id(ErrorClass::GenericError, desc.to_string());
    let name = match top.remove("execute") {
        Some(Value::String(name)) => name,
        Some(_) => return Err(generic("QMP input member 'execute' must be a string")),
        None => return Err(generic("QMP input lacks member 'execute'")),
    };
    let arguments = match top.remove("arguments") {
        None => Value::Object(serde_json::Map::new()),
        Some(v @ Value::Object(_)) => v,
        Some(_) => return Err(generic("QMP input member 'arguments' must be an object")),
    };
    if let Some(key) = top.keys().next() {
        let shown: String = key.chars().take(64).collect();
        return Err(generic(&format!(
            "QMP input member '{shown}' is unexpected"
        )));
    }
    if !Command::names().contains(&name.as_str()) {
        let shown: String = name.chars().take(64).collect();
        return Err(with_id(
            ErrorClass::CommandNotFound,
            format!("The command {shown} has not been found"),
        ));
    }
    // Typed first: a member the command does not take is named as such,
    // null or not.
    let command = typed(&name, &arguments)
        .and_then(|c| not_null(&arguments).map(|()| c))
        .and_then(Command::checked)
        .map_err(|desc| generic(&format!("{name}: {desc}")))?;
    Ok(Request { id, command })
}

/// Reads one JSON value as [`parse`] does: an object that names a key twice
/// is refused.
///
/// # Errors
/// Not JSON, or a key named twice.
pub(crate) fn strict_value(bytes: &[u8]) -> Result<Value, serde_json::Error> {
    serde_json::from_slice(bytes).map(|Strict(v)| v)
}

/// A JSON value as serde_json reads it, except that an object naming a key
/// twice is refused, as QEMU's parser refuses it ("duplicate key"): where
/// the last would win, `{"execute":"query-status","execute":"quit"}` reads
/// as one command to a proxy or log that takes the first and runs another.
struct Strict(Value);

impl<'de> serde::Deserialize<'de> for Strict {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Strict, D::Error> {
        d.deserialize_any(StrictVisitor).map(Strict)
    }
}

struct StrictVisitor;

impl<'de> serde::de::Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        // JSON has no NaN or infinity to read: every f64 here is a number.
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(Strict(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.contains_key(&key) {
                let shown: String = key.chars().take(64).collect();
                return Err(serde::de::Error::custom(format_args!(
                    "duplicate key '{shown}'"
                )));
            }
            let Strict(v) = map.next_value()?;
            object.insert(key, v);
        }
        Ok(Value::Object(object))
    }
}

/// Refuses a null anywhere in the arguments, naming where, as QEMU does for
/// every type kvmscope takes (serde read a null optional member as absent:
/// `set-vcpu-dirty-limit` with `"cpu-index": null` limited every vCPU).
fn not_null(arguments: &Value) -> Result<(), String> {
    match null_at(arguments) {
        Some(path) => Err(format!(
            "parameter '{}': invalid type: null (leave a parameter out for its default)",
            path.strip_prefix('.').unwrap_or(&path)
        )),
        None => Ok(()),
    }
}

/// Where in `v` the first null is (`.member`, `[index]`, ...; empty for `v`
/// itself), made only when there is one.
fn null_at(v: &Value) -> Option<String> {
    match v {
        Value::Null => Some(String::new()),
        Value::Object(o) => o.iter().find_map(|(k, v)| {
            null_at(v).map(|rest| format!(".{}{rest}", k.chars().take(64).collect::<String>()))
        }),
        Value::Array(a) => a
            .iter()
            .enumerate()
            .find_map(|(i, v)| null_at(v).map(|rest| format!("[{i}]{rest}"))),
        _ => None,
    }
}

/// Deserializes `arguments` as command `name`'s, naming the member at fault.
fn typed(name: &str, arguments: &Value) -> Result<Command, String> {
    // Tag first, so serde reads the arguments straight into their type and
    // the error path names the member.
    let text = format!(
        r#"{{"execute":{},"arguments":{arguments}}}"#,
        Value::from(name)
    );
    let mut de = serde_json::Deserializer::from_str(&text);
    serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let member = path.strip_prefix("arguments").unwrap_or(&path);
        let why = in_json_words(&without_position(e.inner()));
        let member = member.strip_prefix('.').filter(|m| !m.is_empty());
        // Said as QEMU says them where serde's words name the member again
        // ("unknown field `x`") or not at all ("missing field `x`" at the
        // top, "expected value" for a name given as a number).
        if let Some(rest) = why.strip_prefix("unknown field `") {
            let (field, expected) = rest.split_once('`').unwrap_or((rest, ""));
            let known = expected
                .strip_prefix(", expected one of ")
                .or_else(|| expected.strip_prefix(", expected "))
                .map(|k| format!(" (it takes {k})"))
                .unwrap_or_else(|| " (it takes none)".into());
            return format!(
                "parameter '{}' is unexpected{known}",
                member.unwrap_or(field)
            );
        }
        let name = |field: &str| match member {
            Some(m) => format!("{m}.{field}"),
            None => field.to_string(),
        };
        if let Some(field) = why
            .strip_prefix("missing field `")
            .and_then(|r| r.strip_suffix('`'))
        {
            return format!("parameter '{}' is missing", name(field));
        }
        let why = if why == "expected value" {
            "invalid type, expected a name (a string)".to_string()
        } else {
            why
        };
        match member {
            Some(m) => format!("parameter '{m}': {why}"),
            None => why,
        }
    })
}

/// A deserializing error without serde's " at line L column C": the place is
/// in the text built from the request above, not in what the client sent.
fn without_position(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let place = format!(" at line {} column {}", e.line(), e.column());
    match text.strip_suffix(&place) {
        Some(why) => why.to_string(),
        None => text,
    }
}

/// serde's "expected u64" in the words of JSON, which a client speaks:
/// Rust's type names mean nothing to a QMP tool.
fn in_json_words(why: &str) -> String {
    const WORDS: [(&str, &str); 10] = [
        ("usize", "a non-negative integer"),
        ("u64", "a non-negative integer"),
        ("u32", "a non-negative integer"),
        ("u16", "a non-negative integer"),
        ("u8", "a non-negative integer"),
        ("i64", "an integer"),
        ("i32", "an integer"),
        ("f64", "a number"),
        ("f32", "a number"),
        ("a boolean", "true or false"),
    ];
    match why.rsplit_once(", expected ") {
        Some((head, ty)) => {
            let ty = WORDS.iter().find(|(t, _)| *t == ty).map_or(ty, |(_, w)| w);
            format!("{head}, expected {ty}")
        }
        None => why.to_string(),
    }
}

impl Command {
    /// Checks what the types cannot say.
    fn checked(self) -> Result<Command, String> {
        match &self {
            Command::QueryStats(a) if a.target != StatsTarget::Vcpu && a.vcpus.is_some() => {
                Err("parameter 'vcpus' only goes with target 'vcpu'".into())
            }
            Command::GetStatsFd(a) if a.target != StatsTarget::Vcpu && a.vcpu.is_some() => {
                Err("parameter 'vcpu' only goes with target 'vcpu'".into())
            }
            Command::QueryReadiness(r) => r.check().map(|_| self),
            Command::CalcDirtyRate(a) => a.check().map(|()| self),
            _ => Ok(self),
        }
    }
}

impl ReadinessRequest {
    /// The checked arguments.
    ///
    /// # Errors
    /// A value out of range, named.
    pub(crate) fn check(&self) -> Result<ReadinessArgs, String> {
        let seconds = |key: &str, v: f64, most: f64| {
            if v.is_finite() && (0.0..=most).contains(&v) {
                Ok(Duration::from_secs_f64(v))
            } else {
                Err(format!(
                    "parameter '{key}' must be a number of seconds from 0 to {most}"
                ))
            }
        };
        let calc_time = self
            .calc_time
            .map(|v| seconds("calc-time", v, MAX_SECONDS))
            .transpose()?;
        // As `downtime-limit` takes it (0 included: stop only when nothing
        // is left dirty).
        let longest = super::migration::MAX_DOWNTIME_LIMIT_MS as f64 / 1e3;
        let max_downtime = self
            .max_downtime
            .map(|v| seconds("max-downtime", v, longest))
            .transpose()?;
        let bandwidth = match self.bandwidth {
            Some(b) if b == 0.0 || (b.is_finite() && (1.0..=MAX_BANDWIDTH).contains(&b)) => {
                // In range: the conversion only drops the fraction.
                Some(crate::units::saturating_u64(b))
            }
            Some(_) => {
                return Err(
                    format!("parameter 'bandwidth' must be bytes per second, from 1 to {MAX_BANDWIDTH:e}, or 0 for unlimited"),
                )
            }
            None => None,
        };
        Ok(ReadinessArgs {
            scan: self.scan,
            calc_time,
            bandwidth,
            max_downtime,
        })
    }
}

/// A request line for `command` (newline included), as a client sends it.
pub(crate) fn request_line(command: &Command, id: Option<&Value>) -> Vec<u8> {
    let mut value = serde_json::to_value(command).unwrap_or(Value::Null);
    if let (Some(id), Value::Object(map)) = (id, &mut value) {
        map.insert("id".into(), id.clone());
    }
    let mut line = value.to_string().into_bytes();
    line.push(b'\n');
    line
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;
