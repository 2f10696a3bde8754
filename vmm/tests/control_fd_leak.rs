//! The VMM leaks no fd, whatever its clients do. One test in its own binary, so
//! that no other test opens or closes fds while it counts `/proc/self/fd`.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;

use common::ServedVm;
use serde_json::json;

/// Connects and sends `bytes`, reading nothing back before closing.
fn hit_and_run(vm: &ServedVm, bytes: &[u8]) {
    let mut s = UnixStream::connect(&vm.socket).unwrap();
    let _ = s.write_all(bytes);
}

#[test]
fn no_fd_is_left_open_after_every_kind_of_client_and_quit() {
    require_kvm!();
    let before = common::open_fds();
    let vm = ServedVm::start("leak", 64 << 20, 2);
    // Fds received and dropped by a well-behaved client.
    let mut good = vm.client();
    for target in [
        json!({"target": "vm"}),
        json!({"target": "vcpu", "vcpu": "all"}),
    ] {
        let (_, fds) = good.execute("get-stats-fd", target).unwrap();
        assert!(!fds.is_empty());
    }
    // Replies with fds that are never received: queued, in flight, then dropped.
    let mut flood = b"{\"execute\":\"qmp_capabilities\"}".to_vec();
    flood.extend(
        b"{\"execute\":\"get-stats-fd\",\"arguments\":{\"target\":\"vcpu\"}}\n".repeat(2000),
    );
    hit_and_run(&vm, &flood);
    // Malformed, unknown, too long.
    hit_and_run(&vm, b"nonsense\n{\"execute\":\"nope\"}\n");
    let mut long = b"{\"a\":\"".to_vec();
    long.resize(kvmscope::protocol::framing::MAX_VALUE + 10, b'x');
    hit_and_run(&vm, &long);
    // More clients than the limit.
    let crowd: Vec<UnixStream> = (0..kvmscope::control::MAX_CLIENTS + 10)
        .map(|_| UnixStream::connect(&vm.socket).unwrap())
        .collect();
    for s in &crowd {
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line).unwrap();
    }
    drop(crowd);
    // A guest command still works, then the VMM quits.
    good.execute(
        "guest-command",
        json!({"vcpu": 1, "command": "touch size=1M", "wait": true}),
    )
    .unwrap();
    drop(good);
    vm.quit();
    assert_eq!(
        common::open_fds(),
        before,
        "every fd the VMM opened is closed"
    );
}
