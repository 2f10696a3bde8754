//! The guest's workloads on real KVM: each one runs and moves the stats it should.

mod common;

use std::time::Instant;

use kvmscope::run::{self, RunConfig};
use kvmscope::summary::Summary;
use kvmscope::vm::VmConfig;
use kvmscope::workload::parse_workload;

fn run_with(memory: u64, vcpus: usize, hugepages: bool, specs: &[&str]) -> Summary {
    let config = RunConfig {
        vm: VmConfig {
            memory,
            vcpus,
            hugepages,
            ..VmConfig::default()
        },
        workloads: specs.iter().map(|s| parse_workload(s).unwrap()).collect(),
        process_start: Instant::now(),
        ..RunConfig::demo()
    };
    let summary = run::run(config).expect("the VM runs");
    assert_eq!(summary.failure(), None, "{}", summary.to_text());
    summary
}

fn kvm(summary: &Summary, vcpu: usize, name: &str) -> u64 {
    summary.vcpus[vcpu]
        .kvm
        .iter()
        .find(|(n, _)| n == name)
        .map_or(0, |(_, v)| *v)
}

#[test]
fn touch_of_n_pages_maps_at_least_n_pages() {
    require_kvm!();
    let s = run_with(64 << 20, 1, false, &["touch size=4M"]);
    let r = &s.vcpus[0].results[0];
    assert_eq!((r.status.as_str(), r.values[0]), ("ok", 1024));
    assert!(
        s.after.pages_4k - s.before.pages_4k >= 1024,
        "{}",
        s.to_text()
    );
    assert!(kvm(&s, 0, "pf_fixed") >= 1024, "{}", s.to_text());
}

#[test]
fn touch_with_stride_writes_every_nth_page() {
    require_kvm!();
    let s = run_with(64 << 20, 1, false, &["touch size=4M stride=4"]);
    assert_eq!(s.vcpus[0].results[0].values[0], 256);
    assert!(s.after.pages_4k - s.before.pages_4k >= 256);
}

#[test]
fn touch_zero_and_read_also_map_pages() {
    require_kvm!();
    let s = run_with(
        64 << 20,
        1,
        false,
        &["touch-zero size=2M; read offset=2M size=2M"],
    );
    let res = &s.vcpus[0].results;
    assert_eq!((res[0].values[0], res[1].values[0]), (512, 512));
    assert_eq!(res[1].values[2], 0, "never-written pages read as zero");
    assert!(
        s.after.pages_4k - s.before.pages_4k >= 1024,
        "{}",
        s.to_text()
    );
}

#[test]
fn read_sees_what_touch_wrote() {
    require_kvm!();
    let s = run_with(
        64 << 20,
        1,
        false,
        &["touch size=8K pattern=0x1000; read size=8K"],
    );
    // Page p of the arena holds (pattern | 1) ^ its address; read xors one word of each.
    let arena = kvmscope::abi::ARENA_BASE;
    let expected = (0x1001 ^ arena) ^ (0x1001 ^ (arena + 4096));
    assert_eq!(s.vcpus[0].results[1].values[2], expected);
}

#[test]
fn hugepages_touch_maps_2m_pages() {
    require_kvm!();
    let s = run_with(128 << 20, 1, true, &["touch size=64M"]);
    assert!(
        s.after.pages_2m - s.before.pages_2m >= 16,
        "a 64 MiB touch on THP-backed RAM maps 2 MiB pages: {}",
        s.to_text()
    );
}

#[test]
fn dirty_reports_its_writes_at_the_requested_rate() {
    require_kvm!();
    let s = run_with(
        64 << 20,
        1,
        false,
        &["dirty ws=16M rate=5000/s for=400ms seed=3"],
    );
    let r = &s.vcpus[0].results[0];
    let (writes, distinct) = (r.values[0], r.values[2]);
    assert!(
        (1800..=2001).contains(&writes),
        "5000/s for 400 ms is 2000 writes, got {writes}"
    );
    assert!(
        distinct > 0 && distinct <= writes,
        "distinct {distinct} of {writes}"
    );
    assert!(
        s.after.pages_4k - s.before.pages_4k >= distinct,
        "{}",
        s.to_text()
    );
}

#[test]
fn exits_workload_counts_port_and_mmio_exits_both_ways() {
    require_kvm!();
    let s = run_with(64 << 20, 1, false, &["exits ports=300 mmio=200"]);
    let ours = &s.vcpus[0].ours;
    assert_eq!(ours["devices"]["exit_test_port"], 300);
    assert_eq!(ours["devices"]["mmio_test"], 200);
    assert_eq!(ours["reasons"]["mmio_write"], 200);
    assert!(
        kvm(&s, 0, "exits") >= 500,
        "KVM counted every exit to userspace: {}",
        s.to_text()
    );
}

#[test]
fn four_vcpus_run_workloads_at_once() {
    require_kvm!();
    let specs = [
        "0: touch offset=0 size=2M; exits count=50",
        "1: touch offset=2M size=2M; exits count=50",
        "2: touch offset=4M size=2M; exits count=50",
        "3: touch offset=6M size=2M; exits count=50",
    ];
    let s = run_with(64 << 20, 4, false, &specs);
    for v in &s.vcpus {
        assert_eq!(v.results.len(), 2, "vcpu{}", v.index);
        assert!(v.results.iter().all(|r| r.status == "ok"));
        assert_eq!(v.ours["devices"]["exit_test_port"], 50);
    }
    assert!(s.after.pages_4k - s.before.pages_4k >= 4 * 512);
}

#[test]
fn all_target_runs_on_every_vcpu() {
    require_kvm!();
    let s = run_with(64 << 20, 3, false, &["all: exits count=10"]);
    assert!(s
        .vcpus
        .iter()
        .all(|v| v.ours["devices"]["exit_test_port"] == 10));
}

#[test]
fn workload_outside_the_arena_is_rejected_before_boot() {
    require_kvm!();
    let config = RunConfig {
        vm: VmConfig {
            memory: 32 << 20,
            ..VmConfig::default()
        },
        workloads: vec![parse_workload("touch size=64M").unwrap()],
        ..RunConfig::demo()
    };
    let err = run::run(config).expect_err("a 64M touch cannot fit a 32M guest");
    let text = kvmscope::error_chain(&err);
    assert!(
        text.starts_with("workload for vCPU 0: touch range") && text.contains("does not fit"),
        "{text}"
    );
    assert_eq!(
        text.matches("does not fit").count(),
        1,
        "the cause is said once: {text}"
    );
}

#[test]
fn workload_for_a_missing_vcpu_is_rejected() {
    require_kvm!();
    let config = RunConfig {
        vm: VmConfig {
            memory: 32 << 20,
            vcpus: 2,
            ..VmConfig::default()
        },
        workloads: vec![parse_workload("5: exits").unwrap()],
        ..RunConfig::demo()
    };
    let err = run::run(config).expect_err("vCPU 5 does not exist");
    let text = kvmscope::error_chain(&err);
    assert!(text.starts_with("workload target: vCPU 5"), "{text}");
}
