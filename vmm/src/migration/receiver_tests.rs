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

/// Values no stream version defines, and counts the guest ABI does not
/// allow, are refused from the config, before any VM is built.
#[test]
fn config_fields_out_of_range_are_refused_naming_the_field() {
    type Set = fn(&mut ConfigRecord);
    let cases: [(Set, &str); 4] = [
        (
            |c| c.dirty_mode = 7,
            "the config's dirty_mode is 7, which stream version 1 does not define",
        ),
        (
            |c| c.hugepages = 5,
            "the config's hugepages is 5, which stream version 1 does not define",
        ),
        (
            |c| c.vcpus = 0,
            "the stream's VM has vCPUs: 0, but this VMM takes 1 to 256 (the guest ABI)",
        ),
        (|c| c.vcpus = 257, "vCPUs: 257, but"),
    ];
    for (set, says) in cases {
        let mut c = config();
        set(&mut c);
        let e = crate::error_chain(&check(&c, &given()).unwrap_err());
        assert!(e.contains(says), "{e}");
    }
}

/// A RAM section whose run claims more pages than the section holds, or
/// none, is named as such (it read as a source that was killed).
#[test]
fn a_run_that_claims_more_than_its_section_or_nothing_is_named() {
    let run = |count: u32, kind: RunKind| {
        zerocopy::IntoBytes::as_bytes(&PageRun {
            first: 3,
            count,
            kind,
        })
        .to_vec()
    };
    let mut short = run(2, RunKind::Normal);
    short.extend_from_slice(&[0; 4096]);
    let e = runs(&short, 64).unwrap_err().to_string();
    assert_eq!(e, "RAM section is 4112 bytes, but its contents need 8208");
    let e = runs(&run(0, RunKind::Zero), 64).unwrap_err().to_string();
    assert_eq!(e, "a page run at page 3 holds no pages");
}

/// Runs go up within a section, as a source writes them: a run that goes
/// back, or overlaps the one before it, is refused (each could make the
/// destination go over all of RAM again for 16 bytes of stream).
#[test]
fn runs_that_go_back_within_a_section_are_refused() {
    let run = |first: u64, count: u32| {
        zerocopy::IntoBytes::as_bytes(&PageRun {
            first,
            count,
            kind: RunKind::Zero,
        })
        .to_vec()
    };
    let section = |runs: &[(u64, u32)]| {
        runs.iter()
            .flat_map(|&(f, c)| run(f, c))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        runs(&section(&[(0, 4), (4, 4), (10, 54)]), 64)
            .unwrap()
            .len(),
        3
    );
    let e = runs(&section(&[(0, 64), (0, 64)]), 64)
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "a page run at page 0 comes after one that ends at page 64 (runs go up within a section)"
    );
    assert!(runs(&section(&[(8, 4), (2, 1)]), 64).is_err());
    assert!(runs(&section(&[(0, 4), (3, 4)]), 64).is_err());
}
