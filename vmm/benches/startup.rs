//! Start-up: from process start to the guest's first port write (its first exit)
//! and to the first command done, for `kvmscope run` as a user starts it.
//! `cargo bench -p kvmscope --bench startup`.

mod common;

use common::percentile;
use std::process::Command;

fn main() {
    if !common::kvm_available("startup") {
        return;
    }
    let runs = 30;
    let (mut first_exit, mut first_done, mut wall) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        let t = std::time::Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_kvmscope"))
            .args([
                "run",
                "--json",
                "--memory",
                "64M",
                "--workload",
                "exits count=1",
            ])
            .output()
            .expect("run kvmscope");
        wall.push(t.elapsed().as_secs_f64() * 1e3);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON summary");
        first_exit.push(
            j["startup_ms"]["to_first_exit"]
                .as_f64()
                .expect("to_first_exit"),
        );
        first_done.push(
            j["startup_ms"]["to_first_command_done"]
                .as_f64()
                .expect("to_first_command_done"),
        );
    }
    println!("kvmscope run start-up, 64 MiB guest, {runs} runs (ms, p50 / p90):");
    println!(
        "  process start -> first guest exit : {:.2} / {:.2}",
        percentile(&mut first_exit, 0.5),
        percentile(&mut first_exit, 0.9)
    );
    println!(
        "  process start -> first command done: {:.2} / {:.2}",
        percentile(&mut first_done, 0.5),
        percentile(&mut first_done, 0.9)
    );
    println!(
        "  whole process (spawn to exit)      : {:.2} / {:.2}",
        percentile(&mut wall, 0.5),
        percentile(&mut wall, 0.9)
    );
}
