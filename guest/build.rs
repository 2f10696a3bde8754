//! Links the guest as a static, freestanding ELF at the ABI's image address
//! (`link.ld`): no C runtime, no libc, no program interpreter. `vmm/build.rs`
//! builds this package; `cargo build --release --target x86_64-unknown-linux-gnu`
//! here does the same by hand.

fn main() {
    let script = std::path::Path::new("link.ld");
    println!("cargo:rerun-if-changed={}", script.display());
    for arg in [
        "-nostartfiles",
        "-nostdlib",
        "-static",
        "-no-pie",
        "-Wl,--build-id=none",
    ] {
        println!("cargo:rustc-link-arg-bins={arg}");
    }
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into());
    println!("cargo:rustc-link-arg-bins=-Wl,-T,{dir}/link.ld");
}
