//! Dirty tracking as a VMM service, on real KVM: bitmap logging turned on at
//! run time for a VM started without a mode, a ring VM that logs only while
//! observed, and several consumers at once. The bitmap cases run on both
//! re-protection paths: manual protect where the kernel offers it, and the
//! whole-slot fallback (`dirty_manual_protect: false`).

mod common;

use std::time::Duration;

use kvm_stats::StatsFd;
use kvmscope::dirty::DirtyMode;
use kvmscope::exits::Reason;
use kvmscope::vm::{Vm, VmConfig};
use kvmscope::workload::parse_sequence;

const MEMORY: u64 = 64 << 20;

fn run_and_wait(vm: &mut Vm, spec: &str, results: usize) {
    vm.push_commands(0, parse_sequence(spec).unwrap());
    common::wait_for(spec, Duration::from_secs(30), || {
        (vm.vcpus()[0].shared.results().len() >= results).then_some(())
    });
}

#[test]
fn bitmap_logging_turned_on_at_run_time_sees_pages_written_after_it() {
    require_kvm!();
    for manual in [true, false] {
        logging_at_run_time_sees_pages_written_after_it(manual);
    }
}

fn logging_at_run_time_sees_pages_written_after_it(manual: bool) {
    let mut vm = Vm::new(VmConfig {
        memory: MEMORY,
        dirty_manual_protect: manual,
        ..VmConfig::default()
    })
    .unwrap();
    assert!(vm.dirty_configured().is_none());
    vm.start().unwrap();
    run_and_wait(&mut vm, "touch size=1M", 1);
    let consumer = vm.dirty().subscribe().unwrap();
    run_and_wait(&mut vm, "touch offset=2M size=2M", 2);
    let pages = consumer.take().unwrap();
    let arena = kvmscope::abi::ARENA_BASE / 4096;
    assert!(
        (0..512).all(|i| pages.contains(arena + 512 + i)),
        "every page of the second touch is dirty"
    );
    assert!(
        pages.count_range(arena, 256) == 0,
        "pages of the first touch, written before logging began, are not"
    );
    drop(consumer);
    // Logging went off with the last consumer; a new one turns it on again.
    let again = vm.dirty().subscribe().unwrap();
    run_and_wait(&mut vm, "touch offset=8M size=4K", 3);
    assert!(again.take().unwrap().contains(arena + 2048));
    assert!(vm.stop(Duration::from_secs(1)).is_empty());
}

#[test]
fn two_consumers_each_see_every_page_since_their_own_last_take() {
    require_kvm!();
    for manual in [true, false] {
        two_consumers_each_see_their_own_pages(manual);
    }
}

fn two_consumers_each_see_their_own_pages(manual: bool) {
    let mut vm = Vm::new(VmConfig {
        memory: MEMORY,
        dirty_log: Some(kvmscope::dirty::DirtyMode::Bitmap),
        dirty_manual_protect: manual,
        ..VmConfig::default()
    })
    .unwrap();
    let a = vm.dirty().subscribe().unwrap();
    let b = vm.dirty().subscribe().unwrap();
    vm.start().unwrap();
    run_and_wait(&mut vm, "touch size=64K", 1);
    let first = a.take().unwrap();
    assert!(first.count() >= 16, "{}", first.count());
    run_and_wait(&mut vm, "touch offset=1M size=64K", 2);
    let (second_a, all_b) = (a.take().unwrap(), b.take().unwrap());
    let arena = kvmscope::abi::ARENA_BASE / 4096;
    assert_eq!(second_a.count_range(arena, 16), 0, "a took those already");
    assert_eq!(all_b.count_range(arena, 16), 16, "b never took them");
    assert_eq!(all_b.count_range(arena + 256, 16), 16);
    assert_eq!(second_a.count_range(arena + 256, 16), 16);
    assert!(vm.stop(Duration::from_secs(1)).is_empty());
}

/// vCPU 0's `pf_fixed` + `pf_taken` (the faults KVM's MMU handled) and our
/// count of its ring-full exits.
fn faults(vm: &Vm, stats: &StatsFd) -> (u64, u64) {
    let mut sample = stats.new_sample();
    stats.read_sample(&mut sample).unwrap();
    let schema = stats.schema();
    let stat = |name: &str| schema.find(name).map_or(0, |id| sample.values(id)[0]);
    let ring_full = vm.vcpus()[0].shared.counters.reason(Reason::DirtyRingFull);
    (stat("pf_fixed") + stat("pf_taken"), ring_full)
}

#[test]
fn a_ring_vm_nobody_observes_takes_no_write_protection_faults() {
    require_kvm!();
    let mut vm = Vm::new(VmConfig {
        memory: MEMORY,
        dirty_log: Some(DirtyMode::Ring(256)),
        ..VmConfig::default()
    })
    .unwrap();
    let stats = StatsFd::new(kvm_stats::ioctl::get_stats_fd(&vm.vcpu_fds()[0]).unwrap()).unwrap();
    vm.start().unwrap();
    // The first touch maps the 1024 pages (faults that have nothing to do
    // with tracking); each rewrite after it is what tracking would tax.
    run_and_wait(&mut vm, "touch size=4M", 1);
    let before = faults(&vm, &stats);
    run_and_wait(&mut vm, "touch size=4M; touch size=4M", 3);
    let unobserved = faults(&vm, &stats);
    assert_eq!(
        unobserved.1, before.1,
        "no ring-full exit while nobody holds the log"
    );
    assert!(
        unobserved.0 - before.0 < 64,
        "2048 page writes with nobody observing took {} MMU faults",
        unobserved.0 - before.0
    );
    assert_eq!(vm.dirty().written_since_boot().unwrap(), None);

    // A consumer turns logging on: every rewrite is logged, through the
    // 256-entry ring (so ring-full exits), and faults to be logged.
    let window = vm.dirty().subscribe().unwrap();
    run_and_wait(&mut vm, "touch size=4M", 4);
    let observed = faults(&vm, &stats);
    let arena = kvmscope::abi::ARENA_BASE / 4096;
    assert_eq!(window.take().unwrap().count_range(arena, 1024), 1024);
    assert!(observed.1 > unobserved.1, "ring-full exits while observed");
    assert!(
        observed.0 - unobserved.0 >= 1024,
        "one write-protection fault per page while observed: {}",
        observed.0 - unobserved.0
    );

    // The last consumer gone, logging is off again: one fault per page at
    // most to make each page writable, then nothing.
    drop(window);
    run_and_wait(&mut vm, "touch size=4M", 5);
    let after_first = faults(&vm, &stats);
    run_and_wait(&mut vm, "touch size=4M; touch size=4M", 7);
    let after = faults(&vm, &stats);
    assert_eq!(
        after.1, after_first.1,
        "no ring-full exit once the log is let go"
    );
    assert!(
        after.0 - after_first.0 < 64,
        "2048 page writes after the log was let go took {} MMU faults",
        after.0 - after_first.0
    );
    assert!(vm.stop(Duration::from_secs(1)).is_empty());
}
