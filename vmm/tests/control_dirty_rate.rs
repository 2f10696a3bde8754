//! QEMU's `calc-dirty-rate` and `query-dirty-rate` on a real VM served over
//! the control socket: each mode against a writer of a known rate, an idle
//! guest, and the refusals in QEMU's words.

mod common;

use std::time::Duration;

use common::ServedVm;
use kvmscope::dirty::DirtyMode;
use serde_json::{json, Value};

const MEM: u64 = 256 << 20;

/// Starts a measurement and waits for its figures.
fn measured(c: &mut kvmscope::client::Client, args: Value) -> Value {
    let (r, _) = c.execute("calc-dirty-rate", args.clone()).unwrap();
    assert_eq!(r, json!({}), "{args}");
    common::wait_for("the measurement", Duration::from_secs(30), || {
        let (info, _) = c.execute("query-dirty-rate", json!({})).unwrap();
        (info["status"] == "measured").then_some(info)
    })
}

#[test]
fn each_mode_measures_a_writer_and_an_idle_guest_as_qemus_do() {
    require_kvm!();
    let vm = ServedVm::start_with("dirtyrate", MEM, 2, |c| {
        c.vm.dirty_log = Some(DirtyMode::Ring(4096));
    });
    let mut c = vm.client();
    let (info, _) = c.execute("query-dirty-rate", json!({})).unwrap();
    assert_eq!(info["status"], "unstarted", "{info}");
    // QEMU 7.2 gives 0 sample pages until a page-sampling measurement, and
    // for the modes that sample nothing.
    assert_eq!(info["sample-pages"], 0, "{info}");
    // Idle: nothing written, by either mode (the sample as large as QEMU
    // takes: 1,024 pages of this guest; a page the guest's own loop rewrites,
    // drawn, would read as 2 MB/s).
    for args in [
        json!({"calc-time": 1, "sample-pages": 4096}),
        json!({"calc-time": 1, "mode": "dirty-ring"}),
    ] {
        let info = measured(&mut c, args.clone());
        assert!(info["dirty-rate"].as_i64().unwrap() <= 2, "{args}: {info}");
    }
    // A writer over 64 MiB on vCPU 1 at 4,000 pages a second for long
    // enough: about 3,600 distinct pages in a second (the working set's
    // 16,384 pages repeat a little), 14 MB/s.
    c.execute(
        "guest-command",
        json!({"vcpu": 1, "command": "touch size=64M", "wait": true}),
    )
    .unwrap();
    c.execute(
        "guest-command",
        json!({"vcpu": 1, "command": "dirty ws=64M rate=4000/s for=60s"}),
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let ring = measured(&mut c, json!({"calc-time": 1, "mode": "dirty-ring"}));
    let rate = ring["dirty-rate"].as_i64().unwrap();
    assert!((6..=20).contains(&rate), "{ring}");
    let per = ring["vcpu-dirty-rate"].as_array().unwrap();
    assert_eq!(per.len(), 2, "{ring}");
    assert_eq!(per[1]["id"], 1, "{ring}");
    // Ring entries: a page written again after a harvest counts again.
    let one = per[1]["dirty-rate"].as_i64().unwrap();
    assert!(one >= rate - 1 && one <= rate + rate / 2 + 2, "{ring}");
    assert_eq!(per[0]["dirty-rate"], 0, "{ring}");
    assert!(ring["x-guest-stall-ms"].as_f64().unwrap() > 0.0, "{ring}");
    assert_eq!(
        (&ring["calc-time"], &ring["mode"], &ring["sample-pages"]),
        (&json!(1), &json!("dirty-ring"), &json!(0))
    );
    // Page sampling, QEMU's default, tracks nothing: 4,096 pages per GiB
    // (1,024 here) see about 5 % of them change.
    let sampled = measured(&mut c, json!({"calc-time": 2, "sample-pages": 4096}));
    let rate = sampled["dirty-rate"].as_i64().unwrap();
    assert!((4..=30).contains(&rate), "{sampled}");
    assert_eq!(
        (&sampled["mode"], &sampled["sample-pages"]),
        (&json!("page-sampling"), &json!(4096))
    );
    assert!(sampled.get("vcpu-dirty-rate").is_none() && sampled.get("x-guest-stall-ms").is_none());
    // One at a time, and the modes this VM keeps no log for, in QEMU's words.
    // (A ring window of a minute, which the quit below ends.)
    c.execute(
        "calc-dirty-rate",
        json!({"calc-time": 60, "mode": "dirty-ring"}),
    )
    .unwrap();
    let busy = format!(
        "{:?}",
        c.execute("calc-dirty-rate", json!({"calc-time": 1}))
            .unwrap_err()
    );
    assert!(
        busy.contains("the dirty rate is already being measured."),
        "{busy}"
    );
    let e = format!(
        "{:?}",
        c.execute(
            "calc-dirty-rate",
            json!({"calc-time": 1, "mode": "dirty-bitmap"})
        )
        .unwrap_err()
    );
    assert!(
        e.contains("mode dirty-bitmap is not enabled, use other method instead."),
        "{e}"
    );
    let e = format!(
        "{:?}",
        c.execute("calc-dirty-rate", json!({"calc-time": 0}))
            .unwrap_err()
    );
    assert!(e.contains("calc-time is out of range[1, 60]."), "{e}");
    assert_eq!(threads_named("dirty-rate"), 1);
    // The VMM's stop ends the measurement and its thread, which would
    // otherwise hold the guest's memory and its dirty log for the minute.
    vm.quit();
    assert_eq!(threads_named("dirty-rate"), 0);
}

/// How many of this process's threads are named `name` (the VMM runs in it).
fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim_end() == name)
        .count()
}
