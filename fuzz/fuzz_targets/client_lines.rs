//! Fuzzes what a VMM sends a bounded client such as the exporter (greeting,
//! replies, events, in pieces). The body is `kvmscope::fuzz::client_lines`,
//! which `cargo test` also runs over the seeds.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    kvmscope::fuzz::client_lines(data);
});
