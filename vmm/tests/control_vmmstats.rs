//! The VMM's own statistics (provider `kvmscope`): files in KVM's binary
//! stats format, handed out read-only by `get-stats-fd`, read by a KVM stats
//! reader unchanged, whose values mean what `query-exits`, `query-migrate`
//! and `query-readiness` say.

mod common;

use std::time::Duration;

use common::ServedVm;
use kvm_stats::{Sample, StatsFd};
use kvmscope::dirty::DirtyMode;
use serde_json::{json, Value};

const MEM: u64 = 64 << 20;

fn own_fds(c: &mut kvmscope::client::Client, target: &str) -> Vec<StatsFd> {
    let args = if target == "vm" {
        json!({"target": "vm", "provider": "kvmscope"})
    } else {
        json!({"target": "vcpu", "provider": "kvmscope"})
    };
    let (_, files) = c.execute("get-stats-fd", args).unwrap();
    files
        .into_iter()
        .map(|f| StatsFd::new_strict(f).expect("a valid stats file"))
        .collect()
}

fn value(fd: &StatsFd, name: &str) -> u64 {
    let mut sample: Sample = fd.new_sample();
    fd.read_sample(&mut sample).unwrap();
    let id = fd
        .schema()
        .find(name)
        .unwrap_or_else(|| panic!("no {name}"));
    sample.values(id)[0]
}

#[test]
fn its_files_read_as_kvm_stats_and_count_the_exits_query_exits_counts() {
    require_kvm!();
    let vm = ServedVm::start("own-exits", MEM, 2);
    let mut c = vm.client();
    let vm_fd = own_fds(&mut c, "vm").remove(0);
    assert_eq!(
        vm_fd.schema().id(),
        format!("kvmscope-{}", std::process::id())
    );
    let vcpus = own_fds(&mut c, "vcpu");
    assert_eq!(vcpus.len(), 2);
    assert!(vcpus[1].schema().id().ends_with("/vcpu-1"));
    c.execute(
        "guest-command",
        json!({"vcpu": 1, "command": "exits ports=100 mmio=50", "wait": true}),
    )
    .unwrap();
    let (exits, _) = c.execute("query-exits", json!({"vcpus": [1]})).unwrap();
    let want = exits[0]["reasons"]["io_out"].as_u64().unwrap();
    assert!(want >= 100, "{exits}");
    // The publisher copies every 100 ms.
    common::wait_for("the published count", Duration::from_secs(5), || {
        (value(&vcpus[1], "exits_io_out") == want).then_some(())
    });
    assert_eq!(
        value(&vcpus[1], "exits_mmio_write"),
        exits[0]["reasons"]["mmio_write"].as_u64().unwrap()
    );
    let published = value(&vm_fd, "published_at_ns");
    std::thread::sleep(Duration::from_millis(300));
    assert!(value(&vm_fd, "published_at_ns") > published, "kept current");
    assert_eq!(value(&vm_fd, "readiness_at_ns"), 0, "nothing measured yet");
    vm.quit();
}

#[test]
fn query_stats_and_its_schemas_answer_for_the_kvmscope_provider() {
    require_kvm!();
    let vm = ServedVm::start("own-query", MEM, 1);
    let mut c = vm.client();
    let (own, _) = c
        .execute(
            "query-stats",
            json!({"target": "vcpu", "providers": [{"provider": "kvmscope", "names": ["exits_hlt", "guest_stall_ns"]}]}),
        )
        .unwrap();
    let entries = own.as_array().unwrap();
    assert_eq!(entries.len(), 1, "{own}");
    assert_eq!(entries[0]["provider"], "kvmscope");
    assert_eq!(entries[0]["qom-path"], "/machine/unattached/device[0]");
    let names: Vec<&str> = entries[0]["stats"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["exits_hlt", "guest_stall_ns"]);
    // No provider asked: every provider, KVM's first.
    let (all, _) = c.execute("query-stats", json!({"target": "vm"})).unwrap();
    let providers: Vec<&Value> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|e| &e["provider"])
        .collect();
    assert_eq!(providers, [&json!("kvm"), &json!("kvmscope")]);
    let (schemas, _) = c
        .execute("query-stats-schemas", json!({"provider": "kvmscope"}))
        .unwrap();
    let targets: Vec<&Value> = schemas
        .as_array()
        .unwrap()
        .iter()
        .map(|e| &e["target"])
        .collect();
    assert_eq!(targets, [&json!("vm"), &json!("vcpu")], "{schemas}");
    let prediction = schemas[0]["stats"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "prediction_total_time_ns")
        .unwrap();
    assert_eq!(prediction["unit"], "seconds");
    assert_eq!(prediction["exponent"], -9);
    vm.quit();
}

#[test]
fn a_readiness_measurement_is_published_with_its_instant() {
    require_kvm!();
    let vm = ServedVm::start_with("own-ready", MEM, 1, |c| {
        c.vm.dirty_log = Some(DirtyMode::Bitmap)
    });
    let mut c = vm.client();
    let vm_fd = own_fds(&mut c, "vm").remove(0);
    c.execute(
        "guest-command",
        json!({"vcpu": 0, "command": "touch size=8M; dirty ws=4M rate=2000/s for=3s"}),
    )
    .unwrap();
    let (r, _) = c
        .execute("query-readiness", json!({"calc-time": 0.5}))
        .unwrap();
    let at = value(&vm_fd, "readiness_at_ns");
    assert!(at > 0, "the measurement's instant");
    let p = &r["prediction"];
    assert_eq!(
        value(&vm_fd, "prediction_converges"),
        u64::from(p["converges"].as_bool().unwrap()),
        "{r}"
    );
    assert!(value(&vm_fd, "prediction_transferred") > 0);
    assert!(value(&vm_fd, "readiness_dirty_bytes_per_second") > 0, "{r}");
    let window = r["dirty_rate"]["window_s"].as_f64().unwrap() * 1e9;
    let published = value(&vm_fd, "readiness_window_ns") as f64;
    assert!((published - window).abs() < 1e3, "{published} ns: {r}");
    vm.quit();
}

/// The periodic measurement measures a running guest only: stopped (or
/// migrated away), none is taken and the figures keep their instant; they
/// come again after `cont` (a postmigrate source published a fresh
/// "converges" every period for a guest that had left).
#[test]
fn the_periodic_measurement_waits_while_the_guest_is_stopped() {
    require_kvm!();
    let vm = ServedVm::start_with("own-periodic-stop", MEM, 1, |c| {
        c.vm.dirty_log = Some(DirtyMode::Bitmap);
        c.readiness_every = Some(kvmscope::control::Periodic {
            period: Duration::from_millis(1500),
            window: Duration::from_millis(200),
        });
    });
    let mut c = vm.client();
    let vm_fd = own_fds(&mut c, "vm").remove(0);
    let published = |what: &str| {
        common::wait_for(what, Duration::from_secs(20), || {
            Some(value(&vm_fd, "readiness_at_ns")).filter(|&at| at > 0)
        })
    };
    let first = published("a first periodic measurement");
    c.execute("stop", json!({})).unwrap();
    // Whatever was under way when it stopped ends within its window.
    std::thread::sleep(Duration::from_millis(500));
    let stopped = value(&vm_fd, "readiness_at_ns");
    assert!(stopped >= first);
    std::thread::sleep(Duration::from_millis(4000));
    assert_eq!(
        value(&vm_fd, "readiness_at_ns"),
        stopped,
        "no measurement while the guest is stopped"
    );
    c.execute("cont", json!({})).unwrap();
    common::wait_for("a measurement after cont", Duration::from_secs(20), || {
        (value(&vm_fd, "readiness_at_ns") > stopped).then_some(())
    });
    vm.quit();
}
