//! `--samples-out` never costs a user a file: a start-up that fails leaves an
//! existing file as it was, and a file that is not a series is replaced only
//! with `--force`.

mod common;

use std::path::Path;
use std::process::Command;

use common::ServedVm;
use kvmscope::run::{self, RunConfig};
use kvmscope::sampler::export::is_series_header;
use kvmscope::sampler::SamplerConfig;
use kvmscope::vm::VmConfig;

/// A series from an earlier run: the header record, then lines only this test wrote.
fn earlier_series(path: &Path) -> Vec<u8> {
    let header = if path.extension().is_some_and(|e| e == "csv") {
        "seq,time_s,pages_4k,pages_2m,pages_1g,mapped_bytes,vcpu,phase,our_io_out"
    } else {
        r#"{"kind":"header","version":1,"vcpus":1}"#
    };
    let text = format!("{header}\nan earlier run's points, which must survive\n").into_bytes();
    std::fs::write(path, &text).unwrap();
    text
}

/// A run of a small VM exporting to `out`, adjusted by `adjust`.
fn config(out: &Path, adjust: impl FnOnce(&mut RunConfig)) -> RunConfig {
    let mut c = RunConfig {
        vm: VmConfig {
            memory: 32 << 20,
            ..VmConfig::default()
        },
        workloads: Vec::new(),
        sampler: Some(SamplerConfig {
            out: Some(out.to_path_buf().into()),
            ..SamplerConfig::default()
        }),
        ..RunConfig::demo()
    };
    adjust(&mut c);
    c
}

/// The names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn a_start_up_failing_on_a_taken_metrics_port_leaves_the_samples_file_unchanged() {
    require_kvm!();
    let dir = common::test_dir("out-port");
    let out = dir.join("series.jsonl");
    let before = earlier_series(&out);
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let err =
        run::run(config(&out, |c| c.metrics_addr = Some(addr))).expect_err("the port is taken");
    assert!(matches!(err, run::Error::Metrics(_)), "{err}");
    assert_eq!(std::fs::read(&out).unwrap(), before, "byte for byte");
    assert_eq!(names(&dir), ["series.jsonl"], "no temporary file left");
}

#[test]
fn a_start_up_failing_on_a_live_socket_leaves_the_samples_file_unchanged() {
    require_kvm!();
    let live = ServedVm::start("out-live", 32 << 20, 1);
    let out = live.dir().join("series.csv");
    let before = earlier_series(&out);
    let socket = live.socket.clone();
    let err = run::run(config(&out, |c| c.socket = Some(socket)))
        .expect_err("another VMM serves that socket");
    assert!(matches!(err, run::Error::Control(_)), "{err}");
    assert_eq!(std::fs::read(&out).unwrap(), before, "byte for byte");
    assert_eq!(names(live.dir()), ["ctl.sock", "series.csv"]);
}

fn kvmscope_run(out: &Path, extra: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kvmscope"))
        .args(["run", "--memory", "32M", "--workload", "exits count=1"])
        .arg("--samples-out")
        .arg(out)
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn a_file_that_is_not_a_series_is_refused_and_kept() {
    require_kvm!();
    let dir = common::test_dir("out-refused");
    let out = dir.join("notes.csv");
    std::fs::write(&out, "my precious notes\n").unwrap();
    let run = kvmscope_run(&out, &[]);
    assert_eq!(run.status.code(), Some(1));
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(
        err.contains("is not a kvmscope samples file") && err.contains("--force"),
        "{err}"
    );
    assert_eq!(std::fs::read(&out).unwrap(), b"my precious notes\n");
    assert_eq!(names(&dir), ["notes.csv"]);
}

#[test]
fn force_replaces_a_file_that_is_not_a_series_and_a_series_is_replaced_without() {
    require_kvm!();
    let dir = common::test_dir("out-force");
    let out = dir.join("notes.jsonl");
    std::fs::write(&out, "my notes, which I want gone\n").unwrap();
    let first_line = |p: &Path| {
        let text = std::fs::read_to_string(p).unwrap();
        text.lines().next().unwrap_or_default().to_string()
    };
    for extra in [&["--force"][..], &[]] {
        let run = kvmscope_run(&out, extra);
        assert!(
            run.status.success(),
            "{extra:?}: {}",
            String::from_utf8_lossy(&run.stderr)
        );
        assert!(is_series_header(&first_line(&out)), "{extra:?}");
    }
    assert_eq!(names(&dir), ["notes.jsonl"]);
}
