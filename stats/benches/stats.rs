//! `cargo bench -p kvm-stats [-- FILTER]`: schema parse (synthetic and real fds), one sample
//! of a real VM and vCPU stats fd, name lookup, delta.
//!
//! On divan: its timer and sample sizing, and its allocation profiler as the global
//! allocator, so every case reports allocations per op (a sample must show 0). The
//! `real` cases need /dev/kvm (a fresh VM with one vCPU each); without it they are
//! skipped with a printed reason.

use std::fs::File;
use std::hint::black_box;
use std::io::Read;

use divan::{AllocProfiler, Bencher};
use kvm_ioctls::{Kvm, VcpuFd, VmFd};
use kvm_stats::builder::every_kind;
use kvm_stats::ioctl::get_stats_fd;
use kvm_stats::{delta, Schema, StatsFd};

#[global_allocator]
static ALLOC: AllocProfiler = AllocProfiler::system();

fn main() {
    let divan = divan::Divan::from_args();
    match Kvm::new() {
        Ok(_) => divan.main(),
        Err(e) => {
            println!("skipping the real-fd cases: cannot open /dev/kvm: {e}");
            divan.skip_regex("^real::").main();
        }
    }
}

/// Cases on a file built in memory: no kernel involved.
mod synthetic {
    use super::*;

    #[divan::bench]
    fn parse_12_stats(bencher: Bencher) {
        let bytes = every_kind().build();
        bencher.bench_local(|| Schema::read(black_box(bytes.as_slice())).ok());
    }

    #[divan::bench]
    fn sample_in_memory(bencher: Bencher) {
        let bytes = every_kind().build();
        let schema = Schema::read(bytes.as_slice()).expect("the builder's file is valid");
        let mut sample = kvm_stats::Sample::new(&schema);
        bencher.bench_local(|| {
            black_box(sample.read_from(black_box(bytes.as_slice()), &schema).ok());
        });
    }
}

/// Cases on the stats fds of a real VM with one vCPU.
mod real {
    use super::*;

    /// A VM and its vCPU, kept alive while their stats fds are read.
    struct Vm {
        _kvm: Kvm,
        vm: VmFd,
        vcpu: VcpuFd,
    }

    fn vm() -> Vm {
        let kvm = Kvm::new().expect("/dev/kvm (checked in main)");
        let vm = kvm.create_vm().expect("a VM");
        let vcpu = vm.create_vcpu(0).expect("a vCPU");
        Vm {
            _kvm: kvm,
            vm,
            vcpu,
        }
    }

    fn vcpu_stats(vm: &Vm) -> StatsFd {
        StatsFd::new(get_stats_fd(&vm.vcpu).expect("vCPU stats fd")).expect("vCPU stats")
    }

    #[divan::bench]
    fn parse_vcpu_dump_in_memory(bencher: Bencher) {
        let vm = vm();
        let mut dump = Vec::new();
        let mut file = get_stats_fd(&vm.vcpu).expect("vCPU stats fd");
        file.read_to_end(&mut dump)
            .expect("read the whole stats fd");
        bencher.bench_local(|| Schema::read(black_box(dump.as_slice())).ok());
    }

    #[divan::bench]
    fn parse_vm_fd(bencher: Bencher) {
        let vm = vm();
        let file: File = get_stats_fd(&vm.vm).expect("VM stats fd");
        bencher.bench_local(|| Schema::read(&file).ok());
    }

    #[divan::bench]
    fn parse_vcpu_fd(bencher: Bencher) {
        let vm = vm();
        let file: File = get_stats_fd(&vm.vcpu).expect("vCPU stats fd");
        bencher.bench_local(|| Schema::read(&file).ok());
    }

    #[divan::bench]
    fn sample_vm_fd(bencher: Bencher) {
        let vm = vm();
        let stats = StatsFd::new(get_stats_fd(&vm.vm).expect("VM stats fd")).expect("VM stats");
        let mut sample = stats.new_sample();
        bencher.bench_local(|| black_box(stats.read_sample(&mut sample).ok()));
    }

    #[divan::bench]
    fn sample_vcpu_fd(bencher: Bencher) {
        let vm = vm();
        let stats = vcpu_stats(&vm);
        let mut sample = stats.new_sample();
        bencher.bench_local(|| black_box(stats.read_sample(&mut sample).ok()));
    }

    #[divan::bench(args = ["exits", "no_such_stat"])]
    fn find_vcpu(bencher: Bencher, name: &str) {
        let vm = vm();
        let stats = vcpu_stats(&vm);
        bencher.bench_local(|| stats.schema().find(black_box(name)));
    }

    #[divan::bench]
    fn delta_vcpu(bencher: Bencher) {
        let vm = vm();
        let stats = vcpu_stats(&vm);
        let (mut older, mut newer) = (stats.new_sample(), stats.new_sample());
        stats.read_sample(&mut older).expect("a sample");
        stats.read_sample(&mut newer).expect("a sample");
        bencher.bench_local(|| delta(stats.schema(), &older, &newer));
    }

    #[divan::bench]
    fn copy_sample_vcpu(bencher: Bencher) {
        let vm = vm();
        let stats = vcpu_stats(&vm);
        let (mut older, mut newer) = (stats.new_sample(), stats.new_sample());
        stats.read_sample(&mut newer).expect("a sample");
        bencher.bench_local(|| older.copy_from(black_box(&newer)));
    }
}
