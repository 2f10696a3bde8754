//! Clients that pipeline requests: complete requests waiting behind a reply
//! are back-pressure, never an unfinished request; and every line a client
//! reads is whole JSON (a reply is sent whole, or the connection closes
//! without another byte).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use common::ServedVm;
use kvmscope::sampler::SamplerConfig;
use serde_json::{json, Value};

const MEM: u64 = 64 << 20;

/// A negotiated raw connection.
fn raw(vm: &ServedVm) -> (UnixStream, BufReader<UnixStream>) {
    let mut s = UnixStream::connect(&vm.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut greeting = String::new();
    r.read_line(&mut greeting).unwrap();
    s.write_all(br#"{"execute":"qmp_capabilities"}"#).unwrap();
    assert_eq!(line(&mut r), json!({"return": {}}));
    (s, r)
}

fn line(r: &mut BufReader<UnixStream>) -> Value {
    let mut text = String::new();
    r.read_line(&mut text).unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| {
        let tail = &text[text.len().saturating_sub(200)..];
        panic!(
            "a line of {} bytes is not JSON ({e}): ...{tail:?}",
            text.len()
        )
    })
}

/// A VMM sampling every millisecond with a 200 ms request deadline, waited
/// on until its ring holds `points`.
fn sampled_vm(
    test: &str,
    points: u64,
    limits: impl FnOnce(&mut kvmscope::control::Limits),
) -> ServedVm {
    let vm = ServedVm::start_with(test, MEM, 2, |c| {
        c.sampler = Some(SamplerConfig {
            interval: Duration::from_millis(1),
            capacity: 8192,
            out: None,
        });
        limits(&mut c.control_limits);
    });
    let mut c = vm.client();
    common::wait_for("sampler points", Duration::from_secs(60), || {
        let (v, _) = c.execute("query-samples", json!({"max": 1})).unwrap();
        (v["last-seq"].as_u64() >= Some(points)).then_some(())
    });
    vm
}

#[test]
fn a_request_waiting_behind_a_long_guest_command_is_answered() {
    require_kvm!();
    let vm = ServedVm::start_with("pipe-wait", MEM, 1, |c| {
        c.control_limits.request = Duration::from_millis(300);
    });
    let (mut s, mut r) = raw(&vm);
    // Both complete, in one write: the second waits behind the first's
    // reply for longer than the request deadline.
    s.write_all(
        br#"{"execute":"guest-command","arguments":{"vcpu":0,"command":"wait for=2s","wait":true},"id":1}
{"execute":"query-status","id":2}"#,
    )
    .unwrap();
    let first = line(&mut r);
    assert_eq!(first["id"], 1, "{first}");
    assert!(first.get("return").is_some(), "{first}");
    let second = line(&mut r);
    assert_eq!(second["id"], 2, "{second}");
    assert!(second["return"]["status"].is_string(), "{second}");
}

#[test]
fn three_hundred_pipelined_pages_are_all_answered() {
    require_kvm!();
    let vm = sampled_vm("pipe-pages", 256, |l| {
        l.request = Duration::from_millis(200);
    });
    let (s, mut r) = raw(&vm);
    const N: usize = 300;
    let mut writer = s.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        let req = br#"{"execute":"query-samples","arguments":{"max":256}}"#;
        let all: Vec<u8> = req.iter().copied().cycle().take(req.len() * N).collect();
        writer.write_all(&all)
    });
    for i in 0..N {
        // Before each `line` parses, it is checked to be JSON: an error line
        // glued to a cut reply fails here.
        let reply = line(&mut r);
        assert!(
            reply["return"]["samples"].is_array(),
            "reply {i} of {N}: {reply}"
        );
    }
    sender.join().unwrap().unwrap();
}
