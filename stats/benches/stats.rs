//! `cargo bench -p kvm-stats [-- FILTER]`: schema parse (synthetic and real fds), one sample
//! of a real VM and vCPU stats fd, name lookup, delta.
//!
//! Own timing loop (no criterion): each case runs in batches; the time of a batch divided by
//! its iterations is one observation, and the median and p99 of the observations are
//! reported in ns/op. A counting global allocator reports allocations per op: a sample must
//! show 0.

use std::alloc::{GlobalAlloc, Layout, System};
use std::fs::File;
use std::hint::black_box;
use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use kvm_ioctls::Kvm;
use kvm_stats::builder::every_kind;
use kvm_stats::ioctl::get_stats_fd;
use kvm_stats::{delta, Schema, StatsFd};

/// Counts every allocation (and reallocation) made through the global allocator.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every method forwards to the system allocator with the caller's arguments, so the
// GlobalAlloc contract is System's; the counter has no effect on memory.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as this method's caller upholds.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as this method's caller upholds.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as this method's caller upholds.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as this method's caller upholds.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const BATCHES: usize = 2000;

struct Bench {
    filter: Option<String>,
}

impl Bench {
    /// Runs `op` in BATCHES batches of `per_batch` iterations and prints median, p99 and
    /// allocations per op.
    fn run(&self, name: &str, per_batch: u32, mut op: impl FnMut()) {
        if self.filter.as_deref().is_some_and(|f| !name.contains(f)) {
            return;
        }
        for _ in 0..per_batch * 10 {
            op();
        }
        let mut ns = Vec::with_capacity(BATCHES);
        let allocs_before = ALLOCATIONS.load(Ordering::Relaxed);
        for _ in 0..BATCHES {
            let start = Instant::now();
            for _ in 0..per_batch {
                op();
            }
            ns.push(start.elapsed().as_nanos() as f64 / f64::from(per_batch));
        }
        // The observation vector was allocated before counting started; nothing else here allocates.
        let allocs = ALLOCATIONS.load(Ordering::Relaxed) - allocs_before;
        ns.sort_by(f64::total_cmp);
        let pick = |q: f64| ns[((ns.len() - 1) as f64 * q).round() as usize];
        let ops = BATCHES as f64 * f64::from(per_batch);
        println!(
            "{name:<28} median {:>9.1} ns/op   p99 {:>9.1} ns/op   allocs/op {:>6.2}",
            pick(0.5),
            pick(0.99),
            allocs as f64 / ops
        );
    }
}

fn real_fds() -> Result<(Kvm, kvm_ioctls::VmFd, kvm_ioctls::VcpuFd), String> {
    let kvm = Kvm::new().map_err(|e| format!("cannot open /dev/kvm: {e}"))?;
    let vm = kvm.create_vm().map_err(|e| e.to_string())?;
    let vcpu = vm.create_vcpu(0).map_err(|e| e.to_string())?;
    Ok((kvm, vm, vcpu))
}

fn dump(file: &File) -> Vec<u8> {
    let mut bytes = Vec::new();
    let mut reader = file;
    reader.read_to_end(&mut bytes).expect("read whole stats fd");
    bytes
}

fn synthetic(b: &Bench) {
    let bytes = every_kind().build();
    b.run("parse_synthetic_12_stats", 200, || {
        black_box(Schema::read(black_box(bytes.as_slice())).ok());
    });
    let schema = Schema::read(bytes.as_slice()).expect("valid");
    let mut sample = kvm_stats::Sample::new(&schema);
    b.run("sample_synthetic_in_memory", 2000, || {
        black_box(sample.read_from(black_box(bytes.as_slice()), &schema).ok());
    });
}

fn real(b: &Bench, vm: &kvm_ioctls::VmFd, vcpu: &kvm_ioctls::VcpuFd) {
    let vm_file = get_stats_fd(vm).expect("VM stats fd");
    let vcpu_file = get_stats_fd(vcpu).expect("vCPU stats fd");
    let vcpu_dump = dump(&vcpu_file);
    b.run("parse_vcpu_dump_in_memory", 100, || {
        black_box(Schema::read(black_box(vcpu_dump.as_slice())).ok());
    });
    b.run("parse_vm_fd", 100, || {
        black_box(Schema::read(&vm_file).ok());
    });
    b.run("parse_vcpu_fd", 100, || {
        black_box(Schema::read(&vcpu_file).ok());
    });
    let vm_stats = StatsFd::new(vm_file).expect("VM stats");
    let vcpu_stats = StatsFd::new(vcpu_file).expect("vCPU stats");
    let mut vm_sample = vm_stats.new_sample();
    b.run("sample_vm_fd", 1000, || {
        black_box(vm_stats.read_sample(&mut vm_sample).ok());
    });
    let mut older = vcpu_stats.new_sample();
    vcpu_stats.read_sample(&mut older).expect("sample");
    let mut newer = vcpu_stats.new_sample();
    b.run("sample_vcpu_fd", 1000, || {
        black_box(vcpu_stats.read_sample(&mut newer).ok());
    });
    let schema = vcpu_stats.schema();
    b.run("find_hit_vcpu", 10_000, || {
        black_box(schema.find(black_box("exits")));
    });
    b.run("find_miss_vcpu", 10_000, || {
        black_box(schema.find(black_box("no_such_stat")));
    });
    b.run("delta_vcpu", 200, || {
        black_box(delta(schema, &older, &newer));
    });
    b.run("copy_sample_vcpu", 2000, || {
        older.copy_from(black_box(&newer));
    });
}

fn main() {
    // cargo passes `--bench`; any other free argument filters cases by substring.
    let filter = std::env::args().skip(1).find(|a| !a.starts_with("--"));
    let b = Bench { filter };
    synthetic(&b);
    match real_fds() {
        Ok((_kvm, vm, vcpu)) => real(&b, &vm, &vcpu),
        Err(reason) => println!("skipping real-fd cases: {reason}"),
    }
}
