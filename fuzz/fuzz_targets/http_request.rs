//! Fuzzes the metrics server's request-head parser (where a head ends, what it
//! gets). The body is `kvmscope::fuzz::http_request`, which `cargo test` also
//! runs over the seeds.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = kvmscope::fuzz::http_request(data);
});
