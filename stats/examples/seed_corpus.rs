//! Writes the fuzz seed corpus: synthetic files (valid and malformed) and, when /dev/kvm is
//! usable, whole dumps of a real VM and vCPU stats fd.
//!
//! `cargo run -p kvm-stats --example seed_corpus -- fuzz/corpus/parse_stats`
//!
//! File names start with `valid-` or `bad-`; the corpus test checks each parses or fails
//! accordingly.

use std::fs::{self, File};
use std::io::Read;
use std::path::Path;

use kvm_ioctls::Kvm;
use kvm_stats::builder::{every_kind, StatsFileBuilder};
use kvm_stats::ioctl::get_stats_fd;
use kvm_stats::{Base, StatType, Unit};

type Failure = Box<dyn std::error::Error>;

fn main() -> Result<(), Failure> {
    let dir = std::env::args()
        .nth(1)
        .ok_or("usage: seed_corpus OUT_DIR")?;
    let dir = Path::new(&dir);
    fs::create_dir_all(dir)?;
    for (name, bytes) in synthetic() {
        fs::write(dir.join(name), bytes)?;
    }
    match real_dumps() {
        Ok([vm, vcpu]) => {
            fs::write(dir.join("valid-real-vm"), vm)?;
            fs::write(dir.join("valid-real-vcpu"), vcpu)?;
        }
        Err(e) => eprintln!("no real dumps: {e}"),
    }
    Ok(())
}

fn synthetic() -> Vec<(&'static str, Vec<u8>)> {
    let b = every_kind();
    let layout = b.layout();
    let header = |edit: fn(&mut kvm_stats::Header)| {
        let mut h = layout;
        edit(&mut h);
        b.build_with(h)
    };
    let bad_flags = header(|h| h.flags = 1);
    let misaligned = header(|h| h.desc_offset += 4);
    // Cut: the cap must fire on the header alone, and seeds should stay small.
    let huge_name = header(|h| h.name_size = kvm_stats::MAX_NAME_SIZE + 8)[..1024].to_vec();
    let overlap = header(|h| h.data_offset = h.desc_offset + 64);
    let full = b.build();
    vec![
        ("valid-every-kind", full.clone()),
        ("valid-empty", StatsFileBuilder::new("kvm-1").build()),
        ("bad-truncated", full[..full.len() / 2].to_vec()),
        ("bad-header-flags", bad_flags),
        ("bad-misaligned-desc", misaligned),
        ("bad-huge-name-size", huge_name),
        ("bad-overlap", overlap),
        (
            "bad-duplicate-name",
            every_kind().counter("exits", 1).build(),
        ),
        ("bad-boolean-log2", bool_log2()),
    ]
}

fn bool_log2() -> Vec<u8> {
    every_kind()
        .stat(
            "flag_hist",
            StatType::Log2Histogram,
            Unit::Boolean,
            Base::Pow10,
            0,
            &[1, 2],
        )
        .build()
}

fn real_dumps() -> Result<[Vec<u8>; 2], Failure> {
    let kvm = Kvm::new()?;
    let vm = kvm.create_vm()?;
    let vcpu = vm.create_vcpu(0)?;
    let dump = |mut file: File| -> Result<Vec<u8>, Failure> {
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        Ok(bytes)
    };
    Ok([dump(get_stats_fd(&vm)?)?, dump(get_stats_fd(&vcpu)?)?])
}
