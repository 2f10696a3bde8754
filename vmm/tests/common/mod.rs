//! Helpers shared by the KVM integration tests.
#![allow(dead_code)]

use std::time::{Duration, Instant};

/// Whether KVM tests can run. Without /dev/kvm they are skipped with a printed
/// reason, unless `KVMSCOPE_REQUIRE_KVM=1` (CI), where a missing KVM fails the test.
pub fn kvm_available() -> bool {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        Ok(_) => true,
        Err(e) => {
            let reason = format!("/dev/kvm cannot be opened: {e}");
            if std::env::var("KVMSCOPE_REQUIRE_KVM").as_deref() == Ok("1") {
                panic!("KVMSCOPE_REQUIRE_KVM=1 but {reason}");
            }
            eprintln!("skipping KVM test: {reason}");
            false
        }
    }
}

/// Skips the calling test when KVM is not available (see `kvm_available`).
#[macro_export]
macro_rules! require_kvm {
    () => {
        if !common::kvm_available() {
            return;
        }
    };
}

/// Polls `check` until it returns `Some`, failing after `limit`.
pub fn wait_for<T>(what: &str, limit: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Open file descriptors of this process.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}
