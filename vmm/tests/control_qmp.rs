//! The control socket speaks QMP as QEMU does: framing, negotiation, QEMU's
//! commands and `query-stats` arguments, QEMU's shapes and error classes.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use common::ServedVm;
use kvmscope::client::{self, Client};
use kvmscope::protocol::ErrorClass;
use serde_json::{json, Value};

const MEM: u64 = 64 << 20;

/// A raw connection: the greeting read, nothing negotiated.
struct Raw {
    s: UnixStream,
    r: BufReader<UnixStream>,
    greeting: Value,
}

impl Raw {
    fn connect(vm: &ServedVm) -> Raw {
        Raw::at(&vm.socket)
    }

    fn at(path: &std::path::Path) -> Raw {
        let s = UnixStream::connect(path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        let greeting = serde_json::from_str(&line).unwrap();
        Raw { s, r, greeting }
    }

    fn send(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).unwrap();
    }

    fn line(&mut self) -> Value {
        let mut line = String::new();
        self.r.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
    }
}

fn remote_error(r: Result<(Value, Vec<std::fs::File>), client::Error>) -> (ErrorClass, String) {
    match r {
        Err(client::Error::Remote { class, desc }) => (class, desc),
        other => panic!("expected an error reply, got {other:?}"),
    }
}

#[test]
fn greeting_has_qemus_shape_and_no_capabilities() {
    require_kvm!();
    let vm = ServedVm::start("greet", MEM, 1);
    let g = Raw::connect(&vm).greeting;
    let v = &g["QMP"]["version"];
    assert!(
        v["qemu"]["major"].is_u64() && v["qemu"]["minor"].is_u64() && v["qemu"]["micro"].is_u64()
    );
    assert!(v["package"].as_str().unwrap().starts_with("kvmscope"));
    assert_eq!(g["QMP"]["capabilities"], json!([]));
}

#[test]
fn commands_before_negotiation_are_refused_as_qemu_does() {
    require_kvm!();
    let vm = ServedVm::start("negotiate", MEM, 1);
    let mut c = Raw::connect(&vm);
    // A command it has and one it has not read alike, as QEMU's do.
    for line in [
        &br#"{"execute":"query-status","id":1}"#[..],
        br#"{"execute":"nosuch","id":1}"#,
        br#"{"execute":"query-stats","arguments":{"target":"bogus"},"id":1}"#,
    ] {
        c.send(line);
        let e = c.line();
        assert_eq!(e["error"]["class"], "CommandNotFound", "{e}");
        assert_eq!(
            e["error"]["desc"], "Expecting capabilities negotiation with 'qmp_capabilities'",
            "{e}"
        );
        assert_eq!(e["id"], 1);
    }
    // A key named twice is no command, in either order (the last one won
    // here, before a request was read).
    for line in [
        &br#"{"execute":"qmp_capabilities","execute":"quit"}"#[..],
        br#"{"execute":"quit","execute":"qmp_capabilities"}"#,
    ] {
        c.send(line);
        let e = c.line();
        assert_eq!(e["error"]["class"], "GenericError", "{e}");
        assert!(
            e["error"]["desc"]
                .as_str()
                .unwrap()
                .contains("duplicate key"),
            "{e}"
        );
    }
    c.send(br#"{"execute":"qmp_capabilities","arguments":{"enable":["bogus"]}}"#);
    let e = c.line();
    assert_eq!(e["error"]["class"], "GenericError", "{e}");
    assert!(e["error"]["desc"].as_str().unwrap().contains("bogus"));
    c.send(br#"{"execute":"qmp_capabilities"}"#);
    assert_eq!(c.line(), json!({"return": {}}));
    c.send(br#"{"execute":"qmp_capabilities"}"#);
    let e = c.line();
    assert_eq!(e["error"]["class"], "CommandNotFound", "{e}");
    assert!(e["error"]["desc"]
        .as_str()
        .unwrap()
        .contains("already complete"));
}

#[test]
fn requests_without_newlines_or_spread_over_lines_are_each_answered_once() {
    require_kvm!();
    let vm = ServedVm::start("framing", MEM, 1);
    let mut c = Raw::connect(&vm);
    // As qemu.qmp sends: compact, no newline, back to back.
    c.send(br#"{"execute":"qmp_capabilities","id":1}{"execute":"query-status","id":2}"#);
    assert_eq!(c.line()["id"], 1);
    let status = c.line();
    assert_eq!(
        (status["id"].clone(), status["return"]["status"].clone()),
        (json!(2), json!("running"))
    );
    // Pretty-printed over several lines and reads.
    c.send(b"{\n  \"execute\": \"query-name\",\n");
    c.send(b"  \"id\": 3\n}\n");
    let name = c.line();
    assert_eq!(name["id"], 3, "{name}");
    assert_eq!(name["return"]["name"], "ctl");
}

#[test]
fn query_status_follows_stop_and_cont() {
    require_kvm!();
    let vm = ServedVm::start("status", MEM, 2);
    let mut c = vm.client();
    let status = |c: &mut Client| c.execute("query-status", json!({})).unwrap().0;
    let s = status(&mut c);
    assert_eq!(
        (
            s["status"].clone(),
            s["running"].clone(),
            s["singlestep"].clone()
        ),
        (json!("running"), json!(true), json!(false))
    );
    c.execute("stop", json!({})).unwrap();
    let s = status(&mut c);
    assert_eq!(
        (s["status"].clone(), s["running"].clone()),
        (json!("paused"), json!(false))
    );
    c.execute("cont", json!({})).unwrap();
    assert_eq!(status(&mut c)["status"], "running");
}

/// The next two lines of `c`: the reply with `id` and the event `name`, in
/// either order (the event goes out when the control thread next wakes).
fn reply_and_event(c: &mut Raw, id: &str, name: &str) {
    let lines = [c.line(), c.line()];
    let reply = lines.iter().find(|l| l.get("return").is_some());
    assert_eq!(reply, Some(&json!({"return": {}, "id": id})), "{lines:?}");
    let event = lines.iter().find(|l| l.get("event").is_some());
    let event = event.unwrap_or_else(|| panic!("no event in {lines:?}"));
    assert_eq!(event["event"], name, "{lines:?}");
    // As QEMU's: no data member, a timestamp.
    assert!(event.get("data").is_none(), "{event}");
    assert!(event["timestamp"]["seconds"].is_u64(), "{event}");
}

#[test]
fn stop_and_cont_send_stop_and_resume_events_to_negotiated_clients() {
    require_kvm!();
    let vm = ServedVm::start("runevents", MEM, 1);
    let negotiate = |c: &mut Raw| {
        c.send(br#"{"execute":"qmp_capabilities"}"#);
        assert_eq!(c.line(), json!({"return": {}}));
    };
    let mut a = Raw::connect(&vm);
    negotiate(&mut a);
    // Connected but not negotiated: events are not for it yet, as in QEMU.
    let mut b = Raw::connect(&vm);
    a.send(br#"{"execute":"stop","id":"s1"}"#);
    reply_and_event(&mut a, "s1", "STOP");
    // Already paused: no second STOP (the two lines after `cont` would show it).
    a.send(br#"{"execute":"stop","id":"s2"}"#);
    assert_eq!(a.line(), json!({"return": {}, "id": "s2"}));
    a.send(br#"{"execute":"cont","id":"c1"}"#);
    reply_and_event(&mut a, "c1", "RESUME");
    a.send(br#"{"execute":"query-status","id":"q"}"#);
    assert_eq!(a.line()["id"], "q");
    negotiate(&mut b);
    b.send(br#"{"execute":"query-status","id":"bq"}"#);
    let first = b.line();
    assert_eq!(
        first["id"], "bq",
        "events reached a client before it negotiated"
    );
}

/// As QEMU's, the last a negotiated client hears from a VMM that stops is
/// `SHUTDOWN` with its cause (libvirt reads a close without one as a crash).
/// A served VMM of its own process (in `dir`), and a client past negotiation.
fn vmm_process(dir: &std::path::Path) -> (common::KillOnDrop, Raw) {
    let socket = dir.join("ctl.sock");
    let vmm = common::KillOnDrop::new(common::served_run(&socket).spawn().unwrap());
    drop(Client::connect_when_ready(&socket, Duration::from_secs(20), || Ok(())).unwrap());
    let mut a = Raw::at(&socket);
    a.send(br#"{"execute":"qmp_capabilities"}"#);
    assert_eq!(a.line(), json!({"return": {}}));
    (vmm, a)
}

#[test]
fn a_stopping_vmm_says_shutdown_and_why_to_negotiated_clients() {
    require_kvm!();
    for (how, reason) in [
        ("quit", "host-qmp-quit"),
        ("SIGTERM", "host-signal"),
        ("panic", "guest-panic"),
    ] {
        let dir = common::test_dir("shutdown-event");
        let socket = dir.join("ctl.sock");
        let (mut vmm, mut a) = vmm_process(&dir);
        // Connected, not negotiated: no event for it.
        let mut b = Raw::at(&socket);
        match how {
            "quit" => a.send(br#"{"execute":"quit","id":"q"}"#),
            "panic" => {
                a.send(br#"{"execute":"guest-command","arguments":{"vcpu":0,"command":"panic"}}"#)
            }
            _ => rustix::process::kill_process(
                rustix::process::Pid::from_child(&vmm),
                rustix::process::Signal::TERM,
            )
            .unwrap(),
        }
        let mut lines = Vec::new();
        loop {
            let mut line = String::new();
            if a.r.read_line(&mut line).unwrap_or(0) == 0 {
                break;
            }
            lines.push(serde_json::from_str::<Value>(&line).unwrap());
        }
        // SHUTDOWN is the last event; for `quit`, its reply follows, as
        // QEMU 7.2 sends them (the event, then the return).
        let mut events = lines.iter().filter(|l| l.get("event").is_some());
        let last = events
            .next_back()
            .unwrap_or_else(|| panic!("{how}: nothing"));
        assert_eq!(last["event"], "SHUTDOWN", "{how}: {lines:?}");
        if how == "quit" {
            assert_eq!(
                lines.last(),
                Some(&json!({"return": {}, "id": "q"})),
                "{lines:?}"
            );
        }
        // A running guest's VMM that stops says SHUTDOWN alone, as QEMU's
        // does for `quit` and a signal: no STOP before it.
        if how != "panic" {
            assert!(
                !lines.iter().any(|l| l["event"] == "STOP"),
                "{how}: {lines:?}"
            );
        }
        // `guest` for the guest's own causes, as QEMU's.
        assert_eq!(
            last["data"],
            json!({"guest": how == "panic", "reason": reason}),
            "{how}: {lines:?}"
        );
        let mut rest = String::new();
        let _ = b.r.read_line(&mut rest);
        assert!(!rest.contains("SHUTDOWN"), "{how}: not negotiated: {rest}");
        // An orderly stop is a success; a guest that panicked is status 2.
        let code = vmm.wait().unwrap().code();
        assert_eq!(code, Some(if how == "panic" { 2 } else { 0 }), "{how}");
    }
}

/// Each command's event comes before its reply, as QEMU 7.2 sends them
/// (`stop`: STOP, then the return; `cont`: RESUME; `quit`: SHUTDOWN), so
/// that a client that looks at the events it has by a reply finds them;
/// and a user's `stop` just before `quit` is said: only a stop the
/// shutdown itself makes goes unsaid.
#[test]
fn stop_cont_and_quit_say_their_events_before_their_replies() {
    require_kvm!();
    let dir = common::test_dir("stop-quit");
    let (mut vmm, mut a) = vmm_process(&dir);
    a.send(br#"{"execute":"stop"} {"execute":"cont"} {"execute":"stop"} {"execute":"quit"}"#);
    let mut said = Vec::new();
    loop {
        let mut line = String::new();
        if a.r.read_line(&mut line).unwrap_or(0) == 0 {
            break;
        }
        let v: Value = serde_json::from_str(&line).unwrap();
        said.push(match v["event"].as_str() {
            Some(e) => e.to_string(),
            None => v.get("return").map_or(line, |_| "return".to_string()),
        });
    }
    assert_eq!(
        said,
        ["STOP", "return", "RESUME", "return", "STOP", "return", "SHUTDOWN", "return"],
        "{said:?}"
    );
    assert_eq!(vmm.wait().unwrap().code(), Some(0));
}

#[test]
fn query_cpus_fast_names_each_vcpu_by_qom_path_and_thread() {
    require_kvm!();
    let vm = ServedVm::start("cpus", MEM, 3);
    let mut c = vm.client();
    let cpus = common::wait_for("vCPU threads", Duration::from_secs(20), || {
        let (v, _) = c.execute("query-cpus-fast", json!({})).unwrap();
        v.as_array()
            .unwrap()
            .iter()
            .all(|cpu| cpu["thread-id"].as_i64() > Some(0))
            .then_some(v)
    });
    for (i, cpu) in cpus.as_array().unwrap().iter().enumerate() {
        assert_eq!(cpu["cpu-index"], i);
        assert_eq!(cpu["qom-path"], format!("/machine/unattached/device[{i}]"));
        assert_eq!(cpu["target"], "x86_64");
        let tid = cpu["thread-id"].as_i64().unwrap();
        let comm = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")).unwrap();
        assert_eq!(comm.trim(), format!("vcpu{i}"));
    }
}

#[test]
fn query_version_and_query_name() {
    require_kvm!();
    let vm = ServedVm::start_with("named", MEM, 1, |c| c.name = Some("web-7".into()));
    let mut c = vm.client();
    let (v, _) = c.execute("query-version", json!({})).unwrap();
    assert_eq!(
        v["qemu"]["major"].as_u64(),
        Some(env!("CARGO_PKG_VERSION_MAJOR").parse().unwrap())
    );
    assert_eq!(
        c.execute("query-name", json!({})).unwrap().0,
        json!({"name": "web-7"})
    );
    // QEMU's KvmInfo, which libvirt asks at start.
    assert_eq!(
        c.execute("query-kvm", json!({})).unwrap().0,
        json!({"enabled": true, "present": true})
    );
}

#[test]
fn libvirt_style_query_stats_with_providers_and_qom_paths_answers() {
    require_kvm!();
    let vm = ServedVm::start("libvirt", MEM, 2);
    let mut c = vm.client();
    let args = json!({
        "target": "vcpu",
        "providers": [{"provider": "kvm", "names": ["exits", "halt_exits"]}],
        // Named twice: one result, as QEMU filters its vCPUs by the list.
        "vcpus": ["/machine/unattached/device[1]", "/machine/unattached/device[1]"],
    });
    let (v, _) = c.execute("query-stats", args).unwrap();
    let entries = v.as_array().unwrap();
    assert_eq!(entries.len(), 1, "{v}");
    assert_eq!(entries[0]["provider"], "kvm");
    assert_eq!(entries[0]["qom-path"], "/machine/unattached/device[1]");
    let names: Vec<&str> = entries[0]["stats"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"exits") && names.iter().all(|n| ["exits", "halt_exits"].contains(n)),
        "{names:?}"
    );
}

#[test]
fn query_stats_that_matches_nothing_is_an_empty_list() {
    require_kvm!();
    let vm = ServedVm::start("nothing", MEM, 1);
    let mut c = vm.client();
    for args in [
        json!({"target": "vm", "providers": [{"provider": "cryptodev"}]}),
        json!({"target": "vm", "providers": [{"provider": "kvm", "names": ["no_such_stat"]}]}),
        json!({"target": "vcpu", "vcpus": ["/machine/peripheral/none"]}),
        json!({"target": "cryptodev"}),
    ] {
        let (v, _) = c.execute("query-stats", args.clone()).unwrap();
        assert_eq!(v, json!([]), "{args}");
    }
    let (v, _) = c
        .execute("query-stats-schemas", json!({"provider": "cryptodev"}))
        .unwrap();
    assert_eq!(v, json!([]));
    let (v, _) = c
        .execute("query-stats-schemas", json!({"provider": "kvm"}))
        .unwrap();
    assert_eq!(v.as_array().unwrap().len(), 2);
    // QEMU's StatsSchema members only: one vCPU's file id or index would
    // read as that vCPU's schema, and it is every vCPU's.
    for schema in v.as_array().unwrap() {
        let mut members: Vec<&String> = schema.as_object().unwrap().keys().collect();
        members.sort();
        assert_eq!(members, ["provider", "stats", "target"], "{schema}");
    }
}

#[test]
fn argument_errors_use_qemus_generic_error_class() {
    require_kvm!();
    let vm = ServedVm::start("classes", MEM, 1);
    let mut c = vm.client();
    let (class, desc) = remote_error(c.execute(
        "query-stats",
        json!({"target": "vm", "providers": [{"provider": "xen"}]}),
    ));
    assert_eq!(class, ErrorClass::GenericError);
    assert!(desc.contains("provider"), "{desc}");
    let (class, _) = remote_error(c.execute("query-everything", json!({})));
    assert_eq!(class, ErrorClass::CommandNotFound);
}
