//! Fuzz bodies for the VMM's parsers of outside input: control-socket request
//! lines and workload specs. The cargo-fuzz targets in `fuzz/` call these, and
//! `vmm/tests/fuzz_corpus.rs` runs them over the seed corpus in `cargo test`.
//! Errors are the expected outcome for bad input; a panic is a bug.

use crate::workload::{parse_command, parse_workload};

/// Control-socket input: split into values as the server does, and each
/// parsed as a request.
pub fn control_line(data: &[u8]) {
    let mut framer = crate::protocol::framing::Framer::new();
    framer.extend(data);
    while let Some(frame) = framer.next_frame(true) {
        if let crate::protocol::framing::Frame::Value(bytes) = frame {
            let _ = crate::protocol::request::parse(&bytes);
        }
    }
}

/// A workload spec: parse it, encode every command for arenas of a few sizes,
/// and check that each command prints as a spec that parses back to itself.
pub fn workload_spec(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(workload) = parse_workload(text) else {
        return;
    };
    for c in &workload.commands {
        for arena in [0, 4096, 64 << 20, u64::MAX] {
            let _ = c.to_guest(arena);
        }
        let printed = c.to_string();
        match parse_command(&printed) {
            Ok(back) => assert_eq!(&back, c, "'{printed}' parses back differently"),
            Err(e) => panic!("'{printed}' (printed from {c:?}) does not parse back: {e}"),
        }
    }
    let _ = workload.target.resolve(8);
}
