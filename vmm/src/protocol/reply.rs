//! What the server sends: the greeting, replies, errors and events, as serde
//! types that the server writes and the clients read.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

pub(crate) use crate::runstate::RunState;

/// QMP error classes. kvmscope uses QEMU's: `GenericError` for everything
/// but an unknown command (or one sent before negotiation), which is
/// `CommandNotFound`, and a vCPU that does not exist, `DeviceNotFound`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorClass {
    /// Any failure but the two below; the connection stays open.
    GenericError,
    /// No such command, or any command but `qmp_capabilities` before negotiation.
    CommandNotFound,
    /// A vCPU index or QOM path the VM does not have.
    DeviceNotFound,
    /// A class this client does not know (from a newer server).
    #[serde(untagged)]
    Other(String),
}

impl std::fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ErrorClass::GenericError => f.write_str("GenericError"),
            ErrorClass::CommandNotFound => f.write_str("CommandNotFound"),
            ErrorClass::DeviceNotFound => f.write_str("DeviceNotFound"),
            ErrorClass::Other(s) => f.write_str(s),
        }
    }
}

/// The body of an error reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QmpError {
    /// The QMP error class.
    pub(crate) class: ErrorClass,
    /// What went wrong, in plain words (QEMU's words where QEMU has them).
    pub(crate) desc: String,
}

/// Seconds and microseconds since the epoch, as QMP stamps events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Timestamp {
    /// Whole seconds since the Unix epoch (wall clock).
    pub(crate) seconds: u64,
    /// Microseconds past `seconds`, below 1,000,000.
    pub(crate) microseconds: u32,
}

impl Timestamp {
    /// The wall-clock time now.
    pub(crate) fn now() -> Self {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Timestamp {
            seconds: now.as_secs(),
            microseconds: now.subsec_micros(),
        }
    }
}

/// An event: `{"event": NAME, "data": {...}, "timestamp": {...}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// The event's name, such as `SAMPLE` or `MIGRATION` (docs/PROTOCOL.md lists them).
    pub(crate) event: String,
    /// The event's data; `null` (omitted on the wire) for none.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub(crate) data: Value,
    /// When the server made the event.
    pub(crate) timestamp: Timestamp,
}

impl Event {
    /// An event stamped now.
    pub(crate) fn new(name: &str, data: Value) -> Self {
        Event {
            event: name.to_string(),
            data,
            timestamp: Timestamp::now(),
        }
    }
}

/// QEMU's `VersionTriple`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub(crate) struct VersionTriple {
    /// kvmscope's major version.
    pub(crate) major: u64,
    /// kvmscope's minor version.
    pub(crate) minor: u64,
    /// kvmscope's patch version.
    pub(crate) micro: u64,
}

/// QEMU's `VersionInfo` (`query-version`, and the greeting's `version`):
/// `qemu` carries kvmscope's version, `package` names kvmscope.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub(crate) struct VersionInfo {
    /// kvmscope's version in QEMU's member (QMP clients read it there).
    pub(crate) qemu: VersionTriple,
    /// `kvmscope X.Y.Z`.
    pub(crate) package: String,
}

impl VersionInfo {
    /// This build's version.
    pub(crate) fn ours() -> Self {
        let part = |s: &str| s.parse().unwrap_or(0);
        VersionInfo {
            qemu: VersionTriple {
                major: part(env!("CARGO_PKG_VERSION_MAJOR")),
                minor: part(env!("CARGO_PKG_VERSION_MINOR")),
                micro: part(env!("CARGO_PKG_VERSION_PATCH")),
            },
            package: concat!("kvmscope ", env!("CARGO_PKG_VERSION")).to_string(),
        }
    }

    /// Whether a server with this version is a kvmscope VMM (its `package`
    /// names kvmscope), not a QEMU.
    pub(crate) fn is_kvmscope(&self) -> bool {
        self.package.starts_with("kvmscope ")
    }
}

/// kvmscope's part of the greeting: the protocol version and the VM.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub(crate) struct KvmscopeGreeting {
    /// Bumped when a reply changes shape.
    pub(crate) protocol: u32,
    /// Features beyond QMP: `stats-fd` (fds ride on replies).
    pub(crate) features: Vec<String>,
    /// The VM this socket serves.
    pub(crate) vm: GreetingVm,
}

/// The VM, as the greeting names it.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub(crate) struct GreetingVm {
    /// The VM's `--name`.
    pub(crate) name: String,
    /// The VMM's process id.
    pub(crate) pid: u32,
    /// Number of vCPUs.
    pub(crate) vcpus: usize,
    /// Guest RAM in bytes.
    pub(crate) memory: u64,
    /// The KVM backend: `vmx`, `svm`, `pvm` or `unknown`.
    pub(crate) backend: String,
    /// The VM stats fd's id string: `kvm-` and the id of the thread that
    /// created the VM (the pid when that was the main thread).
    #[serde(rename = "stats-id")]
    pub(crate) stats_id: String,
}

/// The greeting's `QMP` member.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub(crate) struct GreetingBody {
    /// The server's version, as `query-version` returns it.
    pub(crate) version: VersionInfo,
    /// Capabilities a client may enable with `qmp_capabilities` (none here).
    pub(crate) capabilities: Vec<String>,
    /// kvmscope's additions: protocol version, features, the VM (absent
    /// from QEMU's greeting: the one client reads both).
    #[serde(default)]
    pub(crate) kvmscope: KvmscopeGreeting,
}

/// The first line on every connection: `{"QMP": {...}}`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Greeting {
    /// The `QMP` member, the greeting's only one.
    #[serde(rename = "QMP")]
    pub(crate) qmp: GreetingBody,
}

/// Any line the server sends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Message {
    /// A command's success: `{"return": ..., "id": ...}`.
    Return {
        /// The command's result (`{}` for commands that return nothing).
        #[serde(rename = "return")]
        value: Value,
        /// The request's `id`, echoed; absent when the request had none.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<Value>,
    },
    /// A command's failure: `{"error": {"class", "desc"}, "id": ...}`.
    Error {
        /// The class and description.
        error: QmpError,
        /// The request's `id`, echoed; absent when the request had none or it could not be read.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<Value>,
    },
    /// An asynchronous event, between replies.
    Event(Event),
    /// The first line on a connection.
    Greeting(Greeting),
}

impl Message {
    /// The message as one line, newline included.
    pub(crate) fn to_line(&self) -> Vec<u8> {
        to_line(self)
    }

    /// The line of a [`Message::Return`] whose value was serialized as it was
    /// built (a page of samples: no JSON tree of it in memory).
    pub(crate) fn raw_return_line(value: &RawValue, id: Option<&Value>) -> Vec<u8> {
        #[derive(Serialize)]
        struct RawReturn<'a> {
            #[serde(rename = "return")]
            value: &'a RawValue,
            #[serde(skip_serializing_if = "Option::is_none")]
            id: Option<&'a Value>,
        }
        to_line(&RawReturn { value, id })
    }
    /// An error reply.
    pub(crate) fn error(class: ErrorClass, desc: impl Into<String>, id: Option<Value>) -> Message {
        Message::Error {
            error: QmpError {
                class,
                desc: desc.into(),
            },
            id,
        }
    }
}

/// Any serializable value as one line, newline included.
pub(crate) fn to_line<T: Serialize>(value: &T) -> Vec<u8> {
    // Serializing these types cannot fail: maps have string keys, no floats are NaN-checked.
    let mut line = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    line.push(b'\n');
    line
}

/// QEMU's `StatusInfo` (`query-status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StatusInfo {
    /// True when `status` is `running`.
    pub(crate) running: bool,
    /// Always false; QEMU 7.2 clients expect the member.
    pub(crate) singlestep: bool,
    /// The VM's run state.
    pub(crate) status: RunState,
}

/// QEMU's `CpuInfoFast` (`query-cpus-fast`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) struct CpuInfoFast {
    /// The vCPU's index.
    pub(crate) cpu_index: usize,
    /// Its QOM path ([`vcpu_qom_path`]), accepted wherever a vCPU is named.
    pub(crate) qom_path: String,
    /// The vCPU thread's kernel id (0 before it started).
    pub(crate) thread_id: i64,
    /// The architecture, always `x86_64`.
    pub(crate) target: String,
}

/// QEMU's `NameInfo` (`query-name`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct NameInfo {
    /// The VM's `--name`; kvmscope always sends it (QEMU's is optional).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) name: Option<String>,
}

/// QEMU's `CommandInfo` (`query-commands`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CommandInfo {
    /// The command's wire name.
    pub(crate) name: String,
}

/// The QOM path of vCPU `index`, as QEMU's x86 machines name CPUs.
pub(crate) fn vcpu_qom_path(index: usize) -> String {
    format!("/machine/unattached/device[{index}]")
}

/// The vCPU a QOM path names, if it is one of ours.
pub(crate) fn vcpu_from_qom_path(path: &str) -> Option<usize> {
    let n = path
        .strip_prefix("/machine/unattached/device[")?
        .strip_suffix(']')?;
    if n.len() > 1 && n.starts_with('0') {
        return None;
    }
    n.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qom_paths_round_trip_and_reject_others() {
        assert_eq!(vcpu_from_qom_path(&vcpu_qom_path(17)), Some(17));
        for bad in [
            "/machine/unattached/device[01]",
            "/machine/unattached/device[x]",
            "/machine/peripheral/cpu0",
            "/machine/unattached/device[3",
        ] {
            assert_eq!(vcpu_from_qom_path(bad), None, "{bad}");
        }
    }

    #[test]
    fn messages_parse_back_by_shape() {
        let lines = [
            Message::Return {
                value: serde_json::json!({}),
                id: Some(1.into()),
            },
            Message::error(ErrorClass::CommandNotFound, "x", None),
            Message::Event(Event::new("STOP", Value::Null)),
        ];
        for m in lines {
            let back: Message = serde_json::from_slice(&m.to_line()).unwrap();
            assert_eq!(back, m);
        }
    }

    #[test]
    fn unknown_error_classes_are_kept() {
        let m: Message =
            serde_json::from_str(r#"{"error":{"class":"KVMMissingCap","desc":"d"}}"#).unwrap();
        let Message::Error { error, .. } = m else {
            panic!("{m:?}")
        };
        assert_eq!(error.class, ErrorClass::Other("KVMMissingCap".into()));
    }

    #[test]
    fn a_raw_return_line_is_the_line_of_the_same_return() {
        let value = serde_json::json!({"a": [1, 2], "b": "c"});
        let raw = serde_json::value::to_raw_value(&value).unwrap();
        for id in [None, Some(serde_json::json!("x-1"))] {
            let typed = Message::Return {
                value: value.clone(),
                id: id.clone(),
            };
            assert_eq!(Message::raw_return_line(&raw, id.as_ref()), typed.to_line());
        }
    }

    #[test]
    fn version_carries_ours_in_qemu_shape() {
        let v = serde_json::to_value(VersionInfo::ours()).unwrap();
        assert!(v["qemu"]["major"].is_u64() && v["qemu"]["micro"].is_u64());
        assert!(v["package"].as_str().unwrap().starts_with("kvmscope "));
    }
}
