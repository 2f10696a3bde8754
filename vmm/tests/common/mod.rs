//! Helpers shared by the KVM integration tests.
#![allow(dead_code)]

use std::time::{Duration, Instant};

/// The stall's cost per fault that in-process test VMMs give (the
/// built-in default): the cost is one value for the whole process, which a
/// calibration at each served VM's start would change under the other tests
/// of the binary (`run_cli` tests the calibration through the binary).
pub const DEFAULT_FAULT_COST: Duration = Duration::from_nanos(2_600);

pub mod elf;
pub mod exporter;
pub mod migration;

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

/// Validates a metrics page with Prometheus's own parser (`promtool check
/// metrics`). Without promtool the check is skipped with a printed reason,
/// unless `KVMSCOPE_REQUIRE_KVM=1` (CI, which installs it), where that fails.
pub fn check_with_promtool(page: &str) {
    use std::io::Write as _;
    use std::process::{Command, Stdio};
    let spawned = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) if std::env::var("KVMSCOPE_REQUIRE_KVM").as_deref() == Ok("1") => {
            panic!("promtool is required in CI: {e}")
        }
        Err(e) => return eprintln!("skipping promtool validation: {e}"),
    };
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(page.as_bytes())
        .expect("writing to promtool");
    let out = child.wait_with_output().expect("waiting for promtool");
    assert!(
        out.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Open file descriptors of this process.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Runs `command` with its standard output a pipe nobody reads (`| head`
/// gone before the first line): its exit status and its standard error.
pub fn output_unread(command: &mut std::process::Command) -> (Option<i32>, String) {
    let mut child = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

// ---- Control socket (vmm/tests/control_*.rs) -------------------------------

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use kvmscope::client::Client;
use kvmscope::run::{self, RunConfig};
use kvmscope::summary::Summary;
use kvmscope::vm::VmConfig;

/// A unique socket path for one test, in a fresh directory under the temp
/// dir that its owner removes (`ServedVm` and `Dest` do when dropped); a
/// test that owns nothing else takes a [`test_dir`], removed for it.
pub fn socket_path(test: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("kvmscope-test-{}-{test}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("creating a test directory");
    dir.join("ctl.sock")
}

/// Whether a Unix socket at `path` is listening (`/proc/net/unix`'s
/// `__SO_ACCEPTCON` flag), not only bound: the path exists from `bind`, and a
/// connection made before `listen` is refused. For a socket bound where it
/// is (a migration destination's, QEMU's monitor); the table names a socket
/// by the path it was bound to, so one renamed into place after `listen`
/// (a VMM's control socket) is never found here, and needs no such wait.
pub fn unix_listening(path: &Path) -> bool {
    const ACCEPTCON: u32 = 0x0001_0000;
    let table = std::fs::read_to_string("/proc/net/unix").unwrap_or_default();
    table.lines().skip(1).any(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        f.len() >= 8
            && Path::new(f[7]) == path
            && u32::from_str_radix(f[3], 16).is_ok_and(|flags| flags & ACCEPTCON != 0)
    })
}

/// `kvmscope run` of a small VM (32 MiB, sampler off) serving its control
/// socket at `socket`: add workloads and output, then spawn.
pub fn served_run(socket: &Path) -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_kvmscope"));
    c.args([
        "run",
        "--memory",
        "32M",
        "--sample-interval",
        "off",
        "--socket",
    ])
    .arg(socket);
    c
}

/// A child process killed (and reaped) when dropped, so that a test that
/// fails leaves no VMM running: one that holds the test's stderr also keeps
/// `cargo test`'s output open.
pub struct KillOnDrop(Option<std::process::Child>);

impl KillOnDrop {
    /// Holds `child` until dropped.
    pub fn new(child: std::process::Child) -> KillOnDrop {
        KillOnDrop(Some(child))
    }

    /// Waits for the child and collects its piped output, as
    /// `Child::wait_with_output` (nothing is left to kill after).
    pub fn wait_with_output(mut self) -> std::io::Result<std::process::Output> {
        self.0
            .take()
            .expect("a child until dropped")
            .wait_with_output()
    }
}

impl std::ops::Deref for KillOnDrop {
    type Target = std::process::Child;
    fn deref(&self) -> &std::process::Child {
        self.0.as_ref().expect("a child until dropped")
    }
}

impl std::ops::DerefMut for KillOnDrop {
    fn deref_mut(&mut self) -> &mut std::process::Child {
        self.0.as_mut().expect("a child until dropped")
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let Some(child) = self.0.as_mut() else {
            return;
        };
        if child.try_wait().ok().flatten().is_none() {
            let _ = child.kill();
        }
        let _ = child.wait();
    }
}

/// A fresh directory under the temp dir for one test, removed with what is
/// in it when dropped (a test's sockets, fake stats files and images).
pub struct TestDir(tempfile::TempDir);

impl std::ops::Deref for TestDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        self.0.path()
    }
}

impl AsRef<Path> for TestDir {
    fn as_ref(&self) -> &Path {
        self
    }
}

impl AsRef<std::ffi::OsStr> for TestDir {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.path().as_os_str()
    }
}

/// A `TestDir` named after the test and this process.
pub fn test_dir(test: &str) -> TestDir {
    tempfile::Builder::new()
        .prefix(&format!("kvmscope-test-{}-{test}-", std::process::id()))
        .tempdir()
        .map(TestDir)
        .expect("creating a test directory")
}

/// A VMM run in this process (`run::run` on a thread) serving a control socket.
pub struct ServedVm {
    pub socket: PathBuf,
    thread: Option<JoinHandle<Result<Summary, run::Error>>>,
    /// The socket's directory was made for it (and goes with it); one its
    /// `adjust` chose is the caller's.
    owns_dir: bool,
}

impl ServedVm {
    /// Starts a VMM with `memory` bytes and `vcpus` vCPUs, no workload, and
    /// waits (bounded) until its socket accepts.
    pub fn start(test: &str, memory: u64, vcpus: usize) -> ServedVm {
        Self::start_with(test, memory, vcpus, |_| {})
    }

    /// Like `start`, with `adjust` changing the run's config first (dirty
    /// logging, the sampler...).
    pub fn start_with(
        test: &str,
        memory: u64,
        vcpus: usize,
        adjust: impl FnOnce(&mut RunConfig),
    ) -> ServedVm {
        let socket = socket_path(test);
        let mut config = RunConfig {
            vm: VmConfig {
                memory,
                vcpus,
                ..VmConfig::default()
            },
            workloads: Vec::new(),
            socket: Some(socket.clone()),
            fault_cost: Some(DEFAULT_FAULT_COST),
            ..RunConfig::demo()
        };
        adjust(&mut config);
        // Where `adjust` may have moved it (then the directory made for it
        // goes now, and the one it chose is the caller's).
        let moved = config.socket.clone().expect("a VMM that serves a socket");
        let owns_dir = moved == socket;
        if !owns_dir {
            if let Some(unused) = socket.parent() {
                let _ = std::fs::remove_dir_all(unused);
            }
        }
        let socket = moved;
        let thread = std::thread::spawn(move || run::run(config));
        let mut vm = ServedVm {
            socket,
            thread: Some(thread),
            owns_dir,
        };
        let running = |vm: &ServedVm| vm.thread.as_ref().is_some_and(|t| !t.is_finished());
        let ready = Client::connect_when_ready(&vm.socket, Duration::from_secs(20), || {
            if running(&vm) {
                Ok(())
            } else {
                Err(kvmscope::client::Error::Closed)
            }
        });
        if let Err(e) = ready {
            let result = vm.thread.take().map(|t| t.join());
            panic!(
                "the VMM did not start serving: {e} (run: {:?})",
                result.map(|r| r.map(|s| s.map(|_| ())))
            );
        }
        vm
    }

    /// A client past its greeting, with a 30 s bound on every read and write.
    pub fn client(&self) -> Client {
        let c = Client::connect(&self.socket).expect("connecting to the VMM");
        c.set_timeout(Some(Duration::from_secs(30)))
            .expect("setting a timeout");
        c
    }

    /// Sends `quit` and returns the run's summary.
    pub fn quit(mut self) -> Summary {
        let mut c = self.client();
        c.execute("quit", serde_json::json!({})).expect("quit");
        self.join()
    }

    /// Waits for the run to end (after `quit`, or a failure).
    pub fn join(&mut self) -> Summary {
        let thread = self.thread.take().expect("joined once");
        thread
            .join()
            .expect("the VMM thread panicked")
            .expect("the run failed")
    }

    pub fn dir(&self) -> &Path {
        self.socket.parent().expect("the socket is in a directory")
    }
}

impl Drop for ServedVm {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            if let Ok(mut c) = Client::connect(&self.socket) {
                let _ = c.execute("quit", serde_json::json!({}));
            }
            let _ = t.join();
        }
        if self.owns_dir {
            let _ = std::fs::remove_dir_all(self.dir());
        }
    }
}

// ---- Metrics page (vmm/tests/sampler_cli.rs, run_cli.rs) -------------------

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("binding a loopback port")
        .port()
}

/// The body of `GET /metrics` on a loopback port, or `None` if nothing answers
/// with a page (not serving yet, or gone).
pub fn scrape(port: u16) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(15))).ok()?;
    write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_string())
}

/// The word right after the first `marker` in `text`, parsed (`None` where
/// there is no such marker or the word does not parse): a figure in a log
/// line or a report, e.g. `number_after(log, "costs the guest ")`.
pub fn number_after<T: std::str::FromStr>(text: &str, marker: &str) -> Option<T> {
    text.split(marker).nth(1)?.split(' ').next()?.parse().ok()
}

/// The sum of the samples of metric `name` whose labels include each of
/// `labels` (e.g. `reason="io_out"`), or `None` if the page has none.
pub fn metric(page: &str, name: &str, labels: &[&str]) -> Option<f64> {
    let values: Vec<f64> = page
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (n, rest) = series.split_once('{').unwrap_or((series, ""));
            (n == name && labels.iter().all(|want| rest.contains(want))).then_some(value)
        })
        .filter_map(|v| v.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}
