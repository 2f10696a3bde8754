//! Dirty tracking as a VMM service, on real KVM: bitmap logging turned on at
//! run time for a VM started without a mode, and several consumers at once.

mod common;

use std::time::Duration;

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
    let mut vm = Vm::new(VmConfig {
        memory: MEMORY,
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
    let mut vm = Vm::new(VmConfig {
        memory: MEMORY,
        dirty_log: Some(kvmscope::dirty::DirtyMode::Bitmap),
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
