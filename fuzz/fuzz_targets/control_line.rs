//! Fuzzes the control socket's request-line parser. The body is
//! `kvmscope::fuzz::control_line`, which `cargo test` also runs over the seeds.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kvmscope::fuzz::control_line(data));
