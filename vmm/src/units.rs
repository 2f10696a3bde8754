//! Quantities as users write them on the command line and in workload specs
//! (`64M`, `10Gbit`, `500ms`, `off`, `ring:4096`, `all`), as `FromStr` types
//! that clap parses flags into, with one error type that says what is
//! accepted; and their printing.
//!
//! One convention for byte units everywhere:
//! - `K`, `M`, `G`, `T` and `KiB`, `MiB`, `GiB`, `TiB` are binary (1G = 2^30 bytes);
//! - `KB`, `MB`, `GB`, `TB` are decimal (1GB = 10^9 bytes);
//! - bits are spelled `bit`, `kbit`, `Mbit`, `Gbit`, `Tbit` (decimal; any
//!   case, and `bps`..`Tbps` too).
//!
//! A bare `K`/`M`/`G`/`T` is a size (guest RAM, workload ranges) but not a
//! bandwidth, where `10G` could mean bits or either kind of byte: it is
//! refused with an error that names the three spellings.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// The size units, as the errors name them (the `--help` texts and the
/// README say the same in their own words).
pub(crate) const SIZE_UNITS: &str =
    "K, M, G, T or KiB, MiB, GiB, TiB (binary, 1G = 2^30 bytes); KB, MB, GB, TB (decimal, 1GB = 10^9 bytes)";

/// A quantity that does not parse, with what would have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitError {
    /// Not a size.
    #[error(
        "'{0}' is not a size: use a whole number of bytes with an optional unit, {SIZE_UNITS}"
    )]
    Size(String),
    /// A size past `u64::MAX` bytes.
    #[error("'{0}' is too large: sizes go up to 16 EiB")]
    SizeOverflow(String),
    /// Not a bandwidth.
    #[error("'{0}' is not a bandwidth: use e.g. 10Gbit, 1.25GB/s or 800MiB/s (bits: bit, kbit, Mbit, Gbit, Tbit or Gbps, any case; bytes: B, KB, MB, GB, TB decimal, KiB, MiB, GiB, TiB binary, with or without /s; a bare number is bytes/s), at least 1 B/s (8bit), or 0bit for unlimited")]
    Bandwidth(String),
    /// A bandwidth with a bare `K`/`M`/`G`/`T`.
    #[error("'{text}' is ambiguous for a bandwidth: write {number}{prefix}bit (bits), {number}{prefix}B/s (decimal bytes) or {number}{prefix}iB/s (binary bytes)")]
    AmbiguousBandwidth {
        /// What was given.
        text: String,
        /// Its number.
        number: String,
        /// Its unit letter.
        prefix: String,
    },
    /// Not a duration.
    #[error("'{0}' is not a duration: use a number with ns, us, ms, s or m, e.g. 500ms or 2s")]
    Duration(String),
    /// A duration too long to count in nanoseconds here (over 31 years).
    #[error("'{0}' is too long a duration: at most 1e18 ns (about 31 years)")]
    DurationTooLong(String),
    /// A zero duration where only a positive one makes sense.
    #[error("'{0}' is not a positive duration: use e.g. 500ms or 2s")]
    ZeroDuration(String),
    /// Not a sampler interval.
    #[error(
        "'{0}' is not a sampler interval: use a duration from 1ms up, e.g. 100ms or 1s, or off"
    )]
    Interval(String),
    /// Not a time limit.
    #[error("'{0}' is not a time limit: use a positive duration, e.g. 5s or 500ms, or off")]
    Limit(String),
    /// Not a whole number in range.
    #[error("'{text}' is not a whole number from {min} to {max}")]
    Count {
        /// What was given.
        text: String,
        /// Smallest allowed.
        min: usize,
        /// Largest allowed.
        max: usize,
    },
    /// Not a dirty-log mode.
    #[error("'{0}' is not a dirty-log mode: use bitmap, ring or ring:ENTRIES (e.g. ring:4096)")]
    DirtyLog(String),
    /// Not a vCPU choice.
    #[error("'{0}' is not a vCPU: use an index or all")]
    Vcpu(String),
    /// A dirty ring of a size KVM does not take.
    #[error("ring:{0}: the dirty ring needs a power-of-two entry count from {MIN_RING_ENTRIES} to {MAX_RING_ENTRIES}")]
    RingEntries(u32),
}

/// Splits `text` into its leading number (digits and, with `fraction`, dots)
/// and the unit after it.
fn split_number(text: &str, fraction: bool) -> (&str, &str) {
    let t = text.trim();
    let end = t
        .find(|c: char| !(c.is_ascii_digit() || (fraction && c == '.')))
        .unwrap_or(t.len());
    t.split_at(end)
}

/// Bytes per unit, by the module's convention; bare letters only with `bare`.
fn byte_unit(unit: &str, bare: bool) -> Option<u64> {
    Some(match unit {
        "" | "B" => 1,
        "Ki" | "KiB" => 1 << 10,
        "Mi" | "MiB" => 1 << 20,
        "Gi" | "GiB" => 1 << 30,
        "Ti" | "TiB" => 1 << 40,
        "K" | "k" if bare => 1 << 10,
        "M" | "m" if bare => 1 << 20,
        "G" | "g" if bare => 1 << 30,
        "T" | "t" if bare => 1 << 40,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        _ => return None,
    })
}

/// A size in bytes: a whole number with an optional unit ([`SIZE_UNITS`]),
/// e.g. `4096`, `64M`, `1GiB`, `500MB`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Size(pub u64);

impl FromStr for Size {
    type Err = UnitError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (number, unit) = split_number(text, false);
        let n: u64 = number
            .parse()
            .map_err(|_| UnitError::Size(text.to_string()))?;
        let per_unit = byte_unit(unit, true).ok_or_else(|| UnitError::Size(text.to_string()))?;
        n.checked_mul(per_unit)
            .map(Size)
            .ok_or_else(|| UnitError::SizeOverflow(text.to_string()))
    }
}

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_bytes(self.0))
    }
}

/// Parses a size (see [`Size`]); `None` if it does not parse.
pub(crate) fn parse_size(text: &str) -> Option<u64> {
    text.parse::<Size>().ok().map(|s| s.0)
}

/// A link bandwidth in bytes per second: a number with a unit of bits
/// (`bit`, `kbit`, `Mbit`, `Gbit`, `Tbit`, in any case, or `bps`..`Tbps`
/// with a lower-case `b`;
/// decimal) or bytes (`B`, `KiB`..`TiB`
/// binary, `KB`..`TB` decimal) and an optional `/s`; a bare number is bytes
/// per second. E.g. `10Gbit`, `1.25GB/s`, `800MiB/s`.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct Bandwidth(pub f64);

impl FromStr for Bandwidth {
    type Err = UnitError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || UnitError::Bandwidth(text.to_string());
        let (number, unit) = split_number(text.trim().trim_end_matches("/s"), true);
        let n: f64 = number.parse().map_err(|_| bad())?;
        let unit = unit.trim();
        // Bits in any case (`10gbit`) and as `bps` with a lower-case `b`
        // (`10Gbps`; `GBps` could be bytes): a bit unit says bits whatever
        // its case, bytes keep their case (`MB`, `MiB`).
        let lower = unit.to_ascii_lowercase();
        let bits = match unit.strip_suffix("bps") {
            Some(_) => lower.strip_suffix("bps"),
            None => lower.strip_suffix("bit"),
        };
        let per_unit = match (bits, unit) {
            (Some(""), _) => 1.0 / 8.0,
            (Some("k"), _) => 1e3 / 8.0,
            (Some("m"), _) => 1e6 / 8.0,
            (Some("g"), _) => 1e9 / 8.0,
            (Some("t"), _) => 1e12 / 8.0,
            (_, u @ ("K" | "k" | "M" | "m" | "G" | "g" | "T" | "t")) => {
                return Err(UnitError::AmbiguousBandwidth {
                    text: text.to_string(),
                    number: number.to_string(),
                    prefix: u.to_ascii_uppercase(),
                })
            }
            (_, u) => byte_unit(u, false).ok_or_else(bad)? as f64,
        };
        let v = n * per_unit;
        // 0 (`0bit`) is a link without a limit, as `max-bandwidth` 0 is; a
        // rate under a byte a second would round to that.
        if v.is_finite() && (v == 0.0 || v >= 1.0) {
            Ok(Bandwidth(v))
        } else {
            Err(bad())
        }
    }
}

/// A duration: a number with a unit `ns`, `us`, `ms`, `s` or `m`/`min`
/// (`1.5s` allowed), rounded to the nanosecond; zero allowed (`0s`, or a
/// bare `0`: the one number whose unit does not matter).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Span(pub Duration);

impl FromStr for Span {
    type Err = UnitError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || UnitError::Duration(text.to_string());
        let (number, unit) = split_number(text, true);
        let n: f64 = number.parse().map_err(|_| bad())?;
        let ns_per_unit = match unit {
            "ns" => 1.0,
            "us" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" | "min" => 60e9,
            "" if number == "0" => 0.0,
            _ => return Err(bad()),
        };
        let ns = (n * ns_per_unit).round();
        // Whole nanoseconds below 1e18 (about 31 years) convert to u64 exactly.
        if ns > 1e18 {
            return Err(UnitError::DurationTooLong(text.to_string()));
        }
        if !(0.0..=1e18).contains(&ns) {
            return Err(bad());
        }
        Ok(Span(Duration::from_nanos(saturating_u64(ns))))
    }
}

/// Parses a duration (see [`Span`]); `None` if it does not parse.
pub(crate) fn parse_duration(text: &str) -> Option<Duration> {
    text.parse::<Span>().ok().map(|s| s.0)
}

/// A positive duration (see [`Span`]), e.g. a refresh period or a deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Period(pub Duration);

impl FromStr for Period {
    type Err = UnitError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.parse::<Span>()? {
            Span(d) if d.is_zero() => Err(UnitError::ZeroDuration(text.to_string())),
            Span(d) => Ok(Period(d)),
        }
    }
}

/// A sampler interval: a duration from [`Interval::MIN`] up, or `off` (`None`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interval(pub Option<Duration>);

impl Interval {
    /// The shortest interval: one tick per millisecond.
    pub(crate) const MIN: Duration = Duration::from_millis(1);
}

impl FromStr for Interval {
    type Err = UnitError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.trim() == "off" {
            return Ok(Interval(None));
        }
        match text.parse::<Span>() {
            Ok(Span(d)) if d >= Interval::MIN => Ok(Interval(Some(d))),
            _ => Err(UnitError::Interval(text.to_string())),
        }
    }
}

/// A time limit: a positive duration, or `off` for none (`None`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit(pub Option<Duration>);

impl FromStr for Limit {
    type Err = UnitError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.trim() == "off" {
            return Ok(Limit(None));
        }
        match text.parse::<Period>() {
            Ok(Period(d)) => Ok(Limit(Some(d))),
            Err(_) => Err(UnitError::Limit(text.to_string())),
        }
    }
}

/// A whole number from `MIN` to `MAX`, e.g. a ring's capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Count<const MIN: usize, const MAX: usize>(pub usize);

impl<const MIN: usize, const MAX: usize> FromStr for Count<MIN, MAX> {
    type Err = UnitError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        text.trim()
            .parse::<usize>()
            .ok()
            .filter(|n| (MIN..=MAX).contains(n))
            .map(Count)
            .ok_or_else(|| UnitError::Count {
                text: text.to_string(),
                min: MIN,
                max: MAX,
            })
    }
}

impl<const MIN: usize, const MAX: usize> fmt::Display for Count<MIN, MAX> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// KVM dirty-page tracking as `--dirty-log` names it: `bitmap`, `ring`
/// (65,536 entries per vCPU) or `ring:ENTRIES`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirtyLog {
    /// One dirty bitmap per memory slot (KVM_GET_DIRTY_LOG).
    Bitmap,
    /// A dirty ring of this many entries per vCPU.
    Ring(u32),
}

/// Smallest dirty ring KVM takes: one page of entries.
pub(crate) const MIN_RING_ENTRIES: u32 = 256;
/// Largest dirty ring kvmscope asks for (KVM caps the ring at 1 MiB here).
pub(crate) const MAX_RING_ENTRIES: u32 = 65536;

/// Whether KVM takes a dirty ring of `entries` per vCPU: a power of two
/// from [`MIN_RING_ENTRIES`] to [`MAX_RING_ENTRIES`].
pub(crate) fn ring_entries_valid(entries: u32) -> bool {
    entries.is_power_of_two() && (MIN_RING_ENTRIES..=MAX_RING_ENTRIES).contains(&entries)
}

impl DirtyLog {
    /// Entries per vCPU ring when `ring` names none: the most KVM takes
    /// (1 MiB of ring per vCPU). A ring that fills is harvested and reset,
    /// which protects its pages again: with 4,096 entries a guest writing
    /// 64 MiB as fast as it can lost 0.97 s of a 1 s readiness window to
    /// it, with 65,536 entries 0.04 s (one fault per page, as the bitmap;
    /// docs/BENCHMARKS.md).
    pub(crate) const DEFAULT_RING: u32 = MAX_RING_ENTRIES;
}

impl FromStr for DirtyLog {
    type Err = UnitError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim().split_once(':') {
            None if text.trim() == "bitmap" => Ok(DirtyLog::Bitmap),
            None if text.trim() == "ring" => Ok(DirtyLog::Ring(Self::DEFAULT_RING)),
            Some(("ring", n)) => match n.parse::<u32>() {
                Ok(entries) if ring_entries_valid(entries) => Ok(DirtyLog::Ring(entries)),
                Ok(entries) => Err(UnitError::RingEntries(entries)),
                Err(_) => Err(UnitError::DirtyLog(text.to_string())),
            },
            _ => Err(UnitError::DirtyLog(text.to_string())),
        }
    }
}

/// Which vCPUs a client asks about: one index, or `all`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VcpuChoice {
    /// The vCPU with this index.
    One(usize),
    /// Every vCPU.
    All,
}

impl FromStr for VcpuChoice {
    type Err = UnitError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim() {
            "all" => Ok(VcpuChoice::All),
            n => n
                .parse()
                .map(VcpuChoice::One)
                .map_err(|_| UnitError::Vcpu(text.to_string())),
        }
    }
}

/// `v` rounded toward zero into a `u64`, saturating: NaN and negative values
/// give 0, values past `u64::MAX` give `u64::MAX`. This is what `as` does;
/// the one place that says so, for figures computed in floating point.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
pub fn saturating_u64(v: f64) -> u64 {
    v as u64
}

/// Nanoseconds of `d`, saturating at `u64::MAX` (584 years).
pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Whole milliseconds of `d`, saturating at `u64::MAX` (585 million years).
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// As [`saturating_u64`], into a `usize` (chart geometry).
#[cfg(feature = "plot")]
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
pub(crate) fn saturating_usize(v: f64) -> usize {
    v as usize
}

/// Text a peer sent (a destination's refusal, a VMM's garbled greeting),
/// fit for one log line: invalid UTF-8 replaced, control characters
/// (newlines, escapes, carriage returns; line separators and bidirectional
/// overrides too) written as escapes, and at most
/// `max` characters kept, the cut said. A peer cannot add lines to the log
/// or move a terminal's cursor.
pub(crate) fn peer_text(bytes: &[u8], max: usize) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut out = String::new();
    for (n, c) in text.chars().enumerate() {
        if n == max {
            out.push_str(&format!("... ({} characters in all)", text.chars().count()));
            break;
        }
        // Line and paragraph separators and bidirectional overrides move
        // or reorder what a terminal shows, as control characters do.
        let unsafe_to_show = c.is_control()
            || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
        if unsafe_to_show {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// A report of many lines a peer wrote (a VMM's readiness report), fit for
/// a terminal: each line as [`peer_text`] makes it (at most `width`
/// characters), its newlines kept, at most `lines` of them (the cut said).
pub(crate) fn peer_lines(text: &str, width: usize, lines: usize) -> String {
    let mut out = String::new();
    for line in text.lines().take(lines) {
        out.push_str(&peer_text(line.as_bytes(), width));
        out.push('\n');
    }
    let all = text.lines().count();
    if all > lines {
        out.push_str(&format!("... ({all} lines in all)\n"));
    } else if !text.ends_with('\n') {
        out.pop();
    }
    out
}

/// Formats a duration exactly, in the largest unit that divides it: `5s`, `250ms`, `1500us`.
pub(crate) fn format_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    match ns {
        0 => "0s".to_string(),
        n if n % 1_000_000_000 == 0 => format!("{}s", n / 1_000_000_000),
        n if n % 1_000_000 == 0 => format!("{}ms", n / 1_000_000),
        n if n % 1_000 == 0 => format!("{}us", n / 1_000),
        n => format!("{n}ns"),
    }
}

/// Formats bytes with a binary unit, e.g. `64 MiB`, `1.50 GiB`.
pub(crate) fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    // Printed to two decimals, so f64's 53 bits of precision are plenty.
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

// Tests longer than the module's own code live beside it (see the README's
// "Tests" section for the layout).
#[cfg(test)]
#[path = "units_tests.rs"]
mod tests;
