//! Every kind of bad client gets an error reply or a closed connection, and the
//! VMM, the guest and the other clients carry on.

mod common;

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::time::Duration;

use common::ServedVm;
use kvmscope::client::{self, Client};
use kvmscope::control::MAX_CLIENTS;
use kvmscope::protocol::framing::MAX_VALUE;
use kvmscope::protocol::ErrorClass;
use serde_json::{json, Value};

const MEM: u64 = 64 << 20;

/// A plain connection past its greeting and negotiation, for sending arbitrary bytes.
fn raw(vm: &ServedVm) -> (UnixStream, BufReader<UnixStream>) {
    let mut s = UnixStream::connect(&vm.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut greeting = String::new();
    r.read_line(&mut greeting).unwrap();
    assert!(greeting.starts_with("{\"QMP\""), "{greeting}");
    s.write_all(br#"{"execute":"qmp_capabilities"}"#).unwrap();
    assert_eq!(reply(&mut r), json!({"return": {}}));
    (s, r)
}

fn reply(r: &mut BufReader<UnixStream>) -> Value {
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
}

fn error_class(v: &Value) -> &str {
    v["error"]["class"]
        .as_str()
        .unwrap_or_else(|| panic!("not an error reply: {v}"))
}

/// The VMM still serves and the guest still runs commands.
fn still_healthy(vm: &ServedVm) {
    let mut c = vm.client();
    let (done, _) = c
        .execute(
            "guest-command",
            json!({"vcpu": 0, "command": "exits count=1", "wait": true}),
        )
        .unwrap();
    assert_eq!(done["results"][0]["status"], "ok");
}

#[test]
fn malformed_json_gets_an_error_and_the_connection_stays_usable() {
    require_kvm!();
    let vm = ServedVm::start("malformed", MEM, 1);
    let (mut s, mut r) = raw(&vm);
    s.write_all(b"{\"execute\": \n\x00\xff garbage\n[1,2]\n{\"execute\":}")
        .unwrap();
    for words in [
        "invalid character",
        "must be a JSON object",
        "JSON parse error",
    ] {
        let e = reply(&mut r);
        assert_eq!(error_class(&e), "GenericError");
        assert!(e["error"]["desc"].as_str().unwrap().contains(words), "{e}");
    }
    s.write_all(b"{\"execute\":\"query-vm\",\"id\":5}\n")
        .unwrap();
    let ok = reply(&mut r);
    assert_eq!(
        (ok["id"].as_u64(), ok["return"]["vcpus"].as_u64()),
        (Some(5), Some(1))
    );
}

#[test]
fn unknown_command_gets_command_not_found_with_its_id() {
    require_kvm!();
    let vm = ServedVm::start("unknown", MEM, 1);
    let (mut s, mut r) = raw(&vm);
    s.write_all(b"{\"execute\":\"format-disk\",\"id\":\"a\"}\n")
        .unwrap();
    let e = reply(&mut r);
    assert_eq!(
        (error_class(&e), e["id"].as_str()),
        ("CommandNotFound", Some("a"))
    );
}

#[test]
fn wrong_argument_types_get_a_generic_error_naming_the_member() {
    require_kvm!();
    let vm = ServedVm::start("types", MEM, 1);
    let mut c = vm.client();
    for (cmd, args, member) in [
        ("get-stats-fd", json!({"target": 3}), "target"),
        (
            "get-stats-fd",
            json!({"target": "vcpu", "vcpu": "first"}),
            "vcpu",
        ),
        (
            "query-stats",
            json!({"target": "vm", "names": "pages_4k"}),
            "names",
        ),
        (
            "guest-command",
            json!({"vcpu": 0, "command": 42}),
            "command",
        ),
        ("query-vm", json!({"unexpected": true}), "unexpected"),
    ] {
        match c.execute(cmd, args.clone()) {
            Err(client::Error::Remote { class, desc }) => {
                assert_eq!(class, ErrorClass::GenericError, "{cmd} {args}");
                assert!(desc.contains(member), "{cmd} {args}: {desc}");
            }
            other => panic!("{cmd} {args}: {other:?}"),
        }
    }
}

#[test]
fn vcpu_out_of_range_gets_device_not_found() {
    require_kvm!();
    let vm = ServedVm::start("range", MEM, 2);
    let mut c = vm.client();
    for (cmd, args) in [
        ("get-stats-fd", json!({"target": "vcpu", "vcpu": 2})),
        ("query-stats", json!({"target": "vcpu", "vcpus": [0, 7]})),
        ("guest-command", json!({"vcpu": 99, "command": "exits"})),
        ("query-exits", json!({"vcpus": [2]})),
        ("query-guest", json!({"vcpus": [18446744073709551615u64]})),
    ] {
        match c.execute(cmd, args.clone()) {
            Err(client::Error::Remote { class, desc }) => {
                assert_eq!(class, ErrorClass::DeviceNotFound, "{cmd} {args}");
                assert!(desc.contains("the VM has 2"), "{desc}");
            }
            other => panic!("{cmd} {args}: {other:?}"),
        }
    }
}

#[test]
fn bad_workload_text_or_range_is_an_error_reply_not_a_guest_failure() {
    require_kvm!();
    let vm = ServedVm::start("workload", MEM, 1);
    let mut c = vm.client();
    for command in [
        "jump size=4M",
        "touch size=4M stride=0",
        "touch offset=1G size=4M",
        "dirty ws=1T",
        "",
    ] {
        match c.execute("guest-command", json!({"vcpu": 0, "command": command})) {
            Err(client::Error::Remote { class, desc }) => {
                assert_eq!(class, ErrorClass::GenericError, "{command}");
                assert!(desc.starts_with("command:"), "{desc}");
            }
            other => panic!("{command}: {other:?}"),
        }
    }
    still_healthy(&vm);
}

#[test]
fn request_over_the_limit_gets_an_error_and_is_closed() {
    require_kvm!();
    let vm = ServedVm::start("long", MEM, 1);
    let (mut s, mut r) = raw(&vm);
    // Over the limit and unfinished: the server cannot wait for the end.
    let mut long = b"{\"execute\":\"".to_vec();
    long.resize(MAX_VALUE + 1024, b'x');
    let _ = s.write_all(&long);
    let e = reply(&mut r);
    assert!(
        e["error"]["desc"].as_str().unwrap().contains("at most"),
        "{e}"
    );
    let mut rest = Vec::new();
    assert_eq!(
        r.read_to_end(&mut rest).unwrap(),
        0,
        "then the connection is closed"
    );
    still_healthy(&vm);
}

/// A whole request over the limit, its long part in a string, sent at once:
/// the server reads it in one go and must count the string's bytes too (it
/// answered such a request of 70,000 bytes as if it were short).
#[test]
fn a_whole_request_over_the_limit_in_one_write_is_refused_too() {
    require_kvm!();
    let vm = ServedVm::start("long-whole", MEM, 1);
    let (mut s, mut r) = raw(&vm);
    let id = "x".repeat(MAX_VALUE);
    let line = format!("{{\"execute\":\"query-name\",\"id\":\"{id}\"}}\n");
    s.write_all(line.as_bytes()).unwrap();
    let e = reply(&mut r);
    assert!(
        e["error"]["desc"].as_str().unwrap().contains("at most"),
        "{e}"
    );
    let mut rest = Vec::new();
    assert_eq!(r.read_to_end(&mut rest).unwrap(), 0, "then closed");
    still_healthy(&vm);
}

#[test]
fn client_that_never_reads_is_dropped_and_the_others_carry_on() {
    require_kvm!();
    let vm = ServedVm::start_with("never-reads", MEM, 1, |c| {
        c.control_limits.send = Duration::from_secs(1);
    });
    let (mut s, _r) = raw(&vm);
    s.set_write_timeout(Some(Duration::from_secs(30))).unwrap();
    // Each reply holds an fd; the client takes none, and is dropped at a limit.
    let request = b"{\"execute\":\"get-stats-fd\",\"arguments\":{\"target\":\"vm\"}}\n";
    let mut dropped = false;
    for _ in 0..100_000 {
        if let Err(e) = s.write_all(request) {
            assert!(
                matches!(e.kind(), ErrorKind::BrokenPipe | ErrorKind::ConnectionReset),
                "{e}"
            );
            dropped = true;
            break;
        }
    }
    assert!(dropped, "the server dropped the client that never reads");
    still_healthy(&vm);
}

#[test]
fn client_that_disconnects_in_the_middle_of_replies_does_not_disturb_others() {
    require_kvm!();
    let vm = ServedVm::start("mid-reply", MEM, 2);
    for _ in 0..5 {
        let (mut s, mut r) = raw(&vm);
        // Replies of several KiB each, more than the socket buffers hold.
        let batch =
            b"{\"execute\":\"query-stats\",\"arguments\":{\"target\":\"vcpu\"}}\n".repeat(100);
        s.write_all(&batch).unwrap();
        let mut part = [0u8; 100];
        r.read_exact(&mut part).unwrap();
        assert!(part.starts_with(b"{\"return\""));
        // Hang up with the first reply half read and the rest queued.
    }
    still_healthy(&vm);
}

#[test]
fn request_sent_just_before_hanging_up_still_runs() {
    require_kvm!();
    let vm = ServedVm::start("hang-up", MEM, 1);
    let mut s = UnixStream::connect(&vm.socket).unwrap();
    // Negotiation and the command back to back, no newline, then hang up.
    let request = b"{\"execute\":\"qmp_capabilities\"}{\"execute\":\"guest-command\",\"arguments\":{\"vcpu\":0,\"command\":\"touch size=1M\"}}";
    s.write_all(request).unwrap();
    drop(s);
    // The hung-up client's fd was ready before this client's request was
    // sent, so the server ran its line first: seq 1 is the touch.
    let mut c = vm.client();
    let (done, _) = c
        .execute(
            "guest-command",
            json!({"vcpu": 0, "command": "exits count=1", "wait": true}),
        )
        .unwrap();
    assert_eq!(done["first-seq"], 2);
    let (g, _) = c.execute("query-guest", json!({})).unwrap();
    assert_eq!(g[0]["last-result"]["seq"], 2);
    let (q, _) = c
        .execute(
            "query-stats",
            json!({"target": "vm", "names": ["pages_4k"]}),
        )
        .unwrap();
    assert!(q[0]["stats"][0]["value"].as_u64().unwrap() >= 256, "{q}");
}

#[test]
fn hundreds_of_clients_at_once_are_served_up_to_the_limit_and_refused_beyond() {
    require_kvm!();
    let vm = ServedVm::start("crowd", MEM, 1);
    let conns: Vec<UnixStream> = (0..300)
        .map(|_| UnixStream::connect(&vm.socket).unwrap())
        .collect();
    let (mut served, mut refused) = (0, 0);
    for s in &conns {
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line).unwrap();
        let v: Value = serde_json::from_str(&line).unwrap();
        match v.get("QMP") {
            Some(_) => served += 1,
            None => {
                let desc = v["error"]["desc"].as_str().unwrap_or_default();
                assert!(desc.contains("all are busy"), "{v}");
                refused += 1;
            }
        }
    }
    // Clients idle for a second may be closed to admit later ones (a slow
    // machine connects 300 in more than a second), so at least the limit.
    assert!(served >= MAX_CLIENTS && refused > 0, "{served} {refused}");
    assert_eq!(served + refused, 300);
    drop(conns);
    // The hang-ups may be seen after a new client's connect: retry until served.
    common::wait_for(
        "a client slot",
        Duration::from_secs(20),
        || match Client::connect(&vm.socket) {
            Err(client::Error::Refused { .. }) => None,
            other => Some(other.unwrap()),
        },
    );
    still_healthy(&vm);
}

/// Reads lines until end of stream; the error replies among them.
fn errors_until_closed(r: &mut BufReader<UnixStream>) -> Vec<String> {
    let mut errors = Vec::new();
    for line in r.lines() {
        let v: Value = serde_json::from_str(&line.unwrap()).unwrap();
        if let Some(d) = v["error"]["desc"].as_str() {
            errors.push(d.to_string());
        }
    }
    errors
}

#[test]
fn idle_clients_filling_every_slot_do_not_keep_a_new_client_out() {
    require_kvm!();
    let vm = ServedVm::start("idle-flood", MEM, 1);
    let idle: Vec<(UnixStream, BufReader<UnixStream>)> =
        (0..MAX_CLIENTS).map(|_| raw(&vm)).collect();
    // Once they have idled past the eviction age, a new client gets an
    // ordinary slot (before that, a reserved one, which serves no `query-vm`).
    common::wait_for(
        "a client in an ordinary slot",
        Duration::from_secs(20),
        || {
            let mut c = Client::connect(&vm.socket).ok()?;
            c.execute("query-vm", json!({})).ok()
        },
    );
    // The longest-idle one was told why it was closed.
    let (_, mut first) = idle.into_iter().next().unwrap();
    first
        .get_ref()
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let why = errors_until_closed(&mut first);
    assert!(why.iter().any(|d| d.contains("make room")), "{why:?}");
}

#[test]
fn a_half_sent_request_is_closed_at_the_request_deadline() {
    require_kvm!();
    let vm = ServedVm::start_with("half-sent", MEM, 1, |c| {
        c.control_limits.request = Duration::from_millis(500);
    });
    let (mut s, mut r) = raw(&vm);
    s.write_all(b"{\"execute\": \"query-").unwrap();
    let why = errors_until_closed(&mut r);
    assert!(why[0].contains("not completed within"), "{why:?}");
    still_healthy(&vm);
}

#[test]
fn a_client_that_never_negotiates_is_closed_at_the_handshake_deadline() {
    require_kvm!();
    let vm = ServedVm::start_with("no-handshake", MEM, 1, |c| {
        c.control_limits.handshake = Duration::from_millis(500);
    });
    let s = UnixStream::connect(&vm.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut r = BufReader::new(s);
    let why = errors_until_closed(&mut r);
    assert!(why[0].contains("no capabilities negotiation"), "{why:?}");
    still_healthy(&vm);
}

#[test]
fn peer_with_another_uid_is_refused_with_permission_denied() {
    require_kvm!();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipping: connecting as another uid needs root");
        return;
    }
    let vm = ServedVm::start("uid", MEM, 1);
    // Let uid 65534 reach the socket at all, so that the uid check is what stops it.
    std::fs::set_permissions(vm.dir(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&vm.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvmscope"))
        .args(["ctl", "--socket"])
        .arg(&vm.socket)
        .arg("{\"execute\":\"query-vm\"}")
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("refused") && err.contains("uid 65534"),
        "{err}"
    );
    still_healthy(&vm);
}

#[test]
fn existing_live_socket_is_never_clobbered() {
    require_kvm!();
    let vm = ServedVm::start("live", MEM, 1);
    let config = kvmscope::run::RunConfig {
        vm: kvmscope::vm::VmConfig {
            memory: MEM,
            ..Default::default()
        },
        workloads: Vec::new(),
        socket: Some(vm.socket.clone()),
        ..kvmscope::run::RunConfig::demo()
    };
    let err = anyhow::Error::from(
        kvmscope::run::run(config).expect_err("a second VMM at the same path fails"),
    );
    assert!(
        format!("{err:#}").contains("is in use by a running server"),
        "{err:#}"
    );
    still_healthy(&vm);
}

#[test]
fn stale_socket_is_replaced() {
    require_kvm!();
    let dir = common::test_dir("stale");
    let path = dir.join("ctl.sock");
    drop(UnixListener::bind(&path).unwrap());
    assert!(path.exists());
    let config = kvmscope::run::RunConfig {
        vm: kvmscope::vm::VmConfig {
            memory: MEM,
            ..Default::default()
        },
        workloads: Vec::new(),
        socket: Some(path.clone()),
        ..kvmscope::run::RunConfig::demo()
    };
    let run = std::thread::spawn(move || kvmscope::run::run(config));
    let mut c = Client::connect_when_ready(&path, Duration::from_secs(20), || Ok(())).unwrap();
    c.execute("quit", json!({})).unwrap();
    assert!(run.join().unwrap().is_ok());
    assert!(!path.exists());
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

#[test]
fn guest_failure_during_a_wait_answers_with_an_error_or_closes() {
    require_kvm!();
    let mut vm = ServedVm::start("guest-panic", MEM, 1);
    let mut c = vm.client();
    let args = json!({"vcpu": 0, "command": "panic", "wait": true});
    match c.execute("guest-command", args) {
        Err(client::Error::Remote { class, desc }) => {
            assert_eq!(class, ErrorClass::GenericError);
            assert!(
                desc.contains("stopped before its commands finished"),
                "{desc}"
            );
        }
        // The VMM may stop serving before the reply goes out.
        Err(client::Error::Closed) => {}
        other => panic!("{other:?}"),
    }
    // A guest failure ends the run, and the summary says why.
    let summary = vm.join();
    assert!(
        summary.failure().is_some_and(|f| f.contains("panic")),
        "{:?}",
        summary.failure()
    );
    assert!(!vm.socket.exists());
}
