//! Exit cost: a port-I/O exit round trip through kvmscope's vCPU loop against a
//! bare KVM_RUN loop that does nothing but re-enter, on the same guest and the
//! same `exits` command, in one run. `cargo bench -p kvmscope --bench exits`.

mod common;

use std::time::{Duration, Instant};

use common::median;
use kvm_bindings::{kvm_userspace_memory_region, KVM_MAX_CPUID_ENTRIES};
use kvm_ioctls::{Kvm, VcpuExit};
use kvmscope::abi::{self, mailbox_offset as mb};
use kvmscope::workload::parse_sequence;
use kvmscope::x86_64::regs;
use kvmscope::{boot, memory};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

const MEMORY: u64 = 32 << 20;

/// Runs `exits ports=n` on a bare loop; returns the time per exit.
fn bare_loop(n: u64) -> Duration {
    let kvm = Kvm::new().expect("open /dev/kvm");
    let vm = kvm.create_vm().expect("create VM");
    let mem = memory::create(MEMORY, false).expect("guest memory");
    let entry = boot::load_guest(&mem, boot::DEFAULT_GUEST).expect("load guest");
    boot::write_boot_structures(&mem).expect("boot structures");
    let region = mem.iter().next().expect("one region");
    let slot = kvm_userspace_memory_region {
        slot: 0,
        flags: 0,
        guest_phys_addr: 0,
        memory_size: region.len(),
        userspace_addr: region.as_ptr() as u64,
    };
    // SAFETY: the mapping belongs to `mem`, which outlives the VM in this function.
    unsafe { vm.set_user_memory_region(slot) }.expect("memory slot");
    let mut vcpu = vm.create_vcpu(0).expect("vCPU");
    let cpuid = kvm
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .expect("cpuid");
    regs::setup(&vcpu, &cpuid, entry, 0).expect("registers");
    boot::write_mailbox_boot(&mem, 0, u64::from(vcpu.get_tsc_khz().unwrap_or(1_000_000)))
        .expect("mailbox");
    let mbox = boot::mailbox_addr(0);
    let words = [abi::CMD_EXITS, 1, n, 0, 0, 0, 0, 0];
    for (i, w) in words.iter().enumerate() {
        mem.write_obj(*w, GuestAddress(mbox + mb::CMD + 8 * i as u64))
            .expect("command");
    }
    let mut start = None;
    loop {
        match vcpu.run().expect("KVM_RUN") {
            VcpuExit::IoOut(abi::PORT_READY, _) => start = Some(Instant::now()),
            VcpuExit::IoOut(abi::PORT_DONE, _) => break,
            VcpuExit::IoOut(..) => {}
            other => panic!("unexpected exit {other:?}"),
        }
    }
    start.expect("guest became ready").elapsed() / n as u32
}

/// Runs `exits ports=n` through kvmscope's VM; returns the time per exit.
fn kvmscope_loop(n: u64) -> Duration {
    let mut vm = kvmscope::vm::Vm::new(kvmscope::vm::VmConfig {
        memory: MEMORY,
        ..Default::default()
    })
    .expect("VM");
    vm.push_commands(
        0,
        parse_sequence(&format!("exits ports={n} mmio=0")).expect("spec"),
    );
    vm.start().expect("start");
    let result = loop {
        if let Some(r) = vm.vcpus()[0].shared.results().first().cloned() {
            break r;
        }
        vm.next_event(Duration::from_millis(100));
    };
    vm.stop(Duration::from_secs(1));
    result.host_time / n as u32
}

fn main() {
    if !common::kvm_available("exits") {
        return;
    }
    let n = 20_000;
    let rounds = 7;
    let (mut bare, mut ours) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        bare.push(bare_loop(n));
        ours.push(kvmscope_loop(n));
    }
    let (b, o) = (median(&mut bare), median(&mut ours));
    println!("port-I/O exit round trip, {n} exits x {rounds} rounds (median):");
    println!("  bare KVM_RUN loop : {:>8.0} ns/exit", b.as_nanos() as f64);
    println!("  kvmscope vCPU loop: {:>8.0} ns/exit", o.as_nanos() as f64);
    println!(
        "  overhead          : {:>+8.1} %",
        (o.as_nanos() as f64 / b.as_nanos() as f64 - 1.0) * 100.0
    );
}
