//! Guests that go wrong, and stopping: clear reports, never a hang.

mod common;

use std::time::Duration;

use kvmscope::exits::Fault;
use kvmscope::run::{self, RunConfig};
use kvmscope::vcpu::{Control, Outcome, VcpuState};
use kvmscope::vm::{Vm, VmConfig};
use kvmscope::workload::{parse_sequence, parse_workload};

fn small() -> VmConfig {
    VmConfig {
        memory: 32 << 20,
        ..VmConfig::default()
    }
}

#[test]
fn guest_panic_is_reported_with_message_and_registers() {
    require_kvm!();
    let config = RunConfig {
        vm: small(),
        workloads: vec![parse_workload("panic").unwrap()],
        ..RunConfig::demo()
    };
    let s = run::run(config).unwrap();
    match &s.vcpus[0].outcome {
        Some(Outcome::GuestPanic { message, registers }) => {
            assert!(message.contains("guest panic requested"), "{message}");
            let registers = registers.to_string();
            assert!(registers.contains("rip=0x2"), "{registers}");
        }
        other => panic!("expected a guest panic, got {other:?}"),
    }
    assert!(s.failure().unwrap().starts_with("vCPU 0: guest panic"));
}

#[test]
fn triple_fault_is_reported_as_such() {
    require_kvm!();
    let config = RunConfig {
        vm: small(),
        workloads: vec![parse_workload("fault").unwrap()],
        ..RunConfig::demo()
    };
    let s = run::run(config).unwrap();
    assert!(
        matches!(
            &s.vcpus[0].outcome,
            Some(Outcome::Fault {
                fault: Fault::TripleFault,
                ..
            })
        ),
        "{:?}",
        s.vcpus[0].outcome
    );
    assert!(s.failure().unwrap().contains("triple fault"));
}

#[test]
fn a_failing_vcpu_stops_the_others() {
    require_kvm!();
    let config = RunConfig {
        vm: VmConfig {
            vcpus: 2,
            ..small()
        },
        workloads: vec![
            parse_workload("0: dirty ws=1M rate=1000/s for=60s").unwrap(),
            parse_workload("1: fault").unwrap(),
        ],
        ..RunConfig::demo()
    };
    let s = run::run(config).unwrap();
    assert_eq!(s.vcpus[0].outcome, Some(Outcome::Stopped));
    assert!(s.stuck.is_empty());
}

fn wait_state(vm: &Vm, vcpu: usize, want: impl Fn(&VcpuState) -> bool) {
    common::wait_for("vCPU state", Duration::from_secs(10), || {
        want(&vm.vcpus()[vcpu].shared.state()).then_some(())
    });
}

#[test]
fn stop_ends_running_and_waiting_vcpus_within_a_second() {
    require_kvm!();
    let mut vm = Vm::new(VmConfig {
        vcpus: 2,
        ..small()
    })
    .unwrap();
    vm.push_commands(0, parse_sequence("dirty ws=1M rate=max for=60s").unwrap());
    vm.start().unwrap();
    wait_state(&vm, 0, |s| matches!(s, VcpuState::Running { .. }));
    wait_state(&vm, 1, |s| *s == VcpuState::Waiting);
    let stuck = vm.stop(Duration::from_secs(1));
    assert!(stuck.is_empty(), "vCPUs {stuck:?} did not stop");
    assert!(vm
        .vcpus()
        .iter()
        .all(|v| v.outcome() == Some(&Outcome::Stopped)));
}

#[test]
fn pause_parks_a_running_vcpu_and_resume_lets_it_finish() {
    require_kvm!();
    let mut vm = Vm::new(small()).unwrap();
    vm.push_commands(
        0,
        parse_sequence("dirty ws=1M rate=1000/s for=300ms").unwrap(),
    );
    vm.start().unwrap();
    wait_state(&vm, 0, |s| matches!(s, VcpuState::Running { .. }));
    vm.control_all(Control::Pause);
    wait_state(&vm, 0, |s| *s == VcpuState::Paused);
    let exits = vm.vcpus()[0].shared.counters.total();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        vm.vcpus()[0].shared.counters.total(),
        exits,
        "a paused vCPU does not run"
    );
    vm.control_all(Control::Run);
    common::wait_for(
        "the dirty command to finish",
        Duration::from_secs(10),
        || (!vm.vcpus()[0].shared.results().is_empty()).then_some(()),
    );
    assert_eq!(vm.vcpus()[0].shared.results()[0].status, "ok");
    assert!(vm.stop(Duration::from_secs(1)).is_empty());
}

#[test]
fn wait_command_parks_the_vcpu_for_its_duration() {
    require_kvm!();
    let mut vm = Vm::new(small()).unwrap();
    vm.push_commands(0, parse_sequence("wait for=100ms; exits count=1").unwrap());
    vm.start().unwrap();
    common::wait_for("both commands", Duration::from_secs(10), || {
        (vm.vcpus()[0].shared.results().len() == 2).then_some(())
    });
    let r = vm.vcpus()[0].shared.results();
    assert!(r[0].host_time >= Duration::from_millis(100), "{:?}", r[0]);
    assert_eq!(r[1].status, "ok");
    assert!(vm.stop(Duration::from_secs(1)).is_empty());
}

#[test]
fn garbage_guest_image_is_rejected() {
    require_kvm!();
    let path = std::env::temp_dir().join(format!("kvmscope-not-an-elf-{}", std::process::id()));
    std::fs::write(&path, b"definitely not an ELF").unwrap();
    let err = Vm::new(VmConfig {
        guest: Some(path.clone()),
        ..small()
    })
    .err()
    .expect("garbage is not a guest");
    std::fs::remove_file(&path).unwrap();
    assert!(format!("{err:#}").contains("guest"), "{err}");
}

#[test]
fn too_many_vcpus_is_rejected_naming_the_limit() {
    require_kvm!();
    let err = Vm::new(VmConfig {
        vcpus: 100_000,
        ..small()
    })
    .err()
    .unwrap();
    assert!(err.to_string().contains("100000 vCPUs requested"), "{err}");
}

/// Voluntary context switches of this process's thread `tid`.
fn context_switches(tid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("voluntary_ctxt_switches"))
        .unwrap();
    line.split_whitespace().last().unwrap().parse().unwrap()
}

#[test]
fn a_vcpu_paused_in_a_wait_sleeps_past_the_wait_deadline() {
    require_kvm!();
    let mut vm = Vm::new(small()).unwrap();
    vm.push_commands(0, parse_sequence("wait for=100ms; exits count=1").unwrap());
    vm.start().unwrap();
    wait_state(&vm, 0, |s| *s == VcpuState::Waiting);
    vm.control_all(Control::Pause);
    wait_state(&vm, 0, |s| *s == VcpuState::Paused);
    let tid = *vm.vcpus()[0].shared.tid.get().unwrap();
    let before = context_switches(tid);
    // Past the wait's deadline: a parked thread must not wake over and over.
    std::thread::sleep(Duration::from_millis(300));
    let woke = context_switches(tid) - before;
    assert!(woke < 10, "the paused vCPU thread woke {woke} times");
    vm.control_all(Control::Run);
    common::wait_for("both commands", Duration::from_secs(10), || {
        (vm.vcpus()[0].shared.results().len() == 2).then_some(())
    });
    assert!(vm.stop(Duration::from_secs(1)).is_empty());
}

#[test]
fn a_run_ending_in_a_bare_wait_finishes_without_a_socket() {
    require_kvm!();
    let config = RunConfig {
        vm: small(),
        workloads: vec![parse_workload("touch size=1M; wait").unwrap()],
        ..RunConfig::demo()
    };
    let done = std::thread::spawn(move || run::run(config));
    common::wait_for("the run to end", Duration::from_secs(20), || {
        done.is_finished().then_some(())
    });
    let s = done.join().unwrap().unwrap();
    assert_eq!(
        s.vcpus[0].results.len(),
        1,
        "touch ran; the wait had nothing to wait for"
    );
}

/// Writes `image` to a fresh file for `--guest`, in a directory removed
/// when the first is dropped.
fn guest_file(test: &str, image: &[u8]) -> (common::TestDir, std::path::PathBuf) {
    let dir = common::test_dir(test);
    let path = dir.join("guest.elf");
    std::fs::write(&path, image).unwrap();
    (dir, path)
}

#[test]
fn a_guest_that_never_checks_in_is_stopped_at_the_boot_deadline_with_its_registers() {
    require_kvm!();
    let entry = kvmscope::abi::IMAGE_BASE;
    let image = common::elf::ElfImage::exec(entry, &common::elf::SPIN).bytes();
    let (dir, guest) = guest_file("spin", &image);
    let config = RunConfig {
        vm: VmConfig {
            vcpus: 2,
            guest: Some(guest.clone()),
            ..small()
        },
        workloads: Vec::new(),
        boot_timeout: Some(Duration::from_millis(500)),
        ..RunConfig::demo()
    };
    let done = std::thread::spawn(move || run::run(config));
    common::wait_for(
        "the boot deadline to end the run",
        Duration::from_secs(30),
        || done.is_finished().then_some(()),
    );
    let s = done.join().unwrap().unwrap();
    drop(dir);
    let late = s.boot_timeout.expect("a boot timeout");
    assert_eq!(late.limit, Duration::from_millis(500));
    assert_eq!(late.vcpus.len(), 2, "neither vCPU checked in");
    for (i, registers) in &late.vcpus {
        let r = registers.expect("read by the stopped vCPU thread");
        assert_eq!(r.general.unwrap().rip, entry, "vCPU {i} spins at its entry");
    }
    assert!(s.stuck.is_empty());
    assert!(late.describe().contains("did not check in within 0.5 s"));
}

#[test]
fn a_guest_that_checks_in_is_not_stopped_by_the_boot_deadline() {
    require_kvm!();
    let config = RunConfig {
        vm: small(),
        workloads: vec![parse_workload("exits count=1").unwrap()],
        boot_timeout: Some(Duration::from_secs(30)),
        ..RunConfig::demo()
    };
    let s = run::run(config).unwrap();
    assert!(s.boot_timeout.is_none());
    assert_eq!(s.vcpus[0].outcome, Some(Outcome::Stopped));
    assert!(s.vcpus[0].results.iter().all(|r| r.status == "ok"));
}
