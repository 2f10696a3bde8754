//! Parsing and printing of sizes and durations as users write them (`64M`, `500ms`).

use std::time::Duration;

/// Parses a byte size: a number with an optional binary suffix `K`, `M`, `G`, `T`
/// (optionally followed by `i`/`iB`/`B`), e.g. `4096`, `64M`, `1GiB`.
pub fn parse_size(text: &str) -> Option<u64> {
    let t = text.trim();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(digits_end);
    let n: u64 = num.parse().ok()?;
    let shift = match suffix.trim_end_matches("iB").trim_end_matches(['B', 'i']) {
        "" => 0,
        "K" | "k" => 10,
        "M" | "m" => 20,
        "G" | "g" => 30,
        "T" | "t" => 40,
        _ => return None,
    };
    n.checked_mul(1u64 << shift)
}

/// Parses a duration: a number with a suffix `ns`, `us`, `ms`, `s` or `m` (`1.5s` allowed),
/// rounded to the nanosecond.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().ok()?;
    let ns_per_unit = match unit {
        "ns" => 1.0,
        "us" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        "m" | "min" => 60e9,
        _ => return None,
    };
    let ns = n * ns_per_unit;
    if !ns.is_finite() || !(0.0..=1e18).contains(&ns) {
        return None;
    }
    Some(Duration::from_nanos(ns.round() as u64))
}

/// Formats a duration exactly, in the largest unit that divides it: `5s`, `250ms`, `1500us`.
pub fn format_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    match ns {
        0 => "0s".to_string(),
        n if n % 1_000_000_000 == 0 => format!("{}s", n / 1_000_000_000),
        n if n % 1_000_000 == 0 => format!("{}ms", n / 1_000_000),
        n if n % 1_000 == 0 => format!("{}us", n / 1_000),
        n => format!("{n}ns"),
    }
}

/// Parses a link bandwidth into bytes per second: a number with an optional
/// unit, bits (`bit`, `kbit`, `Mbit`, `Gbit`, `Tbit`; decimal) or bytes (`B`,
/// `KB`/`MB`/`GB`/`TB` decimal, `KiB`/`MiB`/`GiB`/`TiB` binary), and an optional
/// `/s`. A bare number is bytes per second. E.g. `10Gbit`, `1.25GB/s`, `800MiB`.
pub fn parse_bandwidth(text: &str) -> Option<f64> {
    let t = text.trim().trim_end_matches("/s").trim_end_matches("ps");
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().ok()?;
    let factor = match unit.trim() {
        "" | "B" => 1.0,
        "bit" | "b" => 1.0 / 8.0,
        "kbit" | "Kbit" | "kb" => 1e3 / 8.0,
        "Mbit" | "Mb" => 1e6 / 8.0,
        "Gbit" | "Gb" => 1e9 / 8.0,
        "Tbit" | "Tb" => 1e12 / 8.0,
        "KB" | "kB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        "KiB" => 1024.0,
        "MiB" => 1048576.0,
        "GiB" => 1073741824.0,
        "TiB" => 1099511627776.0,
        _ => return None,
    };
    let v = n * factor;
    (v.is_finite() && v > 0.0).then_some(v)
}

/// Formats bytes with a binary unit, e.g. `64 MiB`, `1.50 GiB`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 || v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[i])
    } else {
        format!("{v:.2} {}", UNITS[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_accept_binary_suffixes() {
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("4K"), Some(4096));
        assert_eq!(parse_size("64M"), Some(64 << 20));
        assert_eq!(parse_size("1GiB"), Some(1 << 30));
        assert_eq!(parse_size("2G"), Some(2 << 30));
    }

    #[test]
    fn sizes_reject_garbage_and_overflow() {
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("M"), None);
        assert_eq!(parse_size("12X"), None);
        assert_eq!(parse_size("-4K"), None);
        assert_eq!(parse_size("99999999999999T"), None);
    }

    #[test]
    fn durations_accept_units_and_fractions() {
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration("5s"), Some(Duration::from_secs(5)));
        assert_eq!(parse_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("10us"), Some(Duration::from_micros(10)));
    }

    #[test]
    fn durations_reject_missing_or_unknown_units() {
        assert_eq!(parse_duration("5"), None);
        assert_eq!(parse_duration("5h"), None);
        assert_eq!(parse_duration("s"), None);
        assert_eq!(parse_duration("1e400s"), None);
    }

    #[test]
    fn bandwidth_takes_bits_and_bytes() {
        assert_eq!(parse_bandwidth("10Gbit"), Some(1.25e9));
        assert_eq!(parse_bandwidth("10Gbit/s"), Some(1.25e9));
        assert_eq!(parse_bandwidth("1.25GB/s"), Some(1.25e9));
        assert_eq!(parse_bandwidth("100MiB"), Some(104857600.0));
        assert_eq!(parse_bandwidth("5000"), Some(5000.0));
        assert_eq!(parse_bandwidth("0"), None);
        assert_eq!(parse_bandwidth("fast"), None);
        assert_eq!(parse_bandwidth("10Gbyte"), None);
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
    fn bytes_format_with_binary_units() {
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(64 << 20), "64 MiB");
        assert_eq!(format_bytes(3 << 29), "1.50 GiB");
    }
}
