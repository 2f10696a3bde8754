//! Auto-converge (QEMU's `auto-converge` capability and `cpu-throttle-*`
//! parameters): a guest that dirties memory faster than the link sends it
//! completes once its vCPUs are throttled, and the throttle is lifted when
//! the migration ends, whatever its outcome.

mod common;

use std::time::Duration;

use common::migration::{migrate, query, queue, Dest};
use common::ServedVm;
use kvmscope::dirty::DirtyMode;
use kvmscope::migration::Status;
use serde_json::{json, Value};

const MEM: u64 = 128 << 20;

/// A source whose guest rewrites 32 MiB as fast as it can, for long, with
/// auto-converge on.
fn busy_source(test: &str) -> ServedVm {
    let src = busy_guest(test);
    src.client()
        .execute(
            "migrate-set-capabilities",
            json!({"capabilities": [{"capability": "auto-converge", "state": true}]}),
        )
        .unwrap();
    src
}

fn busy_guest(test: &str) -> ServedVm {
    let src = ServedVm::start_with(test, MEM, 1, |c| c.vm.dirty_log = Some(DirtyMode::Bitmap));
    let mut c = src.client();
    common::migration::guest(&mut c, 0, "touch size=32M");
    queue(&mut c, 0, "dirty ws=32M rate=max for=120s");
    src
}

/// A link far slower than the guest dirties (20 MB/s), big throttle steps
/// so that the test ends soon.
fn slow_link() -> Value {
    json!({"max-bandwidth": 20_000_000, "downtime-limit": 300,
           "cpu-throttle-initial": 80, "cpu-throttle-increment": 10})
}

/// The source's own stat for vCPU 0 (provider `kvmscope`).
fn own_vcpu_stat(src: &ServedVm, name: &str) -> u64 {
    own_vcpu_stat_of(src.client(), name)
}

#[test]
fn a_guest_that_dirties_faster_than_the_link_completes_throttled_and_is_released() {
    require_kvm!();
    let _serial = common::migration::serial();
    let src = busy_source("conv-done");
    let dest = Dest::start("conv-done-dst", |_, _| {});
    let info = migrate(&src, &dest.uri, slow_link());
    assert_eq!(
        info.status,
        Some(Status::Completed),
        "{:?}",
        info.error_desc
    );
    let pct = info
        .cpu_throttle_percentage
        .expect("cpu-throttle-percentage");
    assert!((80..=99).contains(&pct), "throttled to {pct} %");
    let throttled = info.x_cpu_throttled.expect("x-cpu-throttled");
    assert!(throttled.total_ms > 0.0, "{throttled:?}");
    // The source's throttle is lifted as the migration ends (the stats
    // files are refreshed every 100 ms).
    common::wait_for("the throttle lifted", Duration::from_secs(2), || {
        (own_vcpu_stat(&src, "throttle_percentage") == 0).then_some(())
    });
    // The guest runs on at the destination, unthrottled, its command still going.
    let (g, _) = dest
        .client()
        .execute("query-guest", json!({"vcpus": [0]}))
        .unwrap();
    assert_eq!(g[0]["state"], "running", "{g}");
    assert_eq!(own_vcpu_stat_of(dest.client(), "throttle_percentage"), 0);
    dest.quit();
}

fn own_vcpu_stat_of(mut c: kvmscope::client::Client, name: &str) -> u64 {
    let (v, _) = c
        .execute(
            "query-stats",
            json!({"target": "vcpu", "providers": [{"provider": "kvmscope", "names": [name]}]}),
        )
        .unwrap();
    v[0]["stats"][0]["value"].as_u64().unwrap()
}

#[test]
fn a_cancelled_migration_lifts_the_throttle_and_the_guest_runs_on() {
    require_kvm!();
    let _serial = common::migration::serial();
    let src = busy_source("conv-cancel");
    let dest = Dest::start("conv-cancel-dst", |_, _| {});
    let mut c = src.client();
    c.execute("migrate-set-parameters", slow_link()).unwrap();
    c.execute("migrate", json!({"uri": dest.uri})).unwrap();
    common::wait_for("a throttle", Duration::from_secs(30), || {
        (own_vcpu_stat(&src, "throttle_percentage") >= 80).then_some(())
    });
    // Capabilities do not change under a running migration (QEMU's words).
    let refused = c.execute(
        "migrate-set-capabilities",
        json!({"capabilities": [{"capability": "auto-converge", "state": false}]}),
    );
    let e = format!("{:?}", refused.unwrap_err());
    assert!(e.contains("There's a migration process in progress"), "{e}");
    c.execute("migrate_cancel", json!({})).unwrap();
    let info = common::wait_for("the cancel", Duration::from_secs(30), || {
        let i = query(&mut c);
        i.status.is_some_and(Status::is_final).then_some(i)
    });
    assert_eq!(info.status, Some(Status::Cancelled));
    common::wait_for("the throttle lifted", Duration::from_secs(2), || {
        (own_vcpu_stat(&src, "throttle_percentage") == 0).then_some(())
    });
    // The lift ends a sleep under way within one step (2 ms; at 99 % a
    // sleep that did not give way would last up to 2 s): allow for a busy
    // host, then nothing more may be slept.
    std::thread::sleep(Duration::from_millis(100));
    let slept = own_vcpu_stat(&src, "throttled_ns");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        own_vcpu_stat(&src, "throttled_ns"),
        slept,
        "no throttle sleep after the cancel"
    );
    let (status, _) = c.execute("query-status", json!({})).unwrap();
    assert_eq!(status["status"], "running");
    drop(dest);
}

#[test]
fn converge_auto_throttles_from_the_start_to_what_the_model_chose() {
    require_kvm!();
    let _serial = common::migration::serial();
    let src = busy_guest("conv-auto");
    let dest = Dest::start("conv-auto-dst", |_, _| {});
    let text = common::migration::converge_auto(&src, &dest.uri);
    let chosen: u64 = common::number_after(&text, "--converge auto: auto-converge at ")
        .unwrap_or_else(|| panic!("no throttle chosen:\n{text}"));
    assert!((1..=99).contains(&chosen), "{text}");
    let info = query(&mut src.client());
    let pct = info.cpu_throttle_percentage.unwrap();
    assert!(
        pct >= chosen,
        "set {chosen} % from the start, ended at {pct} %"
    );
    // It started throttled: the throttle took vCPU time from pass 1 on.
    assert!(info.x_cpu_throttled.unwrap().total_ms > 0.0);
    dest.quit();
}

/// A bitmap VM of two vCPUs: vCPU 0 rewrites 32 MiB as fast as it can, for
/// long; vCPU 1 runs `second` (queued, the last without waiting).
fn bitmap_pair(test: &str, second: &[&str]) -> ServedVm {
    let src = ServedVm::start_with(test, MEM, 2, |c| {
        c.vm.dirty_log = Some(DirtyMode::Bitmap);
    });
    let mut c = src.client();
    common::migration::guest(&mut c, 0, "touch size=32M");
    queue(&mut c, 0, "dirty ws=32M rate=max for=120s");
    for (i, command) in second.iter().enumerate() {
        if i + 1 < second.len() {
            common::migration::guest(&mut c, 1, command);
        } else {
            queue(&mut c, 1, command);
        }
    }
    src
}

#[test]
fn converge_auto_on_a_bitmap_vm_throttles_only_the_vcpu_that_writes() {
    require_kvm!();
    let _serial = common::migration::serial();
    // vCPU 0 rewrites 32 MiB as fast as it can; vCPU 1 writes ten pages a
    // second, next to nothing: the window's faults tell them apart.
    let src = bitmap_pair(
        "conv-auto-two",
        &["dirty offset=64M ws=1M rate=10 for=120s"],
    );
    let mut c = src.client();
    let dest = Dest::start("conv-auto-two-dst", |_, _| {});
    let text = common::migration::converge_auto(&src, &dest.uri);
    assert!(
        text.contains("% from the start on vCPU 0 ("),
        "the writer alone:\n{text}"
    );
    let info = query(&mut c);
    let asleep = info.x_cpu_throttled.expect("x-cpu-throttled").vcpus;
    assert!(
        asleep[0].ms > 0.0 && asleep[1].ms == 0.0,
        "vCPU 0 throttled, vCPU 1 not: {asleep:?}"
    );
    let (p, _) = c.execute("query-migrate-parameters", json!({})).unwrap();
    assert_eq!(p["x-cpu-throttle-vcpus"], json!([0]), "{p}");
    dest.quit();
}

#[test]
fn a_throttle_of_named_vcpus_widens_to_every_vcpu_once_the_others_write() {
    require_kvm!();
    let _serial = common::migration::serial();
    // Both vCPUs rewrite 32 MiB as fast as they can; the throttle is asked
    // for vCPU 0 alone, at its most from the start: vCPU 1's faults say it
    // writes, the guest outruns the link, and every vCPU is throttled (a
    // guest over the link whose other vCPU writes next to nothing is not:
    // `converge_auto_on_a_bitmap_vm_throttles_only_the_vcpu_that_writes`).
    let src = bitmap_pair(
        "conv-widen",
        &[
            "touch offset=64M size=32M",
            "dirty offset=64M ws=32M rate=max for=120s",
        ],
    );
    let mut c = src.client();
    c.execute(
        "migrate-set-capabilities",
        json!({"capabilities": [{"capability": "auto-converge", "state": true}]}),
    )
    .unwrap();
    let dest = Dest::start("conv-widen-dst", |_, _| {});
    let info = migrate(
        &src,
        &dest.uri,
        // At most 6 passes: the widening is what is tested, not whether
        // two writers at 99 % fit the link.
        json!({"max-bandwidth": 20_000_000, "downtime-limit": 300, "x-max-rounds": 6,
               "cpu-throttle-initial": 99, "x-cpu-throttle-at-start": true,
               "x-cpu-throttle-vcpus": [0]}),
    );
    common::migration::assert_completed(&info);
    let asleep = info.x_cpu_throttled.expect("x-cpu-throttled").vcpus;
    assert!(
        asleep[0].ms > 0.0 && asleep[1].ms > 0.0,
        "both throttled in the end: {asleep:?}"
    );
    dest.quit();
}

#[test]
fn a_blindly_throttled_migration_says_its_prediction_had_no_throttle() {
    require_kvm!();
    let _serial = common::migration::serial();
    use kvmscope::client::migrate::{Converge, MigrateConfig};
    let src = busy_guest("conv-blind");
    let dest = Dest::start("conv-blind-dst", |_, _| {});
    // QEMU's blind steps: the prediction is of the migration unthrottled,
    // and the table must not read as the model's error. At most 4 passes:
    // long enough for a step (two periods of dirtying too fast).
    let config = MigrateConfig {
        socket: src.socket.clone(),
        to: dest.uri.clone(),
        bandwidth: Some(20_000_000),
        max_downtime: Some(Duration::from_millis(300)),
        max_rounds: Some(4),
        predict: true,
        converge: Some(Converge::AutoConverge),
        json: false,
        stop: None,
    };
    let mut out = Vec::new();
    kvmscope::client::migrate::migrate(&config, &mut out).unwrap();
    let text = String::from_utf8_lossy(&out);
    assert!(text.contains("cpu throttle percentage: "), "{text}");
    assert!(
        text.contains("(predicted without a throttle; this migration was throttled"),
        "{text}"
    );
    dest.quit();
}

#[test]
fn capabilities_and_throttle_parameters_are_checked_with_qemus_names() {
    require_kvm!();
    let vm = ServedVm::start("conv-params", 64 << 20, 1);
    let mut c = vm.client();
    let (caps, _) = c.execute("query-migrate-capabilities", json!({})).unwrap();
    assert_eq!(
        caps,
        json!([{"capability": "auto-converge", "state": false},
               {"capability": "dirty-limit", "state": false},
               {"capability": "events", "state": true}])
    );
    let set = |c: &mut kvmscope::client::Client, name: &str, state: bool| {
        c.execute(
            "migrate-set-capabilities",
            json!({"capabilities": [{"capability": name, "state": state}]}),
        )
        .map_err(|e| format!("{e:?}"))
    };
    assert!(set(&mut c, "auto-converge", true).is_ok());
    let e = set(&mut c, "dirty-limit", true).unwrap_err();
    assert!(
        e.contains("requires KVM with accelerator property 'dirty-ring-size' set"),
        "{e}"
    );
    // QEMU's others: off is taken (scripts turn them off), on is refused
    // naming it, an unknown name refused as one.
    let e = set(&mut c, "xbzrle", true).unwrap_err();
    assert!(
        e.contains("kvmscope does not implement the migration capability 'xbzrle'"),
        "{e}"
    );
    assert!(set(&mut c, "postcopy-ram", false).is_ok());
    let e = set(&mut c, "nope", false).unwrap_err();
    assert!(e.contains("unknown variant `nope`"), "{e}");
    // `events`: on as libvirt sets it; kvmscope sends them always.
    assert!(set(&mut c, "events", true).is_ok());
    let e = set(&mut c, "events", false).unwrap_err();
    assert!(e.contains("'events' cannot be turned off"), "{e}");
    let (caps, _) = c.execute("query-migrate-capabilities", json!({})).unwrap();
    assert_eq!(caps[0]["state"], true, "{caps}");
    for (name, bad) in [("cpu-throttle-initial", 0), ("max-cpu-throttle", 100)] {
        let e = c
            .execute("migrate-set-parameters", json!({ name: bad }))
            .unwrap_err();
        let e = format!("{e:?}");
        assert!(
            e.contains(&format!(
                "Parameter '{name}' expects a value from 1 to 99, not {bad}"
            )),
            "{e}"
        );
    }
    // The most below the first, as the parameters would be (QEMU's check):
    // refused, nothing changed.
    for bad in [
        json!({"max-cpu-throttle": 10}),
        json!({"cpu-throttle-initial": 50, "max-cpu-throttle": 40}),
    ] {
        let e = c.execute("migrate-set-parameters", bad).unwrap_err();
        let e = format!("{e:?}");
        assert!(
            e.contains("Parameter 'max-cpu-throttle' expects a value from cpu-throttle-initial"),
            "{e}"
        );
    }
    // kvmscope's x-cpu-throttle-vcpus: the VM's own vCPUs only.
    let e = c
        .execute(
            "migrate-set-parameters",
            json!({"x-cpu-throttle-vcpus": [0, 1]}),
        )
        .unwrap_err();
    let e = format!("{e:?}");
    assert!(
        e.contains(
            "Parameter 'x-cpu-throttle-vcpus' expects the VM's vCPUs (cpu-index 0 to 0), not 1"
        ),
        "{e}"
    );
    let (p, _) = c.execute("query-migrate-parameters", json!({})).unwrap();
    assert_eq!(p["x-cpu-throttle-vcpus"], json!([]), "every vCPU: {p}");
    assert_eq!(
        (
            &p["cpu-throttle-initial"],
            &p["cpu-throttle-increment"],
            &p["max-cpu-throttle"]
        ),
        (&json!(20), &json!(10), &json!(99))
    );
}

/// A stop the round limit forced over the downtime limit says so in the
/// final record (a forced 680 ms stop read as any completed migration).
#[test]
fn a_stop_forced_by_the_round_limit_says_so_when_completed() {
    require_kvm!();
    let _serial = common::migration::serial();
    let src = busy_guest("conv-forced");
    let dest = Dest::start("conv-forced-dst", |_, _| {});
    let info = migrate(
        &src,
        &dest.uri,
        json!({"max-bandwidth": 20_000_000, "downtime-limit": 20, "x-max-rounds": 2}),
    );
    common::migration::assert_completed(&info);
    let (wire, _) = src.client().execute("query-migrate", json!({})).unwrap();
    let downtime = wire["downtime"].as_u64().expect("downtime");
    assert!(downtime > 20, "the stop was over the limit: {wire}");
    let note = wire["x-not-converging"].as_str().unwrap_or_default();
    assert!(
        note.starts_with("the stop was forced by x-max-rounds 2 after 2 passes")
            && note.contains(&format!(
                "a {downtime} ms downtime, over the 20 ms downtime limit"
            )),
        "{wire}"
    );
    dest.quit();
}
