//! Integration tests on the real /dev/kvm: stats fds of a VM and a vCPU running a tiny
//! real-mode guest. Every test goes through [`Guest::start`], which skips with a printed
//! reason when KVM is unavailable, and fails instead when `KVMSCOPE_REQUIRE_KVM=1` (CI).

use std::fs::File;

use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::{Kvm, VcpuExit, VcpuFd, VmFd};
use kvm_stats::check::{check_monotonic, validate_sample};
use kvm_stats::ioctl::{get_stats_fd, KVM_CAP_BINARY_STATS_FD};
use kvm_stats::{format, json, NameFilter, StatType, StatsFd, Target, Unit};

const MEM_SIZE: usize = 0x10000;
const CODE_ADDR: u64 = 0x1000;
/// Real mode: `mov cx, 10; mov dx, 0x3f8; l: out dx, al; dec cx; jnz l; hlt`.
const GUEST_CODE: [u8; 11] = [
    0xb9, 0x0a, 0x00, 0xba, 0xf8, 0x03, 0xee, 0x49, 0x75, 0xfc, 0xf4,
];
/// Port writes the guest makes before it halts.
const GUEST_OUTS: usize = 10;

/// Anonymous memory backing the guest, unmapped on drop.
struct GuestMem(*mut libc::c_void);

impl GuestMem {
    fn new() -> Self {
        // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                MEM_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED, "mmap of guest memory failed");
        // SAFETY: the mapping is MEM_SIZE bytes long and writable; CODE_ADDR + code fits in it.
        unsafe {
            let code = ptr.cast::<u8>().add(CODE_ADDR as usize);
            std::ptr::copy_nonoverlapping(GUEST_CODE.as_ptr(), code, GUEST_CODE.len());
        }
        Self(ptr)
    }
}

impl Drop for GuestMem {
    fn drop(&mut self) {
        // SAFETY: self.0 is the MEM_SIZE mapping made in new(); the VM using it is gone or
        // only reads stats (fields drop after the VM fd in Guest).
        unsafe { libc::munmap(self.0, MEM_SIZE) };
    }
}

/// A VM with one vCPU set up to run [`GUEST_CODE`]. Fields drop in order: vCPU, VM, memory.
struct Guest {
    vcpu: VcpuFd,
    vm: VmFd,
    _kvm: Kvm,
    _mem: GuestMem,
}

impl Guest {
    /// The one gate of these tests: `None` (skip, with the reason printed) when KVM or its
    /// binary stats are unavailable, unless `KVMSCOPE_REQUIRE_KVM=1`, which panics instead.
    fn start(test: &str) -> Option<Self> {
        match Self::try_start() {
            Ok(guest) => Some(guest),
            Err(reason) if std::env::var("KVMSCOPE_REQUIRE_KVM").as_deref() == Ok("1") => {
                panic!("{test}: {reason}, and KVMSCOPE_REQUIRE_KVM=1")
            }
            Err(reason) => {
                eprintln!("skipping {test}: {reason}");
                None
            }
        }
    }

    fn try_start() -> Result<Self, String> {
        let kvm = Kvm::new().map_err(|e| format!("cannot open /dev/kvm: {e}"))?;
        if kvm.check_extension_raw(KVM_CAP_BINARY_STATS_FD.into()) <= 0 {
            return Err("KVM lacks KVM_CAP_BINARY_STATS_FD".into());
        }
        let vm = kvm
            .create_vm()
            .map_err(|e| format!("KVM_CREATE_VM failed: {e}"))?;
        let mem = GuestMem::new();
        let region = kvm_userspace_memory_region {
            slot: 0,
            guest_phys_addr: 0,
            memory_size: MEM_SIZE as u64,
            userspace_addr: mem.0 as u64,
            flags: 0,
        };
        // SAFETY: the region is a live MEM_SIZE mapping owned by `mem`, which outlives the VM
        // (Guest drops vm before _mem).
        unsafe { vm.set_user_memory_region(region) }.map_err(|e| format!("memory region: {e}"))?;
        let vcpu = vm
            .create_vcpu(0)
            .map_err(|e| format!("KVM_CREATE_VCPU failed: {e}"))?;
        let mut sregs = vcpu.get_sregs().map_err(|e| e.to_string())?;
        (sregs.cs.base, sregs.cs.selector) = (0, 0);
        vcpu.set_sregs(&sregs).map_err(|e| e.to_string())?;
        let mut regs = vcpu.get_regs().map_err(|e| e.to_string())?;
        (regs.rip, regs.rflags) = (CODE_ADDR, 2);
        vcpu.set_regs(&regs).map_err(|e| e.to_string())?;
        Ok(Self {
            vcpu,
            vm,
            _kvm: kvm,
            _mem: mem,
        })
    }

    /// Runs the guest to its `hlt`, calling `between_exits` after each port write.
    fn run(&mut self, mut between_exits: impl FnMut()) {
        for _ in 0..=GUEST_OUTS + 5 {
            match self.vcpu.run() {
                Ok(VcpuExit::IoOut(0x3f8, _)) => between_exits(),
                Ok(VcpuExit::Hlt) => return,
                Ok(other) => panic!("unexpected exit {other:?}"),
                Err(e) => panic!("KVM_RUN failed: {e}"),
            }
        }
        panic!("guest did not halt");
    }

    fn vm_stats(&self) -> StatsFd {
        open(get_stats_fd(&self.vm).expect("KVM_GET_STATS_FD on the VM"))
    }

    fn vcpu_stats(&self) -> StatsFd {
        open(get_stats_fd(&self.vcpu).expect("KVM_GET_STATS_FD on the vCPU"))
    }
}

/// The kernel names a VM after the task that created it: this thread (each test runs on its
/// own thread), not the process.
fn creator_tid() -> String {
    let link = std::fs::read_link("/proc/thread-self").expect("/proc/thread-self");
    link.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn open(file: File) -> StatsFd {
    StatsFd::new_strict(file).expect("stats fd passes every check")
}

#[test]
fn vm_stats_fd_passes_all_checks() {
    let Some(guest) = Guest::start("vm_stats_fd_passes_all_checks") else {
        return;
    };
    let stats = guest.vm_stats();
    assert_eq!(stats.schema().id(), format!("kvm-{}", creator_tid()));
    assert_eq!(stats.schema().target(), Target::Vm);
    assert!(stats.schema().warnings().is_empty());
    let mut sample = stats.new_sample();
    stats.read_sample(&mut sample).expect("sample");
    assert_eq!(validate_sample(stats.schema(), &sample), Ok(()));
}

#[test]
fn vcpu_stats_fd_passes_all_checks() {
    let Some(guest) = Guest::start("vcpu_stats_fd_passes_all_checks") else {
        return;
    };
    let stats = guest.vcpu_stats();
    assert_eq!(stats.schema().id(), format!("kvm-{}/vcpu-0", creator_tid()));
    assert_eq!(stats.schema().target(), Target::Vcpu(0));
    let mut sample = stats.new_sample();
    stats.read_sample(&mut sample).expect("sample");
    assert_eq!(validate_sample(stats.schema(), &sample), Ok(()));
}

#[test]
fn vm_stats_have_page_counters() {
    let Some(guest) = Guest::start("vm_stats_have_page_counters") else {
        return;
    };
    let stats = guest.vm_stats();
    for name in ["pages_4k", "pages_2m", "pages_1g"] {
        let id = stats
            .schema()
            .find(name)
            .unwrap_or_else(|| panic!("{name} missing"));
        let desc = stats.schema().get(id).expect("descriptor");
        assert_eq!(
            (desc.kind, desc.unit),
            (StatType::Instant, Unit::None),
            "{name}"
        );
    }
}

#[test]
fn vcpu_stats_have_exits() {
    let Some(guest) = Guest::start("vcpu_stats_have_exits") else {
        return;
    };
    let stats = guest.vcpu_stats();
    let id = stats.schema().find("exits").expect("exits present");
    assert_eq!(
        stats.schema().get(id).map(|d| d.kind),
        Some(StatType::Cumulative)
    );
}

#[test]
fn repeated_samples_succeed() {
    let Some(guest) = Guest::start("repeated_samples_succeed") else {
        return;
    };
    let stats = guest.vcpu_stats();
    let mut older = stats.new_sample();
    let mut newer = stats.new_sample();
    stats.read_sample(&mut older).expect("first sample");
    for _ in 0..100 {
        stats.read_sample(&mut newer).expect("sample");
        assert!(newer.timestamp() >= older.timestamp());
        older.copy_from(&newer);
    }
}

#[test]
fn cumulative_values_never_decrease_across_samples() {
    let Some(mut guest) = Guest::start("cumulative_values_never_decrease_across_samples") else {
        return;
    };
    let fds = [guest.vm_stats(), guest.vcpu_stats()];
    let mut older: Vec<_> = fds.iter().map(StatsFd::new_sample).collect();
    let mut newer = older.clone();
    for (fd, s) in fds.iter().zip(&mut older) {
        fd.read_sample(s).expect("sample");
    }
    guest.run(|| {
        for ((fd, old), new) in fds.iter().zip(&mut older).zip(&mut newer) {
            fd.read_sample(new).expect("sample");
            assert_eq!(check_monotonic(fd.schema(), old, new), Ok(()));
            assert_eq!(validate_sample(fd.schema(), new), Ok(()));
            old.copy_from(new);
        }
    });
}

#[test]
fn vcpu_exits_grow_when_guest_runs() {
    let Some(mut guest) = Guest::start("vcpu_exits_grow_when_guest_runs") else {
        return;
    };
    let stats = guest.vcpu_stats();
    let exits = stats.schema().find("exits").expect("exits present");
    let mut before = stats.new_sample();
    stats.read_sample(&mut before).expect("sample");
    guest.run(|| {});
    let mut after = stats.new_sample();
    stats.read_sample(&mut after).expect("sample");
    let d = kvm_stats::delta(stats.schema(), &before, &after);
    assert!(
        d.cumulative(exits) >= Some(1),
        "exits did not grow: {:?}",
        d.get(exits)
    );
}

#[test]
fn dup_fd_reads_the_same_stats() {
    let Some(guest) = Guest::start("dup_fd_reads_the_same_stats") else {
        return;
    };
    let first = guest.vcpu_stats();
    let dup = open(first.file().try_clone().expect("dup"));
    assert_eq!(dup.schema().stats(), first.schema().stats());
    assert_eq!(dup.schema().id(), first.schema().id());
    let (mut a, mut b) = (first.new_sample(), dup.new_sample());
    first.read_sample(&mut a).expect("sample");
    dup.read_sample(&mut b).expect("sample of dup");
    let exits = first.schema().find("exits").expect("exits present");
    assert_eq!(a.u64(exits), b.u64(exits));
}

#[test]
fn second_fresh_fd_works() {
    let Some(guest) = Guest::start("second_fresh_fd_works") else {
        return;
    };
    let (one, two) = (guest.vm_stats(), guest.vm_stats());
    assert_eq!(one.schema().stats(), two.schema().stats());
    let mut sample = two.new_sample();
    two.read_sample(&mut sample).expect("sample of second fd");
}

#[test]
fn stats_fds_work_after_vm_and_vcpu_fds_close() {
    let Some(mut guest) = Guest::start("stats_fds_work_after_vm_and_vcpu_fds_close") else {
        return;
    };
    let (vm_stats, vcpu_stats) = (guest.vm_stats(), guest.vcpu_stats());
    guest.run(|| {});
    let exits = vcpu_stats.schema().find("exits").expect("exits present");
    let mut before = vcpu_stats.new_sample();
    vcpu_stats.read_sample(&mut before).expect("sample");
    drop(guest);
    let mut after = vcpu_stats.new_sample();
    vcpu_stats
        .read_sample(&mut after)
        .expect("vCPU stats after close");
    assert_eq!(after.u64(exits), before.u64(exits));
    let mut vm_sample = vm_stats.new_sample();
    vm_stats
        .read_sample(&mut vm_sample)
        .expect("VM stats after close");
}

#[test]
fn table_and_json_render_real_stats() {
    let Some(guest) = Guest::start("table_and_json_render_real_stats") else {
        return;
    };
    let fds = [guest.vm_stats(), guest.vcpu_stats()];
    let samples: Vec<_> = fds
        .iter()
        .map(|fd| {
            let mut s = fd.new_sample();
            fd.read_sample(&mut s).expect("sample");
            s
        })
        .collect();
    let table = format::table(fds[0].schema(), &samples[0], &NameFilter::all());
    assert!(table.lines().any(|l| l.starts_with("pages_4k ")), "{table}");
    let sources = fds.iter().map(StatsFd::schema).zip(&samples);
    let result = json::query_stats(sources, &NameFilter::names(["exits", "pages_4k"]));
    assert_eq!(result[0]["target"], "vm");
    assert_eq!(result[0]["stats"][0]["name"], "pages_4k");
    assert_eq!(result[1]["vcpu"], 0);
    assert_eq!(result[1]["stats"][0]["name"], "exits");
    let schemas = json::query_stats_schemas(fds.iter().map(StatsFd::schema));
    assert_eq!(schemas.as_array().map(Vec::len), Some(2));
}
