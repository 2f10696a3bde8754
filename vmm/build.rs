//! Builds the guest (`../guest`) with the host's own `rustc` and target, as a
//! static, freestanding ELF linked at the guest ABI's image address, so that a
//! plain `cargo build` produces a `kvmscope` with its default guest embedded.
//! No other target or toolchain is needed: the guest is built for the host's
//! own x86_64-unknown-linux-gnu target, freestanding.

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    let manifest =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let guest = manifest.join("../guest");
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("guest.elf");
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    // A directory here means: rerun when anything below it changes.
    for f in ["src", "link.ld"] {
        println!("cargo:rerun-if-changed={}", guest.join(f).display());
    }
    let link_script = guest.join("link.ld");
    let status = Command::new(rustc)
        .args([
            "--edition",
            "2021",
            "--crate-type",
            "bin",
            "--crate-name",
            "kvmscope_guest",
        ])
        .args(["--target", "x86_64-unknown-linux-gnu"])
        .args([
            "-C",
            "opt-level=2",
            "-C",
            "panic=abort",
            "-C",
            "relocation-model=static",
        ])
        .args(["-C", "debuginfo=0", "-C", "strip=debuginfo"])
        .args(["-C", "link-arg=-nostartfiles", "-C", "link-arg=-nostdlib"])
        .args([
            "-C",
            "link-arg=-static",
            "-C",
            "link-arg=-no-pie",
            "-C",
            "link-arg=-Wl,--build-id=none",
        ])
        .arg("-C")
        .arg(format!("link-arg=-Wl,-T,{}", link_script.display()))
        // Panic messages name `guest/src/...`, not this machine's checkout path.
        .arg(format!("--remap-path-prefix={}=guest", guest.display()))
        .arg("-o")
        .arg(&out)
        .arg(guest.join("src/main.rs"))
        // Flags meant for the host crates must not leak into the guest build.
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("RUSTFLAGS")
        .status()
        .expect("could not run rustc to build the guest");
    assert!(
        status.success(),
        "building the guest failed (see the rustc errors above)"
    );
    println!("cargo:rustc-env=KVMSCOPE_GUEST_ELF={}", out.display());
}
