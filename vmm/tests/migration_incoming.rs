//! A migration destination (`kvmscope run --incoming`) faced with peers that
//! misbehave, run as a process of the real binary so that signals reach it:
//! a source that stalls mid-page (a signal, `quit` and the idle deadline each
//! end it, non-zero), a source that stalls before its config, a peer that
//! dribbles its header past the header deadline, and a real source behind
//! fifty idle peers.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use kvmscope::client::Client;
use serde_json::json;

/// A destination process: its control socket, where it listens, its stderr
/// file. Dropped, it is killed, then its directory removed (fields drop in
/// order).
struct DestProcess {
    child: common::KillOnDrop,
    socket: PathBuf,
    listen: PathBuf,
    stderr: PathBuf,
    _dir: common::TestDir,
}

impl DestProcess {
    /// Starts `kvmscope run --incoming unix:DIR/incoming.sock --socket DIR/ctl.sock`
    /// with `extra` options, and waits until it listens.
    fn start(test: &str, extra: &[&str]) -> DestProcess {
        let dir = common::test_dir(test);
        let socket = dir.join("ctl.sock");
        let listen = dir.join("incoming.sock");
        let stderr = dir.join("stderr");
        let child = Command::new(env!("CARGO_BIN_EXE_kvmscope"))
            .args(["run", "--sample-interval", "off", "--incoming"])
            .arg(format!("unix:{}", listen.display()))
            .arg("--socket")
            .arg(&socket)
            .args(extra)
            // What it decides along the way is logged at info.
            .env("RUST_LOG", "kvmscope=info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).expect("a stderr file"))
            .spawn()
            .expect("starting kvmscope");
        let d = DestProcess {
            child: common::KillOnDrop::new(child),
            socket,
            listen,
            stderr,
            _dir: dir,
        };
        common::wait_for("the destination to listen", Duration::from_secs(20), || {
            common::unix_listening(&d.listen).then_some(())
        });
        d
    }

    fn connect(&self) -> UnixStream {
        UnixStream::connect(&self.listen).expect("connecting to the destination")
    }

    fn signal(&self, sig: i32) {
        let pid = i32::try_from(self.child.id()).expect("a pid");
        // SAFETY: kill only sends a signal to the process this test started.
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
    }

    /// Its exit status once it has ended, or `None` after `limit`.
    fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("waiting on kvmscope") {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Asserts it ended within `limit` with a non-zero status and an error
    /// that contains `says`.
    fn assert_failed(&mut self, limit: Duration, says: &str) {
        let status = self.wait_exit(limit);
        let stderr = self.stderr();
        let Some(status) = status else {
            panic!("still running {limit:?} later; stderr: {stderr}");
        };
        assert!(!status.success(), "exit status {status}; stderr: {stderr}");
        assert!(
            stderr.contains(says),
            "stderr does not say '{says}': {stderr}"
        );
    }
}

/// The stream header and config section of a 64 MiB, one-vCPU guest: the
/// config-only seed of the stream's fuzz corpus, less its trailer.
fn header_and_config() -> Vec<u8> {
    let seed = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus/migration_stream/ok-config-only");
    let bytes = std::fs::read(seed).expect("the config-only seed");
    // 16 (stream header) + 16 (section header) + 40 (config record).
    bytes[..72].to_vec()
}

/// Reads one reply from the destination and returns its code.
fn read_reply_code(s: &mut UnixStream, limit: Duration) -> u32 {
    s.set_read_timeout(Some(limit)).unwrap();
    let mut head = [0u8; 12];
    s.read_exact(&mut head).expect("a reply within the limit");
    assert_eq!(&head[..4], b"KSMR", "a reply");
    u32::from_le_bytes(head[4..8].try_into().unwrap())
}

/// A fake source: sends the header and config, takes READY, then starts a
/// RAM section and stops in the middle of its first page, connection open.
fn stall_mid_page(dest: &DestProcess) -> UnixStream {
    let mut s = dest.connect();
    s.write_all(&header_and_config()).unwrap();
    assert_eq!(
        read_reply_code(&mut s, Duration::from_secs(30)),
        kvmscope::migration::format::REPLY_READY
    );
    let mut ram = Vec::new();
    ram.extend_from_slice(&2u32.to_le_bytes()); // a RAM section
    ram.extend_from_slice(&0u32.to_le_bytes());
    ram.extend_from_slice(&(16u64 + 4096).to_le_bytes());
    ram.extend_from_slice(&0u64.to_le_bytes()); // one normal run at page 0
    ram.extend_from_slice(&1u32.to_le_bytes());
    ram.extend_from_slice(&(kvmscope::migration::format::RunKind::Normal as u32).to_le_bytes());
    ram.extend_from_slice(&[0xab; 100]); // 100 of its 4096 bytes
    s.write_all(&ram).unwrap();
    s
}

/// How long a stopped destination may take to end: the issue wants a second;
/// the rest is slack for a loaded machine.
const STOP_LIMIT: Duration = Duration::from_secs(5);

#[test]
fn sigterm_ends_an_incoming_migration_stalled_mid_page() {
    require_kvm!();
    let mut dest = DestProcess::start("in-stall-term", &[]);
    let _source = stall_mid_page(&dest);
    dest.signal(libc::SIGTERM);
    dest.assert_failed(STOP_LIMIT, "stopped by signal 15");
}

#[test]
fn quit_ends_an_incoming_migration_stalled_mid_page() {
    require_kvm!();
    let mut dest = DestProcess::start("in-stall-quit", &[]);
    let _source = stall_mid_page(&dest);
    let mut c = Client::connect(&dest.socket).expect("the control socket");
    c.set_timeout(Some(Duration::from_secs(10))).unwrap();
    c.execute("quit", json!({})).expect("quit is answered");
    dest.assert_failed(STOP_LIMIT, "stopped by quit");
}

#[test]
fn a_run_state_change_while_inmigrate_is_refused_at_once() {
    require_kvm!();
    let dest = DestProcess::start("in-stall-pause", &[]);
    let _source = stall_mid_page(&dest);
    let mut c = Client::connect(&dest.socket).expect("the control socket");
    c.set_timeout(Some(Duration::from_secs(10))).unwrap();
    let e = c.execute("stop", json!({})).expect_err("stop is refused");
    assert!(
        kvmscope::error_chain(&e).contains("inmigrate"),
        "{}",
        kvmscope::error_chain(&e)
    );
}

#[test]
fn a_stream_silent_past_the_idle_timeout_fails_naming_it() {
    require_kvm!();
    let mut dest = DestProcess::start("in-stall-idle", &["--incoming-idle-timeout", "2s"]);
    let _source = stall_mid_page(&dest);
    dest.assert_failed(
        Duration::from_secs(2) + STOP_LIMIT,
        "the source sent nothing for 2s",
    );
}

#[test]
fn sigterm_ends_a_destination_waiting_for_the_config() {
    require_kvm!();
    let mut dest = DestProcess::start("in-no-config", &[]);
    let mut s = dest.connect();
    s.write_all(&header_and_config()[..16]).unwrap();
    // The header alone is a source's: the destination waits on for the config.
    dest.signal(libc::SIGTERM);
    dest.assert_failed(STOP_LIMIT, "stopped by signal 15");
}

/// How long a peer has for its whole header (the destination's constant).
const HEADER_WAIT: Duration = Duration::from_secs(5);

#[test]
fn a_header_dribbled_past_the_header_deadline_is_dropped() {
    require_kvm!();
    let dest = DestProcess::start("in-dribble", &[]);
    let mut s = dest.connect();
    let header = header_and_config();
    let started = Instant::now();
    s.set_read_timeout(Some(Duration::from_millis(700)))
        .unwrap();
    let mut dropped = None;
    // A byte every 700 ms: 16 bytes take 11 s, past the header deadline. The
    // destination hangs up on a peer it drops: the read sees the end.
    for &b in &header[..16] {
        let closed = s.write_all(&[b]).is_err() || s.read(&mut [0u8; 64]).is_ok_and(|n| n == 0);
        if closed {
            dropped = Some(started.elapsed());
            break;
        }
    }
    let dropped =
        dropped.expect("the destination dropped the dribbler before its header was whole");
    assert!(
        dropped < HEADER_WAIT + Duration::from_secs(3),
        "dropped after {dropped:?}"
    );
}

#[test]
fn a_source_behind_fifty_idle_peers_is_answered_within_the_header_deadline() {
    require_kvm!();
    let dest = DestProcess::start("in-idle-peers", &[]);
    let idle: Vec<UnixStream> = (0..50).map(|_| dest.connect()).collect();
    let mut s = dest.connect();
    s.write_all(&header_and_config()).unwrap();
    // READY comes once the VM is built: within the header deadline of the
    // source's connection, plus slack for building the VM on a loaded machine.
    assert_eq!(
        read_reply_code(&mut s, HEADER_WAIT + Duration::from_secs(10)),
        kvmscope::migration::format::REPLY_READY
    );
    drop(idle);
}

/// Whether process `pid` holds a KVM VM fd.
fn holds_a_kvm_vm(pid: u32) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.filter_map(Result::ok).any(|fd| {
        std::fs::read_link(fd.path()).is_ok_and(|to| to.as_os_str() == "anon_inode:kvm-vm")
    })
}

#[test]
fn given_memory_and_vcpus_the_destination_builds_its_vm_before_it_listens() {
    require_kvm!();
    // Told nothing of the VM, it waits for the stream's config to build one.
    let told_nothing = DestProcess::start("in-ahead-none", &[]);
    assert!(!holds_a_kvm_vm(told_nothing.child.id()));
    drop(told_nothing);
    let dest = DestProcess::start("in-ahead", &["--memory", "64M", "--vcpus", "1"]);
    assert!(
        holds_a_kvm_vm(dest.child.id()),
        "no VM once it listens; stderr: {}",
        dest.stderr()
    );
    let mut s = dest.connect();
    s.write_all(&header_and_config()).unwrap();
    assert_eq!(
        read_reply_code(&mut s, Duration::from_secs(30)),
        kvmscope::migration::format::REPLY_READY
    );
    assert!(
        !dest.stderr().contains("built ahead"),
        "the stream's VM is the one built: {}",
        dest.stderr()
    );
}

/// Built ahead, a destination serves its control socket before any source
/// connects, as QEMU's `-incoming` serves QMP: an orchestrator connects to
/// it first (before: the socket came only with the source's config), sees
/// `inmigrate`, has run-state changes refused, and can stop the wait.
#[test]
fn built_ahead_the_destination_serves_its_control_socket_before_a_source_connects() {
    require_kvm!();
    let mut dest = DestProcess::start("in-ahead-ctl", &["--memory", "64M", "--vcpus", "1"]);
    let mut c = Client::connect(&dest.socket).expect("the control socket, with no source yet");
    c.set_timeout(Some(Duration::from_secs(10))).unwrap();
    let (status, _) = c.execute("query-status", json!({})).unwrap();
    assert_eq!(status["status"], "inmigrate", "{status}");
    let (m, _) = c.execute("query-migrate", json!({})).unwrap();
    assert_eq!(m["status"], "setup", "{m}");
    let e = c.execute("cont", json!({})).expect_err("cont is refused");
    assert!(
        kvmscope::error_chain(&e).contains("inmigrate"),
        "{}",
        kvmscope::error_chain(&e)
    );
    // What acts on the guest or measures it is refused too: a command
    // queued here was lost when the guest's own queue came (and `wait`
    // answered with the source's result under its number), a window
    // measured a guest not there and published its prediction.
    for (command, args) in [
        (
            "guest-command",
            json!({"vcpu": 0, "command": "touch size=1M", "wait": true}),
        ),
        ("query-readiness", json!({"calc-time": 1})),
        ("calc-dirty-rate", json!({"calc-time": 1})),
    ] {
        let e = kvmscope::error_chain(&c.execute(command, args).expect_err(command));
        assert!(
            e.contains(&format!(
                "the guest is still arriving (inmigrate): {command} needs it"
            )),
            "{e}"
        );
    }
    let (guest, _) = c.execute("query-guest", json!({})).unwrap();
    assert_eq!(guest[0]["queued"], 0, "{guest}");
    // `kvmscope migrate` from it is refused as what it is, a destination.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvmscope"))
        .args(["migrate", "--socket"])
        .arg(&dest.socket)
        .args(["--to", "unix:/nonexistent/kvmscope-test"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(
            "a migration destination whose guest has not arrived (inmigrate); nothing was changed"
        ),
        "{err}"
    );
    c.execute("quit", json!({})).expect("quit is answered");
    dest.assert_failed(STOP_LIMIT, "stopped by quit while waiting for the source");
    assert!(!dest.socket.exists(), "its control socket is gone");
}

#[test]
fn a_stream_whose_vm_differs_from_the_one_built_ahead_in_what_was_not_given_gets_its_own() {
    require_kvm!();
    let dest = DestProcess::start("in-ahead-other", &["--memory", "64M", "--vcpus", "1"]);
    // The same 64 MiB, one-vCPU guest, from a source that logs to a bitmap
    // (the config record's dirty mode, 24 bytes into it).
    let mut stream = header_and_config();
    stream[56..60].copy_from_slice(&1u32.to_le_bytes());
    let mut s = dest.connect();
    s.write_all(&stream).unwrap();
    assert_eq!(
        read_reply_code(&mut s, Duration::from_secs(30)),
        kvmscope::migration::format::REPLY_READY
    );
    let stderr = dest.stderr();
    assert!(
        stderr.contains(
            "its VM (64 MiB, 1 vCPU(s), dirty log bitmap) is not the one built ahead (64 MiB, 1 vCPU(s), no dirty log): building it"
        ),
        "{stderr}"
    );
    // The control socket came up again with the VM built for the stream.
    let mut c = Client::connect(&dest.socket).expect("the control socket again");
    c.set_timeout(Some(Duration::from_secs(10))).unwrap();
    let (status, _) = c.execute("query-status", json!({})).unwrap();
    assert_eq!(status["status"], "inmigrate", "{status}");
}
