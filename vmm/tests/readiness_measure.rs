//! Readiness on real KVM: estimates against ground truth, and dirty rates
//! against what the guest knows it wrote.

mod common;

use std::time::Duration;

use kvmscope::dirty::DirtyMode;
use kvmscope::readiness::{measure_vm, Options, Report};
use kvmscope::vcpu::VcpuState;
use kvmscope::vm::{Vm, VmConfig};
use kvmscope::workload::parse_sequence;

const MEMORY: u64 = 64 << 20;

fn boot(dirty: Option<DirtyMode>, spec: &str) -> Vm {
    let mut vm = Vm::new(VmConfig {
        memory: MEMORY,
        dirty_log: dirty,
        ..VmConfig::default()
    })
    .unwrap();
    vm.push_commands(0, parse_sequence(spec).unwrap());
    vm.start().unwrap();
    vm
}

fn readiness(vm: &Vm, options: &Options) -> Report {
    measure_vm(vm, options, |_, _| {}).unwrap()
}

fn wait_done(vm: &Vm, n: usize) {
    common::wait_for("commands", Duration::from_secs(30), || {
        (vm.vcpus()[0].shared.results().len() >= n).then_some(())
    });
}

#[test]
fn scan_finds_exactly_the_pages_written_nonzero_and_estimates_bound_them() {
    require_kvm!();
    // k = 512 non-zero pages, z = 256 zero-written pages.
    let mut vm = boot(
        Some(DirtyMode::Bitmap),
        "touch size=2M; touch-zero offset=4M size=1M",
    );
    wait_done(&vm, 2);
    let r = readiness(
        &vm,
        &Options {
            calc_time: Duration::ZERO,
            scan: true,
            ..Options::default()
        },
    );
    let scan = &r.scan.as_ref().unwrap().value;
    assert_eq!(scan.nonzero_in_range, 512, "{}", r.to_text());
    assert!(r.mapped_pages() >= 512, "{}", r.to_text());
    assert!(
        r.written.as_ref().unwrap().value >= 512 + 256,
        "{}",
        r.to_text()
    );
    assert!(
        scan.unbacked_pages > 0,
        "most of the 64 MiB was never backed"
    );
    assert_eq!(r.estimate_used, "scan");
    assert!(r.prediction.as_ref().unwrap().converges);
    assert!(vm.stop(Duration::from_secs(1)).is_empty());
}

#[test]
fn memory_written_with_zeros_or_sparsely_on_huge_pages_is_estimated_from_a_sample() {
    require_kvm!();
    // 4 MiB non-zero, 40 MiB written with zeros: KVM maps all 44 MiB and the
    // host backs them; a sample of the resident pages read for zeros sees
    // the difference. Then, on huge pages, one page written per 2 MiB over
    // 32 MiB: 16 pages non-zero where 8,192 are mapped and backed. Both
    // guests back over 8,192 pages: the sample draws, it does not read all.
    for (hugepages, spec, written) in [
        (false, "touch size=4M; touch-zero offset=8M size=40M", 1024),
        (true, "touch offset=16M size=32M stride=512", 16),
    ] {
        let mut vm = Vm::new(VmConfig {
            memory: MEMORY,
            hugepages,
            ..VmConfig::default()
        })
        .unwrap();
        vm.push_commands(0, parse_sequence(spec).unwrap());
        vm.start().unwrap();
        wait_done(&vm, spec.split(';').count());
        let quick = Options {
            calc_time: Duration::ZERO,
            ..Options::default()
        };
        let r = readiness(&vm, &quick);
        let text = r.to_text();
        assert_eq!(r.estimate_used, "sampled", "{text}");
        let estimate = r.sampled.as_ref().unwrap().value;
        assert!(!estimate.whole(), "{estimate:?}");
        let exact = readiness(
            &vm,
            &Options {
                scan: true,
                ..quick
            },
        );
        let truth = exact.scan.as_ref().unwrap().value.nonzero_pages;
        assert!(truth >= written && truth < written + 64, "{truth}");
        assert!(r.mapped_pages() > truth + 8000, "{text}");
        // Within 2 % of the resident pages.
        let off = estimate.estimate().abs_diff(truth) as f64 / estimate.of as f64;
        assert!(off < 0.02, "{estimate:?} against {truth}: {text}");
        assert!(vm.stop(Duration::from_secs(1)).is_empty());
    }
}

#[test]
fn scan_resumes_the_guest_afterwards() {
    require_kvm!();
    let mut vm = boot(None, "touch size=1M");
    wait_done(&vm, 1);
    readiness(
        &vm,
        &Options {
            calc_time: Duration::ZERO,
            scan: true,
            ..Options::default()
        },
    );
    // The guest runs new work after the scan: it was resumed.
    vm.push_commands(0, parse_sequence("exits count=3").unwrap());
    wait_done(&vm, 2);
    assert!(vm.vcpus()[0]
        .shared
        .results()
        .iter()
        .all(|r| r.status == "ok"));
    assert!(vm.stop(Duration::from_secs(1)).is_empty());
}

/// Distinct pages expected when `writes` pages are drawn uniformly from `ws`.
fn expected_distinct(ws: f64, writes: f64) -> f64 {
    ws * (1.0 - (1.0 - 1.0 / ws).powf(writes))
}

fn measured_dirty_rate(mode: DirtyMode) -> (f64, f64) {
    let ws_pages = (32u64 << 20) / 4096;
    let rate = 2000.0;
    let vm = boot(Some(mode), "dirty ws=32M rate=2000/s for=4s");
    common::wait_for("dirty to start", Duration::from_secs(10), || {
        matches!(vm.vcpus()[0].shared.state(), VcpuState::Running { .. }).then_some(())
    });
    std::thread::sleep(Duration::from_millis(200));
    let r = readiness(
        &vm,
        &Options {
            calc_time: Duration::from_secs(1),
            scan: false,
            ..Options::default()
        },
    );
    let d = r.dirty_rate.unwrap().value;
    let expected =
        expected_distinct(ws_pages as f64, rate * d.window.as_secs_f64()) / d.window.as_secs_f64();
    (d.pages_per_s, expected)
}

#[test]
fn dirty_bitmap_rate_is_within_ten_percent_of_the_guests_rate() {
    require_kvm!();
    let (measured, expected) = measured_dirty_rate(DirtyMode::Bitmap);
    assert!(
        (measured / expected - 1.0).abs() < 0.10,
        "measured {measured:.0} pages/s, guest generated {expected:.0}"
    );
}

#[test]
fn dirty_ring_rate_is_within_ten_percent_of_the_guests_rate() {
    require_kvm!();
    let (measured, expected) = measured_dirty_rate(DirtyMode::Ring(4096));
    assert!(
        (measured / expected - 1.0).abs() < 0.10,
        "measured {measured:.0} pages/s, guest generated {expected:.0}"
    );
}

#[test]
fn ring_mode_attributes_pages_to_the_vcpu_that_wrote_them() {
    require_kvm!();
    let mut vm = Vm::new(VmConfig {
        memory: MEMORY,
        vcpus: 2,
        dirty_log: Some(DirtyMode::Ring(256)),
        ..VmConfig::default()
    })
    .unwrap();
    vm.push_commands(1, parse_sequence("touch size=4M").unwrap());
    let window = vm.dirty().subscribe().unwrap();
    vm.start().unwrap();
    common::wait_for("touch", Duration::from_secs(30), || {
        (!vm.vcpus()[1].shared.results().is_empty()).then_some(())
    });
    // 1024 pages through a 256-entry ring: ring-full exits were harvested on the way.
    let (written, per_vcpu) = window
        .sync(|w| (w.per_vcpu.iter().sum::<u64>(), w.per_vcpu.clone()))
        .unwrap();
    // A ring VM logs only while observed: "written since boot" is a bitmap VM's.
    assert_eq!(vm.dirty().written_since_boot().unwrap(), None);
    assert!(written >= 1024, "{written}");
    assert!(
        per_vcpu[1] >= 1024 && per_vcpu[0] < 64,
        "ring entries per vCPU: {per_vcpu:?}"
    );
    assert!(
        vm.vcpus()[1]
            .shared
            .counters
            .reason(kvmscope::exits::Reason::DirtyRingFull)
            > 0
    );
    assert!(vm.stop(Duration::from_secs(1)).is_empty());
}
