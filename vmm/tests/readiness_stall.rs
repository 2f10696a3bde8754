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
    assert!(
        busy["text"]
            .as_str()
            .unwrap()
            .contains("guest stall (tracking)"),
        "{busy}"
    );
    // The metrics page adds up every window that has ended.
    let page = common::wait_for("the metrics page", Duration::from_secs(10), || {
        common::scrape(port)
    });
    let total = common::metric(&page, "kvmscope_guest_stall_seconds_total", &["vcpu=\"0\""])
        .expect("kvmscope_guest_stall_seconds_total on the page");
    assert!(
        (total * 1e3 - ms).abs() < 1.0,
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
    dest.quit();
}
