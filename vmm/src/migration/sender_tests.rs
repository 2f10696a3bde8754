//! Unit tests of `sender.rs`.

use super::*;

#[test]
fn the_paused_stall_limit_follows_downtime_limit_above_its_floor() {
    let p = |downtime_limit, x_check_ram| crate::migration::Parameters {
        downtime_limit,
        x_check_ram,
        ..crate::migration::Parameters::default()
    };
    assert_eq!(stop_stall(&p(300, false), 1 << 30), STOP_STALL_FLOOR);
    assert_eq!(
        stop_stall(&p(2000, false), 1 << 30),
        Duration::from_secs(20)
    );
    assert_eq!(
        stop_stall(&p(300, true), 3 << 30),
        STOP_STALL_FLOOR + Duration::from_secs(3),
        "a second per GiB the destination checksums"
    );
    assert_eq!(
        stop_stall(&p(crate::migration::handle::MAX_DOWNTIME_LIMIT, false), 0),
        Duration::from_secs(20_000)
    );
}

#[test]
fn expected_downtime_counts_pages_headers_the_vcpus_state_and_the_stops_costs() {
    assert_eq!(expected_ms(1, 1, 0, 0.0), u64::MAX);
    // 1000 pages of 4112 bytes at 4.112 MB/s: one second; their section
    // header and pass record, one idle vCPU's state (6,288 bytes with its
    // header) and the trailer 1.5 ms more; the stop's costs 1.25 ms.
    assert_eq!(expected_ms(1000, 1, 0, 4_112_000.0), 1003);
    // A queue as long on the wire as the pages: another second.
    assert_eq!(expected_ms(1000, 1, 4_112_000, 4_112_000.0), 2003);
    // Nothing dirty: the state and the costs (1 ms and 0.25 per vCPU).
    assert_eq!(expected_ms(0, 1, 0, 1e9), 2);
    assert_eq!(expected_ms(0, 4, 0, 1e9), 3);
}

#[test]
fn passes_that_stop_shrinking_are_said_once_and_stay_said_until_a_pass_halves() {
    // No pass before, or an empty one: nothing to compare.
    assert!(!passes_stalled(None, 5000, false));
    assert!(!passes_stalled(Some(0), 5000, false));
    // Shrinking well: converging.
    assert!(!passes_stalled(Some(10_000), 5000, false));
    // Grew, held or shrank by less than a tenth: stalled.
    for dirty in [10_500, 10_000, 9_100, 9_000] {
        assert!(passes_stalled(Some(10_000), dirty, false), "{dirty}");
    }
    assert!(!passes_stalled(Some(10_000), 8_900, false));
    // Once said, a pass that shrinks by a fifth (a wobble) keeps it said;
    // one that halves what is left ends it.
    let mut noted = false;
    let mut said = Vec::new();
    let mut prev = None;
    for dirty in [6144, 6100, 5200, 6000, 4900, 2400, 2300] {
        noted = passes_stalled(prev, dirty, noted);
        said.push(noted);
        prev = Some(dirty);
    }
    assert_eq!(said, [false, true, true, true, true, false, true]);
}
