//! `kvmscope demo`: the whole story in one command. Starts a VMM as a child
//! process with a control socket, connects as a client, receives the stats fds
//! (so they really cross processes), drives the guest through phases over the
//! socket, and shows how KVM's stats and our own counters move in each.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use kvm_stats::{Change, Sample};

use super::stats::{receive, sample_all, Received};
use super::{Client, Error};
use crate::protocol::guest::GuestCommandReply;
use crate::protocol::migration::Parameters;
use crate::protocol::request::ReadinessRequest;
use crate::protocol::vm::VcpuExits;
use crate::protocol::{StatsTarget, VcpuRef, VcpuSelector};
use crate::units::format_bytes;
use kvm_stats::Mapped;

/// What `kvmscope demo` runs.
#[derive(Debug, Clone)]
pub struct DemoConfig {
    /// The `kvmscope` binary to start the VMM with (normally this one).
    pub exe: PathBuf,
    /// Guest RAM of the demo VM, bytes.
    pub memory: u64,
    /// Back guest RAM with transparent huge pages (`run --hugepages`).
    pub hugepages: bool,
    /// Bytes each memory phase covers.
    pub phase_size: u64,
    /// How long the VMM may take to start serving.
    pub startup_timeout: Duration,
}

/// The guest memory the demo's phases reach, in phases from the arena's
/// start: the migration's writer ends at the seventh.
const PHASES_REACHED: u64 = 7;

impl DemoConfig {
    /// Whether the demo's phases fit its guest: why not, naming the flags.
    ///
    /// # Errors
    /// The phases need more of the guest's memory than `memory` gives.
    pub fn check(&self) -> Result<(), String> {
        if self.phase_size == 0 {
            return Err("--phase-size must be above 0".into());
        }
        // The guest's workloads take whole pages (an offset of 3 KiB is
        // refused by the guest, mid-demo).
        if self.phase_size % 4096 != 0 {
            return Err(format!(
                "--phase-size {} is not a whole number of 4 KiB pages: give e.g. {}",
                format_bytes(self.phase_size),
                format_bytes(self.phase_size.next_multiple_of(4096))
            ));
        }
        let needed = self.phase_size.saturating_mul(PHASES_REACHED);
        // The guest's arena (as `boot::arena_size` lays it out): RAM past
        // the guest ABI's fixed pages.
        let arena = self.memory.saturating_sub(crate::abi::ARENA_BASE);
        if needed <= arena {
            return Ok(());
        }
        let memory = (needed + crate::abi::ARENA_BASE)
            .next_multiple_of(2 << 20)
            .max(crate::abi::MIN_MEMORY);
        let most = arena / PHASES_REACHED;
        let unit = if most >= 1 << 20 { 1 << 20 } else { 4096 };
        Err(format!(
            "--phase-size {} reaches {} into the guest's memory ({PHASES_REACHED} phases), and --memory {} leaves the guest {} for them: give at least --memory {} or a --phase-size of at most {}",
            format_bytes(self.phase_size),
            format_bytes(needed),
            format_bytes(self.memory),
            format_bytes(arena),
            format_bytes(memory),
            format_bytes(most / unit * unit),
        ))
    }
}

/// The VMM child: stopped if still running when dropped, whatever the path
/// out, and its socket files removed.
struct Vmm {
    child: Child,
    stdout: Option<ChildStdout>,
    /// The sockets it serves (its control socket; an incoming one).
    sockets: Vec<PathBuf>,
}

impl Vmm {
    fn spawn(config: &DemoConfig, socket: &Path) -> Result<Vmm, Error> {
        let mut args = vec![
            "--name".to_string(),
            DEMO_NAME.into(),
            "--memory".into(),
            config.memory.to_string(),
            // The dirty ring lets the readiness step measure the dirty rate.
            "--dirty-log".into(),
            "ring".into(),
        ];
        if config.hugepages {
            args.push("--hugepages".into());
        }
        Vmm::spawn_run(&config.exe, socket, &args)
    }

    /// `kvmscope run --socket SOCKET ARGS...` as a child.
    fn spawn_run(exe: &Path, socket: &Path, args: &[String]) -> Result<Vmm, Error> {
        let mut cmd = Command::new(exe);
        cmd.arg("run").arg("--socket").arg(socket).args(args);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        // SAFETY: the closure runs in the child between fork and exec and only
        // calls prctl, which is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                // If the demo dies without cleaning up, the VMM gets SIGTERM
                // (an orderly stop that removes the socket).
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            })
        };
        let mut child = cmd.spawn().map_err(Error::Child)?;
        let stdout = child.stdout.take();
        Ok(Vmm {
            child,
            stdout,
            sockets: vec![socket.to_path_buf()],
        })
    }

    /// `Err(ChildExited)` once the VMM has exited.
    fn check_running(&mut self) -> Result<(), Error> {
        match self.child.try_wait().map_err(Error::Child)? {
            Some(status) => Err(Error::ChildExited(status)),
            None => Ok(()),
        }
    }

    /// Waits for the VMM to exit (after `quit`) and returns what it printed.
    fn finish(mut self) -> Result<(std::process::ExitStatus, String), Error> {
        let mut text = String::new();
        if let Some(mut out) = self.stdout.take() {
            out.read_to_string(&mut text).map_err(Error::Child)?;
        }
        Ok((self.child.wait().map_err(Error::Child)?, text))
    }
}

impl Drop for Vmm {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // SIGTERM first: an orderly stop, which removes the sockets.
            if let Ok(pid) = libc::pid_t::try_from(self.child.id()) {
                // SAFETY: kill(2) on our own child's pid, not yet reaped.
                unsafe { libc::kill(pid, libc::SIGTERM) };
            }
            let deadline = Instant::now() + STOP_WAIT;
            while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        // A VMM that was killed, or failed, leaves them behind.
        for socket in &self.sockets {
            let _ = std::fs::remove_file(socket);
        }
    }
}

/// How long a VMM the demo stops may take to stop in order before it is killed.
const STOP_WAIT: Duration = Duration::from_secs(2);

/// The downtime limit the demo predicts and migrates with: the migration
/// parameters' default.
const DEMO_DOWNTIME: Duration = Duration::from_millis(Parameters::DEFAULT_DOWNTIME_LIMIT_MS);
/// The demo migration's link for a writer over `ws` bytes, bytes/s: one
/// that takes twice the downtime limit to send the working set, so that a
/// full-speed writer over it converges only when throttled.
fn demo_link(ws: u64) -> u64 {
    let limit_ms = u64::try_from(DEMO_DOWNTIME.as_millis())
        .unwrap_or(u64::MAX)
        .max(1);
    ws.saturating_mul(1000) / (2 * limit_ms)
}

/// The VM's name on both sides of the migration step: the `vm` label and
/// `query-name` stay the same when the guest moves.
const DEMO_NAME: &str = "kvmscope-demo";

/// The guest phases: name and workload command.
fn phases(size: u64) -> Vec<(&'static str, String)> {
    vec![
        (
            "touch: write a pattern into fresh pages",
            format!("touch size={size}"),
        ),
        (
            "touch-zero: write zeros into other fresh pages",
            format!("touch-zero offset={size} size={size}"),
        ),
        (
            "dirty: rewrite random pages of the first range, paced",
            format!("dirty ws={size} rate=20000/s for=200ms"),
        ),
        (
            "exits: port I/O and MMIO exits to the VMM",
            "exits count=1000".to_string(),
        ),
    ]
}

/// Runs the demo, writing the story to `out`.
///
/// # Errors
/// The VMM could not be started or reached, or a request failed.
pub fn run(config: &DemoConfig, out: &mut dyn Write) -> Result<(), Error> {
    let socket = std::env::temp_dir().join(format!("kvmscope-demo-{}.sock", std::process::id()));
    let mut vmm = Vmm::spawn(config, &socket)?;
    let started = Instant::now();
    let mut client =
        Client::connect_when_ready(&socket, config.startup_timeout, || vmm.check_running())?;
    client.bound_each_request(super::REPLY_TIMEOUT);
    let vm = client.query_vm()?;
    writeln!(
        out,
        "VM {:?}, VMM pid {} serving {} ({:.0} ms to start): {} vCPU, {} guest RAM{}, backend {}",
        client.greeting.qmp.kvmscope.vm.name,
        vm.pid,
        socket.display(),
        started.elapsed().as_secs_f64() * 1e3,
        vm.vcpus,
        format_bytes(config.memory),
        if config.hugepages {
            " (huge pages)"
        } else {
            ""
        },
        vm.backend.description,
    )?;
    // KVM's only: the demo shows what the kernel saw.
    let received = receive(&mut client, true, Some(VcpuSelector::All), false)?;
    let ids: Vec<&str> = received.iter().map(|r| r.stats.schema().id()).collect();
    writeln!(
        out,
        "received {} stats fds over SCM_RIGHTS: {}; every figure below is read through them\n",
        received.len(),
        ids.join(", ")
    )?;
    for (n, (what, command)) in phases(config.phase_size).into_iter().enumerate() {
        writeln!(out, "phase {}: {what}", n + 1)?;
        run_phase(&mut client, &received, &command, out)?;
    }
    // The scan reads the guest's RAM: its request gets a second per GiB more.
    client.bound_each_request(super::REPLY_TIMEOUT + scan_time(config.memory));
    readiness_step(&mut client, config.phase_size, out)?;
    client.bound_each_request(super::REPLY_TIMEOUT);
    migration_step(config, &socket, &mut client, out)?;
    client.quit()?;
    drop(client);
    let (status, summary) = vmm.finish()?;
    writeln!(
        out,
        "quit: the VMM exited ({status}); its own end-of-run summary:"
    )?;
    for line in summary.lines() {
        writeln!(out, "  | {line}")?;
    }
    Ok(())
}

/// Time beyond a request's usual to allow a scan of `memory` bytes of guest
/// RAM: a second per GiB, over ten times what it took (zero pages, the
/// slowest, at 14 GB/s; docs/EXPERIMENTS.md section 2) for a busy host.
fn scan_time(memory: u64) -> Duration {
    Duration::from_secs(memory.div_ceil(1 << 30))
}

/// The question the stats are for: is this guest ready to migrate? The guest
/// dirties memory in the background while the VMM estimates, scans and predicts.
fn readiness_step(client: &mut Client, size: u64, out: &mut dyn Write) -> Result<(), Error> {
    writeln!(out, "readiness: while the guest dirties {} at 2000 pages/s, ask the VMM for estimates, an exact scan and a pre-copy prediction (10 Gbit/s, {} ms)", format_bytes(size), DEMO_DOWNTIME.as_millis())?;
    let dirty = format!("dirty ws={size} rate=2000/s for=2s");
    client.guest_command(0, &dirty, false)?;
    let args = ReadinessRequest {
        scan: true,
        calc_time: Some(0.5),
        bandwidth: Some(1.25e9),
        max_downtime: Some(DEMO_DOWNTIME.as_secs_f64()),
    };
    let report = client.query_readiness(args, |_| {})?;
    for line in report.text.lines() {
        writeln!(out, "  {line}")?;
    }
    writeln!(out)?;
    Ok(())
}

/// The real thing: move the guest, mid-`dirty`, to a second kvmscope, and
/// check in the guest on the other side that its memory arrived whole.
fn migration_step(
    config: &DemoConfig,
    socket: &Path,
    client: &mut Client,
    out: &mut dyn Write,
) -> Result<(), Error> {
    let size = config.phase_size;
    let tmp = |suffix: &str| socket.with_extension(suffix);
    let (incoming, dst_socket) = (tmp("in.sock"), tmp("dst.sock"));
    let uri = format!("unix:{}", incoming.display());
    writeln!(out, "migration: start a second kvmscope with --incoming {uri}, write {} more, and move the guest there while it rewrites {} as fast as it can, over a {}/s link it cannot keep up with ({} ms downtime limit): --converge auto limits the writer from the start", format_bytes(size), format_bytes(4 * size), format_bytes(demo_link(4 * size)), DEMO_DOWNTIME.as_millis())?;
    let mut dst = Vmm::spawn_run(
        &config.exe,
        &dst_socket,
        &[
            "--incoming".into(),
            uri.clone(),
            "--name".into(),
            DEMO_NAME.into(),
        ],
    )?;
    dst.sockets.push(incoming.clone());
    let fresh = format!("touch offset={} size={size} pattern=0xd5", 2 * size);
    client.guest_command(0, &fresh, true)?;
    // Over four phases' worth, past the ranges checked on the other side:
    // a writer with a working set the link cannot send within the downtime.
    let dirty = format!("dirty offset={} ws={} rate=max for=4s", 3 * size, 4 * size);
    client.guest_command(0, &dirty, false)?;
    wait_listening(&mut dst, &incoming, config.startup_timeout)?;
    let mut report = Vec::new();
    let migrate = super::migrate::MigrateConfig {
        socket: socket.to_path_buf(),
        to: uri,
        bandwidth: Some(demo_link(4 * size)),
        max_downtime: Some(DEMO_DOWNTIME),
        max_rounds: None,
        predict: false,
        converge: Some(super::migrate::Converge::Auto),
        json: false,
        stop: None,
    };
    super::migrate::migrate(&migrate, &mut report)?;
    for line in String::from_utf8_lossy(&report).lines() {
        writeln!(out, "  {line}")?;
    }
    verify_on(&mut dst, &dst_socket, config, out)?;
    let _ = dst.finish()?;
    writeln!(
        out,
        "  the source stays paused (postmigrate) until quit, so the guest never runs twice
"
    )?;
    Ok(())
}

/// Waits until the destination listens at `incoming` (its socket file).
fn wait_listening(dst: &mut Vmm, incoming: &Path, timeout: Duration) -> Result<(), Error> {
    let deadline = Instant::now() + timeout;
    while !incoming.exists() {
        dst.check_running()?;
        if Instant::now() >= deadline {
            return Err(Error::NotReady(incoming.to_path_buf(), timeout));
        }
        // The other process's listening socket has no event to wait on.
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

/// Checks, in the guest on the destination, the range touched just before
/// the migration and the range zeroed by phase 2; then quits it.
fn verify_on(
    dst: &mut Vmm,
    dst_socket: &Path,
    config: &DemoConfig,
    out: &mut dyn Write,
) -> Result<(), Error> {
    let size = config.phase_size;
    let mut d =
        Client::connect_when_ready(dst_socket, config.startup_timeout, || dst.check_running())?;
    d.bound_each_request(super::REPLY_TIMEOUT);
    let vm = &d.greeting.qmp.kvmscope.vm;
    writeln!(
        out,
        "  the guest runs on as VM {:?} in VMM pid {}",
        vm.name, vm.pid
    )?;
    let check = format!(
        "verify offset={} size={size} pattern=0xd5; verify-zero offset={size} size={size}",
        2 * size
    );
    let done = d.guest_command(0, &check, true)?;
    for r in done.results.iter().flatten() {
        writeln!(
            out,
            "  on the destination, {}: {} pages checked, {} differ",
            r.command, r.values[0], r.values[2]
        )?;
    }
    d.quit()?;
    Ok(())
}

/// Runs one guest command on vCPU 0 and reports what moved meanwhile.
fn run_phase(
    client: &mut Client,
    received: &[Received],
    command: &str,
    out: &mut dyn Write,
) -> Result<(), Error> {
    let before = sample_all(received)?;
    let vcpu0 = || Some(vec![VcpuRef::Index(0)]);
    let ours_before = client.query_exits(vcpu0())?;
    let done = client.guest_command(0, command, true)?;
    let after = sample_all(received)?;
    let ours_after = client.query_exits(vcpu0())?;
    writeln!(out, "  {command}: {}", describe_results(&done))?;
    write!(out, "{}", report(received, &before, &after))?;
    let ours = match (ours_before.first(), ours_after.first()) {
        (Some(before), Some(after)) => counter_growth(before, after),
        _ => return Err(Error::BadReply("query-exits named no vCPU 0".into())),
    };
    writeln!(out, "  our counters: {ours}\n")?;
    Ok(())
}

fn describe_results(done: &GuestCommandReply) -> String {
    done.results
        .iter()
        .flatten()
        .map(|r| {
            format!(
                "{} in {:.1} ms (guest values [{}])",
                r.status,
                r.host_time_s * 1e3,
                r.values.map(|v| v.to_string()).join(",")
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// What moved between two samples of every received fd: the VM's mapped pages,
/// and each vCPU's cumulative stats that grew.
fn report(received: &[Received], before: &[Sample], after: &[Sample]) -> String {
    let mut text = String::new();
    for ((r, old), new) in received.iter().zip(before).zip(after) {
        let schema = r.stats.schema();
        if r.entry.target == StatsTarget::Vm {
            let (a, b) = (
                Mapped::from_sample(r.stats.schema(), old),
                Mapped::from_sample(r.stats.schema(), new),
            );
            text += &format!(
                "  vm:     pages_4k {}->{}, pages_2m {}->{}, pages_1g {}->{}; mapped {} -> {}\n",
                a.pages_4k,
                b.pages_4k,
                a.pages_2m,
                b.pages_2m,
                a.pages_1g,
                b.pages_1g,
                format_bytes(a.bytes()),
                format_bytes(b.bytes())
            );
            continue;
        }
        let delta = kvm_stats::delta(schema, old, new);
        let grew: Vec<String> = schema
            .iter()
            .filter_map(|(id, d)| match delta.get(id)? {
                Change::Cumulative { delta, .. } if *delta > 0 => Some(format!(
                    "{}+{}",
                    d.name,
                    kvm_stats::format::scalar(d, *delta)
                )),
                _ => None,
            })
            .collect();
        let shown = if grew.is_empty() {
            "nothing moved".to_string()
        } else {
            grew.join(" ")
        };
        text += &format!("  {}: {shown}\n", r.label());
    }
    text
}

/// Our counters (`query-exits` entries) that grew, as `name+delta`.
fn counter_growth(before: &VcpuExits, after: &VcpuExits) -> String {
    after
        .growth(before)
        .into_iter()
        .map(|(name, grew)| format!("{name}+{grew}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(memory: u64, phase_size: u64) -> DemoConfig {
        DemoConfig {
            exe: PathBuf::new(),
            memory,
            hugepages: false,
            phase_size,
            startup_timeout: Duration::ZERO,
        }
    }

    #[test]
    fn phases_that_do_not_fit_the_guest_are_refused_with_sizes_that_would() {
        const M: u64 = 1 << 20;
        assert_eq!(config(256 * M, 4 * M).check(), Ok(()), "the defaults");
        let why = config(32 * M, 4 * M).check().unwrap_err();
        assert!(
            why.contains("give at least --memory 36 MiB or a --phase-size of at most 3 MiB"),
            "{why}"
        );
        // What it suggests fits, either way.
        assert_eq!(config(36 * M, 4 * M).check(), Ok(()));
        assert_eq!(config(32 * M, 3 * M).check(), Ok(()));
        assert_eq!(
            config(256 * M, 0).check(),
            Err("--phase-size must be above 0".into())
        );
        let why = config(64 * M, 3 << 10).check().unwrap_err();
        assert!(why.contains("not a whole number of 4 KiB pages"), "{why}");
        assert_eq!(config(64 * M, 8 << 10).check(), Ok(()));
    }
}
