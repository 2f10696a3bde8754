//! Runs the fuzz body over the committed seed corpus (`fuzz/corpus/parse_stats/`): files named
//! `valid-*` must parse and sample, `bad-*` must fail with an error, and nothing may panic.
//! Other files (inputs a fuzzer found, kept locally) only must not panic.

use std::fs;
use std::path::PathBuf;

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/parse_stats")
}

#[test]
fn fuzz_body_handles_seed_corpus() {
    let dir = corpus_dir();
    let entries = fs::read_dir(&dir).unwrap_or_else(|e| {
        panic!(
            "seed corpus {} unreadable ({e}); regenerate it with \
             `cargo run -p kvm-stats --example seed_corpus -- fuzz/corpus/parse_stats`",
            dir.display()
        )
    });
    let mut seen = 0;
    for entry in entries {
        let path = entry.expect("corpus entry").path();
        let bytes = fs::read(&path).expect("corpus file");
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let result = kvm_stats::fuzz::parse_and_sample(&bytes);
        if name.starts_with("valid-") {
            assert!(result.is_ok(), "{name}: {result:?}");
        } else if name.starts_with("bad-") {
            assert!(result.is_err(), "{name} parsed");
        }
        seen += 1;
    }
    assert!(seen >= 5, "only {seen} seeds in {}", dir.display());
}
