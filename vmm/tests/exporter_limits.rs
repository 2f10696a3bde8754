//! `kvmscope exporter`'s own bounds, alone in this test binary: it counts
//! the process's attach threads, which another test's exporter would add to.

mod common;

use common::exporter::up;

use std::os::unix::net::UnixListener;
use std::time::Duration;

use kvmscope::exporter::{MAX_ATTACHING, MAX_ATTACHING_PER_OWNER};

/// The tests here count this process's attach threads: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

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
    let _one_at_a_time = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let silent_dir = common::test_dir("exl-silent");
    let late_dir = common::test_dir("exl-late");
    // Ten times as many sockets that accept (the backlog does) and never
    // say a word as attaches may be in flight: before, one thread and one
    // connection each, without end (20,000 of them took an exporter down).
    let crowd = 10 * MAX_ATTACHING;
    // Root spreads them over six owners, who could hold 48 threads at 8
    // each: the bound in all holds; anyone else's are one owner's, held to
    // 8 threads.
    let owners = if rustix::process::geteuid().is_root() {
        6
    } else {
        1
    };
    let silent: Vec<UnixListener> = (0..crowd)
        .map(|i| {
            let path = silent_dir.join(format!("silent{i:03}.sock"));
            let l = UnixListener::bind(&path).unwrap();
            if owners > 1 {
                let uid = 60_000 + (i % owners) as u32;
                std::os::unix::fs::chown(&path, Some(uid), Some(uid)).unwrap();
            }
            l
        })
        .collect();
    let timeout = Duration::from_secs(1);
    let mut config = common::exporter::config(&silent_dir, timeout);
    config.dirs.push(late_dir.to_path_buf());
    let e = common::exporter::start(config);
    let tried = |p: &str| {
        (0..silent.len())
            .filter(|i| up(p, &format!("silent{i:03}.sock")).is_some())
            .count()
    };
    // The attach threads seen at once, until every one has been tried (ten
    // rounds of an attach timeout). A thread that has answered may not
    // have exited when the one after it starts: a few over the bound, never
    // the crowd.
    let mut most = 0;
    common::wait_for(
        "the first silent sockets down",
        Duration::from_secs(30),
        || {
            most = most.max(threads_named("exporter-attach"));
            (tried(&common::exporter::page(&e)) > 0).then_some(())
        },
    );
    // A VM its owner starts while the crowd is being tried goes first of
    // that owner's sockets never tried (newest first), not after them all.
    let late = late_dir.join("late.sock");
    let vm = common::ServedVm::start_with("exl-vm", 32 << 20, 1, |c| {
        c.socket = Some(late.clone());
    });
    let page = common::wait_for("the late VM up", Duration::from_secs(30), || {
        most = most.max(threads_named("exporter-attach"));
        Some(common::exporter::page(&e)).filter(|p| up(p, "late.sock") == Some(1.0))
    });
    let before = tried(&page);
    assert!(
        before < crowd / 2,
        "{before} of {crowd} silent sockets tried before the VM"
    );
    common::wait_for("every silent socket tried", Duration::from_secs(60), || {
        most = most.max(threads_named("exporter-attach"));
        (tried(&common::exporter::page(&e)) == crowd).then_some(())
    });
    let bound = MAX_ATTACHING.min(owners * MAX_ATTACHING_PER_OWNER);
    assert!(
        (bound..bound + 8).contains(&most),
        "attach threads at once: {most}, for a bound of {bound}"
    );
    drop(e);
    vm.quit();
}

/// One tenant's crowd of silent sockets does not keep another's VM
/// waiting: sockets are tried by owner in turn. (Root only: the crowd is
/// made another user's.)
#[test]
fn another_owners_crowd_of_silent_sockets_does_not_hold_up_a_vm() {
    require_kvm!();
    let _one_at_a_time = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: only root can give the crowd's sockets to another user");
        return;
    }
    let dir = common::test_dir("exl-owners");
    let crowd = 10 * MAX_ATTACHING;
    let silent: Vec<UnixListener> = (0..crowd)
        .map(|i| {
            let path = dir.join(format!("a-silent{i:03}.sock"));
            let l = UnixListener::bind(&path).unwrap();
            std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
            l
        })
        .collect();
    let e = common::exporter::over(&dir, Duration::from_secs(1));
    // Once the crowd is being tried, a VM of root's comes: found after
    // every silent socket.
    common::wait_for(
        "the first silent sockets down",
        Duration::from_secs(30),
        || {
            let p = common::exporter::page(&e);
            (0..silent.len())
                .any(|i| up(&p, &format!("a-silent{i:03}.sock")).is_some())
                .then_some(())
        },
    );
    let vm_socket = dir.join("z-vm.sock");
    let vm = common::ServedVm::start_with("exl-owner-vm", 32 << 20, 1, |c| {
        c.socket = Some(vm_socket.clone());
    });
    let page = common::wait_for("the VM up", Duration::from_secs(30), || {
        Some(common::exporter::page(&e)).filter(|p| up(p, "z-vm.sock") == Some(1.0))
    });
    let tried = (0..silent.len())
        .filter(|i| up(&page, &format!("a-silent{i:03}.sock")).is_some())
        .count();
    // Before: all 320 first, 10 attach timeouts; by owner, in its first turn.
    assert!(
        tried < crowd / 2,
        "{tried} of {crowd} silent sockets tried before the VM"
    );
    drop(e);
    vm.quit();
}
