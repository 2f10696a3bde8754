//! The guest's stall: what a readiness window and a migration cost the guest
//! in vCPU time, measured from its vCPU threads' CPU time outside the guest
//! (docs/READINESS.md, "What tracking costs the guest").

mod common;

use std::time::Duration;

use common::migration::{guest, migrate, queue, Dest};
use common::ServedVm;
use kvmscope::dirty::DirtyMode;
use kvmscope::migration::Status;
use serde_json::{json, Value};

const MEM: u64 = 256 << 20;

fn window(vm: &ServedVm, seconds: f64) -> Value {
    let mut c = vm.client();
    let (r, _) = c
        .execute("query-readiness", json!({ "calc-time": seconds }))
        .expect("query-readiness");
    r
}

fn stall_ms(r: &Value) -> f64 {
    r["guest_stall"]["total_ms"]
        .as_f64()
        .unwrap_or_else(|| panic!("no guest_stall in {r}"))
}

/// Waits until vCPU 0 runs the command queued last (its result not in yet).
fn wait_running(vm: &ServedVm) {
    let mut c = vm.client();
    common::wait_for("vCPU 0 to run its command", Duration::from_secs(10), || {
        let (v, _) = c.execute("query-guest", json!({"vcpus": [0]})).ok()?;
        (v[0]["state"] == "running").then_some(())
    });
}

#[test]
fn a_window_over_a_writing_guest_reports_its_stall_and_over_an_idle_one_none() {
    require_kvm!();
    let port = common::free_port();
    let vm = ServedVm::start_with("stall-window", MEM, 1, |c| {
        c.vm.dirty_log = Some(DirtyMode::Ring(4096));
        c.sampler = Some(kvmscope::sampler::SamplerConfig {
            interval: Duration::from_millis(50),
            capacity: 64,
            out: None,
        });
        c.metrics_addr = Some(([127, 0, 0, 1], port).into());
    });
    let idle = window(&vm, 0.5);
    assert_eq!(stall_ms(&idle), 0.0, "an idle guest loses nothing: {idle}");
    assert_eq!(idle["guest_stall"]["vcpus"][0]["cpu_index"], 0, "{idle}");

    let mut c = vm.client();
    // Backed first: the host's own first-touch faults are not tracking's, and
    // would count in the rate before the window.
    guest(&mut c, 0, "touch offset=0 size=32M");
    queue(&mut c, 0, "dirty offset=0 ws=32M rate=max for=4s");
    wait_running(&vm);
    let busy = std::thread::scope(|s| {
        let w = s.spawn(|| window(&vm, 1.0));
        // While the window runs, the samples already show its stall so far
        // (not only once it ends).
        let open = common::wait_for("a sample with a stall", Duration::from_secs(10), || {
            let (v, _) = c.execute("query-samples", json!({"max": 1})).ok()?;
            let ns = v["samples"][0]["vcpus"][0]["stall_ns"].as_u64()?;
            (ns > 0).then(|| !w.is_finished())
        });
        assert!(open, "the stall showed only once the window had ended");
        w.join().expect("the window")
    });
    let ms = stall_ms(&busy);
    let period_ms = busy["guest_stall"]["period_s"].as_f64().unwrap() * 1e3;
    // A ring of 4,096 entries under 8,192 pages rewritten as fast as the
    // guest can: every write after a harvest faults, and the ring fills.
    assert!(ms > 0.0, "a writing guest under a ring window: {busy}");
    assert!(
        ms <= period_ms + 20.0,
        "one vCPU loses at most the window: {busy}"
    );
    let share = busy["guest_stall"]["share"].as_f64().unwrap();
    assert!((share - ms / period_ms).abs() < 1e-6, "{busy}");
    // The part of it that was waiting for a CPU is given apart (null where
    // the vCPU's usual waiting was not known yet), never more than the
    // stall it is part of, and in all as per vCPU.
    let waited = &busy["guest_stall"]["vcpus"][0]["waited_ms"];
    assert!(waited.is_null() || waited.is_f64(), "{busy}");
    if let Some(w) = waited.as_f64() {
        assert!((0.0..=ms + 1e-9).contains(&w), "{busy}");
    }
    assert_eq!(&busy["guest_stall"]["waited_ms"], waited, "{busy}");
    assert!(
        busy["text"]
            .as_str()
            .unwrap()
            .contains("guest stall (tracking)"),
        "{busy}"
    );
    // The metrics page adds up every window that has ended, and what each
    // cost in the 2 s after it (pages a ring reset protected during the
    // window and the guest wrote again after it).
    let page = common::wait_for("the metrics page", Duration::from_secs(10), || {
        common::scrape(port)
    });
    let total = common::metric(&page, "kvmscope_guest_stall_seconds_total", &["vcpu=\"0\""])
        .expect("kvmscope_guest_stall_seconds_total on the page");
    assert!(
        total * 1e3 >= ms - 1.0 && total * 1e3 <= ms + 2_000.0,
        "{total} s on the page, {ms} ms in the report (the idle window added 0)"
    );
    common::check_with_promtool(&page);
    vm.quit();
}

#[test]
fn a_migration_of_a_writing_guest_reports_its_stall() {
    require_kvm!();
    let _serial = common::migration::serial();
    let src = ServedVm::start("stall-migrate", MEM, 1);
    let mut c = src.client();
    guest(&mut c, 0, "touch offset=0 size=128M pattern=0x5a");
    queue(&mut c, 0, "dirty offset=0 ws=32M rate=max for=8s");
    wait_running(&src);
    let dest = Dest::start("stall-migrate-dest", |_, _| {});
    let info = migrate(&src, &dest.uri, json!({}));
    assert_eq!(
        info.status,
        Some(Status::Completed),
        "{:?}",
        info.error_desc
    );
    let stall = info.x_guest_stall.expect("x-guest-stall on the source");
    assert_eq!(stall.vcpus.len(), 1);
    assert!(
        stall.total_ms > 0.0,
        "each pass re-protects what the guest rewrote: {stall:?}"
    );
    assert_eq!(stall.total_ms, stall.vcpus[0].ms);
    // Its waiting for a CPU, when measured, is part of it and given apart.
    assert_eq!(stall.waited_ms, stall.vcpus[0].waited_ms, "{stall:?}");
    if let Some(w) = stall.waited_ms {
        assert!((0.0..=stall.total_ms).contains(&w), "{stall:?}");
    }
    dest.quit();
}

/// vCPU 0's stat `name` from `provider`, through `query-stats`: KVM's
/// `pf_taken`, or the VMM's own `guest_stall_ns` (its running stall total).
fn vcpu0_stat(vm: &ServedVm, provider: &str, name: &str) -> u64 {
    let mut c = vm.client();
    let (v, _) = c
        .execute(
            "query-stats",
            json!({"target": "vcpu", "vcpus": ["/machine/unattached/device[0]"],
                   "providers": [{"provider": provider, "names": [name]}]}),
        )
        .expect("query-stats");
    v[0]["stats"][0]["value"]
        .as_u64()
        .unwrap_or_else(|| panic!("no {name} in {v}"))
}

fn faults(vm: &ServedVm) -> u64 {
    vcpu0_stat(vm, "kvm", "pf_taken")
}

fn own_stall_ns(vm: &ServedVm) -> u64 {
    vcpu0_stat(vm, "kvmscope", "guest_stall_ns")
}

/// A ring VM of `entries` entries whose vCPU 0 runs `writer` over the 32
/// MiB it backed first.
fn ring_writer(test: &str, entries: u32, writer: &str) -> ServedVm {
    let vm = ServedVm::start_with(test, MEM, 1, |c| {
        c.vm.dirty_log = Some(DirtyMode::Ring(entries));
    });
    let mut c = vm.client();
    guest(&mut c, 0, "touch offset=0 size=32M");
    queue(&mut c, 0, writer);
    wait_running(&vm);
    vm
}

#[test]
fn a_window_leaves_the_pages_the_guest_wrote_writable_when_it_ends() {
    require_kvm!();
    // A ring that holds every page of the set: no reset during the window.
    let vm = ring_writer(
        "stall-leave",
        16384,
        "dirty offset=0 ws=32M rate=max for=4s",
    );
    let r = window(&vm, 1.0);
    let at_end = faults(&vm);
    std::thread::sleep(Duration::from_millis(500));
    let after = faults(&vm) - at_end;
    let pages = r["dirty_rate"]["pages"].as_u64().expect("pages");
    // A writer this fast rewrites its 8,192 pages within the window: each
    // faulted once when logging protected it. Had the window's last look
    // protected them again, each would fault once more here.
    assert!(pages >= 8_000, "the writer covered its set: {r}");
    assert!(
        after < pages / 20,
        "{after} faults in the 0.5 s after a window of {pages} pages"
    );
    // And the reply says so: of what the guest has mapped, only the few
    // pages it did not write in the window are left protected.
    let left = left_protected(&r);
    assert!(left < pages / 20, "{left} pages left protected: {r}");
    vm.quit();
}

fn left_protected(r: &Value) -> u64 {
    r["guest_stall"]["left_protected_pages"]
        .as_u64()
        .unwrap_or_else(|| panic!("no left_protected_pages in {r}"))
}

/// The pages a window leaves protected are the guest's mapped pages it did
/// not write after their last protection: a writer over 8 MiB of the 32 MiB
/// it mapped leaves the other 24 MiB (and no more than what it mapped).
fn names_what_it_leaves_protected(mode: DirtyMode) {
    let vm = ServedVm::start_with("stall-left", MEM, 1, |c| c.vm.dirty_log = Some(mode));
    let mut c = vm.client();
    guest(&mut c, 0, "touch offset=0 size=32M");
    queue(&mut c, 0, "dirty offset=0 ws=8M rate=max for=4s");
    wait_running(&vm);
    let r = window(&vm, 0.5);
    let pages = r["dirty_rate"]["pages"].as_u64().expect("pages");
    assert!(
        pages >= 2_000,
        "{mode}: the writer covered its 2,048 pages: {r}"
    );
    let left = left_protected(&r);
    let mapped = r["mapped"]["bytes"].as_u64().expect("mapped") / 4096;
    assert!(
        (8_192 - 2_048 - 64..=mapped + 256).contains(&left),
        "{mode}: {left} pages left protected of {mapped} mapped, {pages} written: {r}"
    );
    let at_end = faults(&vm);
    std::thread::sleep(Duration::from_millis(500));
    let after = faults(&vm) - at_end;
    assert!(
        after < 200,
        "{mode}: the writer stays on pages left writable: {after} faults after"
    );
    let cost_us = r["guest_stall"]["fault_cost_us"].as_f64().unwrap();
    let most = r["guest_stall"]["left_stall_ms_max"].as_f64().unwrap();
    assert!(
        (most - left as f64 * cost_us / 1e3).abs() < 1e-3,
        "{mode}: a fault each at most: {r}"
    );
    // The window saw the writer's 8 MiB set, all of it left writable: it
    // expects next to none of the rest to be paid for.
    let expected = r["guest_stall"]["left_stall_ms_expected"].as_f64();
    assert!(
        expected.is_some_and(|e| e < most / 10.0),
        "{mode}: {expected:?} ms expected of {most} at most: {r}"
    );
    assert!(
        r["text"].as_str().unwrap().contains("left write-protected"),
        "{r}"
    );
    vm.quit();
}

#[test]
fn a_ring_window_names_the_pages_it_leaves_protected() {
    require_kvm!();
    names_what_it_leaves_protected(DirtyMode::Ring(65536));
}

#[test]
fn a_bitmap_window_names_the_pages_it_leaves_protected() {
    require_kvm!();
    names_what_it_leaves_protected(DirtyMode::Bitmap);
}

#[test]
fn what_a_window_leaves_protected_costs_the_guest_after_it_and_counts() {
    require_kvm!();
    // Slow enough that most of its 8,192 pages are still protected when the
    // window ends, and it writes them over the seconds after.
    let vm = ring_writer(
        "stall-aftermath",
        65536,
        "dirty offset=0 ws=32M rate=4000/s for=6s",
    );
    let before = own_stall_ns(&vm);
    let r = window(&vm, 0.3);
    let window_ns = (stall_ms(&r) * 1e6) as u64;
    let at_end = faults(&vm);
    // The aftermath is counted for 2 s, then added to the running total
    // within one publishing period.
    std::thread::sleep(Duration::from_millis(2_600));
    let after = faults(&vm) - at_end;
    let total = own_stall_ns(&vm) - before;
    assert!(
        after > 1_000,
        "the protected pages faulted after the window: {after}"
    );
    // The reply named them: the faults after come from the pages it left
    // protected (the writer's set is all mapped, so no first touches).
    let left = left_protected(&r);
    assert!(
        after <= left + 200,
        "{after} faults after a window that left {left} pages protected: {r}"
    );
    assert!(
        total >= window_ns + 1_000 * 2_000,
        "the running total ({total} ns) adds the window ({window_ns} ns) and the \
         {after} faults after it"
    );
    vm.quit();
}

#[test]
fn the_hosts_cost_per_fault_is_measured_from_tracked_and_untracked_sweeps() {
    require_kvm!();
    let c = kvmscope::readiness::calibrate::measure().expect("calibration");
    // A write to a protected page faults into KVM (on this software
    // backend, 2.5-3.2 us here against 0.2 us a page untracked); with PML
    // on hardware there is no fault and the difference is small, but never
    // the other way round.
    assert!(
        c.tracked > c.untracked,
        "tracked {:?}, untracked {:?}",
        c.tracked,
        c.untracked
    );
    assert!(
        (Duration::from_nanos(100)..Duration::from_millis(1)).contains(&c.fault_cost),
        "{c:?}"
    );
    // Shadow paging (this software backend): every tracked write faults.
    if std::path::Path::new("/sys/module/kvm_pvm").exists() {
        assert!(c.tracked > c.untracked * 3, "{c:?}");
    }
}

#[test]
fn a_guest_whose_own_exits_cost_system_time_is_not_read_as_stalled() {
    require_kvm!();
    let _serial = common::migration::serial();
    let vm = ServedVm::start_with("stall-exits", MEM, 1, |c| {
        c.vm.dirty_log = Some(DirtyMode::Ring(4096));
    });
    let mut c = vm.client();
    // Port I/O exits to the VMM as fast as it can (about 40,000 a second
    // here): half the vCPU thread's time is system time, watched or not,
    // and the loop writes no memory.
    queue(&mut c, 0, "exits count=2000000");
    wait_running(&vm);
    // The VMM's readings of its usual rates (every 100 ms) cover a second.
    std::thread::sleep(Duration::from_millis(1200));
    for n in 0..2 {
        // The second comes right after the first: the rates seen before it.
        // Measured against zero, its system time read 43-53 % of the
        // window; what is left is waiting for a CPU beyond the usual, which
        // other tests running beside it on a small host can add.
        let r = window(&vm, 1.0);
        let share = r["guest_stall"]["share"].as_f64().unwrap();
        assert!(share < 0.25, "window {n}: {share} of it read as stall: {r}");
    }
    vm.quit();
}
