//! The control socket against clients that pipeline, do not read, or crowd
//! it (issue 18): complete requests waiting behind a long one are
//! back-pressure, a reply is written whole or not at all, the operator can
//! always get in to `query-status` and `quit`, and only negotiated, idle
//! clients are evicted.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::time::Duration;

use common::ServedVm;
use kvmscope::control::{Limits, MAX_CLIENTS, RESERVED_CLIENTS};
use kvmscope::sampler::SamplerConfig;
use serde_json::Value;

const MEM: u64 = 64 << 20;

fn with_limits(limits: Limits) -> impl FnOnce(&mut kvmscope::run::RunConfig) {
    move |c| c.control_limits = limits
}

/// A raw client past its greeting (negotiated when asked).
fn raw(vm: &ServedVm, negotiate: bool) -> (UnixStream, BufReader<UnixStream>) {
    raw_at(&vm.socket, negotiate)
}

fn raw_at(socket: &std::path::Path, negotiate: bool) -> (UnixStream, BufReader<UnixStream>) {
    let s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut greeting = String::new();
    r.read_line(&mut greeting).unwrap();
    assert!(greeting.contains("\"QMP\""), "{greeting}");
    let mut s = s;
    if negotiate {
        s.write_all(b"{\"execute\":\"qmp_capabilities\"}\n")
            .unwrap();
        let mut ok = String::new();
        r.read_line(&mut ok).unwrap();
        assert!(ok.contains("\"return\""), "{ok}");
    }
    (s, r)
}

/// Asserts the server neither closed a raw client nor sent it anything
/// since its greeting.
fn assert_untouched(s: &UnixStream) {
    s.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 256];
    match (&*s).read(&mut buf) {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!(
            "a raw client was closed or sent to: {other:?} {:?}",
            String::from_utf8_lossy(&buf)
        ),
    }
}

/// A client in every slot, each waiting on a guest command (never evicted:
/// it has a request outstanding).
fn every_slot_busy(vm: &ServedVm) -> Vec<(UnixStream, BufReader<UnixStream>)> {
    (0..MAX_CLIENTS)
        .map(|_| {
            let (mut s, r) = raw(vm, true);
            s.write_all(b"{\"execute\":\"guest-command\",\"arguments\":{\"vcpu\":0,\"command\":\"dirty ws=1M rate=100/s for=30s\",\"wait\":true}}\n")
                .unwrap();
            (s, r)
        })
        .collect()
}

/// Asserts a newcomer is refused: every slot busy.
fn assert_refused_as_busy(vm: &ServedVm) {
    let early = UnixStream::connect(&vm.socket).unwrap();
    early
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let refused = line(&mut BufReader::new(early));
    assert!(
        refused["error"]["desc"]
            .as_str()
            .is_some_and(|d| d.contains("all are busy")),
        "{refused}"
    );
}

fn line(r: &mut BufReader<UnixStream>) -> Value {
    let mut l = String::new();
    r.read_line(&mut l).unwrap();
    serde_json::from_str(&l).unwrap_or_else(|e| panic!("{e}: {l:?}"))
}

#[test]
fn complete_requests_waiting_behind_a_long_one_keep_their_replies() {
    require_kvm!();
    let limits = Limits {
        request: Duration::from_millis(500),
        ..Limits::default()
    };
    let vm = ServedVm::start_with("hostile-pipeline", MEM, 1, with_limits(limits));
    let (mut s, mut r) = raw(&vm, true);
    // One write: a guest command that takes 1.5 s (three request deadlines),
    // then a query behind it.
    s.write_all(
        b"{\"execute\":\"guest-command\",\"arguments\":{\"vcpu\":0,\"command\":\"dirty ws=1M rate=1000/s for=1500ms\",\"wait\":true},\"id\":1}\
          {\"execute\":\"query-status\",\"id\":2}\n",
    )
    .unwrap();
    // Before: closed at the request deadline, both replies lost.
    let first = line(&mut r);
    assert_eq!(first["id"], 1, "{first}");
    assert!(first.get("return").is_some(), "{first}");
    let second = line(&mut r);
    assert_eq!(second["id"], 2, "{second}");
    assert_eq!(second["return"]["status"], "running", "{second}");
}

#[test]
fn a_client_closed_mid_reply_gets_no_byte_after_it() {
    require_kvm!();
    let limits = Limits {
        send: Duration::from_millis(500),
        ..Limits::default()
    };
    let vm = ServedVm::start_with("hostile-midline", MEM, 2, |c| {
        c.control_limits = limits;
        c.sampler = Some(SamplerConfig {
            interval: Duration::from_millis(1),
            capacity: 8192,
            out: None,
        });
    });
    let (mut s, _) = raw(&vm, true);
    // A page of samples is megabytes: far more than the socket holds.
    std::thread::sleep(Duration::from_secs(2));
    s.write_all(b"{\"execute\":\"query-samples\"}\n").unwrap();
    // Not read until the send deadline has closed the client.
    std::thread::sleep(Duration::from_secs(3));
    let mut all = Vec::new();
    s.read_to_end(&mut all).unwrap();
    assert!(
        all.len() > 64 << 10,
        "a reply larger than the socket buffer: {}",
        all.len()
    );
    // Before: the error line came straight after the partial reply, making
    // a line that is not JSON. Now: whole lines only, the cut one without
    // anything after it.
    let text = String::from_utf8_lossy(&all);
    let tail = &text[text.len().saturating_sub(200)..];
    assert!(
        !tail.contains("\"error\""),
        "an error after a partial reply: {tail}"
    );
}

#[test]
fn the_operator_gets_in_to_query_status_and_quit_when_every_client_is_busy() {
    require_kvm!();
    let vm = ServedVm::start("hostile-full", MEM, 1);
    let busy = every_slot_busy(&vm);
    // Before: refused ("all are busy"), so quit over the socket was impossible.
    let (mut op, mut r) = raw(&vm, true);
    op.write_all(b"{\"execute\":\"query-guest\"}\n").unwrap();
    let refused = line(&mut r);
    assert!(
        refused["error"]["desc"]
            .as_str()
            .is_some_and(|d| d.contains("reserved slot")),
        "{refused}"
    );
    op.write_all(b"{\"execute\":\"query-status\"}\n").unwrap();
    let status = line(&mut r);
    assert_eq!(status["return"]["status"], "running", "{status}");
    op.write_all(b"{\"execute\":\"quit\"}\n").unwrap();
    let mut vm = vm;
    vm.join();
    drop(busy);
}

/// Clients that poll faster than the idle eviction allows, every slot
/// taken, reserved ones too: the operator still gets in, in place of the
/// client that has held a reserved slot longest.
#[test]
fn clients_polling_in_every_slot_cannot_lock_the_operator_out() {
    require_kvm!();
    let vm = ServedVm::start("hostile-polling", MEM, 1);
    let busy = every_slot_busy(&vm);
    // Four pollers in the reserved slots, each asking every 200 ms (never
    // idle for the second the idle eviction waits for), until closed: what
    // each was told last.
    let pollers: Vec<_> = (0..RESERVED_CLIENTS)
        .map(|_| {
            let (mut s, mut r) = raw(&vm, true);
            std::thread::spawn(move || loop {
                // A write to a closed client may fail before it reads why.
                let _ = s.write_all(b"{\"execute\":\"query-status\"}\n");
                let mut l = String::new();
                if r.read_line(&mut l).unwrap_or(0) == 0 || !l.contains("\"return\"") {
                    return l;
                }
                std::thread::sleep(Duration::from_millis(200));
            })
        })
        .collect();
    // A second on, the operator gets in (before: refused for as long as
    // they polled) and can stop the VM.
    std::thread::sleep(Duration::from_millis(1300));
    let (mut op, mut r) = raw(&vm, true);
    op.write_all(b"{\"execute\":\"query-status\"}\n").unwrap();
    assert_eq!(line(&mut r)["return"]["status"], "running");
    op.write_all(b"{\"execute\":\"quit\"}\n").unwrap();
    let mut vm = vm;
    vm.join();
    let told: Vec<String> = pollers.into_iter().map(|p| p.join().unwrap()).collect();
    let made_room = told
        .iter()
        .filter(|l| l.contains("a reserved slot is held for a second"))
        .count();
    assert_eq!(made_room, 1, "one poller made room: {told:?}");
    drop(busy);
}

/// Clients in the reserved slots that start a request and never finish it
/// (or never read a reply) cannot keep the operator out either.
#[test]
fn half_sent_requests_in_every_reserved_slot_cannot_lock_the_operator_out() {
    require_kvm!();
    let vm = ServedVm::start("hostile-half", MEM, 1);
    let busy = every_slot_busy(&vm);
    let half: Vec<_> = (0..RESERVED_CLIENTS)
        .map(|_| {
            let (mut s, r) = raw(&vm, true);
            s.write_all(b"{\"execute\":").unwrap();
            (s, r)
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1300));
    // Before: refused until the request deadline (10 s) closed them, and
    // again as they came back.
    let (mut op, mut r) = raw(&vm, true);
    op.write_all(b"{\"execute\":\"quit\"}\n").unwrap();
    // SHUTDOWN, then the return, as QEMU sends them.
    assert_eq!(line(&mut r)["event"], "SHUTDOWN");
    assert!(line(&mut r)["return"].is_object());
    let mut vm = vm;
    vm.join();
    drop((busy, half));
}

/// A process that holds every slot and reconnects as soon as it is refused
/// cannot take the reserved slots as they free: they are for a process that
/// holds no connection (the operator's `kvmscope ctl`).
#[test]
fn a_process_holding_every_slot_and_retrying_cannot_keep_the_operator_out() {
    require_kvm!();
    let vm = ServedVm::start("hostile-churn", MEM, 1);
    let crowd = r#"
import socket, threading, time, sys
path, busy, reserved = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def conn():
    s = socket.socket(socket.AF_UNIX); s.connect(path); f = s.makefile("rwb")
    if b"QMP" not in f.readline(): return None, None
    f.write(b'{"execute":"qmp_capabilities"}\n'); f.flush(); f.readline()
    return s, f
held = []
for _ in range(busy):
    s, f = conn()
    f.write(b'{"execute":"guest-command","arguments":{"vcpu":0,"command":"dirty ws=1M rate=100/s for=30s","wait":true}}\n'); f.flush()
    held.append(s)
def poll():
    while True:
        try:
            s, f = conn()
            while s is not None:
                f.write(b'{"execute":"query-status"}\n'); f.flush()
                if not f.readline(): break
                time.sleep(0.2)
        except OSError:
            pass
        time.sleep(0.05)
for _ in range(reserved + 4):
    threading.Thread(target=poll, daemon=True).start()
print("ready", flush=True)
time.sleep(60)
"#;
    let mut child = common::KillOnDrop::new(
        std::process::Command::new("python3")
            .args(["-c", crowd])
            .arg(&vm.socket)
            .args([MAX_CLIENTS.to_string(), RESERVED_CLIENTS.to_string()])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3 runs (CI installs it)"),
    );
    let mut ready = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut ready)
        .unwrap();
    assert_eq!(ready.trim(), "ready");
    std::thread::sleep(Duration::from_millis(1500));
    // The operator, a process of its own, five times: in every time (before:
    // refused 12 of 12 times in a trial).
    for _ in 0..5 {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvmscope"))
            .args(["ctl", "--socket"])
            .arg(&vm.socket)
            .arg(r#"{"execute":"query-status"}"#)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && said.contains("running"),
            "{said} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    drop(child);
    vm.quit();
}

#[test]
fn clients_that_never_negotiated_are_not_evicted_for_a_new_one() {
    require_kvm!();
    let vm = ServedVm::start("hostile-evict", MEM, 1);
    let raw_clients: Vec<_> = (0..MAX_CLIENTS).map(|_| raw(&vm, false)).collect();
    std::thread::sleep(Duration::from_millis(1200));
    // A new client is served (in a reserved slot) ...
    let (mut s, mut r) = raw(&vm, true);
    s.write_all(b"{\"execute\":\"query-status\"}\n").unwrap();
    assert_eq!(line(&mut r)["return"]["status"], "running");
    // ... and none of the 64 was closed to make room (before: the longest
    // idle one was, though it never negotiated).
    for (s, _) in &raw_clients {
        assert_untouched(s);
    }
    vm.quit();
}

#[test]
fn clients_that_connect_and_say_nothing_cannot_lock_the_operator_out() {
    require_kvm!();
    let vm = ServedVm::start("hostile-silent", MEM, 1);
    // Every slot, the reserved ones too, taken by clients that never negotiate.
    let silent: Vec<_> = (0..MAX_CLIENTS + RESERVED_CLIENTS)
        .map(|_| raw(&vm, false))
        .collect();
    // Within a second of their connecting, none is closed for a newcomer.
    assert_refused_as_busy(&vm);
    // After it, the one that connected first makes room (before: refused
    // until the handshake deadline, 10 s, closed them).
    std::thread::sleep(Duration::from_millis(1200));
    let (mut op, mut r) = raw(&vm, true);
    op.write_all(b"{\"execute\":\"query-status\"}\n").unwrap();
    assert_eq!(line(&mut r)["return"]["status"], "running");
    let (_, first) = &silent[0];
    first
        .get_ref()
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut why = String::new();
    let mut first = BufReader::new(first.get_ref().try_clone().unwrap());
    first.read_line(&mut why).unwrap();
    assert!(why.contains("never negotiated"), "{why}");
    for (s, _) in &silent[1..] {
        assert_untouched(s);
    }
    vm.quit();
}

/// A VMM run as users run it (no RUST_LOG) says on stderr that it refuses
/// clients, once in a while rather than once per connection.
#[test]
fn refused_clients_are_warned_about_by_default_once_in_a_while() {
    require_kvm!();
    let dir = common::test_dir("hostile-warn");
    let (socket, stderr) = (dir.join("vm.sock"), dir.join("stderr"));
    let mut vmm = common::KillOnDrop::new(
        common::served_run(&socket)
            .env_remove("RUST_LOG")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap(),
    );
    // Renamed into place once it listens: no client needed to see it.
    common::wait_for("the control socket", Duration::from_secs(20), || {
        socket.exists().then_some(())
    });
    // From this process, another than the VMM's: the reserve is not for it
    // once it holds connections.
    let _silent: Vec<_> = (0..MAX_CLIENTS).map(|_| raw_at(&socket, false)).collect();
    for _ in 0..3 {
        let refused = UnixStream::connect(&socket).unwrap();
        refused
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let l = line(&mut BufReader::new(refused));
        assert!(l.to_string().contains("all are busy"), "{l}");
    }
    // SAFETY: a signal to the process this test started.
    assert_eq!(unsafe { libc::kill(vmm.id() as i32, libc::SIGTERM) }, 0);
    vmm.wait().unwrap();
    let said = std::fs::read_to_string(&stderr).unwrap();
    let warnings = said
        .matches("refused 1 client(s) since the last such warning")
        .count();
    assert_eq!(warnings, 1, "{said}");
    assert!(said.contains("all are busy"), "{said}");
}

#[test]
fn an_elf_with_nothing_to_load_is_a_load_error_said_once() {
    let dir = common::test_dir("hostile-elf");
    let run = |image: &[u8]| {
        let path = dir.join("guest.elf");
        std::fs::write(&path, image).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_kvmscope"))
            .args(["run", "--memory", "64M", "--guest"])
            .arg(&path)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    if !common::kvm_available() {
        return;
    }
    // An x86-64 ELF64 executable header with no program headers.
    let mut elf = vec![0u8; 64];
    elf[..7].copy_from_slice(b"\x7fELF\x02\x01\x01");
    elf[16..18].copy_from_slice(&2u16.to_le_bytes());
    elf[18..20].copy_from_slice(&62u16.to_le_bytes());
    elf[20..24].copy_from_slice(&1u32.to_le_bytes());
    // The entry point inside the image area, so that only the missing
    // segments are wrong.
    elf[24..32].copy_from_slice(&0x20_0000u64.to_le_bytes());
    elf[32..40].copy_from_slice(&64u64.to_le_bytes());
    elf[52..54].copy_from_slice(&64u16.to_le_bytes());
    elf[54..56].copy_from_slice(&56u16.to_le_bytes());
    // Before: accepted, then a guest failure (exit 2).
    let (code, err) = run(&elf);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("nothing to load"), "{err}");
    // Before: "Unable to read elf header" twice.
    let (code, err) = run(b"");
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(err.matches("Unable to read elf header").count(), 1, "{err}");
}

#[test]
fn a_client_cannot_queue_guest_commands_without_end() {
    require_kvm!();
    use kvmscope::client::Client;
    use kvmscope::vcpu::MAX_QUEUED_COMMANDS;
    use serde_json::json;
    let vm = ServedVm::start("hostile-queue", MEM, 1);
    let mut c = Client::connect(&vm.socket).unwrap();
    // The guest busy for the test's length, so nothing queued runs; the
    // wait taken off the queue before the count starts.
    c.execute(
        "guest-command",
        json!({"vcpu": 0, "command": "wait for=60s"}),
    )
    .unwrap();
    common::wait_for("the guest in its wait", Duration::from_secs(30), || {
        let (g, _) = c.execute("query-guest", json!({})).ok()?;
        (g[0]["queued"] == 0 && g[0]["state"] != "booting").then_some(())
    });
    // Batches of 4,000 (about 60 KiB a request) until one is refused.
    let batch = vec!["exits count=1"; 4000].join("; ");
    let mut accepted = 0;
    let refused = loop {
        match c.execute("guest-command", json!({"vcpu": 0, "command": batch})) {
            Ok(_) => accepted += 4000,
            Err(e) => break e.to_string(),
        }
        assert!(accepted <= MAX_QUEUED_COMMANDS, "{accepted} queued");
    };
    assert_eq!(accepted, MAX_QUEUED_COMMANDS / 4000 * 4000);
    assert!(
        refused.contains(&format!("{accepted} commands queued"))
            && refused.contains(&format!("at most {MAX_QUEUED_COMMANDS}")),
        "{refused}"
    );
    // Nothing of the refused batch was queued, and the VMM serves on.
    let (guest, _) = c.execute("query-guest", json!({})).unwrap();
    assert_eq!(guest[0]["queued"], accepted, "{guest}");
    let mut other = Client::connect(&vm.socket).unwrap();
    let (status, _) = other.execute("query-status", json!({})).unwrap();
    assert_eq!(status["status"], "running", "{status}");
    // A batch that fits what is left is still taken.
    let rest = MAX_QUEUED_COMMANDS - accepted;
    let fits = vec!["exits count=1"; rest].join("; ");
    c.execute("guest-command", json!({"vcpu": 0, "command": fits}))
        .unwrap();
    c.execute("quit", json!({})).unwrap();
    let mut vm = vm;
    vm.join();
}

/// A TCP socket with unsent data and SO_LINGER, sent to the VMM with a
/// request and closed here: the VMM's copy is the last, and closing it
/// would wait out the linger (30 s) on the control thread, every client
/// stalled meanwhile. The VMM takes such fds and closes them without
/// lingering.
#[test]
fn a_lingering_socket_sent_to_the_vmm_does_not_stall_its_control_thread() {
    use rustix::net::{sendmsg, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    use std::os::fd::AsFd;
    require_kvm!();
    let vm = ServedVm::start("hostile-linger", MEM, 1);
    // A TCP connection whose peer never reads, its send buffer filled.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let tcp = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (_peer, _) = listener.accept().unwrap();
    tcp.set_nonblocking(true).unwrap();
    let chunk = vec![0u8; 1 << 16];
    while (&tcp).write(&chunk).is_ok() {}
    rustix::net::sockopt::set_socket_linger(&tcp, Some(Duration::from_secs(30))).unwrap();
    let (s, _r) = raw(&vm, true);
    let fds = [tcp.as_fd()];
    let mut space = vec![std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    assert!(control.push(SendAncillaryMessage::ScmRights(&fds)));
    let line = b"{\"execute\":\"query-status\"}\n";
    let sent = sendmsg(
        &s,
        &[std::io::IoSlice::new(line)],
        &mut control,
        SendFlags::empty(),
    );
    // A kernel with SO_PASSRIGHTS (6.16+): the VMM takes no fd at all; an
    // older one: taken, and closed without lingering.
    if let Err(e) = sent {
        assert_eq!(e, rustix::io::Errno::PERM);
        // Ours is then the last: not to linger here either.
        rustix::net::sockopt::set_socket_linger(&tcp, None).unwrap();
    }
    drop(tcp);
    // Another client is answered at once (before: after the linger).
    let started = std::time::Instant::now();
    let mut c = vm.client();
    c.set_timeout(Some(Duration::from_secs(60))).unwrap();
    let (status, _) = c.execute("query-status", serde_json::json!({})).unwrap();
    assert_eq!(status["status"], "running");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "answered after {:?}",
        started.elapsed()
    );
    vm.quit();
}
