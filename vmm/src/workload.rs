//! Workload specs: the text users give to `--workload` and `guest-command`, parsed
//! into commands, and their encoding into the guest's mailbox.
//!
//! Grammar: `[TARGET:] COMMAND (; COMMAND)*`, where `TARGET` is `all`, a vCPU
//! index, a range `1-3` or a list `0,2`, and `COMMAND` is a name followed by
//! `key=value` parameters, e.g. `touch size=64M; dirty rate=2000/s for=5s`.

use std::fmt;
use std::time::Duration;

use crate::abi;
use crate::units::{format_bytes, format_duration, parse_duration, parse_size};

/// What is wrong with a workload spec; each names the part at fault.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpecError {
    /// The spec has no command.
    #[error("empty workload: expected a command such as 'touch size=4M'")]
    Empty,
    /// More commands for one vCPU than may wait on it (count, limit).
    #[error("{0} commands for one vCPU: at most {1} may be queued")]
    TooMany(usize, usize),
    /// A command name that is not one of the known commands (given).
    #[error("unknown workload command '{0}' (known: {known})", known = COMMANDS.join(", "))]
    UnknownCommand(String),
    /// A parameter the command does not take.
    #[error("unknown parameter '{param}' for {command} (known: {known})")]
    UnknownParam {
        /// The command's name.
        command: &'static str,
        /// The parameter as written.
        param: String,
        /// The command's parameters, comma-separated.
        known: String,
    },
    /// A parameter written without `=VALUE`.
    #[error("parameter '{param}' of {command} needs a value: write {param}=VALUE")]
    MissingValue {
        /// The command's name.
        command: &'static str,
        /// The parameter as written.
        param: String,
    },
    /// The same parameter twice in one command.
    #[error("parameter '{param}' of {command} is given twice")]
    DuplicateParam {
        /// The command's name.
        command: &'static str,
        /// The parameter as written.
        param: String,
    },
    /// A value that does not parse as the parameter's type.
    #[error("bad value '{value}' for '{param}' of {command}: expected {expected}")]
    BadValue {
        /// The command's name.
        command: &'static str,
        /// The parameter's name.
        param: &'static str,
        /// The value as written.
        value: String,
        /// What the parameter takes, in words.
        expected: &'static str,
    },
    /// A `TARGET:` prefix that is not `all`, an index, a range or a list (given).
    #[error("bad vCPU target '{0}': expected all, an index (2), a range (1-3) or a list (0,2)")]
    BadTarget(String),
    /// A target names a vCPU the VM does not have.
    #[error("vCPU {index} in target '{target}' does not exist (the VM has {vcpus})")]
    NoSuchVcpu {
        /// The target as written.
        target: String,
        /// The first index out of range.
        index: usize,
        /// The VM's vCPU count.
        vcpus: usize,
    },
    /// A command's byte range does not fit the guest's arena.
    #[error("{command} range {start:#x}..{end:#x} does not fit the {arena} arena")]
    OutsideArena {
        /// The command's name.
        command: &'static str,
        /// Start of the range, bytes from the arena's start.
        start: u64,
        /// End of the range (exclusive), bytes from the arena's start.
        end: u64,
        /// The arena's size, printed.
        arena: String,
    },
}

const COMMANDS: [&str; 10] = [
    "touch",
    "touch-zero",
    "verify",
    "verify-zero",
    "read",
    "dirty",
    "exits",
    "wait",
    "panic",
    "fault",
];

/// The pattern `touch` and `verify` use when none is given.
pub(crate) const DEFAULT_PATTERN: u64 = 0x6b76_6d73_636f_7065;

/// A page range of the arena, as written in a spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// Bytes from the start of the arena (page-aligned).
    pub(crate) offset: u64,
    /// Bytes to cover; `None` means to the end of the arena.
    pub(crate) size: Option<u64>,
    /// Touch every `stride`th page.
    pub(crate) stride: u64,
}

/// One workload command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Write a non-zero pattern into pages.
    Touch {
        /// The pages.
        span: Span,
        /// Each word becomes `(pattern | 1) ^ page address` (never zero).
        pattern: u64,
    },
    /// Write zeros into pages.
    TouchZero {
        /// The pages.
        span: Span,
    },
    /// Check pages hold what `touch` with `pattern` wrote, or zeros (`None`,
    /// `verify-zero`, what `touch-zero` wrote).
    Verify {
        /// The pages.
        span: Span,
        /// The `touch` pattern to expect; `None`: zeros.
        pattern: Option<u64>,
    },
    /// Read one word of each page.
    Read {
        /// The pages.
        span: Span,
    },
    /// Rewrite random pages of a working set at a paced rate.
    Dirty {
        /// Start of the working set, bytes from the arena's start (page-aligned).
        offset: u64,
        /// Working-set bytes; `None`: to the end of the arena.
        ws: Option<u64>,
        /// Page writes per second; 0 writes as fast as the vCPU can.
        rate: u64,
        /// How long to write (the guest gets it in microseconds).
        duration: Duration,
        /// Seed of the guest's xorshift64* page picker.
        seed: u64,
    },
    /// Port-I/O and MMIO exits.
    Exits {
        /// Port-I/O exits to make.
        ports: u64,
        /// MMIO exits to make.
        mmio: u64,
    },
    /// Park the vCPU in the VMM until the next command (or for a while).
    Wait {
        /// How long; `None`: until the next command is queued (at once if one is).
        duration: Option<Duration>,
    },
    /// Test aid: the guest panics.
    Panic,
    /// Test aid: the guest triple-faults.
    Fault,
}

/// A command as the guest's mailbox takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GuestCommand {
    /// The command code the guest dispatches on (docs/GUEST_ABI.md, "Commands").
    pub(crate) code: u64,
    /// The command's arguments in mailbox order; unused ones are 0.
    pub(crate) args: [u64; 6],
}

/// Which vCPUs a workload is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    /// Every vCPU (`all:`).
    All,
    /// These vCPU indexes, as an index, range or list gave them; a spec
    /// without a prefix is for vCPU 0.
    Some(Vec<usize>),
}

/// A parsed `--workload` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    /// The vCPUs that run the commands.
    pub(crate) target: Target,
    /// The commands, run in order on each target vCPU.
    pub(crate) commands: Vec<Command>,
}

impl Command {
    /// The length of its spec (`to_string().len()`), without making it.
    pub(crate) fn spec_len(&self) -> usize {
        struct Count(usize);
        impl fmt::Write for Count {
            fn write_str(&mut self, s: &str) -> fmt::Result {
                self.0 += s.len();
                Ok(())
            }
        }
        let mut n = Count(0);
        // Counting cannot fail, and neither does our Display.
        let _ = fmt::write(&mut n, format_args!("{self}"));
        n.0
    }

    /// The command's name in specs.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Command::Touch { .. } => "touch",
            Command::TouchZero { .. } => "touch-zero",
            Command::Verify {
                pattern: Some(_), ..
            } => "verify",
            Command::Verify { pattern: None, .. } => "verify-zero",
            Command::Read { .. } => "read",
            Command::Dirty { .. } => "dirty",
            Command::Exits { .. } => "exits",
            Command::Wait { .. } => "wait",
            Command::Panic => "panic",
            Command::Fault => "fault",
        }
    }

    /// The names of the guest's three result words for this command
    /// (docs/GUEST_ABI.md, "Commands"; "" for a word it leaves 0); `None`
    /// for one whose words mean nothing (`wait`, the test aids).
    pub(crate) fn result_names(&self) -> Option<[&'static str; 3]> {
        match self {
            Command::Touch { .. } | Command::TouchZero { .. } => Some(["pages", "ticks", ""]),
            Command::Read { .. } => Some(["pages", "ticks", "xor"]),
            Command::Dirty { .. } => Some(["writes", "ticks", "distinct"]),
            Command::Exits { .. } => Some(["port-exits", "ticks", "mmio-exits"]),
            Command::Verify { .. } => Some(["pages", "ticks", "differ"]),
            Command::Wait { .. } | Command::Panic | Command::Fault => None,
        }
    }

    /// Encodes the command for the guest, checking it against an arena of
    /// `arena_size` bytes. `None` for `wait`, which the VMM carries out itself.
    ///
    /// # Errors
    /// `OutsideArena` when a range does not fit the arena.
    pub(crate) fn to_guest(&self, arena_size: u64) -> Result<Option<GuestCommand>, SpecError> {
        let a = |code, args: [u64; 6]| Ok(Some(GuestCommand { code, args }));
        match *self {
            Command::Touch { span, pattern } => {
                let (off, len) = span_bounds(self.name(), span.offset, span.size, arena_size)?;
                a(abi::CMD_TOUCH, [off, len, span.stride, pattern, 0, 0])
            }
            Command::Verify { span, pattern } => {
                let (off, len) = span_bounds(self.name(), span.offset, span.size, arena_size)?;
                a(
                    abi::CMD_VERIFY,
                    [off, len, span.stride, pattern.unwrap_or(0), 0, 0],
                )
            }
            Command::TouchZero { span } | Command::Read { span } => {
                let (off, len) = span_bounds(self.name(), span.offset, span.size, arena_size)?;
                let code = if matches!(self, Command::Read { .. }) {
                    abi::CMD_READ
                } else {
                    abi::CMD_TOUCH_ZERO
                };
                a(code, [off, len, span.stride, 0, 0, 0])
            }
            Command::Dirty {
                offset,
                ws,
                rate,
                duration,
                seed,
            } => {
                let (off, len) = span_bounds(self.name(), offset, ws, arena_size)?;
                // Microseconds on the wire; a shorter, non-zero duration still runs 1 µs.
                let us = u64::try_from(duration.as_micros())
                    .unwrap_or(u64::MAX)
                    .max(u64::from(!duration.is_zero()));
                a(abi::CMD_DIRTY, [off, len, rate, us, seed, 0])
            }
            Command::Exits { ports, mmio } => a(abi::CMD_EXITS, [ports, mmio, 0, 0, 0, 0]),
            Command::Wait { .. } => Ok(None),
            Command::Panic => a(abi::CMD_PANIC, [0; 6]),
            Command::Fault => a(abi::CMD_FAULT, [0; 6]),
        }
    }
}

fn span_bounds(
    command: &'static str,
    offset: u64,
    size: Option<u64>,
    arena: u64,
) -> Result<(u64, u64), SpecError> {
    let len = size.unwrap_or_else(|| arena.saturating_sub(offset));
    let end = offset.saturating_add(len);
    if end > arena || (size.is_none() && offset >= arena) {
        return Err(SpecError::OutsideArena {
            command,
            start: offset,
            end,
            arena: format_bytes(arena),
        });
    }
    Ok((offset, len))
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())?;
        let span = |f: &mut fmt::Formatter<'_>, s: &Span| {
            write!(f, " offset={}", s.offset)?;
            if let Some(size) = s.size {
                write!(f, " size={size}")?;
            }
            if s.stride != 1 {
                write!(f, " stride={}", s.stride)?;
            }
            Ok(())
        };
        match self {
            Command::Touch { span: s, pattern }
            | Command::Verify {
                span: s,
                pattern: Some(pattern),
            } => {
                span(f, s)?;
                write!(f, " pattern={pattern:#x}")
            }
            Command::Verify {
                span: s,
                pattern: None,
            } => span(f, s),
            Command::TouchZero { span: s } | Command::Read { span: s } => span(f, s),
            Command::Dirty {
                offset,
                ws,
                rate,
                duration,
                seed,
            } => {
                write!(f, " offset={offset}")?;
                if let Some(ws) = ws {
                    write!(f, " ws={ws}")?;
                }
                match rate {
                    0 => write!(f, " rate=max")?,
                    r => write!(f, " rate={r}/s")?,
                }
                write!(f, " for={} seed={seed}", format_duration(*duration))
            }
            Command::Exits { ports, mmio } => write!(f, " ports={ports} mmio={mmio}"),
            Command::Wait { duration: Some(d) } => write!(f, " for={}", format_duration(*d)),
            Command::Wait { duration: None } | Command::Panic | Command::Fault => Ok(()),
        }
    }
}

/// Parses `[TARGET:] COMMAND (; COMMAND)*`.
///
/// # Errors
/// A `SpecError` naming the bad part.
pub fn parse_workload(text: &str) -> Result<Workload, SpecError> {
    let (target, rest) = match text.split_once(':') {
        Some((t, rest)) if looks_like_target(t) => (parse_target(t.trim())?, rest),
        _ => (Target::Some(vec![0]), text),
    };
    Ok(Workload {
        target,
        commands: parse_sequence(rest)?,
    })
}

fn looks_like_target(t: &str) -> bool {
    let t = t.trim();
    t == "all"
        || (!t.is_empty()
            && t.chars()
                .all(|c| c.is_ascii_digit() || c == ',' || c == '-' || c == ' '))
}

fn parse_target(t: &str) -> Result<Target, SpecError> {
    if t == "all" {
        return Ok(Target::All);
    }
    let bad = || SpecError::BadTarget(t.to_string());
    let mut out = Vec::new();
    for part in t.split(',').map(str::trim) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (
                    a.trim().parse().map_err(|_| bad())?,
                    b.trim().parse().map_err(|_| bad())?,
                );
                if a > b || b - a > usize::try_from(abi::MAX_VCPUS).unwrap_or(usize::MAX) {
                    return Err(bad());
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().map_err(|_| bad())?),
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(Target::Some(out))
}

impl Target {
    /// The vCPU indexes this target names in a VM of `vcpus` vCPUs.
    ///
    /// # Errors
    /// `NoSuchVcpu` when an index is out of range.
    pub(crate) fn resolve(&self, vcpus: usize) -> Result<Vec<usize>, SpecError> {
        match self {
            Target::All => Ok((0..vcpus).collect()),
            Target::Some(list) => match list.iter().find(|&&i| i >= vcpus) {
                Some(&index) => Err(SpecError::NoSuchVcpu {
                    // As a list is written (a range comes back as its indexes).
                    target: list
                        .iter()
                        .map(usize::to_string)
                        .collect::<Vec<_>>()
                        .join(","),
                    index,
                    vcpus,
                }),
                None => Ok(list.clone()),
            },
        }
    }
}

/// Parses `COMMAND (; COMMAND)*` (newlines also separate commands).
///
/// # Errors
/// A `SpecError` naming the bad part.
pub fn parse_sequence(text: &str) -> Result<Vec<Command>, SpecError> {
    let cmds = text
        .split([';', '\n'])
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(parse_command)
        .collect::<Result<Vec<_>, _>>()?;
    if cmds.is_empty() {
        return Err(SpecError::Empty);
    }
    Ok(cmds)
}

/// Parses one command, e.g. `touch size=64M stride=2`.
///
/// # Errors
/// A `SpecError` naming the bad part.
pub(crate) fn parse_command(text: &str) -> Result<Command, SpecError> {
    let mut words = text.split_whitespace();
    let name = words.next().ok_or(SpecError::Empty)?;
    let (command, known): (&'static str, &[&'static str]) = match name {
        "touch" => ("touch", &["offset", "size", "stride", "pattern"]),
        "touch-zero" => ("touch-zero", &["offset", "size", "stride"]),
        "verify" => ("verify", &["offset", "size", "stride", "pattern"]),
        "verify-zero" => ("verify-zero", &["offset", "size", "stride"]),
        "read" => ("read", &["offset", "size", "stride"]),
        "dirty" => ("dirty", &["offset", "ws", "rate", "for", "seed"]),
        "exits" => ("exits", &["count", "ports", "mmio"]),
        "wait" => ("wait", &["for"]),
        "panic" => ("panic", &[]),
        "fault" => ("fault", &[]),
        other => return Err(SpecError::UnknownCommand(other.to_string())),
    };
    let p = Params::parse(command, known, words)?;
    Ok(match command {
        "touch" => Command::Touch {
            span: p.span()?,
            pattern: p.hex("pattern")?.unwrap_or(DEFAULT_PATTERN),
        },
        "touch-zero" => Command::TouchZero { span: p.span()? },
        "verify" => Command::Verify {
            span: p.span()?,
            pattern: Some(p.hex("pattern")?.unwrap_or(DEFAULT_PATTERN)),
        },
        "verify-zero" => Command::Verify {
            span: p.span()?,
            pattern: None,
        },
        "read" => Command::Read { span: p.span()? },
        "dirty" => Command::Dirty {
            offset: p.offset()?,
            ws: p.size("ws")?,
            rate: p.rate()?.unwrap_or(1000),
            duration: p.duration("for")?.unwrap_or(Duration::from_secs(1)),
            seed: p.count("seed")?.unwrap_or(1),
        },
        "exits" => {
            let count = p.count("count")?;
            Command::Exits {
                ports: p.count("ports")?.or(count).unwrap_or(1000),
                mmio: p.count("mmio")?.or(count).unwrap_or(1000),
            }
        }
        "wait" => Command::Wait {
            duration: p.duration("for")?,
        },
        "panic" => Command::Panic,
        _ => Command::Fault,
    })
}

/// The `key=value` parameters of one command.
struct Params<'a> {
    command: &'static str,
    pairs: Vec<(&'static str, &'a str)>,
}

impl<'a> Params<'a> {
    fn parse(
        command: &'static str,
        known: &[&'static str],
        words: impl Iterator<Item = &'a str>,
    ) -> Result<Self, SpecError> {
        let mut pairs: Vec<(&'static str, &'a str)> = Vec::new();
        for word in words {
            let (key, value) = match word.split_once('=') {
                Some((k, v)) if !v.is_empty() => (k, v),
                _ => {
                    return Err(SpecError::MissingValue {
                        command,
                        param: word.trim_end_matches('=').to_string(),
                    })
                }
            };
            let key = known.iter().copied().find(|k| *k == key).ok_or_else(|| {
                SpecError::UnknownParam {
                    command,
                    param: key.to_string(),
                    known: if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    },
                }
            })?;
            if pairs.iter().any(|(k, _)| *k == key) {
                return Err(SpecError::DuplicateParam {
                    command,
                    param: key.to_string(),
                });
            }
            pairs.push((key, value));
        }
        Ok(Params { command, pairs })
    }

    fn get(&self, key: &str) -> Option<&'a str> {
        self.pairs.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
    }

    fn bad(&self, param: &'static str, value: &str, expected: &'static str) -> SpecError {
        SpecError::BadValue {
            command: self.command,
            param,
            value: value.to_string(),
            expected,
        }
    }

    fn size(&self, key: &'static str) -> Result<Option<u64>, SpecError> {
        self.get(key)
            .map(|v| {
                parse_size(v)
                    .filter(|&s| s > 0)
                    .ok_or_else(|| self.bad(key, v, "a non-zero size like 4096, 64K or 16M"))
            })
            .transpose()
    }

    fn offset(&self) -> Result<u64, SpecError> {
        match self.get("offset") {
            None => Ok(0),
            Some(v) => parse_size(v)
                .filter(|o| o % abi::PAGE_SIZE == 0)
                .ok_or_else(|| self.bad("offset", v, "a page-aligned size like 0, 4K or 8M")),
        }
    }

    fn span(&self) -> Result<Span, SpecError> {
        let stride = self.count("stride")?.unwrap_or(1);
        if stride == 0 {
            return Err(self.bad("stride", "0", "a page stride of at least 1"));
        }
        Ok(Span {
            offset: self.offset()?,
            size: self.size("size")?,
            stride,
        })
    }

    fn count(&self, key: &'static str) -> Result<Option<u64>, SpecError> {
        self.get(key)
            .map(|v| v.parse().map_err(|_| self.bad(key, v, "a whole number")))
            .transpose()
    }

    fn hex(&self, key: &'static str) -> Result<Option<u64>, SpecError> {
        self.get(key)
            .map(|v| {
                let digits = v.strip_prefix("0x").unwrap_or(v);
                u64::from_str_radix(digits, 16)
                    .ok()
                    .filter(|&p| p != 0)
                    .ok_or_else(|| self.bad(key, v, "a non-zero hex number like 0xabcd"))
            })
            .transpose()
    }

    fn rate(&self) -> Result<Option<u64>, SpecError> {
        self.get("rate")
            .map(|v| {
                let n = v.strip_suffix("/s").unwrap_or(v);
                match n {
                    "max" => Ok(0),
                    _ => {
                        n.parse().ok().filter(|&r| r > 0).ok_or_else(|| {
                            self.bad("rate", v, "pages per second like 2000/s, or max")
                        })
                    }
                }
            })
            .transpose()
    }

    fn duration(&self, key: &'static str) -> Result<Option<Duration>, SpecError> {
        self.get(key)
            .map(|v| {
                parse_duration(v).ok_or_else(|| self.bad(key, v, "a duration like 500ms or 5s"))
            })
            .transpose()
    }
}

#[cfg(test)]
#[path = "workload_tests.rs"]
mod tests;
