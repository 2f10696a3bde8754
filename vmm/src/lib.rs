//! kvmscope: a tiny VMM that shows the KVM binary statistics interface end to end.
//!
//! The binary (`bin/kvmscope/`) only parses the command line into config structs; the
//! engine is here. Threads of `kvmscope run`: the main thread (`run`), one
//! `vcpu<N>` thread per vCPU (`vcpu`), the `sampler`, the `control` plane with
//! its `readiness` and `migration` workers, the `metrics` server, a signal
//! thread that turns SIGINT/SIGTERM/SIGHUP into events, and on a migration's
//! destination a `prefetch` thread (README.md draws them).

// Values here come from the kernel, a peer, a guest or the user: casts must
// not lose, wrap or sign-flip them silently (conversions are checked, or go
// through `units::saturating_u64` and friends); and every public item says
// what it is.
#![warn(
    missing_docs,
    clippy::cast_lossless,
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap,
    clippy::cast_sign_loss
)]
// Items are `pub(crate)` unless the binary, the tests, the benches or the
// fuzz targets need them. Their docs still name the crate-private pieces
// they are built from: read them with `cargo doc --document-private-items`.
#![allow(rustdoc::private_intra_doc_links)]

pub use kvmscope_guest_abi as abi;
pub(crate) mod backend;
pub mod backing;
pub mod boot;
pub mod client;
pub mod control;
pub mod dirty;
pub mod exits;
pub mod exporter;
#[cfg(feature = "fuzzing")]
pub mod fuzz;
pub(crate) mod kick;
pub mod memory;
pub mod messages;
pub mod metrics;
pub mod migration;
#[cfg(feature = "plot")]
pub mod plot;
pub mod protocol;
pub mod readiness;
pub mod run;
pub(crate) mod runstate;
pub mod sampler;
pub(crate) mod scm;
pub mod signals;
pub(crate) mod socket_file;
pub mod summary;
pub mod units;
pub mod vcpu;
pub mod vm;
pub mod vmmstats;
pub(crate) mod wire;
pub mod workload;
pub mod x86_64;

/// Locks `m`, taking over a lock a panicked thread left: the data behind
/// every mutex here stays consistent between statements, and one thread's
/// panic must not take the VMM's other threads down with it.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Waits on `cv` until notified, or at most `timeout` when one is given,
/// taking over a poisoned lock as [`lock`] does.
pub(crate) fn wait<'a, T>(
    cv: &std::sync::Condvar,
    guard: std::sync::MutexGuard<'a, T>,
    timeout: Option<std::time::Duration>,
) -> std::sync::MutexGuard<'a, T> {
    match timeout {
        Some(t) => {
            cv.wait_timeout(guard, t)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0
        }
        None => cv
            .wait(guard)
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    }
}

/// Waits on `cv` while `condition` holds, at most `timeout`, taking over a
/// poisoned lock as [`lock`] does.
pub(crate) fn wait_while<'a, T>(
    cv: &std::sync::Condvar,
    guard: std::sync::MutexGuard<'a, T>,
    timeout: std::time::Duration,
    condition: impl FnMut(&mut T) -> bool,
) -> std::sync::MutexGuard<'a, T> {
    cv.wait_timeout_while(guard, timeout, condition)
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .0
}

/// For a long-lived process (the VMM, the exporter), called first thing in
/// `main`: buffers of 1 MiB and more (pages of samples queued for clients, replies
/// being built) get mappings of their own, unmapped when freed: the memory a
/// crowd of clients made the VMM take goes back when they go. glibc's default
/// threshold rises after the first such buffer is freed, after which they come
/// from the heap, which keeps them (measured: 81 MB resident 2 s after 60
/// unread pages were dropped, against 46 MB with this; docs/BENCHMARKS.md).
pub fn give_large_buffers_back() {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: mallopt only sets an allocator tunable; called before any
        // thread of the caller's exists; an error (0) leaves glibc's default in force.
        let set = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20) };
        if set == 0 {
            log::debug!("mallopt(M_MMAP_THRESHOLD) refused; large buffers stay on the heap");
        }
    }
}

/// An error with its sources, `a: b: c`, for one-line messages (replies,
/// warnings) where the binary's `{:#}` chain printing is not at hand.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text = format!("{text}: {s}");
        source = s.source();
    }
    text
}

/// A line on standard error, as `eprintln!` writes it, that is dropped where
/// standard error is gone (a closed pipe, a parent that died): `eprintln!`
/// panics there, and a VMM or a client must not end for want of a reader
/// of its messages.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}
