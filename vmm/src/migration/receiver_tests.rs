//! Unit tests of `receiver.rs`.

use super::*;

fn config() -> ConfigRecord {
    ConfigRecord {
        memory: 64 << 20,
        tsc_khz: 1,
        vcpus: 2,
        hugepages: 0,
        dirty_mode: format::DIRTY_NONE,
        ring_entries: 0,
        page_size: 4096,
        guest_abi: crate::abi::ABI_VERSION,
    }
}

fn given() -> IncomingConfig {
    IncomingConfig {
        uri: Uri::Unix("/nonexistent".into()),
        memory: None,
        vcpus: None,
        hugepages: None,
        dirty_log: None,
        idle_timeout: super::DEFAULT_IDLE_TIMEOUT,
    }
}

#[test]
fn unset_options_come_from_the_stream() {
    assert!(check(&config(), &given()).is_ok());
}

#[test]
fn a_memory_mismatch_names_both_sizes() {
    let e = check(
        &config(),
        &IncomingConfig {
            memory: Some(128 << 20),
            ..given()
        },
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "the stream's VM has memory of 64 MiB (67108864 bytes), but this VMM was given --memory 128 MiB (134217728 bytes)"
    );
}

#[test]
fn vcpu_hugepage_and_dirty_mismatches_name_both_values() {
    let cases = [
        (
            IncomingConfig {
                vcpus: Some(4),
                ..given()
            },
            "vCPUs: 2, but this VMM was given --vcpus 4",
        ),
        (
            IncomingConfig {
                hugepages: Some(true),
                ..given()
            },
            "RAM without huge pages, but this VMM was given --hugepages",
        ),
        (
            IncomingConfig {
                dirty_log: Some(DirtyMode::Bitmap),
                ..given()
            },
            "dirty tracking: no dirty log, but this VMM was given --dirty-log bitmap",
        ),
    ];
    for (g, text) in cases {
        let e = check(&config(), &g).unwrap_err().to_string();
        assert!(e.ends_with(text), "{e}");
    }
}

#[test]
fn a_page_run_of_an_unknown_kind_is_refused_by_its_value() {
    let good = PageRun {
        first: 0,
        count: 1,
        kind: RunKind::Zero,
    };
    let mut payload = zerocopy::IntoBytes::as_bytes(&good).to_vec();
    assert_eq!(runs(&payload, 4).unwrap().len(), 1, "a zero run is read");
    payload[12..16].copy_from_slice(&3u32.to_ne_bytes());
    let e = runs(&payload, 4).unwrap_err();
    assert!(matches!(e, format::Error::RunKind(3)), "{e}");
    let e = runs(&payload[..15], 4).unwrap_err();
    assert!(matches!(e, format::Error::Length { .. }), "{e}");
}
