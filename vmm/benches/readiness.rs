//! Readiness costs. `cargo bench -p kvmscope --bench readiness`.
//! - the mapped-page estimate (one VM stats read) against guest size;
//! - the zero-page scan on resident memory beside a plain memory-read loop;
//! - the scan of a mostly-untouched 16 GiB guest (never-backed pages skipped);
//! - guest slowdown while the dirty rate is measured (bitmap and ring).

mod common;

use std::hint::black_box;
use std::time::{Duration, Instant};

use common::median;
use kvmscope::dirty::DirtyMode;
use kvmscope::readiness::scan::{self, Ram};
use kvmscope::readiness::{measure_vm, Options};
use kvmscope::vm::{Vm, VmConfig};
use kvmscope::workload::parse_sequence;

const GIB: u64 = 1 << 30;

fn vm(memory: u64, dirty: Option<DirtyMode>, spec: &str) -> Vm {
    let mut vm = Vm::new(VmConfig {
        memory,
        dirty_log: dirty,
        ..Default::default()
    })
    .expect("VM");
    vm.push_commands(0, parse_sequence(spec).expect("spec"));
    vm.start().expect("start");
    vm
}

fn wait_results(vm: &Vm, n: usize) {
    while vm.vcpus()[0].shared.results().len() < n {
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn estimate_cost() {
    println!("mapped-page estimate (one pread of the VM stats fd), median of 10 000:");
    for gib in [1, 4, 16] {
        let mut vm = vm(gib * GIB, None, "touch size=16M");
        wait_results(&vm, 1);
        let mut sample = vm.vm_stats().new_sample();
        let mut times = Vec::new();
        for _ in 0..10_000 {
            let t = Instant::now();
            vm.vm_stats().read_sample(&mut sample).expect("read");
            times.push(t.elapsed().as_nanos() as f64);
        }
        println!("  {gib:>2} GiB guest: {:>7.2} us", median(&mut times) / 1e3);
        vm.stop(Duration::from_secs(1));
    }
}

/// Sums the memory as u64 words: the plain read loop the scan is held against.
fn plain_read(bytes: &[u8]) -> u64 {
    bytes.chunks_exact(8).fold(0u64, |acc, w| {
        acc.wrapping_add(u64::from_ne_bytes([
            w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7],
        ]))
    })
}

fn scan_throughput() {
    // 1 GiB of resident, all-zero memory: the scan's worst case (every byte read).
    let len = GIB as usize;
    // Write every page so the host backs it with real memory (a fresh zeroed
    // allocation maps the shared zero page, which would make reads look free).
    let mut buf = vec![0u8; len];
    buf.fill(1);
    buf.fill(0);
    black_box(&buf);
    let ram = Ram::from_slice(&buf);
    let (mut scan_s, mut plain_s) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let t = Instant::now();
        black_box(scan::scan(&ram, None, 0..0, |_, _| {
            std::ops::ControlFlow::Continue(())
        }));
        scan_s.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        black_box(plain_read(black_box(&buf)));
        plain_s.push(t.elapsed().as_secs_f64());
    }
    let (s, p) = (median(&mut scan_s), median(&mut plain_s));
    println!("zero-page scan on 1 GiB of resident zero pages (median of 5):");
    println!(
        "  scan           : {:>6.2} GB/s ({:.1} ms)",
        GIB as f64 / s / 1e9,
        s * 1e3
    );
    println!(
        "  plain read loop: {:>6.2} GB/s ({:.1} ms)",
        GIB as f64 / p / 1e9,
        p * 1e3
    );
    println!("  scan / plain   : {:>6.2}x the time", s / p);
}

fn readiness_of(vm: &Vm, options: &Options) -> kvmscope::readiness::Report {
    measure_vm(vm, options, |_, _| {}).expect("readiness")
}

fn sparse_scan() {
    let mut vm = vm(16 * GIB, None, "touch size=64M");
    wait_results(&vm, 1);
    let options = Options {
        calc_time: Duration::ZERO,
        scan: true,
        ..Options::default()
    };
    let mut times: Vec<f64> = (0..5)
        .map(|_| {
            readiness_of(&vm, &options)
                .scan
                .expect("scan")
                .took
                .as_secs_f64()
        })
        .collect();
    println!("exact scan of a 16 GiB guest with 64 MiB touched (mincore + read of backed pages, guest paused), median of 5: {:.1} ms", median(&mut times) * 1e3);
    vm.stop(Duration::from_secs(1));
}

/// Guest writes per second of `dirty rate=max` with and without a dirty-rate measurement running.
fn dirty_slowdown(mode: DirtyMode) -> f64 {
    let run = |measuring: bool| {
        let mut vm = vm(256 << 20, Some(mode), "dirty ws=64M rate=max for=1500ms");
        std::thread::sleep(Duration::from_millis(100));
        if measuring {
            readiness_of(
                &vm,
                &Options {
                    calc_time: Duration::from_secs(1),
                    scan: false,
                    ..Options::default()
                },
            );
        }
        wait_results(&vm, 1);
        let writes = vm.vcpus()[0].shared.results()[0].values[0] as f64;
        vm.stop(Duration::from_secs(1));
        writes
    };
    let mut ratios: Vec<f64> = (0..3).map(|_| run(false) / run(true)).collect();
    median(&mut ratios)
}

fn main() {
    if !common::kvm_available("readiness") {
        return;
    }
    estimate_cost();
    scan_throughput();
    sparse_scan();
    println!("guest slowdown of dirty rate=max while measuring the dirty rate (writes/s off ÷ on, median of 3; dirty logging on in both):");
    println!("  dirty-bitmap: {:.3}x", dirty_slowdown(DirtyMode::Bitmap));
    println!(
        "  dirty-ring  : {:.3}x",
        dirty_slowdown(DirtyMode::Ring(4096))
    );
}
