//! Clients that ask for large pages and do not read them cannot hold more
//! than the server's reply budget: past it, a page is refused with an error
//! naming the budget, and a fresh client is still answered.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use common::ServedVm;
use kvmscope::control::MAX_TOTAL_QUEUED;
use kvmscope::sampler::SamplerConfig;
use serde_json::{json, Value};

const MEM: u64 = 64 << 20;

fn line(r: &mut BufReader<UnixStream>) -> Value {
    let mut text = String::new();
    r.read_line(&mut text).unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {} bytes", text.len()))
}

/// A client that negotiates and asks for a page of samples, and reads nothing yet.
fn asks_for_a_page(socket: &std::path::Path) -> (UnixStream, BufReader<UnixStream>) {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    line(&mut r);
    s.write_all(br#"{"execute":"qmp_capabilities"}{"execute":"query-samples"}"#)
        .unwrap();
    (s, r)
}

#[test]
fn pages_nobody_reads_are_refused_past_the_reply_budget() {
    require_kvm!();
    let vm = ServedVm::start_with("budget", MEM, 2, |c| {
        c.sampler = Some(SamplerConfig {
            interval: Duration::from_millis(1),
            capacity: 8192,
            out: None,
        });
        // Reading every page back takes a debug build a while: only the
        // budget may refuse a page here, not the send deadline.
        c.control_limits.send = Duration::from_secs(600);
    });
    let mut c = vm.client();
    let page = common::wait_for("a full page of points", Duration::from_secs(60), || {
        let (v, _) = c.execute("query-samples", json!({})).unwrap();
        (v["more"] == true).then(|| v.to_string().len())
    });
    // Enough clients that their pages together are twice the budget.
    let n = (2 * MAX_TOTAL_QUEUED / page + 1).min(60);
    let clients: Vec<_> = (0..n).map(|_| asks_for_a_page(&vm.socket)).collect();
    // A fresh client is answered while they sit on their pages (this also
    // lets the server take every request above before any is read).
    let (status, _) = c.execute("query-status", json!({})).unwrap();
    assert_eq!(status["status"], "running");
    let mut refused = 0;
    for (_, mut r) in clients.into_iter().rev() {
        assert_eq!(line(&mut r), json!({"return": {}}));
        let reply = line(&mut r);
        if let Some(desc) = reply["error"]["desc"].as_str() {
            assert!(desc.contains("budget"), "{reply}");
            refused += 1;
        } else {
            assert!(reply["return"]["samples"].is_array());
        }
    }
    assert!(refused > 0, "{n} pages of {page} bytes were all queued");
}

/// The process's resident set and its peak, bytes.
fn rss(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| -> u64 {
        let line = status.lines().find(|l| l.starts_with(name)).unwrap();
        line.split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<u64>()
            .unwrap()
            << 10
    };
    (field("VmRSS:"), field("VmHWM:"))
}

#[test]
fn the_memory_of_pages_nobody_read_is_given_back_when_their_clients_go() {
    require_kvm!();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("vm.sock");
    let mut child = common::KillOnDrop::new(
        std::process::Command::new(env!("CARGO_BIN_EXE_kvmscope"))
            .args([
                "run",
                "--memory",
                "64M",
                "--vcpus",
                "8",
                "--sample-interval",
                "1ms",
            ])
            .args(["--sample-buffer", "2048"])
            // No calibration VM of its own (128 MiB, a 64 MiB sweep) whose
            // memory, taken and given back in the background, would fall in
            // the RSS measured here.
            .args(["--fault-cost", "2.6us", "--socket"])
            .arg(&socket)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let pid = child.id();
    common::wait_for("the socket", Duration::from_secs(30), || {
        socket.exists().then_some(())
    });
    let mut c = kvmscope::client::Client::connect(&socket).unwrap();
    // The ring full, so that the sampler's own memory no longer grows.
    common::wait_for("a full ring", Duration::from_secs(120), || {
        let (v, _) = c.execute("query-samples", json!({"max": 1})).unwrap();
        (v["last-seq"].as_u64() > Some(2500)).then_some(())
    });
    let (before, _) = rss(pid);
    let clients: Vec<_> = (0..30).map(|_| asks_for_a_page(&socket)).collect();
    // Each request served: its negotiation answered and the first byte of
    // its page (or of the budget's refusal) sent.
    let mut clients: Vec<_> = clients
        .into_iter()
        .map(|(s, mut r)| {
            assert_eq!(line(&mut r), json!({"return": {}}));
            let mut byte = [0u8];
            std::io::Read::read_exact(&mut r, &mut byte).unwrap();
            (s, r)
        })
        .collect();
    let (_, peak) = rss(pid);
    clients.clear();
    let taken = peak.saturating_sub(before);
    assert!(
        taken > 40 << 20,
        "the pages took only {} MiB (RSS before {} MiB, at the peak {} MiB)",
        taken >> 20,
        before >> 20,
        peak >> 20
    );
    let kept = common::wait_for(
        "the pages' memory given back",
        Duration::from_secs(20),
        || {
            let (now, _) = rss(pid);
            let kept = now.saturating_sub(before);
            (kept < 12 << 20).then_some(kept)
        },
    );
    eprintln!(
        "before {} MiB, peak {} MiB, {} MiB kept after",
        before >> 20,
        peak >> 20,
        kept >> 20
    );
    let _ = c.execute("quit", json!({}));
    let _ = child.wait();
}
