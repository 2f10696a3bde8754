//! The clients, each in its own process so that the fds really cross processes:
//! `kvmscope stats`, `watch`, `ctl`, `demo`, and the Python client.

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::ServedVm;
use kvmscope::client::Client;
use serde_json::{json, Value};

const MEM: u64 = 64 << 20;

fn kvmscope(args: &[&str], socket: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvmscope"))
        .args(args)
        .arg("--socket")
        .arg(socket)
        .output()
        .unwrap()
}

fn stdout_of(out: &Output) -> String {
    assert!(
        out.status.success(),
        "failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A VMM whose vCPU 0 has touched 2 MiB, so pages_4k and exits have moved.
fn touched_vm(test: &str) -> ServedVm {
    let vm = ServedVm::start(test, MEM, 1);
    vm.client()
        .execute(
            "guest-command",
            json!({"vcpu": 0, "command": "touch size=2M", "wait": true}),
        )
        .unwrap();
    vm
}

fn stat(results: &Value, target: &str, name: &str) -> Option<u64> {
    let entry = results["return"]
        .as_array()?
        .iter()
        .find(|r| r["target"] == target)?;
    entry["stats"]
        .as_array()?
        .iter()
        .find(|s| s["name"] == name)?["value"]
        .as_u64()
}

fn python_client(socket: &Path, args: &[&str]) -> Output {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/kvmscope_client.py");
    Command::new("python3")
        .arg(script)
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output()
        .expect("python3 runs (CI installs it)")
}

#[test]
fn stats_command_reads_the_kernel_through_received_fds() {
    require_kvm!();
    let vm = touched_vm("stats-json");
    let j: Value =
        serde_json::from_str(&stdout_of(&kvmscope(&["stats", "--json"], &vm.socket))).unwrap();
    assert!(stat(&j, "vm", "pages_4k").unwrap() >= 512, "{j}");
    assert!(stat(&j, "vcpu", "exits").unwrap() > 0, "{j}");
    // Only unmeasured readiness figures asked for: no entry of the VMM's
    // own VM file (it was one with "stats": []), as for a file that
    // matched nothing.
    let out = stdout_of(&kvmscope(
        &["stats", "--json", "--names", "prediction_*"],
        &vm.socket,
    ));
    let j: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["return"], json!([]), "{j}");
}

#[test]
fn stats_command_prints_a_table_of_the_named_stats() {
    require_kvm!();
    let vm = touched_vm("stats-table");
    let text = stdout_of(&kvmscope(
        &["stats", "--vcpu", "0", "--names", "exits,pf_fixed"],
        &vm.socket,
    ));
    // The VM by its name (the files' ids name the process), then the table.
    let (head, table) = text.split_once('\n').unwrap();
    assert_eq!(
        head,
        format!("kvmscope stats: VM \"ctl\", VMM pid {}", std::process::id())
    );
    assert!(table.starts_with("== vcpu 0 (kvm-"), "{text}");
    let rows: Vec<&str> = table.lines().skip(1).collect();
    assert_eq!(rows.len(), 2, "{text}");
    assert!(rows.iter().any(|r| r.starts_with("exits ")));
    // Patterns, as the exporter's --stats takes them.
    let text = stdout_of(&kvmscope(
        &["stats", "--vcpu", "0", "--names", "pf_*"],
        &vm.socket,
    ));
    let rows: Vec<&str> = text
        .lines()
        .skip(1)
        .filter(|l| !l.starts_with("== "))
        .collect();
    assert!(rows.len() > 1, "{text}");
    assert!(rows.iter().all(|r| r.starts_with("pf_")), "{text}");
}

#[test]
fn watch_command_shows_rates_for_the_requested_refreshes() {
    require_kvm!();
    let vm = touched_vm("watch");
    let text = stdout_of(&kvmscope(
        &[
            "watch",
            "--interval",
            "20ms",
            "--count",
            "3",
            "--vcpu",
            "0",
            "--names",
            "exits",
        ],
        &vm.socket,
    ));
    assert_eq!(text.matches("refresh ").count(), 3, "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("exits") && l.contains("/s)")),
        "{text}"
    );
    assert!(
        !text.contains('\x1b'),
        "no screen clearing when not on a terminal"
    );
}

#[test]
fn watch_ends_when_the_vmm_exits_even_without_a_sampler() {
    require_kvm!();
    // A VMM of its own process (the fds it hands out keep its stats
    // readable after it exits), with no sampler: watch asks it nothing.
    let dir = common::test_dir("watch-exit");
    let socket = dir.join("ctl.sock");
    let _vmm = common::KillOnDrop::new(common::served_run(&socket).spawn().unwrap());
    let mut c = Client::connect_when_ready(&socket, Duration::from_secs(20), || Ok(())).unwrap();
    let mut watch = common::KillOnDrop::new(
        Command::new(env!("CARGO_BIN_EXE_kvmscope"))
            .args(["watch", "--interval", "50ms", "--vm", "--names", "pages_4k"])
            .arg("--socket")
            .arg(&socket)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        watch.try_wait().unwrap().is_none(),
        "watch runs while the VMM does"
    );
    c.execute("quit", json!({})).unwrap();
    common::wait_for("watch to end", Duration::from_secs(10), || {
        watch.try_wait().unwrap()
    });
    let out = watch.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("has exited"), "{err}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("refresh 1"),
        "it showed the stats first"
    );
}

#[test]
fn ctl_command_prints_the_reply_and_fails_on_an_error_reply() {
    require_kvm!();
    let vm = ServedVm::start("ctl", MEM, 1);
    let ok: Value = serde_json::from_str(&stdout_of(&kvmscope(
        &["ctl", "{\"execute\":\"query-vm\",\"id\":1}"],
        &vm.socket,
    )))
    .unwrap();
    assert_eq!(
        (ok["id"].as_u64(), ok["return"]["vcpus"].as_u64()),
        (Some(1), Some(1))
    );
    let bad = kvmscope(&["ctl", "{\"execute\":\"nope\"}"], &vm.socket);
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stdout).contains("CommandNotFound"));
    // Two requests in one line: a reply each, in order.
    let two = stdout_of(&kvmscope(
        &[
            "ctl",
            "{\"execute\":\"query-name\"} {\"execute\":\"query-status\"}",
        ],
        &vm.socket,
    ));
    let replies: Vec<Value> = two
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(replies.len(), 2, "{two}");
    assert_eq!(replies[1]["return"]["status"], "running", "{two}");
    // Split as the VMM splits it: `1,2` is one value it cannot parse, one reply.
    let odd = kvmscope(&["ctl", "1,2"], &vm.socket);
    assert_eq!(odd.status.code(), Some(1));
    assert_eq!(String::from_utf8_lossy(&odd.stdout).lines().count(), 1);
    // Nothing, or a value cut short, would never be answered (a QMP server
    // waits for the rest): refused at once, naming why.
    for (request, why) in [
        ("", "an empty request"),
        ("  ", "an empty request"),
        ("{\"execute\":\"query-status\"", "ends inside a JSON value"),
    ] {
        let out = kvmscope(&["ctl", request], &vm.socket);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{request:?}: {err}");
        assert!(err.contains(why), "{request:?}: {err}");
    }
}

#[test]
fn a_reader_that_goes_away_ends_stats_quietly() {
    require_kvm!();
    let vm = ServedVm::start("stats-pipe", MEM, 2);
    // `kvmscope stats | head -1`: the reader has gone before the page is written.
    let (code, err) = common::output_unread(
        Command::new(env!("CARGO_BIN_EXE_kvmscope"))
            .args(["stats", "--vcpu", "all", "--socket"])
            .arg(&vm.socket),
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(err.is_empty(), "nothing blamed on the VMM: {err}");
}

#[test]
fn python_client_reads_stats_through_received_fds() {
    require_kvm!();
    let vm = touched_vm("python");
    let out = python_client(&vm.socket, &["--json"]);
    let j: Value = serde_json::from_str(&stdout_of(&out)).unwrap();
    let pages = stat(&j, "vm", "pages_4k").unwrap();
    assert!(pages >= 512, "{j}");
    assert!(stat(&j, "vcpu", "exits").unwrap() > 0, "{j}");
    // Python parsed the same file the VMM reads: the idle guest's pages agree.
    let (q, _) = vm
        .client()
        .execute(
            "query-stats",
            json!({"target": "vm", "names": ["pages_4k"]}),
        )
        .unwrap();
    assert_eq!(q[0]["stats"][0]["value"].as_u64(), Some(pages));
}

#[test]
fn python_client_takes_patterns_and_refuses_bad_input_as_kvmscope_stats_does() {
    require_kvm!();
    let vm = touched_vm("python-input");
    let out = python_client(&vm.socket, &["--vcpu", "0", "--names", "pf_*", "--json"]);
    let j: Value = serde_json::from_str(&stdout_of(&out)).unwrap();
    let names: Vec<&str> = j["return"][0]["stats"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert!(names.len() > 1, "{j}");
    assert!(names.iter().all(|n| n.starts_with("pf_")), "{j}");
    for bad in [
        ["--names", ""],
        ["--names", "a b"],
        ["--timeout", "0"],
        ["--timeout", "-5"],
    ] {
        let out = python_client(&vm.socket, &bad);
        assert_eq!(out.status.code(), Some(2), "{bad:?} is refused by argparse");
    }
    let file = vm.dir().join("plain-file");
    std::fs::write(&file, "").unwrap();
    let out = python_client(&file, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("it is not a socket"), "{err}");
}

#[test]
fn python_client_sends_raw_requests() {
    require_kvm!();
    let vm = ServedVm::start("python-raw", MEM, 2);
    let out = python_client(&vm.socket, &["--execute", "{\"execute\":\"query-vm\"}"]);
    let j: Value = serde_json::from_str(&stdout_of(&out)).unwrap();
    assert_eq!(j["return"]["vcpus"], 2);
    // A scan pauses the guest: STOP and RESUME come before the reply,
    // printed first, and the reply last (it printed STOP and left).
    let scan = r#"{"execute":"query-readiness","arguments":{"scan":true,"calc-time":0}}"#;
    let out = python_client(&vm.socket, &["--execute", scan]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout_of(&out));
    let lines: Vec<Value> = stdout_of(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let (reply, events) = lines.split_last().unwrap();
    assert!(reply["return"]["scan"].is_object(), "{reply}");
    let names: Vec<&str> = events.iter().filter_map(|e| e["event"].as_str()).collect();
    assert!(
        names.contains(&"STOP") && names.contains(&"RESUME"),
        "{names:?}"
    );
}

#[test]
fn demo_runs_every_phase_end_to_end_and_cleans_up() {
    require_kvm!();
    let out = Command::new(env!("CARGO_BIN_EXE_kvmscope"))
        .args(["demo", "--memory", "64M", "--phase-size", "1M"])
        .output()
        .unwrap();
    let text = stdout_of(&out);
    for phase in [
        "phase 1: touch",
        "phase 2: touch-zero",
        "phase 3: dirty",
        "phase 4: exits",
    ] {
        assert!(text.contains(phase), "{phase} missing:\n{text}");
    }
    assert!(
        text.contains("received 2 stats fds over SCM_RIGHTS"),
        "{text}"
    );
    // Phase 1's VM line reads `vm:     pages_4k A->B, ...`: a 1M touch maps 256 more pages.
    let moved = text
        .lines()
        .find(|l| l.trim_start().starts_with("vm:"))
        .and_then(|l| l.split_whitespace().nth(2))
        .and_then(|ab| ab.trim_end_matches(',').split_once("->"));
    let (a, b) = moved
        .map(|(a, b)| (a.parse::<u64>().unwrap(), b.parse::<u64>().unwrap()))
        .expect("phase 1 reports pages_4k");
    assert!(b >= a + 256, "pages_4k {a}->{b}:\n{text}");
    assert!(text.contains("Migration status: completed"), "{text}");
    // A throttled migration: the writer outruns the link, --converge auto limits it.
    assert!(
        text.contains("--converge auto: a dirty limit of "),
        "{text}"
    );
    assert!(
        text.contains("guest progress (units/s, its own count): vCPU 0 "),
        "{text}"
    );
    // The VM keeps its name across the migration.
    assert!(text.starts_with("VM \"kvmscope-demo\", VMM pid"), "{text}");
    assert!(
        text.contains("the guest runs on as VM \"kvmscope-demo\" in VMM pid"),
        "{text}"
    );
    assert_eq!(text.matches(" differ").count(), 2, "{text}");
    let differing = text
        .lines()
        .filter(|l| l.ends_with(" differ") && !l.ends_with(" 0 differ"));
    assert_eq!(differing.count(), 0, "the guest arrived whole:\n{text}");
    assert!(text.contains("the VMM exited (exit status: 0)"), "{text}");
    let socket = text
        .split_whitespace()
        .find(|w| w.contains("kvmscope-demo-"))
        .unwrap();
    assert!(!Path::new(socket).exists(), "the demo's socket is gone");
}

#[test]
fn sigterm_stops_the_vmm_and_removes_its_socket() {
    require_kvm!();
    let dir = common::test_dir("sigterm");
    let socket = dir.join("ctl.sock");
    let mut child = common::KillOnDrop::new(
        Command::new(env!("CARGO_BIN_EXE_kvmscope"))
            .args(["run", "--memory", "64M", "--socket"])
            .arg(&socket)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let ready = Client::connect_when_ready(&socket, Duration::from_secs(20), || {
        match child.try_wait() {
            Ok(None) => Ok(()),
            _ => Err(kvmscope::client::Error::Closed),
        }
    });
    drop(ready.expect("the VMM serves"));
    // SAFETY: kill only sends a signal to our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    assert!(!socket.exists(), "the socket file is removed on SIGTERM");
    let _ = std::fs::remove_dir_all(socket.parent().unwrap());
}

#[test]
fn the_python_client_reads_the_vmms_own_stats_with_its_kvm_stats_parser() {
    require_kvm!();
    let vm = touched_vm("py-own");
    let mut c = vm.client();
    c.execute(
        "guest-command",
        json!({"vcpu": 0, "command": "exits ports=40", "wait": true}),
    )
    .unwrap();
    let (exits, _) = c.execute("query-exits", json!({"vcpus": [0]})).unwrap();
    let want = exits[0]["reasons"]["io_out"].as_u64().unwrap();
    // The VMM copies its counters into the files every 100 ms.
    let j = common::wait_for("the published count", Duration::from_secs(5), || {
        let out = python_client(
            &vm.socket,
            &[
                "--provider",
                "kvmscope",
                "--vcpu",
                "0",
                "--names",
                "exits_io_out",
                "--json",
            ],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let j: Value = serde_json::from_slice(&out.stdout).unwrap();
        (stat(&j, "vcpu", "exits_io_out") == Some(want)).then_some(j)
    });
    assert_eq!(j["return"][0]["provider"], "kvmscope", "{j}");
    assert!(j["return"][0]["id"]
        .as_str()
        .unwrap()
        .starts_with("kvmscope-"));
}

#[test]
fn stats_command_shows_the_vmms_own_stats_beside_the_kernels() {
    require_kvm!();
    let vm = touched_vm("stats-own");
    let text = stdout_of(&kvmscope(
        &["stats", "--vcpu", "0", "--names", "exits,exits_hlt"],
        &vm.socket,
    ));
    let headings: Vec<&str> = text.lines().filter(|l| l.starts_with("== ")).collect();
    assert_eq!(headings.len(), 2, "{text}");
    assert!(headings[0].starts_with("== vcpu 0 (kvm-"), "{text}");
    assert!(
        headings[1].starts_with("== vcpu 0, kvmscope (kvmscope-"),
        "{text}"
    );
    // A VMM that never measured readiness: no figure that would read as a
    // measured zero (`prediction_converges false`), and a line saying why;
    // its other own stats as they are. The JSON leaves them out too (a
    // script that reads the verdict finds none, not a false one).
    let vm_text = stdout_of(&kvmscope(&["stats", "--vm"], &vm.socket));
    assert!(vm_text.contains("\nmigration_status "), "{vm_text}");
    assert!(
        !vm_text.contains("prediction_converges") && !vm_text.contains("readiness_at_ns"),
        "{vm_text}"
    );
    assert!(vm_text.contains("has not measured readiness"), "{vm_text}");
    // A wall-clock instant as its UTC date and age, not seconds since 1970.
    let published = vm_text
        .lines()
        .find(|l| l.starts_with("published_at_ns "))
        .unwrap_or_else(|| panic!("{vm_text}"));
    let (date, age) = published["published_at_ns ".len()..]
        .trim()
        .split_once(" (")
        .unwrap_or_else(|| panic!("{published}"));
    assert!(
        date.len() >= 20 && date.as_bytes()[4] == b'-' && date.contains('T') && date.ends_with('Z'),
        "{published}"
    );
    let age: f64 = age.strip_suffix(" s ago)").unwrap().parse().unwrap();
    assert!(
        age < 60.0,
        "the publisher's last write, moments ago: {published}"
    );
    let json = stdout_of(&kvmscope(&["stats", "--vm", "--json"], &vm.socket));
    assert!(!json.contains("\"prediction_converges\""), "{json}");
    assert!(json.contains("\"migration_status\""), "{json}");
    // watch leaves them out too, saying why.
    let text = stdout_of(&kvmscope(
        &[
            "watch",
            "--vm",
            "--count",
            "1",
            "--interval",
            "20ms",
            "--names",
            "published_at_ns,prediction_*",
        ],
        &vm.socket,
    ));
    assert!(text.contains("\npublished_at_ns "), "{text}");
    assert!(!text.contains("prediction_converges"), "{text}");
    assert!(text.contains("has not measured readiness yet"), "{text}");
}
