//! Manual dirty-log protection on real KVM (`KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2`
//! with `KVM_DIRTY_LOG_INITIALLY_SET` where the kernel offers it): the bits
//! set when logging starts are not writes, and a harvested page is logged
//! again when written again. Every case runs on both paths: manual protect
//! where offered, and the whole-slot fallback (`dirty_manual_protect: false`).

mod common;

use std::time::Duration;

use kvmscope::backing::Backing;
use kvmscope::dirty::{DirtyMode, Protection};
use kvmscope::vm::{Vm, VmConfig};
use kvmscope::workload::parse_sequence;

const MEMORY: u64 = 64 << 20;
const PAGES: u64 = MEMORY / 4096;

fn vm(dirty_log: Option<DirtyMode>, manual: bool) -> Vm {
    Vm::new(VmConfig {
        memory: MEMORY,
        dirty_log,
        dirty_manual_protect: manual,
        ..VmConfig::default()
    })
    .unwrap()
}

fn run_and_wait(vm: &mut Vm, spec: &str, results: usize) {
    vm.push_commands(0, parse_sequence(spec).unwrap());
    common::wait_for(spec, Duration::from_secs(30), || {
        (vm.vcpus()[0].shared.results().len() >= results).then_some(())
    });
}

fn arena() -> u64 {
    kvmscope::abi::ARENA_BASE / 4096
}

/// A started VM without a dirty-log mode, its RAM madvised for huge pages,
/// the first 2 MiB of its arena written.
fn huge_page_vm() -> Vm {
    let mut vm = Vm::new(VmConfig {
        memory: MEMORY,
        hugepages: true,
        ..VmConfig::default()
    })
    .unwrap();
    vm.start().unwrap();
    run_and_wait(&mut vm, "touch size=2M", 1);
    vm
}

/// The protection a bitmap VM gets from what the kernel offers.
fn expected(offered: u32, manual: bool) -> Protection {
    match (manual, offered & 1 != 0) {
        (true, true) => Protection::Manual {
            initially_set: offered & 2 != 0,
        },
        _ => Protection::Whole,
    }
}

#[test]
fn a_bitmap_vm_uses_manual_protect_where_the_kernel_offers_it() {
    require_kvm!();
    for manual in [true, false] {
        for mode in [None, Some(DirtyMode::Bitmap)] {
            let vm = vm(mode, manual);
            let offered = vm.dirty().offered();
            eprintln!("KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2 offers {offered:#x}");
            assert_eq!(vm.dirty().protection(), Some(expected(offered, manual)));
        }
    }
    let ring = vm(Some(DirtyMode::Ring(256)), true);
    assert_eq!(ring.dirty().protection(), None, "a ring has no bitmap");
}

#[test]
fn a_window_sees_pages_written_after_it_and_not_the_initially_set_bits() {
    require_kvm!();
    for manual in [true, false] {
        let mut vm = vm(None, manual);
        vm.start().unwrap();
        run_and_wait(&mut vm, "touch size=1M", 1);
        let window = vm.dirty().subscribe().unwrap();
        run_and_wait(&mut vm, "touch offset=2M size=64K", 2);
        let pages = window.take().unwrap();
        let path = vm.dirty().protection();
        assert_eq!(pages.count_range(arena() + 512, 16), 16, "{path:?}");
        assert_eq!(pages.count_range(arena(), 256), 0, "{path:?}");
        // The touch's 16 pages and the guest's own bookkeeping (stack,
        // command mailbox): nowhere near the slot's 16384 bits.
        assert!(
            pages.count() < 16 + 64,
            "{path:?}: {} of {PAGES} pages in a window that saw 16 written",
            pages.count()
        );
        assert!(vm.stop(Duration::from_secs(1)).is_empty());
    }
}

/// With initially-set bits, the bits of pages the host never backed are left
/// set when a window starts, and told apart from writes by what backs them
/// later: a write into a never-backed 2 MiB of guest RAM madvised for huge
/// pages backs all 512 of its pages at once, yet the window sees the one
/// page written, and the next write to a neighbour in a later take.
#[test]
fn a_write_that_backs_a_huge_page_is_one_page_written_not_512() {
    require_kvm!();
    let mut vm = huge_page_vm();
    let path = vm.dirty().protection();
    let window = vm.dirty().subscribe().unwrap();
    // 8 MiB into the arena (2 MiB-aligned): never backed before.
    let first = arena() + 2048;
    run_and_wait(&mut vm, "touch offset=8M size=4K", 2);
    let pages = window.take().unwrap();
    assert!(pages.contains(first), "{path:?}: the page written");
    assert_eq!(
        pages.count_range(first, 512),
        1,
        "{path:?}: its huge page's 511 others were backed, not written"
    );
    assert!(pages.count() < 1 + 64, "{path:?}: {}", pages.count());
    run_and_wait(&mut vm, "touch offset=8196K size=4K", 3);
    let next = window.take().unwrap();
    assert_eq!(next.count_range(first, 512), 1, "{path:?}");
    assert!(
        next.contains(first + 1),
        "{path:?}: the neighbour written next"
    );
    drop(window);
    assert!(vm.stop(Duration::from_secs(1)).is_empty());
}

/// A consumer that arms its pages itself (a migration's first pass): with
/// initially-set bits, writes before a range is armed are not in its window
/// (it reads them after arming), writes after are; the backing it is handed
/// is the pages' as armed.
#[test]
fn a_range_armed_by_its_reader_logs_the_writes_after_its_arming_only() {
    require_kvm!();
    for manual in [true, false] {
        let mut vm = vm(None, manual);
        vm.start().unwrap();
        let path = vm.dirty().protection();
        run_and_wait(&mut vm, "touch size=1M", 1);
        let window = vm.dirty().subscribe_unarmed().unwrap();
        run_and_wait(&mut vm, "touch size=64K", 2);
        // Only initially-set bits with a page map scan leave ranges to arm.
        let defers = path == Some(Protection::INITIALLY_SET) && kvmscope::backing::scan_supported();
        assert_eq!(window.arms_by_range(), defers, "{path:?}");
        let runs = window.arm(0, PAGES).unwrap();
        assert_eq!(
            runs.iter().map(|r| r.1).sum::<u64>(),
            PAGES,
            "{path:?}: every page"
        );
        let data = |p: u64| {
            runs.iter()
                .any(|&(f, n, b)| b == Backing::Data && (f..f + n).contains(&p))
        };
        assert!(data(arena()) && data(arena() + 255), "{path:?}: {runs:?}");
        assert!(!data(arena() + 2048), "{path:?}: never backed");
        run_and_wait(&mut vm, "touch offset=128K size=64K", 3);
        let pages = window.take().unwrap();
        // The whole-slot fallback protects every page as logging starts:
        // its window starts at the subscription, arming or not; so does
        // initially-set without a page map scan (Linux before 6.7).
        let before = if defers { 0 } else { 16 };
        assert_eq!(
            pages.count_range(arena(), 16),
            before,
            "{path:?}: written before arming"
        );
        assert_eq!(pages.count_range(arena() + 32, 16), 16, "{path:?}: after");
        drop(window);
        assert!(vm.stop(Duration::from_secs(1)).is_empty());
    }
}

/// A page whose bit was left set as never backed, armed by another
/// consumer, is handed to a reader as never backed (zero) even once a huge
/// page backs it with data: the fold that later finds it backed sorts it by
/// its content against that zero, so a reader must hold zero for it (a
/// reader handed the data and then a rewrite to zero would keep the data).
#[test]
fn a_page_left_set_as_never_backed_is_handed_out_as_zero_whatever_backs_it_now() {
    require_kvm!();
    let mut vm = huge_page_vm();
    let window = vm.dirty().subscribe().unwrap();
    let reader = vm.dirty().subscribe_unarmed().unwrap();
    // 8 MiB into the arena: a huge page backs both pages at the first write.
    run_and_wait(&mut vm, "touch offset=8M size=8K pattern=0x5a", 2);
    let runs = reader.arm(0, PAGES).unwrap();
    let backing = |p: u64| {
        runs.iter()
            .find(|&&(f, n, _)| (f..f + n).contains(&p))
            .map(|r| r.2)
    };
    let written = arena() + 2048;
    let path = vm.dirty().protection();
    if path == Some(Protection::INITIALLY_SET) && kvmscope::backing::scan_supported() {
        assert_eq!(backing(written), Some(Backing::None), "{runs:?}");
        assert_eq!(backing(written + 1), Some(Backing::None), "{runs:?}");
    }
    assert_eq!(
        backing(arena()),
        Some(Backing::Data),
        "{path:?}: backed before"
    );
    // The next look finds both written (not all zero): every reader sends them.
    let pages = reader.take().unwrap();
    assert_eq!(pages.count_range(written, 2), 2, "{path:?}");
    assert_eq!(
        window.take().unwrap().count_range(written, 512),
        2,
        "{path:?}"
    );
    drop((reader, window));
    assert!(vm.stop(Duration::from_secs(1)).is_empty());
}

#[test]
fn a_harvested_page_is_logged_again_only_when_written_again() {
    require_kvm!();
    for manual in [true, false] {
        for mode in [None, Some(DirtyMode::Bitmap)] {
            let mut vm = vm(mode, manual);
            let window = vm.dirty().subscribe().unwrap();
            vm.start().unwrap();
            let path = (mode, vm.dirty().protection());
            let range = arena() + 256;
            run_and_wait(&mut vm, "touch offset=1M size=64K", 1);
            assert_eq!(window.take().unwrap().count_range(range, 16), 16);
            run_and_wait(&mut vm, "touch offset=4M size=4K", 2);
            let idle = window.take().unwrap();
            assert_eq!(idle.count_range(range, 16), 0, "{path:?}: not rewritten");
            assert!(idle.contains(arena() + 1024), "{path:?}");
            run_and_wait(&mut vm, "touch offset=1M size=64K", 3);
            let again = window.take().unwrap();
            assert_eq!(again.count_range(range, 16), 16, "{path:?}: rewritten");
            drop(window);
            assert!(vm.stop(Duration::from_secs(1)).is_empty());
        }
    }
}

#[test]
fn written_since_boot_counts_the_guest_writes_not_the_initially_set_bits() {
    require_kvm!();
    for manual in [true, false] {
        let mut vm = vm(Some(DirtyMode::Bitmap), manual);
        vm.start().unwrap();
        run_and_wait(&mut vm, "touch size=1M", 1);
        let written = vm.dirty().written_since_boot().unwrap().unwrap();
        let path = vm.dirty().protection();
        // 256 touched pages, plus the guest's page tables, stack and mailbox.
        assert!(
            (256..256 + 128).contains(&written),
            "{path:?}: {written} of {PAGES} pages written since boot"
        );
        // A consumer that comes and goes changes nothing of it.
        drop(vm.dirty().subscribe().unwrap());
        run_and_wait(&mut vm, "touch size=1M", 2);
        let again = vm.dirty().written_since_boot().unwrap().unwrap();
        assert!(
            again >= written && again < written + 64,
            "{path:?}: {again}"
        );
        assert!(vm.stop(Duration::from_secs(1)).is_empty());
    }
}

#[test]
fn a_peek_counts_what_kvm_holds_and_loses_nothing_for_the_next_take() {
    require_kvm!();
    let paths = [
        (Some(DirtyMode::Ring(4096)), true),
        (None, true),
        (None, false),
        (Some(DirtyMode::Bitmap), true),
    ];
    for (mode, manual) in paths {
        let mut vm = vm(mode, manual);
        let window = vm.dirty().subscribe().unwrap();
        vm.start().unwrap();
        let path = (mode, vm.dirty().protection());
        run_and_wait(&mut vm, "touch offset=1M size=64K", 1);
        // Not folded yet: the ring's entries or KVM's bitmap hold them.
        let first = window.peek_count().unwrap();
        assert!((16..16 + 64).contains(&first), "{path:?}: {first}");
        run_and_wait(&mut vm, "touch offset=2M size=128K", 2);
        let second = window.peek_count().unwrap();
        assert!(
            second >= first + 32 && second < first + 32 + 64,
            "{path:?}: {first} then {second}"
        );
        let taken = window.take().unwrap();
        assert_eq!(taken.count_range(arena() + 256, 16), 16, "{path:?}");
        assert_eq!(taken.count_range(arena() + 512, 32), 32, "{path:?}");
        assert!(
            taken.count() >= second,
            "{path:?}: {second} peeked, {} taken",
            taken.count()
        );
        assert!(
            window.peek_count().unwrap() < 64,
            "{path:?}: an empty window again"
        );
        drop(window);
        assert!(vm.stop(Duration::from_secs(1)).is_empty());
    }
}
