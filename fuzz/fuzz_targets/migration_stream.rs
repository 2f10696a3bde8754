//! Fuzzes the migration stream reader as a destination runs it: header,
//! section limits, config checks, RAM runs, vCPU sections and the trailer.
//! The body is `kvmscope::fuzz::migration_stream`, which `cargo test` also runs over the seeds.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    kvmscope::fuzz::migration_stream(data);
});
