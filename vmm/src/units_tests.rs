//! Tests of `units.rs`: every quantity, accepted and refused, and the message
//! a refusal carries.

use super::*;

fn size(text: &str) -> Result<u64, UnitError> {
    text.parse::<Size>().map(|s| s.0)
}

fn bandwidth(text: &str) -> Result<f64, UnitError> {
    text.parse::<Bandwidth>().map(|b| b.0)
}

#[test]
fn sizes_with_bare_letters_and_iec_units_are_binary() {
    assert_eq!(size("4096"), Ok(4096));
    assert_eq!(size("4K"), Ok(4096));
    assert_eq!(size("4k"), Ok(4096));
    assert_eq!(size("64M"), Ok(64 << 20));
    assert_eq!(size("2G"), Ok(2 << 30));
    assert_eq!(size("1GiB"), Ok(1 << 30));
    assert_eq!(size("3Ti"), Ok(3 << 40));
    assert_eq!(size("512B"), Ok(512));
}

#[test]
fn sizes_with_kb_mb_gb_tb_are_decimal() {
    assert_eq!(size("1KB"), Ok(1_000));
    assert_eq!(size("1kB"), Ok(1_000));
    assert_eq!(size("500MB"), Ok(500_000_000));
    assert_eq!(size("1GB"), Ok(1_000_000_000));
    assert_eq!(size("2TB"), Ok(2_000_000_000_000));
}

#[test]
fn sizes_reject_garbage_fractions_and_bits() {
    for bad in ["", "M", "12X", "-4K", "1.5G", "1Gb", "1gb", "1mb", "64 M M"] {
        assert_eq!(size(bad), Err(UnitError::Size(bad.into())), "{bad}");
    }
}

#[test]
fn size_past_u64_is_an_overflow_error() {
    assert_eq!(
        size("99999999999999T"),
        Err(UnitError::SizeOverflow("99999999999999T".into()))
    );
}

#[test]
fn size_error_names_both_conventions() {
    let text = UnitError::Size("lots".into()).to_string();
    assert!(text.starts_with("'lots' is not a size"), "{text}");
    assert!(
        text.contains("binary, 1G = 2^30") && text.contains("decimal, 1GB = 10^9"),
        "{text}"
    );
}

#[test]
fn parse_size_follows_size() {
    assert_eq!(parse_size("16M"), Some(16 << 20));
    assert_eq!(parse_size("1GB"), Some(1_000_000_000));
    assert_eq!(parse_size("x"), None);
}

#[test]
fn bandwidth_takes_bits_and_both_kinds_of_bytes() {
    assert_eq!(bandwidth("10Gbit"), Ok(1.25e9));
    assert_eq!(bandwidth("10Gbit/s"), Ok(1.25e9));
    assert_eq!(bandwidth("100kbit"), Ok(12_500.0));
    assert_eq!(bandwidth("1.25GB/s"), Ok(1.25e9));
    assert_eq!(bandwidth("1GB"), Ok(1e9));
    assert_eq!(bandwidth("100MiB"), Ok(104_857_600.0));
    assert_eq!(bandwidth("1GiB/s"), Ok(1_073_741_824.0));
    assert_eq!(bandwidth("5000"), Ok(5000.0));
}

#[test]
fn bit_units_take_any_case_and_bps_but_byte_units_keep_theirs() {
    for text in ["10gbit", "10GBIT", "10Gbps", "10gbps", "10Gbit/s"] {
        assert_eq!(bandwidth(text), Ok(1.25e9), "{text}");
    }
    assert_eq!(bandwidth("100mbps"), Ok(12.5e6));
    assert_eq!(bandwidth("8bps"), Ok(1.0));
    // Bytes keep their case: `mb` or `GBps` could be read as bits or bytes.
    for bad in ["10gb", "10mib", "10GBps", "10Gibit", "10bits"] {
        assert_eq!(
            bandwidth(bad),
            Err(UnitError::Bandwidth(bad.into())),
            "{bad}"
        );
    }
}

#[test]
fn size_and_bandwidth_agree_on_every_byte_unit() {
    for unit in ["B", "KiB", "MiB", "GiB", "TiB", "KB", "MB", "GB", "TB"] {
        let text = format!("3{unit}");
        assert_eq!(
            bandwidth(&text).ok(),
            size(&text).ok().map(|b| b as f64),
            "{text}"
        );
    }
}

#[test]
fn bandwidth_with_a_bare_letter_is_ambiguous_and_says_how_to_write_it() {
    let err = bandwidth("10G").err().map(|e| e.to_string());
    assert_eq!(
        err.as_deref(),
        Some("'10G' is ambiguous for a bandwidth: write 10Gbit (bits), 10GB/s (decimal bytes) or 10GiB/s (binary bytes)")
    );
    assert!(matches!(
        bandwidth("1.5m/s"),
        Err(UnitError::AmbiguousBandwidth { .. })
    ));
}

#[test]
fn a_zero_bandwidth_is_unlimited_and_one_under_a_byte_a_second_is_refused() {
    assert_eq!(bandwidth("0bit"), Ok(0.0));
    assert_eq!(bandwidth("0"), Ok(0.0));
    assert_eq!(bandwidth("8bit"), Ok(1.0));
    // 1 bit/s would round to 0 bytes/s: no limit at all.
    assert_eq!(bandwidth("1bit"), Err(UnitError::Bandwidth("1bit".into())));
}

#[test]
fn bandwidth_rejects_garbage_and_bit_abbreviations() {
    for bad in ["fast", "10Gbyte", "10Gb", "1e999GB", "-1GB", "0.5B/s"] {
        assert_eq!(
            bandwidth(bad),
            Err(UnitError::Bandwidth(bad.into())),
            "{bad}"
        );
    }
}

#[test]
fn durations_accept_units_and_fractions() {
    assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
    assert_eq!(parse_duration("5s"), Some(Duration::from_secs(5)));
    assert_eq!(parse_duration("1.5s"), Some(Duration::from_millis(1500)));
    assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
    assert_eq!(parse_duration("10us"), Some(Duration::from_micros(10)));
    assert_eq!(parse_duration("0s"), Some(Duration::ZERO));
    // A bare zero needs no unit; any other number does.
    assert_eq!(parse_duration("0"), Some(Duration::ZERO));
    assert_eq!(
        "0".parse::<Period>(),
        Err(UnitError::ZeroDuration("0".into()))
    );
}

#[test]
fn durations_reject_missing_or_unknown_units_and_huge_values() {
    for bad in ["5", "0.5", "00", "5h", "s", "1e400s", "-1s", "1..2s"] {
        assert_eq!(
            bad.parse::<Span>(),
            Err(UnitError::Duration(bad.into())),
            "{bad}"
        );
    }
    // A number that is a duration, but too long to count: said so.
    for long in ["18446744073709551615s", "1000000001s", "16666667m"] {
        assert_eq!(
            long.parse::<Span>(),
            Err(UnitError::DurationTooLong(long.into())),
            "{long}"
        );
    }
    assert_eq!(
        "1000000000s".parse::<Span>(),
        Ok(Span(Duration::from_secs(1_000_000_000)))
    );
}

#[test]
fn period_refuses_zero() {
    assert_eq!("2s".parse(), Ok(Period(Duration::from_secs(2))));
    assert_eq!(
        "0ms".parse::<Period>(),
        Err(UnitError::ZeroDuration("0ms".into()))
    );
    assert!(matches!("x".parse::<Period>(), Err(UnitError::Duration(_))));
}

#[test]
fn durations_format_exactly_and_parse_back() {
    for d in [
        Duration::ZERO,
        Duration::from_secs(5),
        Duration::from_millis(250),
        Duration::from_micros(1500),
        Duration::from_nanos(7),
    ] {
        assert_eq!(parse_duration(&format_duration(d)), Some(d), "{d:?}");
    }
    assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
    assert_eq!(parse_duration("0.1s"), Some(Duration::from_millis(100)));
}

#[test]
fn interval_is_off_or_at_least_a_millisecond() {
    assert_eq!("off".parse(), Ok(Interval(None)));
    assert_eq!("1ms".parse(), Ok(Interval(Some(Interval::MIN))));
    assert_eq!(
        "0.5ms".parse::<Interval>(),
        Err(UnitError::Interval("0.5ms".into()))
    );
    assert_eq!(
        "soon".parse::<Interval>(),
        Err(UnitError::Interval("soon".into()))
    );
}

#[test]
fn count_stays_within_its_bounds() {
    type Ring = Count<2, 100>;
    assert_eq!("2".parse::<Ring>().map(|c| c.0), Ok(2));
    assert_eq!("100".parse::<Ring>().map(|c| c.0), Ok(100));
    let err = "1".parse::<Ring>().err().map(|e| e.to_string());
    assert_eq!(
        err.as_deref(),
        Some("'1' is not a whole number from 2 to 100")
    );
    assert!("101".parse::<Ring>().is_err() && "x".parse::<Ring>().is_err());
}

#[test]
fn dirty_log_names_bitmap_and_rings() {
    assert_eq!("bitmap".parse(), Ok(DirtyLog::Bitmap));
    assert_eq!("ring".parse(), Ok(DirtyLog::Ring(65536)));
    assert_eq!("ring:65536".parse(), Ok(DirtyLog::Ring(65536)));
    assert_eq!("ring:256".parse(), Ok(DirtyLog::Ring(256)));
    // Sizes KVM refuses are refused on the command line (exit status 2),
    // not when the VM is built.
    for entries in [1000, 128, 131072, 0] {
        let refused = format!("ring:{entries}").parse::<DirtyLog>();
        assert_eq!(refused, Err(UnitError::RingEntries(entries)), "{entries}");
    }
    assert_eq!(
        UnitError::RingEntries(1000).to_string(),
        "ring:1000: the dirty ring needs a power-of-two entry count from 256 to 65536"
    );
    for bad in ["ring:", "ring:big", "bitmap:4", "log"] {
        assert_eq!(
            bad.parse::<DirtyLog>(),
            Err(UnitError::DirtyLog(bad.into())),
            "{bad}"
        );
    }
}

#[test]
fn vcpu_choice_is_an_index_or_all() {
    assert_eq!("all".parse(), Ok(VcpuChoice::All));
    assert_eq!("3".parse(), Ok(VcpuChoice::One(3)));
    assert_eq!(
        "-1".parse::<VcpuChoice>(),
        Err(UnitError::Vcpu("-1".into()))
    );
}

#[test]
fn bytes_format_with_binary_units() {
    assert_eq!(format_bytes(512), "512 B");
    assert_eq!(format_bytes(64 << 20), "64 MiB");
    assert_eq!(format_bytes(3 << 29), "1.50 GiB");
    assert_eq!(Size(64 << 20).to_string(), "64 MiB");
}

#[test]
fn peer_text_keeps_a_peer_on_one_line() {
    let sent = b"\x1b[2J\x1b[31mpwned\r\n\xff\xfe\n\nnext";
    let shown = peer_text(sent, 100);
    assert!(!shown.chars().any(char::is_control), "{shown:?}");
    assert_eq!(
        shown,
        "\\u{1b}[2J\\u{1b}[31mpwned\\r\\n\u{fffd}\u{fffd}\\n\\nnext"
    );
    assert_eq!(peer_text(b"abcdef", 3), "abc... (6 characters in all)");
    assert_eq!(peer_text(b"plain words", 100), "plain words");
    assert_eq!(
        peer_text("a\u{202e}b\u{2028}c".as_bytes(), 100),
        "a\\u{202e}b\\u{2028}c"
    );
}

#[test]
fn a_peers_report_keeps_its_lines_and_escapes_the_rest() {
    // CRLF ends a line as LF does; a CR inside one is escaped.
    let text = "converges\n\u{1b}]0;owned\u{7}title\r\nla\rst\n";
    assert_eq!(
        peer_lines(text, 100, 10),
        "converges\n\\u{1b}]0;owned\\u{7}title\nla\\rst\n"
    );
    assert_eq!(
        peer_lines("a\nb\nc\nd", 100, 2),
        "a\nb\n... (4 lines in all)\n"
    );
    // Exactly as many lines as allowed: nothing cut, the last newline kept.
    assert_eq!(peer_lines("a\nb\n", 100, 2), "a\nb\n");
    assert_eq!(peer_lines("a\nb", 100, 2), "a\nb");
}
