//! `kvmscope exporter`'s own bounds, alone in this test binary: it counts
//! the process's attach threads, which another test's exporter would add to.

mod common;

use common::exporter::up;

use std::os::unix::net::UnixListener;
use std::time::{Duration, Instant};

use kvmscope::exporter::MAX_ATTACHING;

/// This process's threads named `name`.
fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim_end() == name)
        })
        .count()
}

#[test]
fn a_directory_of_silent_sockets_holds_at_most_max_attaching_attaches_and_a_vm_still_comes() {
    require_kvm!();
    let silent_dir = common::test_dir("exl-silent");
    let late_dir = common::test_dir("exl-late");
    // More sockets that accept (the backlog does) and never say a word
    // than attaches may be in flight: before, one thread and one connection
    // each, without end (20,000 of them took an exporter down).
    let silent: Vec<UnixListener> = (0..MAX_ATTACHING + 16)
        .map(|i| UnixListener::bind(silent_dir.join(format!("silent{i:03}.sock"))).unwrap())
        .collect();
    let timeout = Duration::from_secs(1);
    let mut config = common::exporter::config(&silent_dir, timeout);
    config.dirs.push(late_dir.to_path_buf());
    let e = common::exporter::start(config);
    let started = Instant::now();
    let mut most = 0;
    // The silent ones fill every slot, and are tried again only after
    // RETRY_AFTER (5 s): within two attach timeouts (and the rescans
    // between) every one has been tried once and is down.
    while started.elapsed() < 2 * timeout + Duration::from_millis(800) {
        most = most.max(threads_named("exporter-attach"));
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(most, MAX_ATTACHING, "attach threads at once");
    let p = common::exporter::page(&e);
    for i in 0..silent.len() {
        let name = format!("silent{i:03}.sock");
        assert_eq!(up(&p, &name), Some(0.0), "{name}: {p}");
    }
    // A VM that comes now is attached ahead of the silent ones' retries.
    let late = late_dir.join("late.sock");
    let vm = common::ServedVm::start_with("exl-vm", 32 << 20, 1, |c| {
        c.socket = Some(late.clone());
    });
    common::wait_for("the late VM up", Duration::from_secs(10), || {
        (up(&common::exporter::page(&e), "late.sock") == Some(1.0)).then_some(())
    });
    drop(e);
    assert_eq!(
        threads_named("exporter-attach"),
        0,
        "attach threads after a stop"
    );
    vm.quit();
}
