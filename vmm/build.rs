//! Builds the guest package (`../guest`, a `no_std` workspace of its own) with
//! the host's own cargo, rustc and target, so that a plain `cargo build`
//! produces a `kvmscope` with its default guest embedded. No other target or
//! toolchain is needed: the guest is a freestanding program for the host's own
//! x86_64-unknown-linux-gnu target, linked by `guest/build.rs` as a static ELF
//! at the guest ABI's image address. It has no dependencies outside `guest/`,
//! so the build works offline; it gets a target directory of its own under
//! `OUT_DIR`, apart from the one this build holds locked.

use std::env;
use std::path::PathBuf;
use std::process::Command;

const GUEST_TARGET: &str = "x86_64-unknown-linux-gnu";

fn main() {
    let manifest =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let guest = manifest.join("../guest");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let target_dir = out_dir.join("guest-target");
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    // A directory here means: rerun when anything below it changes.
    for f in [
        "src",
        "abi",
        "build.rs",
        "link.ld",
        "Cargo.toml",
        "Cargo.lock",
    ] {
        println!("cargo:rerun-if-changed={}", guest.join(f).display());
    }
    let status = Command::new(cargo)
        // The guest's own directory, so that only its configuration applies.
        .current_dir(&guest)
        .args(["build", "--release", "--locked", "--offline", "--quiet"])
        .args(["--target", GUEST_TARGET])
        .arg("--target-dir")
        .arg(&target_dir)
        // Flags and wrappers meant for the host crates (clippy's driver
        // included) must not leak into the guest build.
        .env("CARGO_ENCODED_RUSTFLAGS", "")
        .env_remove("RUSTFLAGS")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET")
        .status()
        .expect("could not run cargo to build the guest");
    assert!(
        status.success(),
        "building the guest failed (see the errors above)"
    );
    let elf = target_dir
        .join(GUEST_TARGET)
        .join("release")
        .join("kvmscope-guest");
    println!("cargo:rustc-env=KVMSCOPE_GUEST_ELF={}", elf.display());
    println!("cargo:rustc-env=KVMSCOPE_COMMIT={}", commit(&manifest));
}

/// The source's commit, for `--version` (an experiment's record names the
/// binary's commit, not the checkout's it ran from): `unknown` outside a git
/// checkout. Rerun when HEAD moves: its reflog (`logs/HEAD`, written at
/// every commit, checkout and reset), else HEAD and its ref; the git
/// directory as git names it (a worktree's is not `.git`). Only files that
/// exist are named: cargo reruns a build script for ever for one that does
/// not.
fn commit(manifest: &std::path::Path) -> String {
    let git = |args: &[&str]| {
        Command::new("git")
            .arg("-C")
            .arg(manifest)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .filter(|out| !out.is_empty())
    };
    let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]).map(PathBuf::from) else {
        return "unknown".into();
    };
    let watch = |path: PathBuf| {
        let there = path.exists();
        if there {
            println!("cargo:rerun-if-changed={}", path.display());
        }
        there
    };
    if !watch(dir.join("logs").join("HEAD")) {
        watch(dir.join("HEAD"));
        if let Some(name) = git(&["symbolic-ref", "-q", "HEAD"]) {
            watch(dir.join(name));
        }
        watch(dir.join("packed-refs"));
    }
    git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into())
}
