//! QEMU's own QMP clients talk to kvmscope unpatched: the `qemu.qmp` Python
//! library (QMPClient, the legacy QEMUMonitorProtocol, events) and
//! `qmp-shell`. CI installs `qemu.qmp` (.ci/run); elsewhere these tests skip
//! with a reason when it is missing, unless KVMSCOPE_REQUIRE_KVM=1.

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use common::ServedVm;
use kvmscope::sampler::SamplerConfig;
use serde_json::Value;

const MEM: u64 = 64 << 20;

/// True when `qemu.qmp` can be imported; panics in CI when it cannot.
fn qemu_qmp_available() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import qemu.qmp"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok && std::env::var_os("KVMSCOPE_REQUIRE_KVM").is_some_and(|v| v == "1") {
        panic!("qemu.qmp is required in CI (python3 -m pip install qemu.qmp)");
    }
    if !ok {
        eprintln!("skipping: the qemu.qmp Python package is not installed");
    }
    ok
}

fn with_sampler(c: &mut kvmscope::run::RunConfig) {
    c.sampler = Some(SamplerConfig {
        interval: std::time::Duration::from_millis(10),
        capacity: 64,
        out: None,
    });
}

#[test]
fn qemu_qmp_library_negotiates_queries_and_receives_events() {
    require_kvm!();
    if !qemu_qmp_available() {
        return;
    }
    let vm = ServedVm::start_with("qemu-qmp", MEM, 2, with_sampler);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/qemu_clients/check_qemu_qmp.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(&vm.socket)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["status"]["status"], "running", "{v}");
    assert!(v["version"]["qemu"]["major"].is_u64());
    assert_eq!(v["cpus"].as_array().unwrap().len(), 2);
    let stats = v["stats"].as_array().unwrap();
    assert_eq!(stats.len(), 1, "{v}");
    assert_eq!(stats[0]["qom-path"], v["cpus"][0]["qom-path"]);
    assert_eq!(stats[0]["stats"][0]["name"], "exits");
    assert_eq!(v["schemas"].as_array().unwrap().len(), 2);
    assert_eq!(v["error"]["class"], "CommandNotFound", "{v}");
    assert_eq!(v["events"], serde_json::json!(["SAMPLE", "SAMPLE"]));
    assert_eq!(v["run_events"], serde_json::json!(["STOP", "RESUME"]));
    assert_eq!(v["legacy"]["status"], "running", "{v}");
}

#[test]
fn qmp_shell_runs_a_piped_command() {
    require_kvm!();
    if !qemu_qmp_available() {
        return;
    }
    let vm = ServedVm::start("qmp-shell", MEM, 1);
    let mut child = Command::new("python3")
        .args(["-m", "qemu.qmp.qmp_shell"])
        .arg(&vm.socket)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"query-status\nquery-stats target=vm\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("\"status\": \"running\""), "{stdout}");
    assert!(stdout.contains("\"pages_4k\""), "{stdout}");
}
