//! The control socket's commands, as a client sees them, on a real VM.

mod common;

use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;

use common::ServedVm;
use kvm_stats::StatsFd;
use serde_json::{json, Value};

const MEM: u64 = 64 << 20;

fn stat(result: &Value, name: &str) -> Option<u64> {
    result["stats"]
        .as_array()?
        .iter()
        .find(|s| s["name"] == name)?["value"]
        .as_u64()
}

#[test]
fn greeting_names_the_protocol_version_and_the_vm() {
    require_kvm!();
    let vm = ServedVm::start("greeting", MEM, 1);
    let g = vm.client().greeting;
    let g = serde_json::to_value(g).unwrap();
    assert_eq!(g["QMP"]["kvmscope"]["protocol"], 2);
    assert_eq!(g["QMP"]["kvmscope"]["vm"]["pid"], std::process::id());
    assert_eq!(g["QMP"]["kvmscope"]["vm"]["vcpus"], 1);
    assert_eq!(g["QMP"]["kvmscope"]["vm"]["memory"], MEM);
    assert_eq!(g["QMP"]["kvmscope"]["vm"]["name"], "ctl");
    assert!(g["QMP"]["version"]["qemu"]["major"].is_u64());
    assert_eq!(g["QMP"]["capabilities"], json!([]));
}

#[test]
fn socket_file_is_owner_only_and_goes_away_after_quit() {
    require_kvm!();
    let vm = ServedVm::start("mode", MEM, 1);
    let mode = std::fs::metadata(&vm.socket).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let socket = vm.socket.clone();
    vm.quit();
    assert!(
        !socket.exists(),
        "the socket file is removed when the VMM stops"
    );
}

#[test]
fn query_vm_reports_pid_backend_vcpus_memory_layout_and_abi() {
    require_kvm!();
    let vm = ServedVm::start("query-vm", MEM, 2);
    let (v, _) = vm.client().execute("query-vm", json!({})).unwrap();
    assert_eq!(v["pid"], std::process::id());
    assert_eq!(v["vcpus"], 2);
    assert_eq!(v["memory"]["size"], MEM);
    assert_eq!(v["guest-abi"], kvmscope::abi::ABI_VERSION);
    assert!(v["backend"]["kind"].is_string());
    let arena = v["memory"]["layout"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "arena")
        .cloned()
        .unwrap();
    assert_eq!(arena["start"], kvmscope::abi::ARENA_BASE);
    assert_eq!(arena["size"], kvmscope::boot::arena_size(MEM));
    // The same reply, decoded into the protocol's type as the Rust client does.
    let info = vm.client().query_vm().unwrap();
    assert_eq!(serde_json::to_value(&info).unwrap(), v);
    assert_eq!(info.stats_ids.vcpus.len(), 2);
    let arena = info.region("arena").unwrap();
    assert_eq!(arena.size, kvmscope::boot::arena_size(MEM));
}

#[test]
fn get_stats_fd_for_vm_gives_a_read_only_stats_fd_named_in_the_reply() {
    require_kvm!();
    let vm = ServedVm::start("fd-vm", MEM, 1);
    let (v, fds) = vm
        .client()
        .execute("get-stats-fd", json!({"target": "vm"}))
        .unwrap();
    assert_eq!(fds.len(), 1);
    // SAFETY: F_GETFL only reads the flags of an fd we own.
    let flags = unsafe { libc::fcntl(fds[0].as_raw_fd(), libc::F_GETFL) };
    assert_eq!(flags & libc::O_ACCMODE, libc::O_RDONLY);
    let link = std::fs::read_link(format!("/proc/self/fd/{}", fds[0].as_raw_fd())).unwrap();
    assert_eq!(
        link.to_string_lossy(),
        "anon_inode:kvm-vm-stats",
        "a stats fd, not the VM fd"
    );
    let stats = StatsFd::new(fds.into_iter().next().unwrap()).unwrap();
    assert_eq!(
        v["fds"],
        json!([{"target": "vm", "id": stats.schema().id()}])
    );
    // `kvm-<id of the thread that created the VM>`: here a test thread, not the process.
    assert!(
        stats.schema().id().starts_with("kvm-"),
        "{}",
        stats.schema().id()
    );
}

#[test]
fn get_stats_fd_for_all_vcpus_gives_one_fd_per_vcpu_in_order() {
    require_kvm!();
    let vm = ServedVm::start("fd-all", MEM, 3);
    let (v, fds) = vm
        .client()
        .execute("get-stats-fd", json!({"target": "vcpu", "vcpu": "all"}))
        .unwrap();
    assert_eq!(fds.len(), 3);
    for (i, (entry, file)) in v["fds"].as_array().unwrap().iter().zip(fds).enumerate() {
        let stats = StatsFd::new(file).unwrap();
        assert_eq!(entry["vcpu"], i);
        assert_eq!(entry["id"], stats.schema().id());
        assert!(stats.schema().id().ends_with(&format!("/vcpu-{i}")));
    }
}

#[test]
fn stats_read_through_a_received_fd_match_query_stats() {
    require_kvm!();
    let vm = ServedVm::start("fd-vs-query", MEM, 1);
    let mut c = vm.client();
    c.execute(
        "guest-command",
        json!({"vcpu": 0, "command": "touch size=1M", "wait": true}),
    )
    .unwrap();
    let (_, fds) = c.execute("get-stats-fd", json!({"target": "vm"})).unwrap();
    let stats = StatsFd::new(fds.into_iter().next().unwrap()).unwrap();
    let mut sample = stats.new_sample();
    stats.read_sample(&mut sample).unwrap();
    let pages = sample.u64(stats.schema().find("pages_4k").unwrap());
    let (q, _) = c
        .execute(
            "query-stats",
            json!({"target": "vm", "names": ["pages_4k"]}),
        )
        .unwrap();
    assert!(
        pages >= 256,
        "a 1M touch maps at least 256 pages, got {pages}"
    );
    assert_eq!(
        stat(&q[0], "pages_4k"),
        Some(pages),
        "the guest is idle, so both reads agree"
    );
}

#[test]
fn query_stats_filters_names_and_vcpus() {
    require_kvm!();
    let vm = ServedVm::start("query-stats", MEM, 2);
    let (q, fds) = vm
        .client()
        .execute(
            "query-stats",
            json!({"target": "vcpu", "vcpus": [1], "names": ["exits", "pf_fixed"]}),
        )
        .unwrap();
    assert!(fds.is_empty());
    let results = q.as_array().unwrap();
    assert_eq!(results.len(), 1);
    assert_eq!(results[0]["vcpu"], 1);
    let names: Vec<&str> = results[0]["stats"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect();
    assert_eq!(names.len(), 2);
    assert!(names.contains(&"exits") && names.contains(&"pf_fixed"));
}

#[test]
fn query_stats_schemas_describes_vm_and_vcpu_stats() {
    require_kvm!();
    let vm = ServedVm::start("schemas", MEM, 2);
    let (q, _) = vm
        .client()
        .execute("query-stats-schemas", json!({}))
        .unwrap();
    // Every provider when none is named: KVM's, then the VMM's own.
    let targets: Vec<(&str, &str)> = q
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| Some((s["provider"].as_str()?, s["target"].as_str()?)))
        .collect();
    assert_eq!(
        targets,
        [
            ("kvm", "vm"),
            ("kvm", "vcpu"),
            ("kvmscope", "vm"),
            ("kvmscope", "vcpu")
        ]
    );
    let exits = q[1]["stats"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "exits")
        .cloned()
        .unwrap();
    assert_eq!(exits["type"], "cumulative");
}

#[test]
fn guest_command_with_wait_returns_results_and_maps_pages() {
    require_kvm!();
    let vm = ServedVm::start("guest-wait", MEM, 1);
    let mut c = vm.client();
    let (done, _) = c
        .execute(
            "guest-command",
            json!({"vcpu": 0, "command": "touch size=2M; read size=2M", "wait": true}),
        )
        .unwrap();
    assert_eq!(
        (done["first-seq"].as_u64(), done["last-seq"].as_u64()),
        (Some(1), Some(2))
    );
    let results = done["results"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    assert!(results.iter().all(|r| r["status"] == "ok"), "{results:?}");
    assert_eq!(results[0]["values"][0], 512, "the guest wrote 512 pages");
    let (q, _) = c
        .execute(
            "query-stats",
            json!({"target": "vm", "names": ["pages_4k"]}),
        )
        .unwrap();
    assert!(stat(&q[0], "pages_4k").unwrap() >= 512);
}

#[test]
fn guest_command_without_wait_queues_and_query_guest_shows_the_result() {
    require_kvm!();
    let vm = ServedVm::start("guest-nowait", MEM, 1);
    let mut c = vm.client();
    let (queued, _) = c
        .execute(
            "guest-command",
            json!({"vcpu": 0, "command": "touch size=1M"}),
        )
        .unwrap();
    assert_eq!(queued, json!({"vcpu": 0, "first-seq": 1, "last-seq": 1}));
    // Commands run in order, so when this one is done the first one is too.
    c.execute(
        "guest-command",
        json!({"vcpu": 0, "command": "exits count=1", "wait": true}),
    )
    .unwrap();
    let (g, _) = c.execute("query-guest", json!({})).unwrap();
    assert_eq!(g[0]["vcpu"], 0);
    // The state may still read "running" for a moment: the vCPU records the
    // result before it goes back to waiting.
    assert_ne!(g[0]["state"], "finished");
    assert_eq!(g[0]["queued"], 0);
    assert_eq!(g[0]["last-result"]["seq"], 2);
}

#[test]
fn query_exits_counts_the_exits_a_command_made() {
    require_kvm!();
    let vm = ServedVm::start("exits", MEM, 1);
    let mut c = vm.client();
    let (before, _) = c.execute("query-exits", json!({"vcpus": [0]})).unwrap();
    c.execute(
        "guest-command",
        json!({"vcpu": 0, "command": "exits ports=100 mmio=50", "wait": true}),
    )
    .unwrap();
    let (after, _) = c.execute("query-exits", json!({})).unwrap();
    let grew = |group: &str, name: &str| {
        after[0][group][name].as_u64().unwrap() - before[0][group][name].as_u64().unwrap()
    };
    assert_eq!(grew("devices", "exit_test_port"), 100);
    assert_eq!(grew("devices", "mmio_test"), 50);
    assert_eq!(after[0]["vcpu"], 0);
}

#[test]
fn pause_holds_queued_commands_until_resume() {
    require_kvm!();
    let vm = ServedVm::start("pause", MEM, 1);
    let mut c = vm.client();
    c.execute(
        "guest-command",
        json!({"vcpu": 0, "command": "exits count=1", "wait": true}),
    )
    .unwrap();
    c.execute("pause", json!({})).unwrap();
    c.execute(
        "guest-command",
        json!({"vcpu": 0, "command": "touch size=1M"}),
    )
    .unwrap();
    let (g, _) = c.execute("query-guest", json!({"vcpus": [0]})).unwrap();
    assert_eq!(g[0]["queued"], 1, "paused: the command waits");
    c.execute("resume", json!({})).unwrap();
    let (done, _) = c
        .execute(
            "guest-command",
            json!({"vcpu": 0, "command": "exits count=1", "wait": true}),
        )
        .unwrap();
    assert_eq!(done["results"][0]["status"], "ok");
    let (g, _) = c.execute("query-guest", json!({"vcpus": [0]})).unwrap();
    assert_eq!(g[0]["queued"], 0);
}

#[test]
fn quit_ends_the_run_with_every_vcpu_stopped() {
    require_kvm!();
    let vm = ServedVm::start("quit", MEM, 2);
    let summary = vm.quit();
    assert!(summary.failure().is_none());
    assert_eq!(summary.vcpus.len(), 2);
    assert!(summary.stuck.is_empty());
}

#[test]
fn query_commands_lists_every_command() {
    require_kvm!();
    let vm = ServedVm::start("commands", MEM, 1);
    let (v, _) = vm.client().execute("query-commands", json!({})).unwrap();
    let names: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(names, kvmscope::protocol::Command::names());
}

#[test]
fn the_guest_counts_its_own_progress_and_query_guest_reads_it() {
    require_kvm!();
    let vm = ServedVm::start("progress", MEM, 2);
    let mut c = vm.client();
    // A count once the vCPU has run (null before its first exit: on a
    // loaded host the query can come first).
    let progress = |c: &mut kvmscope::client::Client, vcpu: usize| {
        common::wait_for(
            "the guest's count",
            std::time::Duration::from_secs(10),
            || {
                let (g, _) = c.execute("query-guest", json!({"vcpus": [vcpu]})).unwrap();
                g[0]["progress"].as_u64()
            },
        )
    };
    let before = progress(&mut c, 0);
    // A page touched, read or written and an exit made are a unit each.
    for command in [
        "touch size=4M",
        "read size=2M stride=2",
        "exits ports=10 mmio=5",
    ] {
        let (done, _) = c
            .execute(
                "guest-command",
                json!({"vcpu": 0, "command": command, "wait": true}),
            )
            .unwrap();
        assert_eq!(done["results"][0]["status"], "ok", "{command}");
    }
    assert_eq!(progress(&mut c, 0) - before, 1024 + 256 + 15);
    assert_eq!(progress(&mut c, 1), 0, "vCPU 1 has run nothing");
    // While a command runs, the count moves at its pace (the VMM reads it
    // without an exit), and its rate over the last second is the pace.
    c.execute(
        "guest-command",
        json!({"vcpu": 1, "command": "dirty ws=4M rate=2000/s for=3s"}),
    )
    .unwrap();
    let rate = common::wait_for(
        "a progress rate",
        std::time::Duration::from_secs(10),
        || {
            let (g, _) = c.execute("query-guest", json!({"vcpus": [1]})).unwrap();
            let p = g[0]["progress"].as_u64().unwrap();
            let r = g[0]["progress-per-second"].as_f64()?;
            (p > 2000 && r > 0.0).then_some(r)
        },
    );
    assert!(
        (1500.0..2500.0).contains(&rate),
        "paced at 2000/s, read {rate}/s"
    );
}
