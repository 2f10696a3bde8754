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
