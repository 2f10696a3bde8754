//! The fuzz bodies (`kvmscope::fuzz`) over the seed corpora in `fuzz/corpus/`:
//! `ok-*` seeds must parse, `bad-*` seeds must be rejected, none may panic.

use std::path::Path;

use kvmscope::fuzz::{
    client_lines, control_line, http_request, migration_handshake, migration_stream, workload_spec,
};

fn seeds(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target);
    let mut out: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    out.sort();
    assert!(
        out.len() >= 4,
        "seed corpus {target} has {} files",
        out.len()
    );
    out
}

#[test]
fn control_line_seeds_parse_or_fail_as_named() {
    for (name, data) in seeds("control_line") {
        control_line(&data);
        let parsed = kvmscope::protocol::request::parse(&data);
        assert_eq!(
            parsed.is_ok(),
            name.starts_with("ok-"),
            "{name}: {parsed:?}"
        );
    }
}

#[test]
fn workload_spec_seeds_parse_or_fail_as_named() {
    for (name, data) in seeds("workload_spec") {
        workload_spec(&data);
        let parsed = kvmscope::workload::parse_workload(std::str::from_utf8(&data).unwrap());
        assert_eq!(
            parsed.is_ok(),
            name.starts_with("ok-"),
            "{name}: {parsed:?}"
        );
    }
}

#[test]
fn migration_stream_seeds_load_or_fail_as_named() {
    for (name, data) in seeds("migration_stream") {
        assert_eq!(migration_stream(&data), name.starts_with("ok-"), "{name}");
    }
}

#[test]
fn http_request_seeds_get_the_page_or_not_as_named() {
    for (name, data) in seeds("http_request") {
        assert_eq!(http_request(&data), name.starts_with("ok-"), "{name}");
    }
}

#[test]
fn migration_handshake_seeds_are_taken_or_dropped_as_named() {
    for (name, data) in seeds("migration_handshake") {
        assert_eq!(
            migration_handshake(&data),
            name.starts_with("ok-"),
            "{name}"
        );
    }
}

#[test]
fn client_lines_seeds_are_greeted_or_refused_as_named() {
    for (name, data) in seeds("client_lines") {
        assert_eq!(client_lines(&data), name.starts_with("ok-"), "{name}");
    }
}
