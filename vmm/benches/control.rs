//! Control socket round trips: `get-stats-fd` and `query-stats` latency (p50,
//! p99) from one client, and requests per second from 8 clients at once,
//! against an idle in-process VMM; and, for scale, one read of a received
//! stats fd. Run: `cargo bench -p kvmscope --bench control` (needs /dev/kvm).

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::percentile;
use kvmscope::client::Client;
use kvmscope::run::{self, RunConfig};
use kvmscope::vm::VmConfig;
use serde_json::{json, Value};

const ROUND_TRIPS: usize = 5000;
const CLIENTS: usize = 8;
const LOAD_TIME: Duration = Duration::from_secs(2);

fn us(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e6)
}

/// Latency of `n` round trips of `command`; the fds received are closed each time.
fn latency(client: &mut Client, command: &str, args: &Value, n: usize) -> (Duration, Duration) {
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let (_, fds) = client.execute(command, args.clone()).expect("request");
        drop(fds);
        times.push(t.elapsed());
    }
    (percentile(&mut times, 0.5), percentile(&mut times, 0.99))
}

/// Requests per second with `CLIENTS` clients sending `command` back to back.
fn throughput(socket: &Path, command: &'static str, args: Value) -> f64 {
    let start = Arc::new(Barrier::new(CLIENTS));
    let threads: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (socket, start, args) = (socket.to_path_buf(), start.clone(), args.clone());
            std::thread::spawn(move || {
                let mut c = Client::connect(&socket).expect("connect");
                start.wait();
                let t = Instant::now();
                let mut done = 0u64;
                while t.elapsed() < LOAD_TIME {
                    drop(c.execute(command, args.clone()).expect("request"));
                    done += 1;
                }
                done as f64 / t.elapsed().as_secs_f64()
            })
        })
        .collect();
    threads
        .into_iter()
        .map(|t| t.join().expect("client thread"))
        .sum()
}

/// The requests measured: command, arguments, label.
fn cases() -> Vec<(&'static str, Value, &'static str)> {
    vec![
        (
            "get-stats-fd",
            json!({"target": "vm"}),
            "get-stats-fd vm (fresh KVM_GET_STATS_FD)",
        ),
        (
            "get-stats-fd",
            json!({"target": "vcpu", "vcpu": 0}),
            "get-stats-fd vcpu 0 (dup)",
        ),
        ("query-stats", json!({"target": "vm"}), "query-stats vm"),
        ("query-stats", json!({"target": "vcpu"}), "query-stats vcpu"),
        ("query-vm", json!({}), "query-vm"),
    ]
}

/// p50 and p99 of one read of a vCPU stats fd received over the socket.
fn read_latency(client: &mut Client) -> (Duration, Duration) {
    let (_, fds) = client
        .execute("get-stats-fd", json!({"target": "vcpu", "vcpu": 0}))
        .expect("fd");
    let stats = kvm_stats::StatsFd::new(fds.into_iter().next().expect("one fd")).expect("stats fd");
    let mut sample = stats.new_sample();
    let mut times: Vec<Duration> = (0..ROUND_TRIPS)
        .map(|_| {
            let t = Instant::now();
            stats.read_sample(&mut sample).expect("read");
            t.elapsed()
        })
        .collect();
    (percentile(&mut times, 0.5), percentile(&mut times, 0.99))
}

/// Keeps the calling thread, and the threads it starts from now on, on `cpus`.
fn pin(cpus: &[usize]) {
    // SAFETY: an all-zero cpu_set_t is an empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        // SAFETY: CPU_SET only writes bit `cpu` of the set we own (cpu < 1024).
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    // SAFETY: sched_setaffinity reads `set`, of the size we pass; pid 0 is this thread.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    assert_eq!(
        rc,
        0,
        "sched_setaffinity: {}",
        std::io::Error::last_os_error()
    );
}

/// Starts an idle 64 MiB, 1-vCPU VMM in this process; its threads inherit
/// this thread's CPU affinity.
fn start_vmm(
    socket: &Path,
) -> (
    Client,
    std::thread::JoinHandle<Result<kvmscope::summary::Summary, run::Error>>,
) {
    let config = RunConfig {
        vm: VmConfig {
            memory: 64 << 20,
            vcpus: 1,
            ..VmConfig::default()
        },
        workloads: Vec::new(),
        socket: Some(socket.to_path_buf()),
        ..RunConfig::demo()
    };
    let vmm = std::thread::spawn(move || run::run(config));
    let client = Client::connect_when_ready(socket, Duration::from_secs(20), || Ok(()))
        .expect("the VMM serves");
    (client, vmm)
}

/// p50/p99 of every case.
fn latencies(client: &mut Client) -> Vec<(Duration, Duration)> {
    cases()
        .iter()
        .map(|(command, args, _)| {
            latency(client, command, args, ROUND_TRIPS / 10);
            latency(client, command, args, ROUND_TRIPS)
        })
        .collect()
}

fn main() {
    if !common::kvm_available("control") {
        return;
    }
    let socket: PathBuf =
        std::env::temp_dir().join(format!("kvmscope-bench-{}.sock", std::process::id()));
    let all_cpus: Vec<usize> =
        (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect();
    // Client and control thread on one CPU: no cross-CPU wakeups.
    pin(&[0]);
    let (mut client, vmm) = start_vmm(&socket);
    let same_cpu = latencies(&mut client);
    client.execute("quit", json!({})).expect("quit");
    vmm.join().expect("VMM thread").expect("run");
    // Anywhere the scheduler puts them.
    pin(&all_cpus);
    let (mut client, vmm) = start_vmm(&socket);
    let any_cpu = latencies(&mut client);
    println!("| request | p50 / p99 (us), one CPU | p50 / p99 (us), any CPU |\n|---|---|---|");
    for ((_, _, label), (a, b)) in cases().iter().zip(same_cpu.iter().zip(&any_cpu)) {
        println!(
            "| {label} | {} / {} | {} / {} |",
            us(a.0),
            us(a.1),
            us(b.0),
            us(b.1)
        );
    }
    let (p50, p99) = read_latency(&mut client);
    println!(
        "| (for scale) one read of a received vCPU stats fd | | {} / {} |",
        us(p50),
        us(p99)
    );
    println!(
        "\n| {CLIENTS} clients, back to back for {LOAD_TIME:?}, any CPU | requests/s |\n|---|---|"
    );
    for (command, args, label) in cases().into_iter().take(4) {
        println!("| {label} | {:.0} |", throughput(&socket, command, args));
    }
    client.execute("quit", json!({})).expect("quit");
    vmm.join().expect("VMM thread").expect("run");
}
