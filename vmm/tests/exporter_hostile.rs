//! `kvmscope exporter` against VMMs that misbehave on purpose (issue 18):
//! fake VMMs in this process speak the control protocol, hand out real KVM
//! stats fds (of a VM built here) or forged ones, and then dribble, flood or
//! lie. One bad source must never hold up or break the page for the others.
//! `kvmscope stats`, the other client that takes their fds, is held to the
//! same: a forged fd is named for what it is.

mod common;

use common::exporter::up;

use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvmscope::exporter::Exporter;
use kvmscope::vm::{Vm, VmConfig};
use rustix::net::{sendmsg, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};

const LIMIT: Duration = Duration::from_secs(30);

fn exporter(dir: &Path, timeout: Duration) -> Exporter {
    common::exporter::over(dir, timeout)
}

fn page(e: &Exporter) -> String {
    common::exporter::page(e)
}

fn page_within(e: &Exporter, what: &str, limit: Duration, check: impl Fn(&str) -> bool) -> String {
    common::wait_for(what, limit, || Some(page(e)).filter(|p| check(p)))
}

fn greeting(name: &str, vcpus: usize) -> String {
    format!(
        "{{\"QMP\":{{\"version\":{{\"qemu\":{{\"major\":0,\"minor\":1,\"micro\":0}},\"package\":\"fake\"}},\
         \"capabilities\":[],\"kvmscope\":{{\"protocol\":2,\"features\":[\"stats-fd\"],\
         \"vm\":{{\"name\":\"{name}\",\"pid\":1,\"vcpus\":{vcpus},\"memory\":16777216,\
         \"backend\":\"pvm\",\"stats-id\":\"kvm-1\"}}}}}}}}\n"
    )
}

/// Real KVM stats files of a VM built (not started) in this process.
struct RealStats {
    _vm: Vm,
    vm: std::fs::File,
    vcpu: std::fs::File,
}

impl RealStats {
    fn new() -> RealStats {
        let vm = Vm::new(VmConfig {
            memory: 16 << 20,
            vcpus: 1,
            ..VmConfig::default()
        })
        .expect("a VM");
        let vm_file = vm.vm_stats().file().try_clone().unwrap();
        let vcpu = kvm_stats::ioctl::get_stats_fd(&vm.vcpu_fds()[0]).expect("a vCPU stats fd");
        RealStats {
            _vm: vm,
            vm: vm_file,
            vcpu,
        }
    }
}

fn send_with_fds(s: &UnixStream, line: &str, files: &[&std::fs::File]) {
    let fds: Vec<_> = files.iter().map(|f| f.as_fd()).collect();
    let mut space =
        vec![std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(fds.len()))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    assert!(control.push(SendAncillaryMessage::ScmRights(&fds)));
    let iov = [std::io::IoSlice::new(line.as_bytes())];
    let _ = sendmsg(s, &iov, &mut control, SendFlags::empty());
}

/// What a fake VMM does once the exporter has asked for the vCPU stats fds.
type After = Box<dyn Fn(&mut UnixStream, &mut BufReader<UnixStream>) + Send + Sync>;

/// Reads and ignores whatever the exporter sends next, until it hangs up.
fn drain() -> After {
    Box::new(|_, r| {
        let mut line = String::new();
        while r.read_line(&mut line).is_ok_and(|n| n > 0) {}
    })
}

/// A well-behaved fake VMM named `name` at `socket`, handing out `real`'s
/// stats.
fn honest_vmm(socket: &Path, name: &str, real: &RealStats) {
    honest_vmm_with_own(socket, name, real, None);
}

/// `honest_vmm`, handing out `own` as its own stats files.
fn honest_vmm_with_own(socket: &Path, name: &str, real: &RealStats, own: Own) {
    fake_vmm_with_own(
        socket,
        greeting(name, 1),
        Arc::new(real.vm.try_clone().unwrap()),
        Arc::new(vec![real.vcpu.try_clone().unwrap()]),
        own,
        drain(),
    );
}

/// A fake VMM: greets as kvmscope does, answers negotiation and
/// `query-status`, hands out `vm`'s and `vcpus`' fds, then runs `after`.
fn fake_vmm(
    path: &Path,
    greet: String,
    vm: Arc<std::fs::File>,
    vcpus: Arc<Vec<std::fs::File>>,
    after: After,
) {
    fake_vmm_with_own(path, greet, vm, vcpus, None, after);
}

/// The VMM's own stats files a fake VMM hands out: the VM's and the vCPUs'.
type Own = Option<(Arc<std::fs::File>, Arc<Vec<std::fs::File>>)>;

/// `fake_vmm`, answering the exporter's request for the VMM's own stats
/// with `own`'s files (as a kvmscope without them does when `None`).
fn fake_vmm_with_own(
    path: &Path,
    greet: String,
    vm: Arc<std::fs::File>,
    vcpus: Arc<Vec<std::fs::File>>,
    own: Own,
    after: After,
) {
    let listener = UnixListener::bind(path).unwrap();
    let after = Arc::new(after);
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            let (greet, vm, vcpus, own, after) = (
                greet.clone(),
                vm.clone(),
                vcpus.clone(),
                own.clone(),
                after.clone(),
            );
            std::thread::spawn(move || {
                let mut r = BufReader::new(s.try_clone().unwrap());
                let _ = s.write_all(greet.as_bytes());
                let mut line = String::new();
                while r.read_line(&mut line).is_ok_and(|n| n > 0) {
                    if line.contains("get-stats-fd") && line.contains("\"vcpu\"") {
                        let files: Vec<&std::fs::File> = vcpus.iter().collect();
                        let entries: Vec<String> = (0..files.len())
                            .map(|i| format!("{{\"target\":\"vcpu\",\"vcpu\":{i},\"id\":\"x\"}}"))
                            .collect();
                        let reply = format!("{{\"return\":{{\"fds\":[{}]}}}}\n", entries.join(","));
                        send_with_fds(&s, &reply, &files);
                        // The exporter then asks for the VMM's own stats:
                        // answered as a kvmscope without them answers, or
                        // with `own`'s files (the VM's, then the vCPUs').
                        line.clear();
                        if r.read_line(&mut line).is_ok_and(|n| n > 0) {
                            match &own {
                                None => {
                                    let _ = s.write_all(b"{\"error\":{\"class\":\"GenericError\",\"desc\":\"Parameter 'provider' is unexpected\"}}\n");
                                }
                                Some((own_vm, own_vcpus)) => {
                                    send_with_fds(
                                        &s,
                                        "{\"return\":{\"fds\":[{\"target\":\"vm\",\"id\":\"x\"}]}}\n",
                                        &[own_vm],
                                    );
                                    line.clear();
                                    let _ = r.read_line(&mut line);
                                    let files: Vec<&std::fs::File> = own_vcpus.iter().collect();
                                    let entries: Vec<String> = (0..files.len())
                                        .map(|i| {
                                            format!(
                                                "{{\"target\":\"vcpu\",\"vcpu\":{i},\"id\":\"x\"}}"
                                            )
                                        })
                                        .collect();
                                    let reply = format!(
                                        "{{\"return\":{{\"fds\":[{}]}}}}\n",
                                        entries.join(",")
                                    );
                                    send_with_fds(&s, &reply, &files);
                                }
                            }
                        }
                        after(&mut s, &mut r);
                        return;
                    } else if line.contains("get-stats-fd") {
                        send_with_fds(
                            &s,
                            "{\"return\":{\"fds\":[{\"target\":\"vm\",\"id\":\"x\"}]}}\n",
                            &[&vm],
                        );
                    } else if line.contains("query-status") {
                        let _ = s
                            .write_all(b"{\"return\":{\"status\":\"running\",\"running\":true,\"singlestep\":false}}\n");
                    } else {
                        let _ = s.write_all(b"{\"return\":{}}\n");
                    }
                    line.clear();
                }
            });
        }
    });
}

#[test]
fn a_vmm_that_dribbles_its_answer_after_a_migration_holds_up_no_scrape() {
    require_kvm!();
    let dir = common::test_dir("exh-dribble");
    let real = RealStats::new();
    let vm = Arc::new(real.vm.try_clone().unwrap());
    let vcpus = Arc::new(vec![real.vcpu.try_clone().unwrap()]);
    fake_vmm(
        &dir.join("slow.sock"),
        greeting("slow", 1),
        vm,
        vcpus,
        Box::new(|s, r| {
            let _ = s.write_all(
                b"{\"event\":\"MIGRATION\",\"data\":{\"status\":\"completed\"},\"timestamp\":{\"seconds\":0,\"microseconds\":0}}\n",
            );
            // The follow-up query-status is answered a byte every 100 ms, for ever.
            let mut line = String::new();
            let _ = r.read_line(&mut line);
            for b in b"{\"return\":{\"status\":\"running\"".iter().cycle() {
                if s.write_all(&[*b]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }),
    );
    let e = exporter(&dir, Duration::from_secs(1));
    page_within(&e, "the VM up", LIMIT, |p| up(p, "slow.sock") == Some(1.0));
    // Scrapes go on, each served at once, while the VMM dribbles; once the
    // follow-up's whole deadline (the attach timeout, 1 s) passes, the VM goes.
    let t = Instant::now();
    let mut slowest = Duration::ZERO;
    while t.elapsed() < Duration::from_secs(3) {
        let s = Instant::now();
        let p = page(&e);
        slowest = slowest.max(s.elapsed());
        if up(&p, "slow.sock").is_none() {
            break;
        }
    }
    // Before: a scrape waited on the registry lock while the dribble went on.
    assert!(
        slowest < Duration::from_secs(2),
        "a scrape took {slowest:?}"
    );
    page_within(
        &e,
        "the dribbling VM dropped",
        Duration::from_secs(5),
        |p| up(p, "slow.sock").is_none(),
    );
}

#[test]
fn a_greeting_dribbled_or_without_end_is_down_within_the_attach_timeout() {
    let dir = common::test_dir("exh-greet");
    let slow = UnixListener::bind(dir.join("slow.sock")).unwrap();
    std::thread::spawn(move || {
        for mut s in slow.incoming().flatten() {
            std::thread::spawn(move || {
                for b in greeting("slow", 1).bytes() {
                    if s.write_all(&[b]).is_err() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            });
        }
    });
    let endless = UnixListener::bind(dir.join("endless.sock")).unwrap();
    std::thread::spawn(move || {
        for mut s in endless.incoming().flatten() {
            std::thread::spawn(move || {
                let chunk = vec![b'x'; 64 << 10];
                while s.write_all(&chunk).is_ok() {}
            });
        }
    });
    let e = exporter(&dir, Duration::from_millis(500));
    // Before: the dribbled greeting (about 15 s of it) stayed pending, never
    // shown down; the endless line was read to 64 MiB first.
    let p = page_within(&e, "both down", Duration::from_secs(5), |p| {
        up(p, "slow.sock") == Some(0.0) && up(p, "endless.sock") == Some(0.0)
    });
    common::check_with_promtool(&p);
}

#[test]
fn forged_stats_files_are_refused_and_an_honest_vm_keeps_its_lines() {
    require_kvm!();
    let dir = common::test_dir("exh-forged");
    // A regular file laid out as a stats file, with a stat whose name holds
    // a line of the page's own.
    let forged = kvm_stats::builder::StatsFileBuilder::new("kvm-1")
        .counter("exits", 7)
        .counter(
            "x\nkvmscope_exporter_vm_up{vm=\"a\",pid=\"1\",socket=\"injected\"} 0\n# x",
            1,
        )
        .build();
    let path = dir.join("forged.stats");
    std::fs::write(&path, forged).unwrap();
    let file = || Arc::new(std::fs::File::open(&path).unwrap());
    fake_vmm(
        &dir.join("forger.sock"),
        greeting("forger", 1),
        file(),
        Arc::new(vec![std::fs::File::open(&path).unwrap()]),
        drain(),
    );
    let real = RealStats::new();
    honest_vmm(&dir.join("honest.sock"), "honest", &real);
    let e = exporter(&dir, Duration::from_secs(2));
    let p = page_within(&e, "honest up, forger down", LIMIT, |p| {
        up(p, "honest.sock") == Some(1.0) && up(p, "forger.sock") == Some(0.0)
    });
    assert!(!p.contains("injected"), "{p}");
    // Every vCPU stat of the honest VM is on the page.
    let vcpu_stats = kvm_stats::StatsFd::new(real.vcpu.try_clone().unwrap()).unwrap();
    let families = p
        .lines()
        .filter(|l| l.starts_with("kvmscope_kvm_vcpu_") && l.contains("honest"))
        .count();
    assert!(
        families >= vcpu_stats.schema().iter().count(),
        "{families} vCPU lines for {} stats",
        vcpu_stats.schema().iter().count()
    );
    common::check_with_promtool(&p);
}

#[test]
fn the_stats_client_names_a_received_fd_that_is_not_a_stats_file() {
    let dir = common::test_dir("exh-pipe");
    let (pipe, _writer) = std::io::pipe().unwrap();
    let pipe: std::fs::File = std::os::fd::OwnedFd::from(pipe).into();
    let socket = dir.join("piper.sock");
    fake_vmm(
        &socket,
        greeting("piper", 1),
        Arc::new(pipe),
        Arc::new(Vec::new()),
        drain(),
    );
    // kvmscope stats, and the Python client, which says the same.
    for mut client in stats_clients(&socket, &["--vm"]) {
        let out = client
            .output()
            .expect("the client runs (CI installs python3)");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.contains("the stats fd the VMM sent for the VM (kvm) is not a readable stats file")
                && err.contains("(it is \"pipe\""),
            "{err}"
        );
    }
}

/// `kvmscope stats ARGS --socket SOCKET` and the Python client with the
/// same arguments.
fn stats_clients(socket: &Path, args: &[&str]) -> [std::process::Command; 2] {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/kvmscope_client.py");
    let mut rust = std::process::Command::new(env!("CARGO_BIN_EXE_kvmscope"));
    rust.arg("stats").args(args).arg("--socket").arg(socket);
    let mut python = std::process::Command::new("python3");
    python.arg(script).args(args).arg("--socket").arg(socket);
    [rust, python]
}

/// `kvmscope stats` against a VMM that hands out what no stats fd is: a
/// file whose read blocks (`/dev/kmsg` at its end: the client sat in
/// `pread` for ever) is refused by what it is, unread; more vCPU fds than
/// the greeting's vCPUs are refused too (3,000 were taken and held).
#[test]
fn the_stats_client_reads_no_fd_of_another_kind_and_no_more_than_the_vcpus() {
    require_kvm!();
    let dir = common::test_dir("exh-kinds");
    // Each client run to its end, or given up on: a read that blocks
    // must not hold the test.
    let ended = |mut client: std::process::Command| {
        let mut child = client
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("the client runs (CI installs python3)");
        let status = common::wait_for("the client to end", Duration::from_secs(20), || {
            child.try_wait().unwrap()
        });
        let mut err = String::new();
        let _ = std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err);
        (status.code(), err)
    };
    if let Ok(mut kmsg) = std::fs::File::open("/dev/kmsg") {
        use std::io::Seek as _;
        let _ = kmsg.seek(std::io::SeekFrom::End(0));
        let socket = dir.join("kmsg.sock");
        fake_vmm(
            &socket,
            greeting("kmsg", 1),
            Arc::new(kmsg),
            Arc::new(Vec::new()),
            drain(),
        );
        // Both clients say the same (the fake VMM serves one client at a
        // time, each given the same fds).
        for client in stats_clients(&socket, &["--vm"]) {
            let (code, err) = ended(client);
            assert_eq!(code, Some(1), "{err}");
            assert!(
                err.contains("(it is \"/dev/kmsg\", not kvm-vm-stats); it was not read"),
                "{err}"
            );
        }
    } else {
        eprintln!("/dev/kmsg cannot be opened here: its case skipped");
    }
    let real = RealStats::new();
    let socket = dir.join("many.sock");
    let vcpus: Vec<_> = (0..3).map(|_| real.vcpu.try_clone().unwrap()).collect();
    fake_vmm(
        &socket,
        greeting("many", 1),
        Arc::new(real.vm.try_clone().unwrap()),
        Arc::new(vcpus),
        drain(),
    );
    let [rust, _] = stats_clients(&socket, &["--vcpu", "all"]);
    let (code, err) = ended(rust);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("the reply names 3 stats fds for a VM whose greeting names 1 vCPUs"),
        "{err}"
    );
}

/// A memfd named as the VMM's own stats files are, holding a stats file
/// with one counter; sealed against shrinking or not. Returns it (writable)
/// and a read-only fd of it, as `get-stats-fd` hands out.
fn own_stats_memfd(sealed: bool) -> (std::fs::File, std::fs::File) {
    let file = kvm_stats::builder::StatsFileBuilder::new("kvmscope-1/vm").counter("exits_hlt", 5);
    own_stats_memfd_of(&file, sealed)
}

/// `own_stats_memfd` holding the file `builder` makes.
fn own_stats_memfd_of(
    builder: &kvm_stats::builder::StatsFileBuilder,
    sealed: bool,
) -> (std::fs::File, std::fs::File) {
    use rustix::fs::{MemfdFlags, OFlags, SealFlags};
    let bytes = builder.build();
    let fd = rustix::fs::memfd_create(kvmscope::vmmstats::MEMFD_NAME, MemfdFlags::ALLOW_SEALING)
        .unwrap();
    let mut file = std::fs::File::from(fd);
    file.write_all(&bytes).unwrap();
    if sealed {
        rustix::fs::fcntl_add_seals(&file, SealFlags::SHRINK | SealFlags::GROW).unwrap();
    }
    let path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&file));
    let reader =
        rustix::fs::open(path.as_str(), OFlags::RDONLY, rustix::fs::Mode::empty()).unwrap();
    (file, std::fs::File::from(reader))
}

#[test]
fn own_stats_a_vmm_could_shrink_are_read_with_pread_and_shrinking_them_drops_only_that_vm() {
    // Mapped, a file its owner truncates would fault (SIGBUS) in every
    // later read and take the exporter down; read with pread, the read
    // comes back short and only that VM is dropped.
    require_kvm!();
    let dir = common::test_dir("exh-shrink");
    let real = RealStats::new();
    let (own_vm, own_vm_reader) = own_stats_memfd(false);
    let (_own_vcpu, own_vcpu_reader) = own_stats_memfd(false);
    honest_vmm_with_own(
        &dir.join("shrinker.sock"),
        "shrinker",
        &real,
        Some((Arc::new(own_vm_reader), Arc::new(vec![own_vcpu_reader]))),
    );
    let honest = RealStats::new();
    honest_vmm(&dir.join("honest.sock"), "honest", &honest);
    let e = exporter(&dir, Duration::from_secs(2));
    let own_hlt =
        |p: &str| common::metric(p, "kvmscope_vmm_vm_exits_hlt_total", &["vm=\"shrinker\""]);
    page_within(&e, "both up, the shrinker's own stats read", LIMIT, |p| {
        up(p, "honest.sock") == Some(1.0) && own_hlt(p) == Some(5.0)
    });
    own_vm.set_len(0).unwrap();
    let p = page_within(&e, "the shrinker dropped", LIMIT, |p| {
        own_hlt(p).is_none()
            && common::metric(p, "kvmscope_exporter_read_errors_total", &[])
                .is_some_and(|n| n >= 1.0)
    });
    assert_eq!(up(&p, "honest.sock"), Some(1.0), "{p}");
    common::check_with_promtool(&p);
}

#[test]
fn more_vcpu_fds_than_the_greeting_names_are_closed() {
    require_kvm!();
    let dir = common::test_dir("exh-fds");
    let real = RealStats::new();
    let many: Vec<std::fs::File> = (0..200).map(|_| real.vcpu.try_clone().unwrap()).collect();
    fake_vmm(
        &dir.join("many.sock"),
        greeting("many", 1),
        Arc::new(real.vm.try_clone().unwrap()),
        Arc::new(many),
        drain(),
    );
    let before = common::open_fds();
    let e = exporter(&dir, Duration::from_secs(2));
    let p = page_within(&e, "the VM up", LIMIT, |p| up(p, "many.sock") == Some(1.0));
    assert!(
        p.contains("vcpus=\"1\""),
        "one vCPU, as its greeting says: {p}"
    );
    // Before: 200 fds kept (and 200 vCPUs shown).
    let held = common::open_fds().saturating_sub(before);
    assert!(held < 50, "the exporter holds {held} more fds");
    assert!(p.contains("kvmscope_exporter_fd_limit "), "{p}");
}

#[test]
fn a_socket_renamed_over_a_live_one_is_attached_and_the_old_vm_dropped() {
    require_kvm!();
    let dir = common::test_dir("exh-rename");
    let real = RealStats::new();
    let live = dir.join("vm.sock");
    honest_vmm(&live, "old", &real);
    let e = exporter(&dir, Duration::from_secs(2));
    page_within(&e, "old up", LIMIT, |p| p.contains("vm=\"old\""));
    // A new VMM binds elsewhere and its socket is renamed over the live one
    // (the old VMM still runs and keeps its connection open).
    let staging_dir = common::test_dir("exh-rename-new");
    let staging = staging_dir.join("new.sock");
    honest_vmm(&staging, "new", &real);
    std::fs::rename(&staging, &live).unwrap();
    // Before: the old VM stayed on the page and the new socket was never tried.
    let p = page_within(&e, "new up, old gone", Duration::from_secs(10), |p| {
        p.contains("vm=\"new\"") && !p.contains("vm=\"old\"")
    });
    common::check_with_promtool(&p);
}

#[test]
fn a_vm_whose_fds_would_spend_the_open_file_budget_is_down_and_says_why() {
    require_kvm!();
    let dir = common::test_dir("exh-fdbudget");
    let real = RealStats::new();
    honest_vmm(&dir.join("vm.sock"), "vm", &real);
    // An exporter whose hard limit is 70 open files: what it holds at start
    // plus the VM's 2 stats fds plus the 64 kept free do not fit.
    let port = common::free_port();
    let mut child = common::KillOnDrop::new(
        std::process::Command::new("prlimit")
            .args([
                "--nofile=70:70",
                env!("CARGO_BIN_EXE_kvmscope"),
                "exporter",
                "--vm-sockets",
            ])
            .arg(&dir)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("prlimit (util-linux) runs the exporter"),
    );
    let p = common::wait_for("the VM down, the limit on the page", LIMIT, || {
        common::scrape(port).filter(|p| up(p, "vm.sock") == Some(0.0))
    });
    assert_eq!(
        common::metric(&p, "kvmscope_exporter_fd_limit", &[]),
        Some(70.0),
        "{p}"
    );
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("open-file budget is spent"), "{log}");
}

#[test]
fn an_attached_vm_stays_attached_past_its_attach_deadline() {
    require_kvm!();
    let dir = common::test_dir("exh-steady");
    let real = RealStats::new();
    let attaches = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = attaches.clone();
    fake_vmm(
        &dir.join("vm.sock"),
        greeting("steady", 1),
        Arc::new(real.vm.try_clone().unwrap()),
        Arc::new(vec![real.vcpu.try_clone().unwrap()]),
        Box::new(move |_, r| {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let mut line = String::new();
            while r.read_line(&mut line).is_ok_and(|n| n > 0) {}
        }),
    );
    let e = exporter(&dir, Duration::from_millis(300));
    page_within(&e, "the VM up", LIMIT, |p| up(p, "vm.sock") == Some(1.0));
    // Ten times the attach deadline: the connection is kept and not asked
    // anything (before: dropped once the attach deadline had passed, and
    // attached again, over and over).
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(up(&page(&e), "vm.sock"), Some(1.0));
    assert_eq!(
        attaches.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "attached once"
    );
}

#[test]
fn a_vmm_whose_vm_file_has_exit_counters_of_its_own_cannot_put_a_series_twice() {
    // The page's kvmscope_vmm_vm_exits_* families are the vCPUs' counters
    // summed: a VM file's `exits_hlt` (a counter) or `exits_hlt_total` (a
    // gauge, the same metric name) would write one series twice, or one
    // family in two groups, and Prometheus refuses such a page whole.
    require_kvm!();
    use kvm_stats::builder::StatsFileBuilder;
    use kvm_stats::{Base, StatType, Unit};
    let dir = common::test_dir("exh-own-exits");
    let real = RealStats::new();
    let vm = StatsFileBuilder::new("kvmscope-1")
        .counter("exits_hlt", 1000)
        .stat(
            "exits_hlt_total",
            StatType::Instant,
            Unit::None,
            Base::Pow10,
            0,
            &[2000],
        );
    let vcpu = StatsFileBuilder::new("kvmscope-1/vcpu-0").counter("exits_hlt", 7);
    let (_vm, vm_reader) = own_stats_memfd_of(&vm, true);
    let (_vcpu, vcpu_reader) = own_stats_memfd_of(&vcpu, true);
    honest_vmm_with_own(
        &dir.join("doubler.sock"),
        "doubler",
        &real,
        Some((Arc::new(vm_reader), Arc::new(vec![vcpu_reader]))),
    );
    let honest = RealStats::new();
    honest_vmm(&dir.join("honest.sock"), "honest", &honest);
    let e = exporter(&dir, Duration::from_secs(2));
    let p = page_within(&e, "both up", LIMIT, |p| {
        up(p, "honest.sock") == Some(1.0) && up(p, "doubler.sock") == Some(1.0)
    });
    let lines: Vec<&str> = p
        .lines()
        .filter(|l| l.starts_with("kvmscope_vmm_vm_exits_hlt_total{") && l.contains("doubler"))
        .collect();
    // One line: the vCPU's counter summed, neither of the VM file's.
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].ends_with(" 7"), "{lines:?}");
    common::check_with_promtool(&p);
}

#[test]
fn a_named_socket_that_is_not_there_stays_down_until_it_comes() {
    let dir = common::test_dir("exp-named-gone");
    let gone = dir.join("gone.sock");
    let mut config = common::exporter::config(&dir, Duration::from_secs(2));
    config.dirs.clear();
    config.sockets = vec![gone.clone()];
    let e = common::exporter::start(config);
    let name = gone.display().to_string();
    page_within(&e, "the named socket down", LIMIT, |p| {
        up(p, &name) == Some(0.0)
    });
    // Down on every scrape, not forgotten between tries (it was tried again
    // at once, logged twice a second, and left the page in between).
    for _ in 0..8 {
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(up(&page(&e), &name), Some(0.0), "{name} stays down");
    }
}
