//! `kvmscope exporter` against real VMMs (child processes) in a socket
//! directory: VMs found, labelled and read through their stats fds; VMs that
//! start later, die or migrate away; VMMs that hang or speak garbage.

mod common;

use std::io::Write;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use kvmscope::client::Client;
use kvmscope::exporter::{Exporter, ExporterConfig};
use serde_json::json;

const LIMIT: Duration = Duration::from_secs(30);

/// A `kvmscope run --socket` child, killed on drop.
struct Vmm {
    child: common::KillOnDrop,
    socket: PathBuf,
}

impl Vmm {
    fn start(socket: &Path, extra: &[&str]) -> Vmm {
        let child = Command::new(env!("CARGO_BIN_EXE_kvmscope"))
            .args([
                "run",
                "--memory",
                "64M",
                "--sample-interval",
                "off",
                "--socket",
            ])
            .arg(socket)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let vmm = Vmm {
            child: common::KillOnDrop::new(child),
            socket: socket.to_path_buf(),
        };
        common::wait_for("the VMM's socket", LIMIT, || {
            Client::connect(socket).ok().map(|_| ())
        });
        vmm
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

fn exporter(dir: &Path, timeout: Duration) -> Exporter {
    common::exporter::over(dir, timeout)
}

fn page(e: &Exporter) -> String {
    common::exporter::page(e)
}

/// The page once `check` accepts it.
fn page_when(e: &Exporter, what: &str, check: impl Fn(&str) -> bool) -> String {
    common::wait_for(what, LIMIT, || Some(page(e)).filter(|p| check(p)))
}

fn up(page: &str, vm: &str, pid: u32) -> bool {
    common::metric(
        page,
        "kvmscope_exporter_vm_up",
        &[&format!("vm=\"{vm}\",pid=\"{pid}\"")],
    ) == Some(1.0)
}

#[test]
fn vms_in_the_directory_are_on_the_page_with_their_labels_and_kernel_values() {
    require_kvm!();
    let dir = common::test_dir("exp-three");
    let a = Vmm::start(&dir.join("a.sock"), &["--vcpus", "2"]);
    let b = Vmm::start(&dir.join("b.sock"), &["--name", "web-01"]);
    let e = exporter(&dir, Duration::from_secs(2));
    page_when(&e, "a and b on the page", |p| {
        up(p, "a", a.pid()) && up(p, "web-01", b.pid())
    });
    // A VMM started later is picked up.
    let c = Vmm::start(&dir.join("c.sock"), &[]);
    let page = page_when(&e, "c on the page", |p| up(p, "c", c.pid()));
    common::check_with_promtool(&page);
    // Values are the kernel's: the same as the VMM reads for query-stats
    // (the guests are idle, so nothing moves in between).
    let mut client = Client::connect(&a.socket).unwrap();
    let (stats, _) = client
        .execute("query-stats", json!({"target": "vcpu", "names": ["exits"]}))
        .unwrap();
    let page = self::page(&e);
    for (i, vcpu) in stats.as_array().unwrap().iter().enumerate() {
        let want = vcpu["stats"][0]["value"].as_f64().unwrap();
        let labels = format!(
            "vm=\"a\",pid=\"{}\",socket=\"{}\",vcpu=\"{i}\"",
            a.pid(),
            a.socket.display()
        );
        let got = common::metric(&page, "kvmscope_kvm_vcpu_exits_total", &[&labels]);
        assert_eq!(got, Some(want), "vCPU {i}:\n{page}");
    }
    assert_eq!(
        common::metric(
            &page,
            "kvmscope_exporter_guest_memory_bytes",
            &["vm=\"web-01\""]
        ),
        Some((64u64 << 20) as f64)
    );
    assert!(
        common::metric(&page, "kvmscope_exporter_mapped_bytes", &["vm=\"c\""])
            .is_some_and(|v| v > 0.0)
    );
    assert!(common::metric(&page, "kvmscope_exporter_scrape_duration_seconds", &[]).is_some());
    assert_eq!(e.vms(), 3);
    // The VMMs' own stats files (sealed memfds) are read through read-only
    // mappings, not with a pread each: every file a VMM maps to write, the
    // exporter (this process) maps too.
    for v in [&a, &b, &c] {
        let files = own_stats_mappings(&v.pid().to_string());
        assert!(!files.is_empty(), "VMM {} maps its stats files", v.pid());
        let mapped = own_stats_mappings("self");
        assert!(
            files.iter().all(|(inode, _)| mapped.contains_key(inode)),
            "the exporter maps {mapped:?}, VMM {} has {files:?}",
            v.pid()
        );
        assert!(
            mapped.values().all(|perms| perms.starts_with("r--s")),
            "read-only and shared: {mapped:?}"
        );
    }
}

#[test]
fn the_vmms_exit_counters_are_summed_per_vm_and_shown_per_vcpu_only_when_asked() {
    require_kvm!();
    let dir = common::test_dir("exp-exits");
    // Port-out exits on both vCPUs, counted by the VMM.
    let a = Vmm::start(
        &dir.join("a.sock"),
        &["--vcpus", "2", "--workload", "all: exits count=100"],
    );
    let per_vcpu = exporter(&dir, Duration::from_secs(2));
    let summed = common::exporter::start(ExporterConfig {
        vcpu_exits: false,
        ..common::exporter::config(&dir, Duration::from_secs(2))
    });
    let vm = |p: &str| common::metric(p, "kvmscope_vmm_vm_exits_io_out_total", &["vm=\"a\""]);
    let vcpu = |p: &str, i: u32| {
        common::metric(
            p,
            "kvmscope_vmm_vcpu_exits_io_out_total",
            &["vm=\"a\"", &format!("vcpu=\"{i}\"")],
        )
    };
    // One page, one instant: the VM's line is its vCPUs' lines added up.
    let page = page_when(&per_vcpu, "a's exits per vCPU", |p| {
        up(p, "a", a.pid()) && vcpu(p, 1).is_some_and(|n| n > 0.0)
    });
    common::check_with_promtool(&page);
    let (v0, v1) = (vcpu(&page, 0).unwrap(), vcpu(&page, 1).unwrap());
    assert_eq!(vm(&page), Some(v0 + v1), "{page}");
    // By default: the sum per VM, no exit counter per vCPU, the vCPUs'
    // other own stats still there.
    let page = page_when(&summed, "a on the default page", |p| {
        up(p, "a", a.pid()) && vm(p).is_some_and(|n| n >= v0 + v1)
    });
    common::check_with_promtool(&page);
    assert!(
        page.contains("# HELP kvmscope_vmm_vm_exits_io_out_total sum over the VM's vCPUs of"),
        "{page}"
    );
    // The VMM's own families say what they mean and in which unit.
    assert!(
        page.contains(
            "# HELP kvmscope_vmm_vcpu_guest_stall_seconds_total kvmscope VMM's own vCPU stat \
             guest_stall_ns (Cumulative, in seconds): vCPU time this vCPU's guest lost to dirty tracking."
        ),
        "{page}"
    );
    assert!(
        !page.contains("kvmscope_vmm_vcpu_exits_"),
        "no exit counter per vCPU:\n{page}"
    );
    assert!(common::metric(
        &page,
        "kvmscope_vmm_vcpu_guest_stall_seconds_total",
        &["vm=\"a\"", "vcpu=\"1\""]
    )
    .is_some());
    // The guest's progress as a counter only: its rate is PromQL's to take.
    assert!(common::metric(
        &page,
        "kvmscope_vmm_vcpu_guest_progress_total",
        &["vm=\"a\"", "vcpu=\"1\""]
    )
    .is_some());
    assert!(
        !page.contains("guest_progress_per_second"),
        "no rate beside its counter:\n{page}"
    );
}

/// One VMM is one VM on the page however its socket is named: in the
/// directory, named again with `..` in its path, and through a second link.
#[test]
fn a_socket_named_several_ways_is_one_vm_on_the_page() {
    require_kvm!();
    let dir = common::test_dir("exp-spelled");
    let a = Vmm::start(&dir.join("a.sock"), &[]);
    let name = dir.file_name().unwrap();
    let other = common::test_dir("exp-spelled-link");
    std::fs::hard_link(dir.join("a.sock"), other.join("link.sock")).unwrap();
    let e = common::exporter::start(ExporterConfig {
        sockets: vec![
            dir.join("..").join(name).join("a.sock"),
            other.join("link.sock"),
        ],
        ..common::exporter::config(&dir, Duration::from_secs(2))
    });
    page_when(&e, "a on the page", |p| up(p, "a", a.pid()));
    // Give every spelling a rescan or two to be tried.
    std::thread::sleep(Duration::from_millis(1500));
    let page = page(&e);
    let lines: Vec<&str> = page
        .lines()
        .filter(|l| l.starts_with("kvmscope_exporter_vm_up{"))
        .collect();
    assert_eq!(lines.len(), 1, "{lines:?}");
    common::check_with_promtool(&page);
}

/// A `--stats` pattern that matches no stat (a typo) shows no line, so the
/// exporter says so, once, when the first VM is on its page.
#[test]
fn a_stats_pattern_that_matches_nothing_is_said_once() {
    require_kvm!();
    let dir = common::test_dir("exp-typo");
    let a = Vmm::start(&dir.join("a.sock"), &[]);
    let port = common::free_port();
    let mut child = common::KillOnDrop::new(
        Command::new(env!("CARGO_BIN_EXE_kvmscope"))
            .args(["exporter", "--listen", &format!("127.0.0.1:{port}")])
            .arg("--vm-sockets")
            .arg(&dir)
            .args(["--stats", "pages_*,pages_4kk,exits"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    common::wait_for("a on the page", LIMIT, || {
        common::scrape(port).filter(|p| up(p, "a", a.pid()))
    });
    common::scrape(port).unwrap();
    // SAFETY: sending a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = common::wait_for("the exporter to exit", LIMIT, || child.try_wait().unwrap());
    assert!(status.success(), "{status}");
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert_eq!(
        err.matches("--stats pages_4kk: no stat").count(),
        1,
        "{err}"
    );
    assert!(
        !err.contains("--stats exits:") && !err.contains("--stats pages_*:"),
        "{err}"
    );
}

/// Figures that only mean something once their thing exists are absent
/// before, not zeros: a dirty limit (a line of 0 would read as a vCPU that
/// may not write) and a migration's figures (its status is always there).
#[test]
fn a_dirty_limit_and_a_migrations_figures_are_on_the_page_only_once_they_exist() {
    require_kvm!();
    let dir = common::test_dir("exp-absent");
    let a = Vmm::start(
        &dir.join("a.sock"),
        &["--vcpus", "2", "--dirty-log", "ring"],
    );
    let e = exporter(&dir, Duration::from_secs(2));
    let limit = |p: &str, i: u32| {
        common::metric(
            p,
            "kvmscope_vmm_vcpu_dirty_limit_bytes_per_second",
            &["vm=\"a\"", &format!("vcpu=\"{i}\"")],
        )
    };
    let vm = |p: &str, name: &str| common::metric(p, name, &["vm=\"a\""]);
    let page = page_when(&e, "a on the page", |p| up(p, "a", a.pid()));
    assert_eq!(
        vm(&page, "kvmscope_vmm_vm_migration_status"),
        Some(0.0),
        "{page}"
    );
    assert!(
        !page.contains("kvmscope_vmm_vm_migration_transferred_bytes")
            && !page.contains("kvmscope_vmm_vcpu_dirty_limit"),
        "no migration, no limit, no line:\n{page}"
    );
    let mut c = Client::connect(&a.socket).unwrap();
    c.execute(
        "set-vcpu-dirty-limit",
        json!({"cpu-index": 1, "dirty-rate": 8}),
    )
    .unwrap();
    let page = page_when(&e, "vCPU 1's limit", |p| limit(p, 1).is_some());
    common::check_with_promtool(&page);
    assert_eq!(limit(&page, 1), Some(8.0 * 1024.0 * 1024.0), "{page}");
    assert_eq!(limit(&page, 0), None, "vCPU 0 has no limit:\n{page}");
    c.execute("cancel-vcpu-dirty-limit", json!({})).unwrap();
    page_when(&e, "no limit line once it is lifted", |p| {
        !p.contains("kvmscope_vmm_vcpu_dirty_limit")
    });
    // A migration to nowhere fails, and its figures are there from then on.
    c.execute("migrate", json!({"uri": "unix:/nonexistent/kvmscope-test"}))
        .unwrap();
    let page = page_when(&e, "a's failed migration", |p| {
        vm(p, "kvmscope_vmm_vm_migration_status") == Some(5.0)
    });
    common::check_with_promtool(&page);
    assert_eq!(
        vm(&page, "kvmscope_vmm_vm_migration_transferred_bytes"),
        Some(0.0),
        "{page}"
    );
    assert_eq!(
        vm(&page, "kvmscope_vmm_vm_migration_total_bytes"),
        Some(64.0 * 1024.0 * 1024.0),
        "{page}"
    );
}

/// The VMM stats files (`/memfd:kvmscope-stats`) process `pid` has mapped:
/// inode and permissions.
fn own_stats_mappings(pid: &str) -> std::collections::BTreeMap<u64, String> {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap()
        .lines()
        .filter(|l| l.contains("/memfd:kvmscope-stats"))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((f.get(4)?.parse().ok()?, f.get(1)?.to_string()))
        })
        .collect()
}

#[test]
fn a_vmm_that_measures_readiness_shows_its_prediction_and_one_that_does_not_shows_none() {
    require_kvm!();
    let dir = common::test_dir("exp-ready");
    let measures = Vmm::start(
        &dir.join("fresh.sock"),
        &[
            "--dirty-log",
            "bitmap",
            "--readiness-every",
            "2s",
            "--readiness-window",
            "300ms",
            "--workload",
            "touch size=8M; dirty ws=4M rate=2000/s for=120s",
        ],
    );
    let silent = Vmm::start(&dir.join("silent.sock"), &["--vcpus", "2"]);
    let e = exporter(&dir, Duration::from_secs(2));
    // Measured at least twice with the same verdict (a steady writer): the
    // streak says the verdict is not the moment's.
    let fresh = |p: &str| {
        common::metric(
            p,
            "kvmscope_vmm_vm_prediction_verdict_streak",
            &["vm=\"fresh\""],
        )
        .is_some_and(|n| n >= 2.0)
    };
    let page = page_when(&e, "the fresh VM's readiness figures, twice", |p| {
        fresh(p) && up(p, "silent", silent.pid())
    });
    common::check_with_promtool(&page);
    let fresh_line = |name: &str| common::metric(&page, name, &["vm=\"fresh\""]);
    assert_eq!(
        fresh_line("kvmscope_vmm_vm_prediction_converges"),
        Some(1.0),
        "{page}"
    );
    assert!(fresh_line("kvmscope_vmm_vm_prediction_transferred_bytes").is_some_and(|b| b > 0.0));
    assert!(fresh_line("kvmscope_vmm_vm_readiness_at_seconds").is_some_and(|at| at > 0.0));
    let rate = fresh_line("kvmscope_vmm_vm_readiness_dirty_bytes_per_second").unwrap();
    assert!(rate > 1_000_000.0, "about 2000 pages/s: {rate} B/s");
    // The VMM that never measured: its own counters, no readiness line at all.
    let silent_lines: Vec<&str> = page
        .lines()
        .filter(|l| l.starts_with("kvmscope_vmm_vm_") && l.contains("vm=\"silent\""))
        .collect();
    assert!(
        silent_lines
            .iter()
            .any(|l| l.starts_with("kvmscope_vmm_vm_published_at_seconds")),
        "{page}"
    );
    assert!(
        !silent_lines
            .iter()
            .any(|l| l.contains("_readiness_") || l.contains("_prediction_")),
        "{silent_lines:?}"
    );
    // Its vCPUs' exit counters, from its own stats fds.
    assert!(common::metric(
        &page,
        "kvmscope_vmm_vcpu_exits_io_out_total",
        &["vm=\"silent\"", "vcpu=\"1\""]
    )
    .is_some());
    drop(measures);
}

#[test]
fn a_killed_vmm_leaves_the_page_its_fds_are_closed_and_its_socket_shows_down_until_removed() {
    require_kvm!();
    let dir = common::test_dir("exp-kill");
    let a = Vmm::start(&dir.join("a.sock"), &[]);
    let mut b = Vmm::start(&dir.join("b.sock"), &["--vcpus", "2"]);
    let e = exporter(&dir, Duration::from_secs(2));
    page_when(&e, "both on the page", |p| {
        up(p, "a", a.pid()) && up(p, "b", b.pid())
    });
    let before = common::open_fds();
    // SIGKILL: the socket file stays behind, only the connection tells.
    b.child.kill().unwrap();
    b.child.wait().unwrap();
    page_when(&e, "b gone from the page", |p| {
        !p.contains("vm=\"b\"") && up(p, "a", a.pid())
    });
    // b's VM fd, two vCPU fds and its control connection are closed.
    let after = common::wait_for("b's fds closed", LIMIT, || {
        let n = common::open_fds();
        (n + 4 <= before).then_some(n)
    });
    assert!(after + 4 <= before, "{before} -> {after}");
    // Its socket file, which nothing listens on, is a VM that died: down
    // on the page until the file is removed.
    let dead = format!("socket=\"{}\"}} 0", dir.join("b.sock").display());
    page_when(&e, "b's socket down", |p| p.contains(&dead));
    std::fs::remove_file(dir.join("b.sock")).unwrap();
    page_when(&e, "b's socket off the page", |p| {
        !p.contains("b.sock") && up(p, "a", a.pid())
    });
}

#[test]
fn a_vmm_that_never_answers_or_speaks_garbage_is_skipped_without_delaying_the_page() {
    require_kvm!();
    let dir = common::test_dir("exp-bad");
    let a = Vmm::start(&dir.join("a.sock"), &[]);
    // Accepts (the kernel's backlog) and never says a word.
    let _silent = UnixListener::bind(dir.join("silent.sock")).unwrap();
    // Answers every connection with a line that is not a greeting.
    let garbage = UnixListener::bind(dir.join("garbage.sock")).unwrap();
    std::thread::spawn(move || {
        for mut s in garbage.incoming().flatten() {
            let _ = s.write_all(b"220 smtp.example.com ESMTP\n");
        }
    });
    // The attach timeout is one deadline for the whole attach: a debug-build
    // VMM on a loaded two-core machine can take over half a second for it.
    let e = exporter(&dir, Duration::from_secs(2));
    // The page is served all along; the fakes show as down once their
    // attach timed out or failed.
    let page = page_when(&e, "a up, the fakes down", |p| {
        up(p, "a", a.pid()) && p.contains("silent.sock\"} 0") && p.contains("garbage.sock\"} 0")
    });
    common::check_with_promtool(&page);
}

#[test]
fn a_vm_that_migrates_between_vmms_in_the_directory_stays_on_the_page_under_its_new_pid() {
    require_kvm!();
    let _serial = common::migration::serial();
    let dir = common::test_dir("exp-mig");
    let elsewhere_dir = common::test_dir("exp-mig-in");
    let elsewhere = elsewhere_dir.join("in.sock");
    let src = Vmm::start(&dir.join("src.sock"), &["--name", "db-1"]);
    let e = exporter(&dir, Duration::from_secs(2));
    page_when(&e, "the source on the page", |p| up(p, "db-1", src.pid()));
    let uri = format!("unix:{}", elsewhere.display());
    let dst = {
        let child = Command::new(env!("CARGO_BIN_EXE_kvmscope"))
            .args([
                "run",
                "--sample-interval",
                "off",
                "--name",
                "db-1",
                "--memory",
                "64M",
                "--vcpus",
                "1",
                "--incoming",
                &uri,
                "--socket",
            ])
            .arg(dir.join("dst.sock"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Vmm {
            child: common::KillOnDrop::new(child),
            socket: dir.join("dst.sock"),
        }
    };
    common::wait_for("the destination listening", LIMIT, || {
        common::unix_listening(&elsewhere).then_some(())
    });
    // Built ahead, the destination is on the page before its guest comes:
    // its run state says the guest is still arriving (3, inmigrate), so
    // that a query can leave its RAM out where the source's counts it.
    let run_state = |p: &str, pid: u32| {
        common::metric(
            p,
            "kvmscope_vmm_vm_run_state",
            &[&format!("vm=\"db-1\",pid=\"{pid}\"")],
        )
    };
    page_when(&e, "the waiting destination, inmigrate", |p| {
        run_state(p, dst.pid()) == Some(3.0) && run_state(p, src.pid()) == Some(1.0)
    });
    let mut c = Client::connect(&src.socket).unwrap();
    c.execute("migrate", json!({"uri": uri})).unwrap();
    let page = page_when(&e, "db-1 under the destination's pid only, running", |p| {
        up(p, "db-1", dst.pid())
            && !p.contains(&format!("pid=\"{}\"", src.pid()))
            && run_state(p, dst.pid()) == Some(1.0)
    });
    common::check_with_promtool(&page);
    let _ = Client::connect(&dst.socket).and_then(|mut d| d.execute("quit", json!({})));
}

/// A paused QEMU (no guest code needed for its stats) with a QMP monitor.
fn qemu(monitor: &Path) -> Option<common::KillOnDrop> {
    let spawned = Command::new("qemu-system-x86_64")
        .args([
            "-enable-kvm",
            "-machine",
            "q35",
            "-nodefaults",
            "-display",
            "none",
        ])
        .args(["-smp", "2", "-m", "64", "-name", "qvm-test", "-S", "-qmp"])
        .arg(format!("unix:{},server=on,wait=off", monitor.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    match spawned {
        Ok(c) => Some(common::KillOnDrop::new(c)),
        Err(e) if std::env::var("KVMSCOPE_REQUIRE_KVM").as_deref() == Ok("1") => {
            panic!("qemu-system-x86_64 is required in CI: {e}")
        }
        Err(e) => {
            eprintln!("skipping: no qemu-system-x86_64 ({e})");
            None
        }
    }
}

#[test]
fn a_qemu_vm_read_over_qmp_shares_the_families_of_the_fd_read_vms() {
    require_kvm!();
    let dir = common::test_dir("exp-qemu");
    let monitor_dir = common::test_dir("exp-qemu-mon");
    let monitor = monitor_dir.join("qmp.sock");
    let Some(mut q) = qemu(&monitor) else {
        return;
    };
    common::wait_for("QEMU's monitor", LIMIT, || {
        common::unix_listening(&monitor).then_some(())
    });
    let a = Vmm::start(&dir.join("a.sock"), &[]);
    let e = common::exporter::start(ExporterConfig {
        // The second is a kvmscope VMM's socket, given as a QEMU monitor by
        // mistake: down, never read as a QEMU.
        qmp_sockets: vec![monitor.clone(), dir.join("a.sock")],
        qmp_interval: Duration::from_millis(200),
        qmp_vcpus: true,
        vcpu_exits: false,
        ..common::exporter::config(&dir, Duration::from_secs(2))
    });
    let qvm = format!("vm=\"qvm-test\",pid=\"{}\"", q.id());
    let page = page_when(&e, "both VMs on the page", |p| {
        up(p, "a", a.pid())
            && common::metric(p, "kvmscope_exporter_qemu_up", &[&qvm]) == Some(1.0)
            && p.contains("qom_path=")
    });
    // One family holds both providers' VMs (promtool refuses a family split up).
    common::check_with_promtool(&page);
    assert!(
        common::metric(&page, "kvmscope_kvm_vm_pages_4k", &[&qvm]).is_some(),
        "{page}"
    );
    assert!(common::metric(&page, "kvmscope_kvm_vm_pages_4k", &["vm=\"a\""]).is_some());
    // The mapped-pages estimate for the QEMU VM too, from the same stats.
    let pages = |size| common::metric(&page, &format!("kvmscope_kvm_vm_pages_{size}"), &[&qvm]);
    let mapped = pages("4k").unwrap() * 4096.0
        + pages("2m").unwrap_or(0.0) * f64::from(2u32 << 20)
        + pages("1g").unwrap_or(0.0) * f64::from(1u32 << 30);
    assert_eq!(
        common::metric(&page, "kvmscope_exporter_mapped_bytes", &[&qvm]),
        Some(mapped),
        "{page}"
    );
    let vcpus = common::metric(
        &page,
        "kvmscope_exporter_qemu_info",
        &[&qvm, "vcpus_read=\"2\""],
    );
    assert_eq!(vcpus, Some(1.0), "{page}");
    // Each vCPU under its own index, as `query-cpus-fast` gives it (QEMU 7.2
    // lists a query-stats reply's vCPUs last first): vCPU 0 is `device[0]`
    // on this machine, vCPU 1 a later device.
    let labelled: Vec<(&str, &str)> = page
        .lines()
        .filter(|l| l.contains(&qvm) && l.contains("qom_path="))
        .map(|l| {
            let label = |name: &str| {
                l.split(&format!("{name}=\""))
                    .nth(1)
                    .and_then(|v| v.split('"').next())
                    .unwrap_or_default()
            };
            (label("vcpu"), label("qom_path"))
        })
        .collect();
    assert!(!labelled.is_empty(), "{page}");
    let device = |path: &str| -> u32 {
        path.trim_start_matches("/machine/unattached/device[")
            .trim_end_matches(']')
            .parse()
            .unwrap_or_else(|_| panic!("{path}"))
    };
    for (vcpu, path) in &labelled {
        match *vcpu {
            "0" => assert_eq!(device(path), 0, "{page}"),
            "1" => assert!(device(path) > 0, "{page}"),
            other => panic!("vcpu {other:?} of a 2-vCPU QEMU: {page}"),
        }
    }
    // The version from QEMU's greeting, and whether its vCPU queries kick
    // (this host's QEMU is 7.2: they do).
    let info = page
        .lines()
        .find(|l| l.starts_with("kvmscope_exporter_qemu_info{"))
        .expect("a qemu_info line");
    let version = info
        .split("qemu_version=\"")
        .nth(1)
        .and_then(|v| v.split('"').next())
        .expect("a qemu_version label");
    let (major, minor) = {
        let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap());
        (parts.next().unwrap(), parts.next().unwrap())
    };
    let kicks = (major, minor) < (8, 1);
    assert!(
        info.contains(&format!("vcpu_kicks=\"{}\"", u8::from(kicks))),
        "{info}"
    );
    let mistaken = |p: &str| {
        p.lines()
            .filter(|l| l.contains("a.sock") && l.starts_with("kvmscope_exporter_qemu_"))
            .map(String::from)
            .collect::<Vec<_>>()
    };
    // Three refreshes later, the mistaken socket is down and no more: no
    // info, no age (taken as a QEMU, it showed qemu_version="0.1.0").
    std::thread::sleep(Duration::from_millis(700));
    let later = page_when(&e, "the page again", |p| up(p, "a", a.pid()));
    let lines = mistaken(&later);
    assert_eq!(
        lines.len(),
        1,
        "a kvmscope socket given as a QEMU monitor: {lines:?}"
    );
    assert!(
        lines[0].starts_with("kvmscope_exporter_qemu_up{") && lines[0].ends_with(" 0"),
        "{lines:?}"
    );
    // Never read as a QEMU: no pid is known (not pid "0").
    assert!(lines[0].contains("pid=\"\""), "{lines:?}");
    // QEMU going away shows as down, and the page goes on; after three
    // refreshes without an answer its figures leave the page.
    q.kill().unwrap();
    q.wait().unwrap();
    page_when(&e, "QEMU down, its figures gone", |p| {
        common::metric(p, "kvmscope_exporter_qemu_up", &[&qvm]) == Some(0.0)
            && common::metric(p, "kvmscope_kvm_vm_pages_4k", &[&qvm]).is_none()
            && !p.contains("qom_path=")
            && up(p, "a", a.pid())
    });
}

/// A QMP monitor of our own making that greets as QEMU 7.2 and answers each
/// command with `answer(name)` (a `return` value) after `delay`; `None`
/// answers nothing. Counts the `query-stats` it answered.
fn fake_monitor(
    path: &Path,
    delay: Duration,
    answer: fn(&str) -> Option<serde_json::Value>,
) -> std::sync::Arc<std::sync::atomic::AtomicUsize> {
    let listener = UnixListener::bind(path).unwrap();
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = answered.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let greeting = json!({"QMP": {"version": {"qemu": {"micro": 22, "minor": 2, "major": 7},
                "package": "fake"}, "capabilities": ["oob"]}});
            if writeln!(conn, "{greeting}").is_err() {
                continue;
            }
            let reader = std::io::BufReader::new(conn.try_clone().unwrap());
            for line in std::io::BufRead::lines(reader) {
                let Ok(line) = line else { break };
                let request: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
                let name = request["execute"].as_str().unwrap_or_default();
                let value = if name == "qmp_capabilities" {
                    Some(json!({}))
                } else {
                    std::thread::sleep(delay);
                    answer(name)
                };
                let Some(value) = value else { continue };
                if name == "query-stats" {
                    count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                let mut reply = json!({"return": value});
                if let Some(id) = request.get("id") {
                    reply["id"] = id.clone();
                }
                if writeln!(conn, "{reply}").is_err() {
                    break;
                }
            }
        }
    });
    answered
}

/// Monitors listed first that say `pages_4k` is a counter, or scale it by
/// ten, no longer change how an honest QEMU's `pages_4k` reads (its gauge
/// lines were written under the first's `# TYPE counter`, as
/// `kvmscope_kvm_vm_pages_4k_total`; a source of another scale was left
/// out); one whose reply is over a bound (600 stats) is down, none of its
/// stats on the page; the page stays valid.
#[test]
fn a_lying_or_flooding_qemu_monitor_does_not_change_how_an_honest_one_reads() {
    require_kvm!();
    let dir = common::test_dir("exp-qemu-liar");
    let sock = |name: &str| dir.join(format!("{name}.sock"));
    let (liar, scaler, flood, monitor) = (sock("liar"), sock("scaler"), sock("flood"), sock("qmp"));
    let Some(q) = qemu(&monitor) else {
        return;
    };
    common::wait_for("QEMU's monitor", LIMIT, || {
        common::unix_listening(&monitor).then_some(())
    });
    fake_monitor(&liar, Duration::ZERO, |name| match name {
        "query-name" => Some(json!({"name": "liar"})),
        "query-stats-schemas" => Some(json!([{"provider": "kvm", "target": "vm",
            "stats": [{"name": "pages_4k", "type": "cumulative", "exponent": 0}]}])),
        "query-stats" => {
            Some(json!([{"provider": "kvm", "stats": [{"name": "pages_4k", "value": 7}]}]))
        }
        _ => None,
    });
    fake_monitor(&scaler, Duration::ZERO, |name| match name {
        "query-name" => Some(json!({"name": "scaler"})),
        "query-stats-schemas" => Some(json!([{"provider": "kvm", "target": "vm",
            "stats": [{"name": "pages_4k", "type": "instant", "exponent": 1}]}])),
        "query-stats" => {
            Some(json!([{"provider": "kvm", "stats": [{"name": "pages_4k", "value": 7}]}]))
        }
        _ => None,
    });
    let flooded = fake_monitor(&flood, Duration::ZERO, |name| match name {
        "query-name" => Some(json!({"name": "flood"})),
        "query-stats-schemas" => {
            let stats: Vec<_> = (0..500)
                .map(|i| json!({"name": format!("s{i}"), "type": "instant", "exponent": 0}))
                .collect();
            Some(json!([{"provider": "kvm", "target": "vm", "stats": stats}]))
        }
        "query-stats" => {
            let stats: Vec<_> = (0..600)
                .map(|i| json!({"name": format!("s{i}"), "value": i}))
                .collect();
            Some(json!([{"provider": "kvm", "stats": stats}]))
        }
        _ => None,
    });
    let e = common::exporter::start(ExporterConfig {
        dirs: vec![],
        qmp_sockets: vec![liar, scaler, flood, monitor.clone()],
        qmp_interval: Duration::from_millis(200),
        ..common::exporter::config(&dir, Duration::from_secs(2))
    });
    let qvm = format!("vm=\"qvm-test\",pid=\"{}\"", q.id());
    let qemu_up = |p: &str, vm: &str| {
        p.lines().any(|l| {
            l.starts_with("kvmscope_exporter_qemu_up{")
                && l.contains(&format!("vm=\"{vm}\""))
                && l.ends_with(" 1")
        })
    };
    let page = page_when(&e, "every monitor read once, the honest ones up", |p| {
        qemu_up(p, "liar")
            && qemu_up(p, "scaler")
            && qemu_up(p, "qvm-test")
            && flooded.load(std::sync::atomic::Ordering::Relaxed) >= 2
    });
    common::check_with_promtool(&page);
    assert!(
        common::metric(&page, "kvmscope_kvm_vm_pages_4k", &[&qvm]).is_some(),
        "the honest QEMU's gauge: {page}"
    );
    assert!(
        common::metric(&page, "kvmscope_kvm_vm_pages_4k_total", &[&qvm]).is_none(),
        "{page}"
    );
    assert_eq!(
        common::metric(&page, "kvmscope_kvm_vm_pages_4k_total", &["vm=\"liar\""]),
        Some(7.0),
        "the liar in a family of its own kind: {page}"
    );
    assert_eq!(
        common::metric(&page, "kvmscope_kvm_vm_pages_4k", &["vm=\"scaler\""]),
        Some(70.0),
        "the scaler in the gauge's family, on its own scale: {page}"
    );
    assert!(!qemu_up(&page, "flood"), "{page}");
    assert!(!page.contains("kvmscope_kvm_vm_s0{"), "{page}");
}

/// The exporter stops without waiting for a monitor in the middle of a
/// slow answer (each command may take the attach timeout: a stop waited for
/// every poller's reading to end, 8 s and more).
#[test]
fn the_exporter_stops_at_once_while_a_monitor_answers_slowly() {
    let dir = common::test_dir("exp-qemu-slow");
    let slow = dir.join("slow.sock");
    fake_monitor(&slow, Duration::from_secs(5), |name| match name {
        "query-name" => Some(json!({"name": "slow"})),
        _ => Some(json!([])),
    });
    let e = common::exporter::start(ExporterConfig {
        dirs: vec![],
        qmp_sockets: vec![slow],
        qmp_interval: Duration::from_millis(200),
        ..common::exporter::config(&dir, Duration::from_secs(30))
    });
    // In its first slow answer.
    std::thread::sleep(Duration::from_millis(500));
    let started = std::time::Instant::now();
    drop(e);
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "the stop waited {:?} for the monitor",
        started.elapsed()
    );
}

/// A monitor whose vCPUs' reply keeps more than the exporter keeps of one
/// reply (2,700 vCPUs of 100 stats: 270,000 values) keeps its VM's stats
/// on the page and loses its vCPUs' lines, up all the while; an honest
/// monitor's vCPUs beside it read as before.
#[test]
fn a_monitor_whose_vcpus_reply_is_over_what_is_kept_keeps_its_vm_lines() {
    const VCPUS: usize = 2700;
    let dir = common::test_dir("exp-qemu-cut");
    let (crowd, small) = (dir.join("crowd.sock"), dir.join("small.sock"));
    let path = |i: usize| format!("/machine/unattached/device[{i}]");
    // The same answers for both targets: the VM's reading takes the first
    // result; the vCPUs' takes them all.
    fn schema() -> serde_json::Value {
        let stats: Vec<_> = (0..100)
            .map(|i| json!({"name": format!("s{i}"), "type": "instant", "exponent": 0}))
            .collect();
        json!([{"provider": "kvm", "target": "vm", "stats": stats},
               {"provider": "kvm", "target": "vcpu", "stats": stats}])
    }
    fake_monitor(&crowd, Duration::ZERO, |name| match name {
        "query-name" => Some(json!({"name": "crowd"})),
        "query-stats-schemas" => Some(schema()),
        "query-stats" => {
            let stats: Vec<_> = (0..100)
                .map(|i| json!({"name": format!("s{i}"), "value": i}))
                .collect();
            let results: Vec<_> = (0..VCPUS)
                .map(|i| json!({"provider": "kvm", "qom-path": format!("/machine/unattached/device[{i}]"), "stats": stats}))
                .collect();
            Some(json!(results))
        }
        "query-cpus-fast" => Some(json!((0..VCPUS)
            .map(
                |i| json!({"cpu-index": i, "qom-path": format!("/machine/unattached/device[{i}]")})
            )
            .collect::<Vec<_>>())),
        _ => None,
    });
    fake_monitor(&small, Duration::ZERO, |name| match name {
        "query-name" => Some(json!({"name": "small"})),
        "query-stats-schemas" => Some(schema()),
        "query-stats" => Some(
            json!([{"provider": "kvm", "qom-path": "/machine/unattached/device[0]",
            "stats": [{"name": "s1", "value": 5}]}]),
        ),
        "query-cpus-fast" => {
            Some(json!([{"cpu-index": 0, "qom-path": "/machine/unattached/device[0]"}]))
        }
        _ => None,
    });
    let e = common::exporter::start(ExporterConfig {
        dirs: vec![],
        qmp_sockets: vec![crowd, small],
        qmp_interval: Duration::from_millis(300),
        qmp_vcpus: true,
        ..common::exporter::config(&dir, Duration::from_secs(10))
    });
    let page = page_when(&e, "both monitors read", |p| {
        common::metric(p, "kvmscope_kvm_vm_s1", &["vm=\"crowd\""]).is_some()
            && common::metric(p, "kvmscope_kvm_vcpu_s1", &["vm=\"small\""]).is_some()
    });
    common::check_with_promtool(&page);
    let up = |vm: &str| {
        page.lines().any(|l| {
            l.starts_with("kvmscope_exporter_qemu_up{")
                && l.contains(&format!("vm=\"{vm}\""))
                && l.ends_with(" 1")
        })
    };
    assert!(up("crowd") && up("small"), "{page}");
    assert_eq!(
        common::metric(&page, "kvmscope_kvm_vm_s99", &["vm=\"crowd\""]),
        Some(99.0),
        "{page}"
    );
    assert!(
        !page
            .lines()
            .any(|l| l.starts_with("kvmscope_kvm_vcpu_") && l.contains("vm=\"crowd\"")),
        "the crowd's vCPU lines left out"
    );
    assert_eq!(
        common::metric(
            &page,
            "kvmscope_kvm_vcpu_s1",
            &["vm=\"small\"", &format!("qom_path=\"{}\"", path(0))]
        ),
        Some(5.0),
        "{page}"
    );
}
