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
    let clients: Vec<_> = (0..n)
        .map(|_| {
            let mut s = UnixStream::connect(&vm.socket).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
            let mut r = BufReader::new(s.try_clone().unwrap());
            line(&mut r);
            s.write_all(br#"{"execute":"qmp_capabilities"}{"execute":"query-samples"}"#)
                .unwrap();
            (s, r)
        })
        .collect();
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
