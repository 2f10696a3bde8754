//! The sampler on real KVM: what it records, its bounds, its exports.

mod common;

use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kvmscope::metrics::MetricsServer;
use kvmscope::sampler::record::{parse_csv, parse_jsonl, Point};
use kvmscope::sampler::{Sampler, SamplerConfig};
use kvmscope::vm::{Vm, VmConfig};
use kvmscope::workload::parse_sequence;

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("kvmscope-test-{}-{name}", std::process::id()))
}

fn vm(vcpus: usize) -> Vm {
    Vm::new(VmConfig {
        memory: 64 << 20,
        vcpus,
        ..VmConfig::default()
    })
    .unwrap()
}

fn start_sampler(vm: &Vm, interval_ms: u64, capacity: usize, out: Option<PathBuf>) -> Sampler {
    let config = SamplerConfig {
        interval: Duration::from_millis(interval_ms),
        capacity,
        out: out.map(Into::into),
    };
    Sampler::start(
        config,
        &vm.fd_file().unwrap(),
        vm.vcpu_fds(),
        vm.vcpus().iter().map(|v| v.shared.clone()).collect(),
        kvmscope::sampler::SampledVm {
            name: "test-vm".into(),
            memory: vm.config().memory,
        },
    )
    .unwrap()
}

fn wait_results(vm: &Vm, vcpu: usize, n: usize) {
    common::wait_for("commands to finish", Duration::from_secs(30), || {
        (vm.vcpus()[vcpu].shared.results().len() >= n).then_some(())
    });
}

/// Runs `spec` on vCPU 0 with a sampler at `interval_ms`, stops, returns the file's text.
fn sampled_run(spec: &str, interval_ms: u64, file: &str) -> (String, Vec<Point>) {
    require_kvm_or_skip();
    let path = temp(file);
    let mut vm = vm(1);
    let mut sampler = start_sampler(&vm, interval_ms, 100_000, Some(path.clone()));
    sampler.commit_export().unwrap();
    let cmds = parse_sequence(spec).unwrap();
    let n = cmds.len();
    vm.push_commands(0, cmds);
    vm.start().unwrap();
    wait_results(&vm, 0, n);
    // One more tick after the last command, so the series holds the final state.
    let seq = sampler.shared.last_seq();
    assert!(sampler.shared.wait_after(seq + 1, Duration::from_secs(5)));
    assert!(vm.stop(Duration::from_secs(1)).is_empty());
    sampler.stop().unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    (text, sampler.shared.since(0).0)
}

fn require_kvm_or_skip() {
    assert!(common::kvm_available(), "callers check KVM first");
}

#[test]
fn touch_raises_mapped_bytes_by_at_least_the_pages_touched() {
    require_kvm!();
    let (text, _) = sampled_run(
        "wait for=30ms; touch size=4M; wait for=30ms",
        2,
        "touch.jsonl",
    );
    let (_, points) = parse_jsonl(&text).unwrap();
    let first = points.first().unwrap().mapped_bytes();
    let last = points.last().unwrap().mapped_bytes();
    assert!(
        last - first >= 4 << 20,
        "mapped bytes rose {first} -> {last}"
    );
    assert!(
        points
            .iter()
            .any(|p| p.vcpus[0].phase & 0xff == kvmscope::abi::CMD_TOUCH),
        "the touch phase marker was sampled"
    );
}

#[test]
fn counters_never_go_down_across_samples() {
    require_kvm!();
    let (text, _) = sampled_run(
        "touch size=2M; exits count=300; dirty ws=1M rate=5000/s for=100ms",
        1,
        "mono.jsonl",
    );
    let (header, points) = parse_jsonl(&text).unwrap();
    assert!(points.len() > 10);
    for pair in points.windows(2) {
        let (a, b) = (&pair[0].vcpus[0], &pair[1].vcpus[0]);
        assert!(pair[1].seq > pair[0].seq && pair[1].time_s >= pair[0].time_s);
        for (i, (x, y)) in a.kvm.iter().zip(&b.kvm).enumerate() {
            assert!(y >= x, "KVM {} went down: {x} -> {y}", header.kvm_stats[i]);
        }
        for (x, y) in a.ours.iter().zip(&b.ours) {
            assert!(y >= x, "our counter went down: {x} -> {y}");
        }
        assert!(b.progress >= a.progress, "the guest's count went down");
    }
    // The guest's own count: 512 pages touched, 600 exits, ~500 writes.
    let last = &points.last().unwrap().vcpus[0];
    assert!(
        (512 + 600 + 400..512 + 600 + 600).contains(&last.progress),
        "{}",
        last.progress
    );
    assert!(
        points.iter().any(|p| p.vcpus[0].progress_per_s > 0.0),
        "a tick saw the count move"
    );
    let exits = header
        .kvm_stats
        .iter()
        .position(|n| n == "exits")
        .expect("exits recorded");
    assert!(points.last().unwrap().vcpus[0].kvm[exits] >= 600);
}

#[test]
fn jsonl_export_matches_the_ring() {
    require_kvm!();
    let (text, ring) = sampled_run("touch size=1M; exits count=50", 2, "ring.jsonl");
    let (header, points) = parse_jsonl(&text).unwrap();
    assert_eq!(points, ring, "file and ring hold the same points");
    assert_eq!(header.vcpus, 1);
    assert_eq!(header.memory, 64 << 20);
    assert!(header.backend["kind"].is_string());
}

#[test]
fn csv_export_matches_the_ring() {
    require_kvm!();
    let (text, ring) = sampled_run("touch size=1M; exits count=50", 2, "ring.csv");
    let (_, points) = parse_csv(&text).unwrap();
    assert_eq!(points.len(), ring.len());
    for (p, r) in points.iter().zip(&ring) {
        assert_eq!(
            (p.seq, p.pages_4k, p.pages_2m, p.mapped_bytes()),
            (r.seq, r.pages_4k, r.pages_2m, r.mapped_bytes())
        );
        assert_eq!(
            (&p.vcpus[0].kvm, &p.vcpus[0].ours, p.vcpus[0].phase),
            (&r.vcpus[0].kvm, &r.vcpus[0].ours, r.vcpus[0].phase)
        );
        assert_eq!(p.vcpus[0].progress, r.vcpus[0].progress);
    }
}

#[test]
fn ring_keeps_its_bound_however_long_it_runs() {
    require_kvm!();
    let vm = vm(1);
    let sampler = start_sampler(&vm, 1, 8, None);
    assert!(sampler.shared.wait_after(0, Duration::from_secs(5)));
    common::wait_for("50 ticks", Duration::from_secs(10), || {
        (sampler.shared.last_seq() >= 50).then_some(())
    });
    let (points, dropped) = sampler.shared.since(0);
    assert_eq!(points.len(), 8);
    assert_eq!(dropped + 8, points.last().unwrap().seq);
    assert!(points.windows(2).all(|w| w[1].seq == w[0].seq + 1));
}

#[test]
fn bad_sampler_config_is_rejected() {
    require_kvm!();
    let vm = vm(1);
    let start = |interval, capacity, out: Option<PathBuf>| {
        Sampler::start(
            SamplerConfig {
                interval,
                capacity,
                out: out.map(Into::into),
            },
            &vm.fd_file().unwrap(),
            vm.vcpu_fds(),
            vec![],
            kvmscope::sampler::SampledVm {
                name: "test-vm".into(),
                memory: 1,
            },
        )
    };
    assert!(start(Duration::from_micros(10), 8, None)
        .err()
        .unwrap()
        .to_string()
        .contains("1 ms minimum"));
    assert!(start(Duration::from_millis(5), 1, None)
        .err()
        .unwrap()
        .to_string()
        .contains("from 2 to"));
    assert!(start(Duration::from_millis(5), 8, Some(temp("x.txt")))
        .err()
        .unwrap()
        .to_string()
        .contains("unknown extension"));
}

#[test]
fn sixty_four_vcpus_sample_correctly() {
    require_kvm!();
    let mut vm = Vm::new(VmConfig {
        memory: 64 << 20,
        vcpus: 64,
        ..VmConfig::default()
    })
    .unwrap();
    let sampler = start_sampler(&vm, 5, 1000, None);
    for i in 0..64 {
        vm.push_commands(i, parse_sequence("exits ports=5 mmio=0").unwrap());
    }
    vm.start().unwrap();
    for i in 0..64 {
        wait_results(&vm, i, 1);
    }
    let seq = sampler.shared.last_seq();
    assert!(sampler.shared.wait_after(seq + 1, Duration::from_secs(5)));
    let (points, _) = sampler.shared.since(seq);
    let last = points.last().unwrap();
    assert_eq!(last.vcpus.len(), 64);
    let io_out = kvmscope::exits::Reason::IoOut as usize;
    for (i, v) in last.vcpus.iter().enumerate() {
        assert!(
            v.ours[io_out] >= 5,
            "vcpu{i} recorded {} port writes",
            v.ours[io_out]
        );
    }
    assert!(vm.stop(Duration::from_secs(2)).is_empty());
}

fn fetch(addr: std::net::SocketAddr, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn metrics_page_passes_promtool() {
    require_kvm!();
    let mut vm = vm(2);
    let sampler = start_sampler(&vm, 2, 100, None);
    vm.push_commands(1, parse_sequence("touch size=1M; exits count=20").unwrap());
    vm.start().unwrap();
    wait_results(&vm, 1, 2);
    let seq = sampler.shared.last_seq();
    assert!(sampler.shared.wait_after(seq + 1, Duration::from_secs(5)));
    let server =
        MetricsServer::start("127.0.0.1:0".parse().unwrap(), Arc::clone(&sampler.shared)).unwrap();
    let reply = fetch(server.addr, "/metrics");
    let (head, body) = reply.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(body.contains("kvmscope_mapped_bytes{"), "{body}");
    assert!(body.contains("kvmscope_kvm_vcpu_exits_total{") && body.contains("vcpu=\"1\""));
    assert!(body.contains("kvmscope_exits_total{") && body.contains("reason=\"io_out\""));
    assert!(
        body.contains("_bucket{") && body.contains("le=\"+Inf\""),
        "KVM histograms become Prometheus histograms"
    );
    assert!(fetch(server.addr, "/other").starts_with("HTTP/1.1 404"));
    common::check_with_promtool(body);
    assert!(vm.stop(Duration::from_secs(1)).is_empty());
}
