//! `kvmscope run` as a user runs it: exit codes, messages, JSON, signals.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

fn kvmscope() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kvmscope"))
}

#[test]
fn bad_workload_spec_is_an_error_naming_the_bad_part() {
    let out = kvmscope()
        .args(["run", "--workload", "touch sz=4M"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown parameter 'sz' for touch"), "{err}");
}

/// Values the VMM cannot take are refused as the command line's errors
/// (status 2), before any VM is built, each naming the rule.
#[test]
fn values_out_of_range_and_flags_that_disagree_exit_2_naming_the_rule() {
    for (args, said) in [
        (&["--dirty-log", "ring:1000"][..], "ring:1000: the dirty ring needs a power-of-two entry count from 256 to 65536"),
        (&["--memory", "64"], "guest memory of 64 bytes is too small: the guest ABI needs at least 16777216 bytes (a unit: 64M, 1G)"),
        (&["--fault-cost", "2s"], "'2s' is more than 1s"),
        (&["--sample-interval", "off", "--samples-out", "/tmp/kvmscope-never.csv"], "--samples-out needs the sampler"),
        (&["--samples-out", "/tmp/kvmscope-never.txt"], "unknown extension; use .csv, or .jsonl/.json/.ndjson"),
        (&["--metrics-addr", "localhost:9100"], "'localhost:9100' is not an IP address and port: use e.g. 127.0.0.1:9100"),
    ] {
        let out = kvmscope().arg("run").args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(said), "{args:?}: {err}");
        assert!(err.starts_with("error: "), "{args:?}: said as clap says: {err}");
    }
}

/// A negative number or rate is the value of its flag, refused naming
/// the flag (it was read as an unknown flag: `unexpected argument '-3'`).
#[test]
fn a_negative_value_is_refused_naming_its_flag() {
    for (args, said) in [
        (
            &[
                "migrate",
                "--socket",
                "/nonexistent",
                "--to",
                "unix:/x",
                "--max-rounds",
                "-3",
            ][..],
            "invalid value '-3' for '--max-rounds <N>'",
        ),
        (
            &[
                "migrate",
                "--socket",
                "/nonexistent",
                "--to",
                "unix:/x",
                "--bandwidth",
                "-1Gbit",
            ],
            "invalid value '-1Gbit' for '--bandwidth <RATE>'",
        ),
        (
            &[
                "readiness",
                "--socket",
                "/nonexistent",
                "--bandwidth",
                "-1Gbit",
            ],
            "invalid value '-1Gbit' for '--bandwidth <RATE>'",
        ),
        (
            &["watch", "--socket", "/nonexistent", "--count", "-2"],
            "invalid value '-2' for '--count <N>'",
        ),
    ] {
        let out = kvmscope().args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(said), "{args:?}: {err}");
    }
}

/// A workload that does not fit the VM (a range past its arena, a vCPU it
/// lacks) is the command line's error too, found against the VM before
/// anything runs.
#[test]
fn a_workload_that_does_not_fit_the_vm_exits_2_naming_it() {
    require_kvm!();
    for (workload, said) in [
        (
            "touch size=1G",
            "touch range 0x0..0x40000000 does not fit the 56 MiB arena",
        ),
        (
            "3: touch size=1M",
            "vCPU 3 in target '3' does not exist (the VM has 1)",
        ),
    ] {
        let out = kvmscope()
            .args(["run", "--memory", "64M", "--workload", workload])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{workload}: {err}");
        assert!(err.contains(said), "{workload}: {err}");
    }
}

#[test]
fn bad_memory_size_is_an_error() {
    let out = kvmscope()
        .args(["run", "--memory", "lots"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("'lots' is not a size"));
}

#[test]
fn empty_names_counts_and_patterns_are_refused_once_each_naming_the_flag() {
    for (args, code, said) in [
        (&["run", "--name", ""][..], 2, "a VM's name cannot be empty"),
        (
            &["run", "--vcpus", "0"][..],
            2,
            "a VM has from 1 to 256 vCPUs",
        ),
        (
            &["run", "--vcpus", "257"][..],
            2,
            "a VM has from 1 to 256 vCPUs",
        ),
        (
            &["run", "--vcpus", "-1"][..],
            2,
            "a VM has from 1 to 256 vCPUs",
        ),
        // A negative duration reaches its parser (clap took it for a flag).
        (
            &["run", "--boot-timeout", "-1s"][..],
            2,
            "'-1s' is not a time limit",
        ),
        (
            &["run", "--sample-interval", "-5ms"][..],
            2,
            "'-5ms' is not a sampler interval",
        ),
        (
            &["stats", "--socket", "/nonexistent", "--names", "pf_*,a-b"][..],
            2,
            "pattern \"a-b\": use stat names",
        ),
        (
            &["watch", "--socket", "/nonexistent", "--count", "0"][..],
            2,
            "at least 1 refresh",
        ),
        (
            &[
                "exporter",
                "--socket",
                "/nonexistent",
                "--stats",
                "",
                "--listen",
                "127.0.0.1:0",
            ][..],
            2,
            "pattern \"\": use stat names",
        ),
        (
            &["stats", "--socket", "/nonexistent", "--vcpu", "-1"][..],
            2,
            "'-1' is not a vCPU",
        ),
        (
            &[
                "readiness",
                "--socket",
                "/nonexistent",
                "--calc-time",
                "100m",
            ][..],
            2,
            "'100m' is more than 10m",
        ),
    ] {
        let out = kvmscope().args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
        assert_eq!(err.matches(said).count(), 1, "{args:?}: {err}");
    }
}

#[test]
fn unaligned_memory_is_an_error_naming_the_rule() {
    let out = kvmscope()
        .args(["run", "--memory", "33M"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("multiple of 2 MiB"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn default_run_boots_and_prints_a_json_summary() {
    require_kvm!();
    let out = kvmscope().args(["run", "--json"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let cmds = j["vcpus"][0]["commands"].as_array().unwrap();
    assert_eq!(cmds.len(), 5);
    assert!(cmds.iter().all(|c| c["status"] == "ok"), "{cmds:?}");
    assert!(
        j["mapped"]["after"]["bytes"].as_u64().unwrap()
            > j["mapped"]["before"]["bytes"].as_u64().unwrap()
    );
    assert!(j["backend"]["kind"].is_string());
}

#[test]
fn guest_panic_exits_nonzero_with_a_report() {
    require_kvm!();
    let out = kvmscope()
        .args(["run", "--memory", "32M", "--workload", "panic"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("vCPU 0: guest panic") && err.contains("rip="),
        "{err}"
    );
}

/// How many vCPU threads process `pid` has (0 once it is gone).
fn vcpu_threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |tasks| {
        tasks
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .filter(|c| c.starts_with("vcpu"))
            .count()
    })
}

/// A two-vCPU run with long workloads, stopped by `signal` once both vCPU
/// threads run: its exit status and its output.
fn stopped_by(signal: i32) -> (std::process::ExitStatus, std::process::Output) {
    let mut child = common::KillOnDrop::new(
        kvmscope()
            .args([
                "run",
                "--memory",
                "32M",
                "--vcpus",
                "2",
                "--workload",
                "all: dirty ws=1M rate=1000/s for=60s",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // Wait until the guest runs: its dirty command shows up in the stats only once
    // booted, so poll the process's threads for the vCPU threads instead.
    let pid = child.id();
    common::wait_for("vcpu threads", Duration::from_secs(10), || {
        (vcpu_threads(pid) == 2).then_some(())
    });
    // SAFETY: sending a signal to our own child.
    unsafe { libc::kill(pid as i32, signal) };
    let status = common::wait_for("kvmscope to exit", Duration::from_secs(10), || {
        child.try_wait().unwrap()
    });
    (status, child.wait_with_output().unwrap())
}

#[test]
fn sigterm_stops_the_vm_in_order() {
    require_kvm!();
    let (status, out) = stopped_by(libc::SIGTERM);
    assert!(status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("stopped by signal 15"), "{text}");
    assert!(text.contains("vcpu1: stopped"), "{text}");
}

/// SIGHUP (a closed terminal, a dropped ssh session) stops the VM in order
/// as SIGTERM does, as QEMU's; it killed the process outright before.
#[test]
fn sighup_stops_the_vm_in_order() {
    require_kvm!();
    let (status, out) = stopped_by(libc::SIGHUP);
    assert!(status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("stopped by signal 1"), "{text}");
}

/// A run whose summary nobody reads (standard output a full pipe) cannot
/// end its stop; a second stop signal ends it at once, saying so (before,
/// it stayed blocked for good, and signals did nothing).
#[test]
fn a_second_signal_ends_a_run_whose_summary_nobody_reads() {
    require_kvm!();
    // 2 x 256 results kept, about 150 bytes each in JSON: over a pipe's 64 KiB.
    let workload = format!("all: {}", vec!["exits count=1"; 300].join("; "));
    let mut child = common::KillOnDrop::new(
        kvmscope()
            .args([
                "run",
                "--memory",
                "32M",
                "--vcpus",
                "2",
                "--json",
                "--workload",
            ])
            .arg(&workload)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let pid = child.id();
    // The workloads done, the vCPU threads gone: the summary is being written.
    let vcpus = || vcpu_threads(pid);
    common::wait_for("vcpu threads", Duration::from_secs(10), || {
        (vcpus() == 2).then_some(())
    });
    common::wait_for("the workloads' end", Duration::from_secs(60), || {
        (vcpus() == 0).then_some(())
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        child.try_wait().unwrap().is_none(),
        "it blocks on its summary"
    );
    for _ in 0..2 {
        // SAFETY: sending a signal to our own child.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        std::thread::sleep(Duration::from_millis(100));
    }
    let status = common::wait_for("kvmscope to exit", Duration::from_secs(10), || {
        child.try_wait().unwrap()
    });
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{status:?}");
    let mut err = String::new();
    let out = child.wait_with_output().unwrap();
    err.push_str(&String::from_utf8_lossy(&out.stderr));
    assert!(err.contains("a second stop signal"), "{err}");
}

#[test]
fn sigint_stops_the_vm_in_order_with_status_0_as_documented() {
    require_kvm!();
    let (status, out) = stopped_by(libc::SIGINT);
    assert_eq!(
        status.code(),
        Some(0),
        "an orderly stop on a signal is a success (run --help, README): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("stopped by signal 2"), "{text}");
    assert!(
        text.contains("vcpu0: stopped") && text.contains("vcpu1: stopped"),
        "{text}"
    );
}

#[test]
fn metrics_addr_alone_keeps_the_vm_up_after_its_workload_until_sigterm() {
    require_kvm!();
    let port = common::free_port();
    let mut child = common::KillOnDrop::new(
        kvmscope()
            .args(["run", "--memory", "32M", "--sample-interval", "2ms"])
            .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
            .args(["--workload", "exits ports=5 mmio=0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // Port writes: READY, PHASE, 5 to the exit-test port, then DONE, the last
    // before the vCPU runs out of work (where a run without serving ends).
    let ticks = common::wait_for("the workload's last exit", Duration::from_secs(20), || {
        let page = common::scrape(port)?;
        let writes = common::metric(&page, "kvmscope_exits_total", &["reason=\"io_out\""])?;
        let ticks = common::metric(&page, "kvmscope_sampler_ticks_total", &[])?;
        (writes >= 8.0).then_some(ticks)
    });
    // Still serving well after the workload ended: 100 more sampler ticks.
    common::wait_for("100 more ticks", Duration::from_secs(20), || {
        let page = common::scrape(port)?;
        (common::metric(&page, "kvmscope_sampler_ticks_total", &[])? >= ticks + 100.0).then_some(())
    });
    assert!(
        child.try_wait().unwrap().is_none(),
        "the VMM ended while serving"
    );
    // SAFETY: sending a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = common::wait_for("kvmscope to exit", Duration::from_secs(10), || {
        child.try_wait().unwrap()
    });
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(", metrics http://127.0.0.1:{port}/metrics;")),
        "where it serves: {err}"
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("stopped by signal 15"), "{text}");
    assert!(
        text.contains("exits ports=5 mmio=0"),
        "the workload ran: {text}"
    );
}

#[test]
fn a_guest_that_never_checks_in_exits_5_naming_the_deadline_and_registers() {
    require_kvm!();
    let entry = kvmscope::abi::IMAGE_BASE;
    let image = common::elf::ElfImage::exec(entry, &common::elf::SPIN).bytes();
    let dir = common::test_dir("boot-timeout");
    let path = dir.join("spin.elf");
    std::fs::write(&path, image).unwrap();
    let mut child = common::KillOnDrop::new(
        kvmscope()
            .args(["run", "--memory", "32M", "--boot-timeout", "1s", "--guest"])
            .arg(&path)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let status = common::wait_for(
        "kvmscope to give up on the guest",
        Duration::from_secs(30),
        || child.try_wait().unwrap(),
    );
    let out = child.wait_with_output().unwrap();
    std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(status.code(), Some(5), "{err}");
    assert!(
        err.contains("the guest did not check in within 1 s"),
        "{err}"
    );
    assert!(
        err.contains(&format!("vCPU 0 registers: rip={entry:#x} rsp=")),
        "{err}"
    );
    assert!(err.contains("cr3=0x3000"), "{err}");
}

#[test]
fn memory_over_the_maximum_is_an_error_naming_the_maximum() {
    let out = kvmscope()
        .args(["run", "--memory", "64G"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("over the maximum of 65534 MiB"), "{err}");
}

#[test]
fn a_fifo_as_the_guest_is_refused_at_once() {
    require_kvm!();
    let dir = common::test_dir("guest-fifo");
    let fifo = dir.join("guest.elf");
    let path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: `path` is a NUL-terminated string that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
    let mut child = common::KillOnDrop::new(
        kvmscope()
            .args(["run", "--memory", "32M", "--guest"])
            .arg(&fifo)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // Bounded: before the fix, opening the FIFO waited for a writer for ever.
    let status = common::wait_for(
        "kvmscope to refuse the FIFO",
        Duration::from_secs(20),
        || child.try_wait().unwrap(),
    );
    let out = child.wait_with_output().unwrap();
    std::fs::remove_dir_all(fifo.parent().unwrap()).unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("is not a regular file"), "{err}");
}

#[test]
fn incoming_idle_timeout_needs_incoming_even_beside_a_workload() {
    // clap's own check let it through beside --workload (which --incoming
    // conflicts with), and the run ignored it.
    for extra in [&["--workload", "touch size=1M"][..], &[]] {
        let out = kvmscope()
            .args(["run", "--memory", "32M", "--incoming-idle-timeout", "5s"])
            .args(extra)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {err}");
        assert!(err.contains("--incoming"), "{err}");
    }
}

#[test]
fn readiness_every_needs_a_socket_and_dirty_logging_and_a_window_shorter_than_it() {
    let run = |args: &[&str]| {
        let out = kvmscope().arg("run").args(args).output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = run(&["--readiness-every", "60s", "--socket", "/tmp/x.sock"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("--dirty-log"), "{err}");
    let (code, err) = run(&["--readiness-every", "60s", "--dirty-log", "ring"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("--socket"), "{err}");
    let (code, err) = run(&[
        "--readiness-every",
        "1s",
        "--readiness-window",
        "2s",
        "--dirty-log",
        "bitmap",
        "--socket",
        "/tmp/kvmscope-never.sock",
    ]);
    assert_eq!(
        code,
        Some(2),
        "flags that disagree: the command line is wrong"
    );
    assert!(
        err.contains("--readiness-window (2s) must be shorter than --readiness-every (1s)"),
        "{err}"
    );
    // Given no value, the period is 90 s: last, or with another option
    // after it (not taken for its value).
    let rest = [
        "--dirty-log",
        "ring",
        "--socket",
        "/tmp/kvmscope-never.sock",
        "--readiness-window",
        "120s",
    ];
    for at_end in [true, false] {
        let mut args = rest.to_vec();
        args.insert(if at_end { args.len() } else { 0 }, "--readiness-every");
        let (code, err) = run(&args);
        assert_eq!(code, Some(2));
        assert!(
            err.contains("--readiness-window (120s) must be shorter than --readiness-every (90s)"),
            "{err}"
        );
    }
}

/// A run stopped mid-command says which command it cut short and how many
/// queued ones never started, in text and in JSON (before: the running
/// command was missing from the summary without a word).
#[test]
fn a_run_stopped_mid_command_names_the_command_cut_short_and_those_not_started() {
    require_kvm!();
    let dir = common::test_dir("run-cut");
    let socket = dir.join("vm.sock");
    // A guest command, and the VMM's own `wait` (left out of the summary
    // before 2026-12-08).
    for (json, first) in [
        (false, "dirty ws=1M rate=1000/s for=60s"),
        (true, "dirty ws=1M rate=1000/s for=60s"),
        (false, "wait for=60s"),
        (true, "wait for=60s"),
    ] {
        let mut cmd = common::served_run(&socket);
        cmd.args([
            "--workload",
            &format!("{first}; touch size=1M; touch size=2M"),
        ]);
        if json {
            cmd.arg("--json");
        }
        let child = common::KillOnDrop::new(
            cmd.stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        let mut c =
            kvmscope::client::Client::connect_when_ready(&socket, Duration::from_secs(20), || {
                Ok(())
            })
            .unwrap();
        common::wait_for("the first command to run", Duration::from_secs(20), || {
            let (g, _) = c.execute("query-guest", serde_json::json!({})).unwrap();
            (g[0]["state"] != "booting" && g[0]["queued"] == 2).then_some(())
        });
        c.execute("quit", serde_json::json!({})).unwrap();
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        if json {
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            let vcpu = &v["vcpus"][0];
            assert_eq!(vcpu["interrupted"]["seq"], 1, "{v}");
            assert!(
                vcpu["interrupted"]["command"]
                    .as_str()
                    .unwrap()
                    .starts_with(&first[..4]),
                "{v}"
            );
            assert_eq!(vcpu["not_started"], 2, "{v}");
            assert_eq!(v["quit"], true, "{v}");
        } else {
            assert!(
                text.lines().any(|l| l.contains("#1")
                    && l.contains(&first[..4])
                    && l.ends_with("interrupted: the run stopped")),
                "{text}"
            );
            assert!(text.contains("2 queued command(s) not started"), "{text}");
            assert!(text.contains("stopped by quit"), "{text}");
        }
    }
}

/// `query-readiness`'s cost per fault from a served `kvmscope run` with
/// `args` (a writer on vCPU 0, one short window), and its stderr.
fn fault_cost_served(test: &str, args: &[&str]) -> (f64, String) {
    let dir = common::test_dir(test);
    let socket = dir.join("ctl.sock");
    let mut child = common::KillOnDrop::new(
        kvmscope()
            .args(["run", "--memory", "64M", "--dirty-log", "ring", "--socket"])
            .arg(&socket)
            .args(args)
            .args(["--workload", "dirty ws=16M rate=max for=30s"])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut c =
        kvmscope::client::Client::connect_when_ready(&socket, Duration::from_secs(20), || {
            match child.try_wait().unwrap() {
                None => Ok(()),
                Some(_) => Err(kvmscope::client::Error::Closed),
            }
        })
        .expect("the VMM serves");
    // The calibration, where there is one, takes about 0.25 s from the start
    // (more on a busy host: building its VM may wait seconds): asked again
    // until the cost is no longer the default, 20 s at most.
    let asked = std::time::Instant::now();
    let cost = loop {
        let (r, _) = c
            .execute("query-readiness", serde_json::json!({"calc-time": 0.2}))
            .unwrap();
        let cost = r["guest_stall"]["fault_cost_us"].as_f64().unwrap();
        if (cost - 2.6).abs() > 1e-9 || asked.elapsed() > Duration::from_secs(20) {
            break cost;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    c.execute("quit", serde_json::json!({})).unwrap();
    let out = child.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    // Served, it says where once it is up (and nothing else until it stops).
    let served = format!(
        "kvmscope run: serving VM \"ctl\" (1 vCPU(s), 64 MiB): control socket {} (QMP); it runs until `quit` or SIGINT/SIGTERM/SIGHUP",
        socket.display()
    );
    assert!(log.lines().any(|l| l == served), "{log}");
    (cost, log)
}

#[test]
fn a_served_vmm_measures_the_hosts_cost_per_fault_unless_given_one() {
    require_kvm!();
    let (cost, log) = fault_cost_served("fault-cost-given", &["--fault-cost", "7.5us"]);
    assert!((cost - 7.5).abs() < 1e-9, "{cost}");
    assert!(!log.contains("per page written on this host"), "{log}");
    let (cost, log) = fault_cost_served("fault-cost-measured", &[]);
    let line = log
        .lines()
        .find(|l| l.contains("dirty logging costs the guest"))
        .unwrap_or_else(|| panic!("no calibration in the log: {log}"));
    let said: f64 = common::number_after(line, "guest ").unwrap_or_else(|| panic!("{line}"));
    // The log rounds to 0.1 us.
    assert!((cost - said).abs() <= 0.05 + 1e-9, "{cost} against {line}");
}

/// `--version` names the commit the binary was built from, so that a figure
/// recorded with it (experiments' meta.json) says which code made it.
#[test]
fn version_names_the_commit_it_was_built_from() {
    let out = kvmscope().arg("--version").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let commit = text
        .trim()
        .strip_prefix(&format!("kvmscope {} (commit ", env!("CARGO_PKG_VERSION")))
        .and_then(|rest| rest.strip_suffix(')'))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        commit == "unknown"
            || (commit.len() == 12 && commit.bytes().all(|b| b.is_ascii_hexdigit())),
        "{text}"
    );
}

/// A reader of the summary that is gone (`| head`, a parent that died) does
/// not make the run fail: it ends with the status the run earned, without a
/// panic (it died in `println!` with status 101).
#[test]
fn a_summary_nobody_reads_leaves_the_exit_status_as_the_run_made_it() {
    require_kvm!();
    for json in [false, true] {
        let mut cmd = kvmscope();
        cmd.args(["run", "--memory", "16M", "--workload", "touch size=4K"]);
        if json {
            cmd.arg("--json");
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "json {json}: {err}");
        assert!(!err.contains("panicked"), "json {json}: {err}");
    }
    // Nobody reads its messages either: a run that ends with one (here a
    // guest that panics, status 2) ends with the status, not a panic in
    // `eprintln!` (101). (A boot deadline of 1 us, used before, is one a
    // guest can meet: it is time on a CPU, and the vCPU may check in before
    // the main loop first looks; 2 runs in 14 exited 0.)
    let mut child = kvmscope()
        .args(["run", "--memory", "16M", "--workload", "panic"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    drop(child.stderr.take());
    assert_eq!(child.wait().unwrap().code(), Some(2));
}
