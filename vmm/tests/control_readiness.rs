//! `query-readiness`, `kvmscope readiness` and the sampler's socket commands,
//! on a real VM served over the control socket.

mod common;

use std::time::Duration;

use common::ServedVm;
use kvmscope::dirty::DirtyMode;
use kvmscope::sampler::SamplerConfig;
use serde_json::{json, Value};

const MEM: u64 = 64 << 20;

fn with_dirty(mode: DirtyMode) -> impl FnOnce(&mut kvmscope::run::RunConfig) {
    move |c| c.vm.dirty_log = Some(mode)
}

fn with_sampler(c: &mut kvmscope::run::RunConfig) {
    c.sampler = Some(SamplerConfig {
        interval: Duration::from_millis(5),
        capacity: 64,
        out: None,
    });
}

fn guest(vm: &ServedVm, command: &str) {
    let mut c = vm.client();
    c.execute(
        "guest-command",
        json!({"vcpu": 0, "command": command, "wait": true}),
    )
    .expect("guest command");
}

#[test]
fn query_readiness_predicts_for_the_migration_parameters_unless_asked_otherwise() {
    require_kvm!();
    let vm = ServedVm::start_with("ready-params", MEM, 1, with_dirty(DirtyMode::Bitmap));
    let mut c = vm.client();
    c.execute(
        "migrate-set-parameters",
        json!({"max-bandwidth": 125_000_000, "downtime-limit": 30}),
    )
    .unwrap();
    let (r, _) = c
        .execute("query-readiness", json!({"calc-time": 0}))
        .unwrap();
    assert_eq!(r["link"]["from"], "migration-parameters", "{r}");
    assert_eq!(r["link"]["bandwidth"], 125_000_000.0, "{r}");
    assert_eq!(r["link"]["downtime-limit-ms"], 30, "{r}");
    let m = &r["prediction"]["migrate"];
    assert_eq!(m["status"], "completed", "{r}");
    assert_eq!(m["ram"]["dirty-sync-count"], 1, "{r}");
    assert!(m["ram"]["transferred"].as_u64().unwrap() > 0, "{r}");
    let (r, _) = c
        .execute(
            "query-readiness",
            json!({"calc-time": 0, "bandwidth": 0, "max-downtime": 0.3}),
        )
        .unwrap();
    assert_eq!(r["link"]["from"], "request", "{r}");
    assert_eq!(r["link"]["bandwidth"], Value::Null, "{r}");
    assert_eq!(r["link"]["downtime-limit-ms"], 300, "{r}");
    assert_eq!(r["link"]["downtime-limit-from"], "request", "{r}");
    // Each from where it came: the link asked for, the limit the VMM's.
    let (r, _) = c
        .execute("query-readiness", json!({"calc-time": 0, "bandwidth": 0}))
        .unwrap();
    let link = &r["link"];
    assert_eq!(
        (
            &link["from"],
            &link["downtime-limit-ms"],
            &link["downtime-limit-from"]
        ),
        (
            &json!("request"),
            &json!(30),
            &json!("migration-parameters")
        ),
        "{r}"
    );
    assert!(
        r["text"]
            .as_str()
            .unwrap()
            .contains("link (request), downtime limit 30 ms (migration-parameters)"),
        "{r}"
    );
    vm.quit();
}

#[test]
fn query_readiness_scan_finds_the_nonzero_pages_written() {
    require_kvm!();
    let vm = ServedVm::start_with("ready-scan", MEM, 1, with_dirty(DirtyMode::Bitmap));
    guest(&vm, "touch size=1M; touch-zero offset=1M size=1M");
    let mut c = vm.client();
    let (r, _) = c
        .execute("query-readiness", json!({"scan": true, "calc-time": 0}))
        .unwrap();
    assert_eq!(r["scan"]["nonzero_in_arena"], 256, "{r}");
    assert!(r["mapped"]["bytes"].as_u64().unwrap() >= 256 * 4096);
    assert!(r["written_since_boot"]["pages"].as_u64().unwrap() >= 512);
    assert_eq!(r["estimate_used"], "scan");
    assert_eq!(r["prediction"]["converges"], true);
    // The 256 zero-written pages are mapped yet zero: the mapped estimate
    // over-counts by about that many (less the few non-zero boot pages, such as
    // page tables, that the MMU reads but holds no leaf mapping for).
    let over = r["scan"]["errors"]["mapped"]["error_pages"]
        .as_i64()
        .unwrap();
    assert!((240..=300).contains(&over), "{}", r["text"]);
    assert!(r["text"].as_str().unwrap().contains("verdict: converges"));
    vm.quit();
}

#[test]
fn query_readiness_measures_the_dirty_rate_over_the_window() {
    require_kvm!();
    let vm = ServedVm::start_with("ready-rate", MEM, 1, with_dirty(DirtyMode::Ring(4096)));
    let mut c = vm.client();
    c.execute(
        "guest-command",
        json!({"vcpu": 0, "command": "dirty ws=32M rate=2000/s for=3s"}),
    )
    .unwrap();
    let (r, _) = c
        .execute("query-readiness", json!({"calc-time": 0.5}))
        .unwrap();
    let d = &r["dirty_rate"];
    assert_eq!(d["mode"], "dirty-ring");
    let rate = d["pages_per_s"].as_f64().unwrap();
    assert!(
        (1500.0..2200.0).contains(&rate),
        "about 2000 pages/s (less a few collisions): {rate}"
    );
    assert_eq!(d["per_vcpu"].as_array().unwrap().len(), 1);
    // A ring VM logs only while observed: nothing is known since boot.
    assert_eq!(r["written_since_boot"], Value::Null, "{r}");
    vm.quit();
}

#[test]
fn query_readiness_without_dirty_logging_has_no_rate_and_uses_mapped() {
    require_kvm!();
    let vm = ServedVm::start("ready-plain", MEM, 1);
    guest(&vm, "touch size=1M");
    let (r, _) = vm.client().execute("query-readiness", json!({})).unwrap();
    assert_eq!(r["dirty_rate"], Value::Null);
    assert_eq!(r["written_since_boot"], Value::Null);
    assert_eq!(r["scan"], Value::Null);
    assert_eq!(r["estimate_used"], "mapped");
    vm.quit();
}

/// A 128 MiB ring VM on huge pages whose guest wrote 64 MiB.
fn huge_ring_vm(test: &str) -> ServedVm {
    let vm = ServedVm::start_with(test, 128 << 20, 1, |c| {
        c.vm.dirty_log = Some(DirtyMode::Ring(4096));
        c.vm.hugepages = true;
    });
    guest(&vm, "touch size=64M pattern=0x5a");
    vm
}

/// On huge pages, letting dirty logging go unmaps the 4 KiB pieces KVM
/// split the 2 MiB pages into (KVM maps them whole again only as the guest
/// touches them): mapped then falls under what the guest wrote, and the
/// prediction takes the most KVM has mapped instead.
#[test]
fn after_a_window_on_huge_pages_the_prediction_takes_the_most_kvm_mapped() {
    require_kvm!();
    let vm = huge_ring_vm("ready-peak");
    let mut c = vm.client();
    let ask = |c: &mut kvmscope::client::Client, args: Value| {
        c.execute("query-readiness", args)
            .expect("query-readiness")
            .0
    };
    let before = ask(&mut c, json!({"calc-time": 0}));
    let mapped = |r: &Value| r["mapped"]["bytes"].as_u64().unwrap();
    // Most of it (a huge page the host could not find falls back to 4 KiB).
    assert!(
        before["mapped"]["pages_2m"].as_u64().unwrap() >= 16,
        "the guest's 64 MiB mapped 2 MiB at a time: {before}"
    );
    // Mapped, or (the 2 MiB pages the boot wrote a little of) a sample of
    // the resident pages read for zeros.
    assert!(
        matches!(before["estimate_used"].as_str(), Some("mapped" | "sampled")),
        "{before}"
    );
    // A writer over half of it, done before the window ends.
    c.execute(
        "guest-command",
        json!({"vcpu": 0, "command": "dirty ws=32M rate=max for=500ms"}),
    )
    .unwrap();
    ask(&mut c, json!({"calc-time": 1.0}));
    let after = ask(&mut c, json!({"calc-time": 0}));
    let peak = after["mapped"]["peak_bytes"].as_u64().expect("peak_bytes");
    assert!(peak >= mapped(&before), "{after}");
    if mapped(&after) + (1 << 20) <= peak {
        // The host backs what KVM let go (and the prediction takes that, or
        // what a sample of it reads non-zero).
        assert!(
            matches!(
                after["estimate_used"].as_str(),
                Some("resident" | "sampled")
            ),
            "{after}"
        );
        let normal = after["prediction"]["migrate"]["ram"]["normal"]
            .as_u64()
            .unwrap();
        assert!(
            normal * 4096 >= 62 << 20,
            "the 64 MiB the guest wrote go as data: {normal} pages: {}",
            after["text"]
        );
    } else {
        assert!(
            matches!(after["estimate_used"].as_str(), Some("mapped" | "sampled")),
            "{after}"
        );
    }
    // This backend (shadow paging) lets them go.
    if std::path::Path::new("/sys/module/kvm_pvm").exists() {
        assert!(
            mapped(&after) + (16 << 20) < mapped(&before),
            "mapped {} after the window, {} before",
            mapped(&after),
            mapped(&before)
        );
    }
    vm.quit();
}

/// A guest that maps more during a window is growing, not letting go: the
/// measurement's estimates stand against what KVM mapped as it started.
#[test]
fn a_guest_growing_during_the_window_is_not_read_as_letting_go() {
    require_kvm!();
    let vm = ServedVm::start_with("ready-grow", MEM, 1, with_dirty(DirtyMode::Ring(4096)));
    let mut c = vm.client();
    // About 4,000 new pages (16 MiB) a second, over memory never touched.
    c.execute(
        "guest-command",
        json!({"vcpu": 0, "command": "dirty offset=16M ws=32M rate=4000/s for=3s"}),
    )
    .unwrap();
    let (r, _) = c
        .execute("query-readiness", json!({"calc-time": 1.0}))
        .unwrap();
    let mapped = r["mapped"]["bytes"].as_u64().unwrap();
    let peak = r["mapped"]["peak_bytes"].as_u64().unwrap();
    assert_eq!(r["estimate_used"], "mapped", "{r}");
    assert!(mapped + (1 << 20) > peak, "{r}");
    vm.quit();
}

/// The same after a standalone dirty limit, with no readiness measurement
/// before it: the VMM's stats thread keeps the most KVM mapped.
#[test]
fn the_most_kvm_mapped_is_kept_with_no_measurement_before() {
    require_kvm!();
    let vm = huge_ring_vm("ready-peak-limit");
    let mut c = vm.client();
    // Seen by the stats thread (every 100 ms) before logging starts.
    std::thread::sleep(Duration::from_millis(300));
    c.execute("set-vcpu-dirty-limit", json!({"dirty-rate": 1000}))
        .unwrap();
    guest(&vm, "dirty ws=32M rate=max for=500ms");
    c.execute("cancel-vcpu-dirty-limit", json!({})).unwrap();
    let (r, _) = c
        .execute("query-readiness", json!({"calc-time": 0}))
        .unwrap();
    let mapped = r["mapped"]["bytes"].as_u64().unwrap();
    let peak = r["mapped"]["peak_bytes"].as_u64().unwrap();
    assert!(peak >= 64 << 20, "the stats thread saw the 64 MiB: {r}");
    if std::path::Path::new("/sys/module/kvm_pvm").exists() {
        assert!(mapped + (16 << 20) < peak, "{r}");
        assert!(
            matches!(r["estimate_used"].as_str(), Some("resident" | "sampled")),
            "{r}"
        );
        let normal = r["prediction"]["migrate"]["ram"]["normal"]
            .as_u64()
            .unwrap();
        assert!(
            normal * 4096 >= 62 << 20,
            "the 64 MiB written go as data: {r}"
        );
    }
    vm.quit();
}

/// A client whose `query-readiness` window of `seconds` runs (once the
/// server has taken it, a second is refused: asked until it is), and that
/// refusal.
fn window_running(vm: &ServedVm, seconds: f64) -> (kvmscope::client::Client, String) {
    let mut first = vm.client();
    first
        .send_line(
            json!({"execute": "query-readiness", "arguments": {"calc-time": seconds}})
                .to_string()
                .as_bytes(),
        )
        .unwrap();
    let refused = common::wait_for(
        "a second request to be refused",
        Duration::from_secs(5),
        || match vm
            .client()
            .execute("query-readiness", json!({"calc-time": 0}))
        {
            Err(kvmscope::client::Error::Remote { desc, .. })
                if desc.contains("already running") =>
            {
                Some(desc)
            }
            _ => None,
        },
    );
    (first, refused)
}

#[test]
fn a_second_readiness_while_one_runs_is_refused() {
    require_kvm!();
    let vm = ServedVm::start_with("ready-busy", MEM, 1, with_dirty(DirtyMode::Bitmap));
    let (mut first, refused) = window_running(&vm, 1.0);
    assert!(refused.contains("try again"));
    let reply = first.read_reply_after_events(|_| Ok(())).unwrap().value;
    assert!(
        reply["return"]["dirty_rate"]["pages_per_s"].is_number(),
        "{reply}"
    );
    vm.quit();
}

/// A window whose client goes stops: it would track the guest, at its cost,
/// and hold the one readiness slot, for nobody.
#[test]
fn a_window_whose_client_went_stops_and_frees_the_slot() {
    require_kvm!();
    let vm = ServedVm::start_with("ready-gone", MEM, 1, with_dirty(DirtyMode::Ring(65536)));
    let (first, _) = window_running(&vm, 600.0);
    drop(first);
    // Within a few checks, the slot is free and the log let go.
    let (r, _) = common::wait_for("the slot to be free", Duration::from_secs(5), || {
        vm.client()
            .execute("query-readiness", json!({"calc-time": 0.1}))
            .ok()
    });
    assert!(r["dirty_rate"]["pages_per_s"].is_number(), "{r}");
    vm.quit();
}

/// A client's `query-readiness` while the periodic measurement
/// (`run --readiness-every`) runs is answered: the periodic one stops for
/// it (it was refused, "already running", at random for such VMMs; so were
/// `readiness` and `migrate --predict`).
#[test]
fn a_clients_readiness_goes_before_the_periodic_one() {
    require_kvm!();
    let vm = ServedVm::start_with("ready-periodic", MEM, 1, |c| {
        with_dirty(DirtyMode::Bitmap)(c);
        // The first is due a second in; its window would last 20 s.
        c.readiness_every = Some(kvmscope::control::Periodic {
            period: Duration::from_secs(60),
            window: Duration::from_secs(20),
        });
    });
    // Due a second in, started within a sweep (at most a second) after.
    std::thread::sleep(Duration::from_millis(2500));
    let started = std::time::Instant::now();
    let (r, _) = vm
        .client()
        .execute("query-readiness", json!({"calc-time": 0.2}))
        .expect("answered, not refused as already running");
    assert!(r["dirty_rate"]["pages_per_s"].is_number(), "{r}");
    // It did not wait out the periodic window.
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    vm.quit();
}

#[test]
fn readiness_scan_progress_events_come_before_the_reply() {
    require_kvm!();
    let vm = ServedVm::start("ready-progress", MEM, 1);
    let mut c = vm.client();
    c.send_line(
        json!({"execute": "query-readiness", "arguments": {"scan": true, "calc-time": 0}, "id": 7})
            .to_string()
            .as_bytes(),
    )
    .unwrap();
    let mut events = Vec::new();
    let reply = c
        .read_reply_after_events(|e| {
            events.push(e.clone());
            Ok(())
        })
        .unwrap()
        .value;
    assert_eq!(reply["id"], 7);
    // The scan holds the guest paused: STOP comes before any progress (RESUME,
    // when the hold ends, may come before or after the reply).
    let names: Vec<_> = events.iter().map(|e| e["event"].clone()).collect();
    assert_eq!(names.first(), Some(&json!("STOP")), "{names:?}");
    let progress: Vec<_> = events
        .iter()
        .filter(|e| e["event"] == "READINESS_PROGRESS")
        .collect();
    let last = progress.last().expect("progress events");
    assert_eq!(last["data"]["done"], last["data"]["total"]);
    vm.quit();
}

#[test]
fn readiness_cli_prints_the_report_and_json() {
    require_kvm!();
    let vm = ServedVm::start_with("ready-cli", MEM, 1, with_dirty(DirtyMode::Bitmap));
    guest(&vm, "touch size=1M");
    let socket = vm.socket.to_str().unwrap().to_string();
    let run = |extra: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvmscope"))
            .args(["readiness", "--socket", &socket, "--calc-time", "200ms"])
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let text = run(&["--scan", "--bandwidth", "1Gbit", "--max-downtime", "100ms"]);
    assert!(
        text.contains("mapped (pages_4k/2m/1g)") && text.contains("verdict:"),
        "{text}"
    );
    let j: Value = serde_json::from_str(&run(&["--json"])).unwrap();
    assert!(j["mapped"]["took_us"].is_number() && j.get("text").is_none());
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_kvmscope"))
        .args(["readiness", "--socket", &socket, "--bandwidth", "fast"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("'fast' is not a bandwidth"));
    // Past what the VMM takes: refused on the command line, naming the flag
    // (the VMM's refusal named its QMP argument, with exit status 1).
    for (flag, value, said) in [
        ("--bandwidth", "100Tbit", "more than 80Tbit"),
        ("--max-downtime", "3000s", "more than 2000s"),
    ] {
        let bad = std::process::Command::new(env!("CARGO_BIN_EXE_kvmscope"))
            .args(["readiness", "--socket", &socket, flag, value])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&bad.stderr);
        assert_eq!(bad.status.code(), Some(2), "{err}");
        assert!(err.contains(flag) && err.contains(said), "{err}");
    }
    vm.quit();
}

#[test]
fn query_samples_returns_points_after_since() {
    require_kvm!();
    let vm = ServedVm::start_with("samples", MEM, 1, with_sampler);
    guest(&vm, "touch size=1M");
    let mut c = vm.client();
    // The sampler's first ticks may come after the touch on a busy host.
    let all = common::wait_for("two sampler points", Duration::from_secs(20), || {
        let (all, _) = c.execute("query-samples", json!({})).unwrap();
        (all["last-seq"].as_u64() >= Some(2)).then_some(all)
    });
    let samples = all["samples"].as_array().unwrap();
    assert!(!samples.is_empty());
    assert_eq!(all["header"]["kind"], "header");
    let last = all["last-seq"].as_u64().unwrap();
    let (some, _) = c
        .execute("query-samples", json!({"since": last - 1, "max": 5}))
        .unwrap();
    let seqs: Vec<u64> = some["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["seq"].as_u64().unwrap())
        .collect();
    assert!(seqs.iter().all(|&s| s >= last), "{seqs:?}");
    let (two, _) = c.execute("query-samples", json!({"max": 2})).unwrap();
    assert_eq!(two["samples"].as_array().unwrap().len(), 2);
    vm.quit();
}

#[test]
fn subscribe_samples_streams_events_until_unsubscribed() {
    require_kvm!();
    let vm = ServedVm::start_with("subscribe", MEM, 1, with_sampler);
    let mut c = vm.client();
    let (r, _) = c.execute("subscribe-samples", json!({})).unwrap();
    let mut seq = r["since"].as_u64().unwrap();
    for _ in 0..5 {
        let v = c.read_reply().unwrap().value;
        assert_eq!(v["event"], "SAMPLE", "{v}");
        let s = v["data"]["seq"].as_u64().unwrap();
        assert!(s > seq, "seq {s} after {seq}");
        seq = s;
        assert!(v["data"]["mapped_bytes"].is_number() && v["timestamp"]["seconds"].is_number());
    }
    c.send_line(br#"{"execute":"unsubscribe-samples","id":"u"}"#)
        .unwrap();
    let reply = c.read_reply_after_events(|_| Ok(())).unwrap().value;
    assert_eq!(reply["return"]["was-subscribed"], true);
    assert_eq!(reply["id"], "u");
    vm.quit();
}

#[test]
fn sample_commands_without_a_sampler_say_why() {
    require_kvm!();
    let vm = ServedVm::start("no-sampler", MEM, 1);
    for cmd in ["query-samples", "subscribe-samples"] {
        match vm.client().execute(cmd, json!({})) {
            Err(kvmscope::client::Error::Remote { desc, .. }) => {
                assert!(desc.contains("sampler is off"), "{desc}")
            }
            other => panic!("{cmd}: {other:?}"),
        }
    }
    vm.quit();
}

#[test]
fn watch_shows_the_samplers_derived_values() {
    require_kvm!();
    let vm = ServedVm::start_with("watch-derived", MEM, 1, with_sampler);
    guest(&vm, "touch size=2M");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvmscope"))
        .args([
            "watch",
            "--socket",
            vm.socket.to_str().unwrap(),
            "--count",
            "1",
            "--interval",
            "50ms",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("== sampler (tick"), "{text}");
    assert!(text.contains("last command #1 touch"), "{text}");
    let mapped_line = text.lines().find(|l| l.starts_with("mapped")).unwrap();
    assert!(mapped_line.contains("MiB"), "{mapped_line}");
    vm.quit();
}

#[test]
fn a_scan_does_not_resume_a_guest_the_user_paused() {
    require_kvm!();
    let vm = ServedVm::start("ready-paused", MEM, 1);
    let mut c = vm.client();
    c.execute("pause", json!({})).unwrap();
    c.execute(
        "guest-command",
        json!({"vcpu": 0, "command": "touch size=1M"}),
    )
    .unwrap();
    let (r, _) = c.execute("query-readiness", json!({"scan": true})).unwrap();
    assert!(r["scan"]["nonzero_pages"].is_number());
    // Still paused after the scan: the queued touch has not run.
    let (g, _) = c.execute("query-guest", json!({})).unwrap();
    assert_eq!(g[0]["state"], "paused", "{g}");
    assert_eq!(g[0]["queued"], 1, "{g}");
    c.execute("resume", json!({})).unwrap();
    common::wait_for(
        "the touch to run after resume",
        Duration::from_secs(10),
        || {
            let (g, _) = vm.client().execute("query-guest", json!({})).unwrap();
            (g[0]["queued"] == 0 && g[0]["state"] == "waiting").then_some(())
        },
    );
    vm.quit();
}

#[test]
fn readiness_can_be_asked_again_as_soon_as_it_answers() {
    require_kvm!();
    let vm = ServedVm::start("ready-again", MEM, 1);
    let mut c = vm.client();
    for _ in 0..5 {
        c.execute("query-readiness", json!({"scan": true}))
            .expect("no 'already running' right after a reply");
    }
    vm.quit();
}

/// A window says where its cost per fault came from: in a VMM's first
/// moments, before its calibration ends, the default (2.6 us, where the
/// hosts seen cost 2.6 to 40 us), which its text says; then this host's,
/// measured; or the one given.
#[test]
fn a_window_says_where_its_cost_per_fault_came_from() {
    require_kvm!();
    for (given, source) in [(None, "measured"), (Some("7us"), "given")] {
        let dir = common::test_dir("ready-calibrated");
        let socket = dir.join("ctl.sock");
        let mut run = common::served_run(&socket);
        run.args(["--dirty-log", "ring"]);
        if let Some(cost) = given {
            run.args(["--fault-cost", cost]);
        }
        let _vmm = common::KillOnDrop::new(run.spawn().unwrap());
        let mut c =
            kvmscope::client::Client::connect_when_ready(&socket, Duration::from_secs(20), || {
                Ok(())
            })
            .unwrap();
        // At once: the calibration (0.25-3.5 s) may not have ended.
        let mut window = || {
            let (r, _) = c
                .execute("query-readiness", json!({"calc-time": 0.2}))
                .unwrap();
            r
        };
        let first = window();
        let g = &first["guest_stall"];
        let flagged = first["text"].as_str().unwrap().contains(
            "faults priced at the default 2.6 us each: this host's cost was not measured",
        );
        if g["fault_cost_source"] == "default" {
            assert!(
                given.is_none() && g["fault_cost_us"] == 2.6 && flagged,
                "{first}"
            );
        } else {
            assert!(!flagged, "{first}");
        }
        let r = common::wait_for(source, Duration::from_secs(30), || {
            let r = window();
            (r["guest_stall"]["fault_cost_source"] == source).then_some(r)
        });
        if given.is_some() {
            assert_eq!(r["guest_stall"]["fault_cost_us"], 7.0, "{r}");
        }
        c.execute("quit", json!({})).unwrap();
    }
}
