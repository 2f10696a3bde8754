//! Fuzzes the workload-spec parser, its encoder and its print/parse round trip.
//! The body is `kvmscope::fuzz::workload_spec`, which `cargo test` also runs over the seeds.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kvmscope::fuzz::workload_spec(data));
