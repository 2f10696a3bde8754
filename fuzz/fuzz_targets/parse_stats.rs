//! Fuzzes the stats-file parser and everything that reads a parsed sample. The body lives in
//! `kvm_stats::fuzz` so that `cargo test` also runs it over the seed corpus.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Errors are expected for malformed input; only a panic (or a sanitizer report) is a bug.
    let _ = kvm_stats::fuzz::parse_and_sample(data);
});
