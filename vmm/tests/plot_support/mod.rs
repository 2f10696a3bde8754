//! A made-up experiment series and a temporary directory, shared by the
//! `kvmscope plot` tests.
#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};

use kvmscope::abi;
use kvmscope::sampler::record::{our_names, Point, SeriesHeader, VcpuPoint};
use serde_json::json;

/// Samples in `experiment()`.
pub const SAMPLES: usize = 60;

/// The phase labels `experiment()` should produce, one per change.
pub const PHASE_LABELS: [&str; 4] = ["v0 #1 touch", "v1 #1 read", "v0 #2 dirty", "v0 #3 exits"];

/// A directory under the system temp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        let path = std::env::temp_dir().join(format!("kvmscope-plot-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).expect("create temp dir");
        TempDir(path)
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

pub fn header(vcpus: usize) -> SeriesHeader {
    SeriesHeader {
        version: 1,
        name: "test-vm".into(),
        backend: json!({"kind": "vmx", "description": "vmx (EPT, tdp_mmu=Y)"}),
        quiet_stats: Vec::new(),
        vcpus,
        memory: 256 << 20,
        interval_ms: 10.0,
        kvm_stats: vec!["exits".into(), "pf_fixed".into()],
    }
}

pub fn vcpu(phase: u64, exits_per_s: f64, our_exits_per_s: f64) -> VcpuPoint {
    VcpuPoint {
        phase,
        kvm: vec![0, 0],
        ours: vec![0; our_names().len()],
        exits_per_s,
        our_exits_per_s,
        ..VcpuPoint::default()
    }
}

fn marker(seq: u64, code: u64) -> u64 {
    (seq << 8) | code
}

/// Two vCPUs over 0.6 s: vCPU 0 touches 32 MiB, dirties, then makes exits;
/// vCPU 1 reads. Mapped memory climbs into the tens of MiB.
pub fn experiment() -> (SeriesHeader, Vec<Point>) {
    let points = (0..SAMPLES as u64)
        .map(|i| {
            let p0 = match i {
                0..=4 => 0,
                5..=19 => marker(1, abi::CMD_TOUCH),
                20..=39 => marker(2, abi::CMD_DIRTY),
                _ => marker(3, abi::CMD_EXITS),
            };
            let p1 = if i < 12 { 0 } else { marker(1, abi::CMD_READ) };
            let rate = if (5..20).contains(&i) {
                80_000.0
            } else {
                300.0 + i as f64
            };
            Point {
                seq: i,
                time_s: i as f64 * 0.01,
                pages_4k: (i.min(20) - i.min(5)) * 512,
                pages_2m: if i >= 20 { 4 } else { 0 },
                pages_1g: 0,
                vcpus: vec![vcpu(p0, rate, rate / 10.0), vcpu(p1, 50.0, 5.0)],
            }
        })
        .collect();
    (header(2), points)
}

pub fn write_jsonl(path: &Path, header: &SeriesHeader, points: &[Point]) {
    let mut text = header.to_json().to_string() + "\n";
    for p in points {
        text += &(p.to_json(header).to_string() + "\n");
    }
    fs::write(path, text).expect("write series");
}

pub fn write_csv(path: &Path, header: &SeriesHeader, points: &[Point]) {
    let mut text = header.csv_columns() + "\n";
    for p in points {
        text += &p.to_csv();
    }
    fs::write(path, text).expect("write series");
}
