//! Starting to log dirty pages, manual protect (`KVM_CLEAR_DIRTY_LOG` in
//! 64 MiB chunks, initially set) against the whole-slot fallback.
//! `cargo bench -p kvmscope --bench dirty`.
//! - the VMM's cost of starting a window (subscribe → armed) on a guest
//!   started without a mode (the bitmap turned on at run time), 512 MiB of it
//!   written just before, by guest size;
//! - a migration's start: logging on with nothing armed, then each 64 MiB
//!   range armed as pass 0 reads it;
//! - the same on a VM that logs from boot (what a readiness window needs),
//!   with and without 512 MiB written since the last look;
//! - the guest's stall: writes of `dirty rate=max` in the 100 ms segment in
//!   which the window starts, against the segments before it.
//!
//! Guest RAM is reserved, not backed: only the touched 512 MiB is.

mod common;

use std::time::{Duration, Instant};

use common::median;
use kvmscope::dirty::DirtyMode;
use kvmscope::vm::{Vm, VmConfig};
use kvmscope::workload::parse_sequence;

const GIB: u64 = 1 << 30;
const TOUCH: &str = "touch size=512M";
const SEGMENT: &str = "dirty ws=4M rate=max for=100ms";

fn vm(memory: u64, manual: bool) -> Vm {
    vm_with(memory, manual, None)
}

fn vm_with(memory: u64, manual: bool, dirty_log: Option<DirtyMode>) -> Vm {
    let mut vm = Vm::new(VmConfig {
        memory,
        dirty_manual_protect: manual,
        dirty_log,
        ..Default::default()
    })
    .expect("VM");
    vm.start().expect("start");
    vm
}

fn run(vm: &mut Vm, spec: &str) {
    let n = vm.vcpus()[0].shared.results().len() + parse_sequence(spec).expect("spec").len();
    vm.push_commands(0, parse_sequence(spec).expect("spec"));
    wait_results(vm, n);
}

fn wait_results(vm: &Vm, n: usize) {
    while vm.vcpus()[0].shared.results().len() < n {
        std::thread::sleep(Duration::from_micros(200));
    }
}

fn path(manual: bool) -> &'static str {
    if manual {
        "manual protect"
    } else {
        "whole slot    "
    }
}

/// Median and largest time of `subscribe` over 5 windows, 512 MiB rewritten
/// before each (so that there is as much mapped to protect each time).
fn start_cost(memory: u64, manual: bool) -> (f64, f64) {
    windows(&mut vm(memory, manual), true)
}

/// The same on a VM that logs from boot (`--dirty-log bitmap`, what a
/// readiness window needs), manual protect: the start folds what was written
/// since the last look and protects it again. `rewrite`: 512 MiB written
/// before each window (as above); otherwise written once, before a first
/// window that is not counted, and nothing since.
fn start_cost_from_boot(memory: u64, rewrite: bool) -> (f64, f64) {
    let mut vm = vm_with(memory, true, Some(DirtyMode::Bitmap));
    run(&mut vm, TOUCH);
    drop(vm.dirty().subscribe().expect("subscribe"));
    windows(&mut vm, rewrite)
}

/// Times 5 `subscribe`s (`rewrite`: `TOUCH` before each), then stops the VM.
fn windows(vm: &mut Vm, rewrite: bool) -> (f64, f64) {
    let mut times = Vec::new();
    for _ in 0..5 {
        if rewrite {
            run(vm, TOUCH);
        }
        let t = Instant::now();
        let window = vm.dirty().subscribe().expect("subscribe");
        times.push(t.elapsed().as_secs_f64() * 1e3);
        drop(window);
    }
    vm.stop(Duration::from_secs(1));
    let max = times.iter().copied().fold(0.0, f64::max);
    (median(&mut times), max)
}

/// A migration's start on a guest without a mode (manual protect): turning
/// logging on with nothing armed (`subscribe_unarmed`), then arming every
/// 64 MiB range as pass 0 would, each just before it is read. Medians over 5
/// starts, 512 MiB rewritten before each: (start, all the arming, the
/// longest single range's arming), in ms.
fn migration_start(memory: u64) -> (f64, f64, f64) {
    let mut vm = vm(memory, true);
    let (mut starts, mut totals, mut longest) = (Vec::new(), Vec::new(), Vec::new());
    let pages = memory / 4096;
    for _ in 0..5 {
        run(&mut vm, TOUCH);
        let t = Instant::now();
        let consumer = vm.dirty().subscribe_unarmed().expect("subscribe");
        starts.push(t.elapsed().as_secs_f64() * 1e3);
        let (mut total, mut most) = (0.0, 0.0f64);
        for first in (0..pages).step_by(16384) {
            let t = Instant::now();
            consumer.arm(first, 16384).expect("arm");
            let ms = t.elapsed().as_secs_f64() * 1e3;
            total += ms;
            most = most.max(ms);
        }
        totals.push(total);
        longest.push(most);
        drop(consumer);
    }
    vm.stop(Duration::from_secs(1));
    (
        median(&mut starts),
        median(&mut totals),
        median(&mut longest),
    )
}

/// Guest writes in the 100 ms segment in which a window starts, as a share
/// of the median of the four segments before it; median of 3 runs.
fn stall(memory: u64, manual: bool) -> f64 {
    let mut shares: Vec<f64> = (0..3)
        .map(|_| {
            let mut vm = vm(memory, manual);
            run(&mut vm, TOUCH);
            let segments = [SEGMENT; 8].join("; ");
            let base = vm.vcpus()[0].shared.results().len();
            vm.push_commands(0, parse_sequence(&segments).expect("spec"));
            wait_results(&vm, base + 5);
            let window = vm.dirty().subscribe().expect("subscribe");
            wait_results(&vm, base + 8);
            let writes: Vec<f64> = vm.vcpus()[0].shared.results()[base..]
                .iter()
                .map(|r| r.values[0] as f64)
                .collect();
            drop(window);
            vm.stop(Duration::from_secs(1));
            let mut before = writes[1..5].to_vec();
            writes[5] / median(&mut before)
        })
        .collect();
    median(&mut shares)
}

fn main() {
    if !common::kvm_available("dirty") {
        return;
    }
    println!("starting a window (subscribe -> armed), guest without a mode, {TOUCH} before each, median / max of 5:");
    for gib in [1, 4, 16] {
        for manual in [false, true] {
            let (med, max) = start_cost(gib * GIB, manual);
            println!(
                "  {gib:>2} GiB, {}: {med:>7.2} ms / {max:>7.2} ms",
                path(manual)
            );
        }
    }
    println!("a migration's start, guest without a mode, manual protect, {TOUCH} before each, medians of 5: logging on / arming every 64 MiB range / the longest range:");
    for gib in [1, 16] {
        let (start, total, longest) = migration_start(gib * GIB);
        println!("  {gib:>2} GiB: {start:>7.2} ms / {total:>7.2} ms / {longest:>7.2} ms");
    }
    println!("starting a window on a VM that logs from boot (bitmap, manual protect), median / max of 5:");
    for gib in [1, 16] {
        for rewrite in [true, false] {
            let (med, max) = start_cost_from_boot(gib * GIB, rewrite);
            let what = if rewrite {
                "512 MiB written since the last look"
            } else {
                "nothing written since the last look"
            };
            println!("  {gib:>2} GiB, {what}: {med:>7.2} ms / {max:>7.2} ms");
        }
    }
    println!("guest writes of '{SEGMENT}' in the segment a window starts in, / the segments before (1.0: no stall), 16 GiB guest, {TOUCH} first, median of 3:");
    for manual in [false, true] {
        println!("  {}: {:.3}", path(manual), stall(16 * GIB, manual));
    }
}
