//! Fuzzes a migration destination's wait for its source: a peer's first
//! bytes, arriving in pieces of any size, judged as they come (more, not a
//! source, a source, another version) and as a whole, which must agree.
//! The body is `kvmscope::fuzz::migration_handshake`, which `cargo test` also runs over the seeds.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    kvmscope::fuzz::migration_handshake(data);
});
