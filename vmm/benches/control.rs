//! Control socket round trips: `get-stats-fd` and `query-stats` latency (p50,
//! p99) from one client, and requests per second from 8 clients at once,
//! against an idle in-process VMM; and, for scale, one read of a received
//! stats fd. Run: `cargo bench -p kvmscope --bench control` (needs /dev/kvm).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use kvmscope::client::Client;
use kvmscope::run::{self, RunConfig};
use kvmscope::vm::VmConfig;
use serde_json::{json, Value};

const ROUND_TRIPS: usize = 5000;
const CLIENTS: usize = 8;
const LOAD_TIME: Duration = Duration::from_secs(2);

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

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
    times.sort_unstable();
    (percentile(&times, 0.5), percentile(&times, 0.99))
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
    times.sort_unstable();
    (percentile(&times, 0.5), percentile(&times, 0.99))
}

fn main() {
    if std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_err()
    {
        eprintln!("control bench: /dev/kvm cannot be opened; skipped");
        return;
    }
    let socket: PathBuf =
        std::env::temp_dir().join(format!("kvmscope-bench-{}.sock", std::process::id()));
    let config = RunConfig {
        vm: VmConfig {
            memory: 64 << 20,
            vcpus: 1,
            ..VmConfig::default()
        },
        workloads: Vec::new(),
        socket: Some(socket.clone()),
        ..RunConfig::demo()
    };
    let vmm = std::thread::spawn(move || run::run(config));
    let mut client = Client::connect_when_ready(&socket, Duration::from_secs(20), || Ok(()))
        .expect("the VMM serves");
    println!("| request | p50 (us) | p99 (us) |\n|---|---|---|");
    for (command, args, label) in &cases() {
        latency(&mut client, command, args, ROUND_TRIPS / 10);
        let (p50, p99) = latency(&mut client, command, args, ROUND_TRIPS);
        println!("| {label} | {} | {} |", us(p50), us(p99));
    }
    let (p50, p99) = read_latency(&mut client);
    println!(
        "| (for scale) one read of a received vCPU stats fd | {} | {} |",
        us(p50),
        us(p99)
    );
    println!("\n| {CLIENTS} clients, back to back for {LOAD_TIME:?} | requests/s |\n|---|---|");
    for (command, args, label) in cases().into_iter().take(4) {
        println!("| {label} | {:.0} |", throughput(&socket, command, args));
    }
    client.execute("quit", json!({})).expect("quit");
    vmm.join().expect("VMM thread").expect("run");
}
