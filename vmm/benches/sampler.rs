//! Sampler cost: time per tick for the VM and N vCPUs (N = 1, 8, 64), and the
//! slowdown of guest `touch` and `dirty` workloads with the sampler at 1 kHz
//! against no sampler, as a ratio measured in one run.
//! `cargo bench -p kvmscope --bench sampler`.

mod common;

use std::time::Duration;

use common::{median, percentile};
use kvmscope::sampler::{Sampler, SamplerConfig};
use kvmscope::vm::{Vm, VmConfig};
use kvmscope::workload::parse_sequence;

fn sampler(vm: &Vm, interval: Duration) -> Sampler {
    let config = SamplerConfig {
        interval,
        capacity: 4096,
        out: None,
    };
    Sampler::start(
        config,
        &vm.fd_file().expect("VM fd"),
        vm.vcpu_fds(),
        vm.vcpus().iter().map(|v| v.shared.clone()).collect(),
        kvmscope::sampler::SampledVm {
            name: "test-vm".into(),
            memory: vm.config().memory,
        },
    )
    .expect("sampler")
}

/// Median and p99 of the whole-tick time over `ticks` ticks.
fn tick_cost(vcpus: usize, ticks: u64) -> (f64, f64) {
    let vm = Vm::new(VmConfig {
        memory: 32 << 20,
        vcpus,
        ..Default::default()
    })
    .expect("VM");
    let s = sampler(&vm, Duration::from_millis(1));
    let mut costs = Vec::new();
    let mut seq = 0;
    while costs.len() < ticks as usize {
        s.shared.wait_after(seq, Duration::from_secs(1));
        seq = s.shared.last_seq();
        costs.push(
            s.shared
                .last_tick_ns
                .load(std::sync::atomic::Ordering::Relaxed) as f64,
        );
    }
    (median(&mut costs), percentile(&mut costs, 0.99))
}

/// Runs the workload once; returns (touch ns per page, dirty writes per second).
fn workload(with_sampler: bool) -> (f64, f64) {
    let mut vm = Vm::new(VmConfig {
        memory: 128 << 20,
        ..Default::default()
    })
    .expect("VM");
    let _s = with_sampler.then(|| sampler(&vm, Duration::from_millis(1)));
    vm.push_commands(
        0,
        parse_sequence("touch size=64M; dirty ws=32M rate=max for=500ms").expect("spec"),
    );
    vm.start().expect("start");
    let results = loop {
        let r = vm.vcpus()[0].shared.results();
        if r.len() == 2 {
            break r;
        }
        vm.next_event(Duration::from_millis(50));
    };
    vm.stop(Duration::from_secs(1));
    (
        results[0].host_time.as_nanos() as f64 / results[0].values[0] as f64,
        results[1].values[0] as f64 / 0.5,
    )
}

fn main() {
    if !common::kvm_available("sampler") {
        return;
    }
    println!(
        "sampler tick (VM + N vCPU stats fds, one pread each, point, ring), 1 kHz, 1000 ticks:"
    );
    for n in [1, 8, 64] {
        let (p50, p99) = tick_cost(n, 1000);
        println!(
            "  N = {n:>2}: p50 {:>7.1} us, p99 {:>7.1} us",
            p50 / 1e3,
            p99 / 1e3
        );
    }
    let rounds = 5;
    let (mut touch_ratio, mut dirty_ratio) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let (t_off, d_off) = workload(false);
        let (t_on, d_on) = workload(true);
        touch_ratio.push(t_on / t_off);
        dirty_ratio.push(d_off / d_on);
    }
    println!("guest slowdown with the sampler at 1 kHz vs off (median of {rounds} alternating pairs; 1.00 = none):");
    println!(
        "  touch 64 MiB (time per page)     : {:.3}x",
        median(&mut touch_ratio)
    );
    println!(
        "  dirty rate=max (writes per second): {:.3}x",
        median(&mut dirty_ratio)
    );
}
