//! The replies of the guest commands, shared by the server
//! (`control/commands.rs`), the run summary and the clients (`client/demo.rs`):
//! `guest-command` (the commands queued, and with `wait` their results) and
//! one command's result as `query-guest` and the summary report it.

use serde::{Deserialize, Serialize};

/// One finished guest command.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommandResultReply {
    /// Its sequence number on its vCPU.
    pub seq: u64,
    /// The command, as a spec.
    pub command: String,
    /// `ok`, or what went wrong.
    pub status: String,
    /// The guest's result words (meaning per command, docs/GUEST_ABI.md).
    pub values: [u64; 3],
    /// Host time from handing the command over to its completion, seconds.
    pub host_time_s: f64,
}

/// `guest-command`'s return.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct GuestCommandReply {
    /// The vCPU whose queue took the commands.
    pub vcpu: usize,
    /// The first command's sequence number.
    pub first_seq: u64,
    /// The last command's sequence number.
    pub last_seq: u64,
    /// With `wait`: each command's result, in order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub results: Option<Vec<CommandResultReply>>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn replies_keep_their_wire_names() {
        let r = GuestCommandReply {
            vcpu: 1,
            first_seq: 4,
            last_seq: 5,
            results: Some(vec![CommandResultReply {
                seq: 4,
                command: "exits".into(),
                status: "ok".into(),
                values: [1, 2, 3],
                host_time_s: 0.5,
            }]),
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(
            v,
            json!({"vcpu": 1, "first-seq": 4, "last-seq": 5, "results": [
                {"seq": 4, "command": "exits", "status": "ok", "values": [1, 2, 3], "host_time_s": 0.5}
            ]})
        );
        assert_eq!(serde_json::from_value::<GuestCommandReply>(v).unwrap(), r);
        let queued = GuestCommandReply { results: None, ..r };
        assert!(serde_json::to_value(&queued)
            .unwrap()
            .get("results")
            .is_none());
    }
}
