//! `--metrics-addr`: the sampler's latest readings as a Prometheus text page at
//! `/metrics`, served by a small `metrics` thread (`http`: one poll loop, bounded
//! connections and deadlines, so no client holds up a scrape).
//!
//! Names follow Prometheus conventions: a `kvmscope_` prefix, base units in the
//! name (`_seconds`, `_bytes`) with values scaled to them, `_total` on counters,
//! `vcpu` labels, and KVM histograms as Prometheus histograms (cumulative
//! `_bucket{le=…}` and `_count`; KVM keeps no sum, so there is no `_sum`).

pub mod http;

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use kvm_stats::{Descriptor, Sample, Schema, StatType, Unit};

use crate::exits::Reason;
use crate::sampler::Shared;

/// Why the metrics server could not start.
pub(crate) use http::Error;

/// The `Content-Type` of the Prometheus text format.
pub(crate) const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The running metrics server; dropping it stops the thread.
pub struct MetricsServer {
    /// The address bound (with the real port when 0 was asked for).
    pub addr: SocketAddr,
    server: http::Server,
}

impl MetricsServer {
    /// Listens on `addr` and serves `/metrics` from `samples`.
    ///
    /// # Errors
    /// The address cannot be bound, or the thread not started.
    pub fn start(addr: SocketAddr, samples: Arc<Shared>) -> Result<MetricsServer, Error> {
        // One page per sampler tick, shared by every scrape of that tick: a
        // crowd of scrapers costs one render, and replies in flight share it.
        let mut cached: Option<(u64, Arc<String>)> = None;
        let render = move || {
            let seq = samples.last_seq();
            match &cached {
                Some((s, page)) if *s == seq && seq != 0 => page.clone(),
                _ => {
                    let page = Arc::new(render(&samples));
                    cached = Some((seq, page.clone()));
                    page
                }
            }
        };
        let page = http::Page {
            path: "/metrics",
            content_type: CONTENT_TYPE,
            render: Box::new(render),
        };
        let server = http::Server::start(addr, "metrics", page)?;
        Ok(MetricsServer {
            addr: server.addr,
            server,
        })
    }

    /// Stops the server and says whether it had served to the end (dropping
    /// it stops it too, logging a failure instead).
    ///
    /// # Errors
    /// The server's loop failed or its thread panicked.
    pub fn shutdown(self) -> Result<(), Error> {
        self.server.shutdown()
    }
}

/// A raw value in base units. Negative exponents divide by an exact power, so
/// 3 ns prints as 0.000000003, not 0.0000000030000000000000004.
pub(crate) fn in_base_units(raw: u64, d: &Descriptor) -> f64 {
    let radix = f64::from(d.base.radix().unwrap_or(10));
    let exp = i32::from(d.exponent);
    if exp < 0 {
        raw as f64 / radix.powi(-exp)
    } else {
        raw as f64 * radix.powi(exp)
    }
}

/// A raw value in base units as the page writes it: exact decimal digits
/// where the unit is a negative power of ten (nanoseconds as seconds: 3 ns
/// is `0.000000003`, 1,250,000,000 ns `1.25`), written straight into `out`
/// (a host's page has thousands of them); through `f64` otherwise.
fn write_in_base_units(out: &mut String, raw: u64, d: &Descriptor) {
    let digits = usize::from(d.exponent.unsigned_abs());
    let scale = u32::try_from(digits)
        .ok()
        .and_then(|e| 10u64.checked_pow(e));
    match scale {
        Some(scale) if d.exponent < 0 && d.base.radix() == Some(10) => {
            let mut num = itoa::Buffer::new();
            out.push_str(num.format(raw / scale));
            let frac = raw % scale;
            if frac != 0 {
                let frac = num.format(frac);
                out.push('.');
                out.extend(std::iter::repeat_n('0', digits.saturating_sub(frac.len())));
                out.push_str(frac.trim_end_matches('0'));
            }
        }
        _ => {
            let _ = write!(out, "{}", in_base_units(raw, d));
        }
    }
}

/// A KVM stat's Prometheus name (with its base unit).
pub(crate) fn metric_name(prefix: &str, d: &Descriptor) -> String {
    let name = match d.unit {
        Unit::Seconds => {
            let stem = ["_ns", "_us", "_ms", "_seconds", "_s"]
                .iter()
                .find_map(|s| d.name.strip_suffix(s))
                .unwrap_or(&d.name);
            format!("{stem}_seconds")
        }
        Unit::Bytes if !d.name.ends_with("_bytes") => format!("{}_bytes", d.name),
        Unit::Cycles if !d.name.ends_with("_cycles") => format!("{}_cycles", d.name),
        _ => d.name.clone(),
    };
    let name: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{prefix}{name}")
}

/// One KVM stat as a metric family: its name, type, and (for histograms)
/// the `le` of each bucket, worked out once per page, not per source.
struct Family {
    full: String,
    kind: &'static str,
    /// The raw value is the base-unit value (exponent 0): printed as an integer.
    integral: bool,
    les: Vec<String>,
}

impl Family {
    fn of(prefix: &str, d: &Descriptor) -> Option<Family> {
        let name = metric_name(prefix, d);
        let (kind, full) = match d.kind {
            StatType::Cumulative => ("counter", format!("{name}_total")),
            StatType::Instant | StatType::Peak => ("gauge", name),
            StatType::LinearHistogram | StatType::Log2Histogram => ("histogram", name),
            StatType::Unknown(_) => return None,
        };
        let les = if kind == "histogram" {
            (0..usize::from(d.size))
                .map(|i| match d.bucket_bounds(i).and_then(|(_, upper)| upper) {
                    Some(upper) => {
                        let mut le = String::new();
                        write_in_base_units(&mut le, upper.saturating_sub(1), d);
                        le
                    }
                    None => "+Inf".to_string(),
                })
                .collect()
        } else {
            Vec::new()
        };
        Some(Family {
            full,
            kind,
            integral: d.exponent == 0,
            les,
        })
    }

    /// `# HELP` and `# TYPE`, once per family on the page.
    fn write_header(
        &self,
        out: &mut String,
        d: &Descriptor,
        whose: Whose,
        seen: &mut HashSet<String>,
    ) {
        if seen.insert(self.full.clone()) {
            // The value is in base units whatever the stat's own scale
            // (`_ns` reads as seconds); the VMM's own stats say what they
            // mean (its special values among it).
            let unit = match d.unit {
                Unit::Bytes => ", in bytes",
                Unit::Seconds => ", in seconds",
                Unit::Cycles => ", in cycles",
                Unit::Boolean => ", 0 or 1",
                Unit::None | Unit::Unknown(_) => "",
            };
            let meaning = whose
                .meaning(&d.name)
                .map(|m| format!(": {}", help_text(m)))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "# HELP {} {} stat {} ({:?}{unit}){meaning}\n# TYPE {} {}",
                self.full,
                whose.text(),
                help_text(&d.name),
                d.kind,
                self.full,
                self.kind
            );
        }
    }

    /// One source's samples of the family. Pages run to tens of thousands of
    /// lines (a host's exporter), so lines are pushed piecewise, integers
    /// through `itoa`, not through the formatting machinery.
    fn write_values(&self, out: &mut String, d: &Descriptor, values: &[u64], labels: &str) {
        let mut num = itoa::Buffer::new();
        let start = |out: &mut String, suffix: &str, le: Option<&str>| {
            out.push_str(&self.full);
            out.push_str(suffix);
            out.push('{');
            out.push_str(labels);
            if let Some(le) = le {
                out.push_str(",le=\"");
                out.push_str(le);
                out.push('"');
            }
            out.push_str("} ");
        };
        let line = |out: &mut String, suffix: &str, le: Option<&str>, value: &str| {
            start(out, suffix, le);
            out.push_str(value);
            out.push('\n');
        };
        if self.kind != "histogram" {
            let raw = values.first().copied().unwrap_or(0);
            if self.integral {
                line(out, "", None, num.format(raw));
            } else {
                start(out, "", None);
                write_in_base_units(out, raw, d);
                out.push('\n');
            }
            return;
        }
        let mut cumulative = 0u64;
        for (count, le) in values.iter().zip(&self.les) {
            cumulative = cumulative.saturating_add(*count);
            line(out, "_bucket", Some(le), num.format(cumulative));
        }
        if self.les.last().is_some_and(|le| le != "+Inf") {
            line(out, "_bucket", Some("+Inf"), num.format(cumulative));
        }
        line(out, "_count", None, num.format(cumulative));
    }
}

/// Where one source's stats come from: a stats file's schema and a sample
/// of it (KVM's own, read with one `pread`; or one made in its layout, as the
/// exporter's exit sums are), or descriptors listed with their values (as a
/// QMP `query-stats` reply gives them).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Values<'a> {
    /// A schema and a sample of it.
    Sampled(&'a Schema, &'a Sample),
    /// Each stat's descriptor with its values.
    Listed(&'a Listed),
}

/// Stats listed with their values, as a QMP `query-stats` reply gives them.
pub(crate) type Listed = [(Descriptor, Vec<u64>)];

/// Where a stat is in the first source that has it: its id there and that
/// source's schema, or its place in that source's list.
#[derive(Debug, Clone, Copy)]
enum Hint<'a> {
    Sampled(kvm_stats::StatId, &'a Schema),
    Listed(usize),
}

impl<'a> Values<'a> {
    /// Every stat of the source, with its id and schema where it has them.
    fn stats(self) -> Box<dyn Iterator<Item = (Hint<'a>, &'a Descriptor)> + 'a> {
        match self {
            Values::Sampled(schema, _) => Box::new(
                schema
                    .iter()
                    .map(move |(id, d)| (Hint::Sampled(id, schema), d)),
            ),
            Values::Listed(list) => Box::new(
                list.iter()
                    .enumerate()
                    .map(|(i, (d, _))| (Hint::Listed(i), d)),
            ),
        }
    }

    /// The stat called `name`: its descriptor in this source and its values.
    /// `hint` is where another source has it: taken as it is where the two
    /// share their descriptors (one pointer compared: a page of hundreds of
    /// fds would otherwise touch every fd's descriptor of every stat), tried
    /// first where not (one name compared: the lists of one QEMU have their
    /// stats in one order).
    fn find(self, name: &str, hint: Hint<'_>) -> Option<(&'a Descriptor, &'a [u64])> {
        match self {
            Values::Sampled(schema, sample) => {
                let id = match hint {
                    Hint::Sampled(id, from) if schema.shares_descriptors(from) => Some(id),
                    Hint::Sampled(id, _)
                        if schema.get(id).is_some_and(|same| same.name == name) =>
                    {
                        Some(id)
                    }
                    _ => schema.find(name),
                }?;
                Some((schema.get(id)?, sample.values(id)))
            }
            Values::Listed(list) => {
                let at = match hint {
                    Hint::Listed(i) => list.get(i).filter(|(d, _)| d.name == name),
                    Hint::Sampled(..) => None,
                };
                at.or_else(|| list.iter().find(|(d, _)| d.name == name))
                    .map(|(d, v)| (d, v.as_slice()))
            }
        }
    }
}

/// One source of stats on a page (a VM or a vCPU) and the labels its lines carry.
#[derive(Debug, Clone)]
pub(crate) struct Source<'a> {
    /// Its labels, without braces (`vm="a",vcpu="0"`): borrowed where its
    /// provider keeps them between scrapes.
    pub(crate) labels: Cow<'a, str>,
    /// Its stats.
    pub(crate) values: Values<'a>,
    /// Stats of this source left off the page (by name).
    pub(crate) hide: Option<HideRule>,
}

/// Whether a stat (by name) is left off the page.
pub(crate) type HideRule = fn(&str) -> bool;

impl<'a> Source<'a> {
    /// A source whose every stat is shown.
    pub(crate) fn new(labels: impl Into<Cow<'a, str>>, values: Values<'a>) -> Source<'a> {
        Source {
            labels: labels.into(),
            values,
            hide: None,
        }
    }

    fn shows(&self, name: &str) -> bool {
        self.hide.is_none_or(|hide| !hide(name))
    }
}

/// Whose stats a family holds: its `# HELP` says so, and for the VMM's own
/// what each means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Whose {
    /// KVM's, of a VM or (`vcpu`) of a vCPU.
    Kvm { vcpu: bool },
    /// The kvmscope VMM's own, of a VM or (`vcpu`) of a vCPU.
    Own { vcpu: bool },
    /// The VMM's own vCPU stats summed over a VM's vCPUs.
    OwnVcpuSum,
}

impl Whose {
    /// Whose stats they are, as `# HELP` says it ("`text` stat `name`").
    fn text(self) -> &'static str {
        match self {
            Whose::Kvm { vcpu: false } => "KVM VM",
            Whose::Kvm { vcpu: true } => "KVM vCPU",
            Whose::Own { vcpu: false } => "kvmscope VMM's own VM",
            Whose::Own { vcpu: true } => "kvmscope VMM's own vCPU",
            Whose::OwnVcpuSum => "sum over the VM's vCPUs of the kvmscope VMM's own vCPU",
        }
    }

    /// What stat `name` means: the VMM's own say (KVM's are KVM's to
    /// document).
    fn meaning(self, name: &str) -> Option<&'static str> {
        match self {
            Whose::Kvm { .. } => None,
            Whose::Own { vcpu } => crate::vmmstats::meaning(name, vcpu),
            Whose::OwnVcpuSum => crate::vmmstats::meaning(name, true),
        }
    }
}

/// Writes every stat of `sources`, grouped by stat (all sources of one stat
/// together, as the text format requires), each source with its own labels
/// and its own descriptor's unit, under families named `prefix` and the
/// stat's name. Only stats whose name `keep` accepts are written; families
/// already in `seen` get no second `# HELP`/`# TYPE`.
pub(crate) fn write_sources(
    out: &mut String,
    sources: &[Source<'_>],
    prefix: &str,
    whose: Whose,
    seen: &mut HashSet<String>,
    keep: &dyn Fn(&str) -> bool,
) {
    // Each family's stat and kind, by its name on the page: another stat or
    // kind whose name on the page is the same (a gauge `x_total` beside a
    // counter `x`, `x` in bytes beside `x_bytes`) is left out (said once),
    // not written under the first's `# TYPE` or as a second run of lines.
    let mut written: HashMap<String, (&str, Kind)> = HashMap::new();
    for (hint, d) in every_stat(sources)
        .into_iter()
        .filter(|(_, d)| keep(&d.name))
    {
        let Some(family) = Family::of(prefix, d) else {
            continue;
        };
        let kind = Kind::of(d);
        match written.get(&family.full) {
            Some(&first) if first != (d.name.as_str(), kind) => {
                clashing_family(&family.full);
                continue;
            }
            Some(_) => {}
            None => {
                written.insert(family.full.clone(), (d.name.as_str(), kind));
            }
        }
        family.write_header(out, d, whose, seen);
        // Sources side by side mostly hide by one rule (each VMM's vCPUs):
        // the rule is asked once per run of sources that share it, not once
        // per source (hundreds per stat on a host's page).
        let mut last_rule: Option<(HideRule, bool)> = None;
        let mut shows = |source: &Source<'_>| {
            let Some(hide) = source.hide else {
                return true;
            };
            match last_rule {
                Some((rule, shown)) if std::ptr::fn_addr_eq(rule, hide) => shown,
                _ => {
                    let shown = !hide(&d.name);
                    last_rule = Some((hide, shown));
                    shown
                }
            }
        };
        for source in sources.iter().filter(|s| shows(s)) {
            match source.values.find(&d.name, hint) {
                // A source whose stat of this name is of another kind has
                // it written in that kind's family (its own entry here).
                // The first source's descriptor itself (every source of one layout).
                Some((own, values)) if std::ptr::eq(own, d) || same_scale(own, d) => {
                    family.write_values(out, own, values, &source.labels);
                }
                Some((own, values)) if Kind::of(own) == kind => {
                    // Its own exponent, base or buckets: its own scaling
                    // and `le` labels, in the same family.
                    if let Some(f) = Family::of(prefix, own) {
                        f.write_values(out, own, values, &source.labels);
                    }
                }
                _ => {}
            }
        }
    }
}

/// What decides the family a stat of one name is written in, its name on
/// the page and its `# TYPE`: counter, gauge or histogram, and the unit.
/// Sources that disagree (a QEMU monitor that says `pages_4k` is a counter)
/// each get their own family instead of the first one's deciding how the
/// others read; sources that agree on it but scale their values otherwise
/// (exponent, base, a histogram's buckets) share the family, each written
/// to its own scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Kind {
    page: u8,
    unit: u32,
}

impl Kind {
    fn of(d: &Descriptor) -> Kind {
        let page = match d.kind {
            StatType::Cumulative => 0,
            StatType::Instant | StatType::Peak => 1,
            StatType::LinearHistogram | StatType::Log2Histogram => 2,
            StatType::Unknown(_) => 3,
        };
        Kind {
            page,
            unit: d.unit.to_flags(),
        }
    }
}

/// Whether `a`'s values read on `b`'s scale, in its family: the same type,
/// unit, base, exponent and buckets (true for every source of one kernel).
fn same_scale(a: &Descriptor, b: &Descriptor) -> bool {
    a.kind == b.kind
        && a.unit == b.unit
        && a.base == b.base
        && a.exponent == b.exponent
        && a.bucket_size == b.bucket_size
        && a.size == b.size
}

/// Logs a family left out because its name on the page was another kind's,
/// once per name.
fn clashing_family(full: &str) {
    static SAID: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    if first_time(&SAID, full) {
        log::warn!(
            "metrics: leaving out {full} of a source that gives it another type or unit than the first source that has it"
        );
    }
}

/// Whether `name` is new to `said` (at most 256 remembered: past that,
/// nothing more is said), remembering it.
fn first_time(said: &std::sync::Mutex<Vec<String>>, name: &str) -> bool {
    let mut said = crate::lock(said);
    let new = said.len() < 256 && !said.iter().any(|n| n == name);
    if new {
        said.push(name.to_string());
    }
    new
}

/// Every stat of every source, each once, in the order they first appear
/// (each source's own schema: a VM whose kernel has other stats than the
/// first one's still shows them all), with the id it has in the first source
/// that has it. A name that is not metric-name material (`[A-Za-z0-9_]`,
/// not starting with a digit) is left out, and said once in the log.
fn every_stat<'a>(sources: &[Source<'a>]) -> Vec<(Hint<'a>, &'a Descriptor)> {
    let mut names = HashSet::new();
    let mut stats = Vec::new();
    // Sources of one layout (every vCPU of one kernel) have the same stats:
    // one of each is looked at, so that hundreds of fds cost one schema walk.
    // Listed sources have no layout; one whose names are the last one's
    // (each QEMU vCPU) adds nothing either.
    // A handful of layouts at most, met hundreds of times: a list, not a hash.
    let mut layouts = Vec::new();
    let mut new_layout = |layout: (u64, Option<usize>)| {
        let new = !layouts.contains(&layout);
        if new {
            layouts.push(layout);
        }
        new
    };
    let mut last_listed: Option<(&Listed, Option<usize>)> = None;
    let shown = sources
        .iter()
        .filter(|s| {
            let hide = s.hide.map(|f| f as usize);
            match s.values {
                Values::Sampled(schema, _) => new_layout((schema.layout(), hide)),
                Values::Listed(list) => {
                    let same = last_listed.is_some_and(|(last, last_hide)| {
                        last_hide == hide
                            && last.len() == list.len()
                            && last.iter().zip(list).all(|(a, b)| {
                                a.0.name == b.0.name && Kind::of(&a.0) == Kind::of(&b.0)
                            })
                    });
                    last_listed = Some((list, hide));
                    !same
                }
            }
        })
        .flat_map(|s| s.values.stats().filter(move |(_, d)| s.shows(&d.name)));
    for (id, d) in shown {
        if !names.insert((d.name.as_str(), Kind::of(d))) {
            continue;
        }
        if valid_name(&d.name) {
            stats.push((id, d));
        } else {
            refused_name(&d.name);
        }
    }
    stats
}

/// Whether a stat name can stand in a metric name as it is.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Logs a refused stat name, once per name.
fn refused_name(name: &str) {
    static SAID: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    if first_time(&SAID, name) {
        log::warn!("metrics: leaving out a stat whose name is not a metric name: {name:?}");
    }
}

/// A vCPU's labels: its VM's `labels` and its `vcpu` index.
pub(crate) fn vcpu_labels(labels: &str, index: usize) -> String {
    format!("{labels},vcpu=\"{index}\"")
}

/// `# HELP` text in the text format: backslash and line feed escaped.
pub(crate) fn help_text(text: &str) -> String {
    text.replace('\\', "\\\\").replace('\n', "\\n")
}

/// A label value in the text format: backslash, double quote and line feed escaped.
pub(crate) fn label_value(text: &str) -> String {
    text.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The page: our own gauges and counters, then every KVM stat of the VM and vCPUs.
pub(crate) fn render(samples: &Shared) -> String {
    let mut out = String::new();
    let vm = format!("vm=\"{}\"", label_value(&samples.header.name));
    let (points, _) = samples.since(samples.last_seq().saturating_sub(1));
    let _ = writeln!(
        out,
        "# HELP kvmscope_info The VM (name as the vm label, the VMM's pid) and the KVM backend running its guest.\n# TYPE kvmscope_info gauge"
    );
    let _ = writeln!(
        out,
        "kvmscope_info{{{vm},pid=\"{}\",backend=\"{}\",tdp=\"{}\"}} 1",
        std::process::id(),
        samples.backend.kind,
        samples.backend.tdp
    );
    if let Some(p) = points.last() {
        let _ = writeln!(out, "# HELP kvmscope_mapped_bytes Guest memory the KVM MMU maps (pages_4k/2m/1g in bytes).\n# TYPE kvmscope_mapped_bytes gauge");
        let _ = writeln!(out, "kvmscope_mapped_bytes{{{vm}}} {}", p.mapped_bytes());
        let _ = writeln!(out, "# HELP kvmscope_exits_total vCPU exits to the VMM, by our own count.\n# TYPE kvmscope_exits_total counter");
        for (i, v) in p.vcpus.iter().enumerate() {
            for (r, n) in Reason::ALL.iter().zip(&v.ours) {
                let _ = writeln!(
                    out,
                    "kvmscope_exits_total{{{vm},vcpu=\"{i}\",reason=\"{}\"}} {n}",
                    r.label()
                );
            }
        }
        let per_vcpu_ns = |out: &mut String,
                           name: &str,
                           help: &str,
                           ns: &dyn Fn(&crate::vcpu::VcpuShared) -> u64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (i, v) in samples.vcpus.iter().enumerate() {
                let _ = writeln!(out, "{name}{{{vm},vcpu=\"{i}\"}} {}", ns(v) as f64 / 1e9);
            }
        };
        per_vcpu_ns(
            &mut out,
            "kvmscope_guest_stall_seconds_total",
            "vCPU time the guest lost to dirty tracking in readiness windows, migrations and standalone dirty limits (set-vcpu-dirty-limit), so far in those still running, and in the 2 s after each (the pages it left protected; docs/READINESS.md).",
            &crate::vcpu::stall::shown_ns,
        );
        per_vcpu_ns(
            &mut out,
            "kvmscope_dirty_ring_full_seconds_total",
            "Time the vCPU thread spent harvesting its full dirty ring while its guest waited.",
            &|v| v.ring_full_ns.load(Ordering::Relaxed),
        );
        per_vcpu_ns(
            &mut out,
            "kvmscope_throttled_seconds_total",
            "Time the vCPU slept for auto-converge's throttle or its dirty limit (its guest did not run).",
            &|v| v.throttle.slept_ns(),
        );
        let _ = writeln!(out, "# HELP kvmscope_cpu_throttle_percent The auto-converge throttle in force on the vCPU (0: none).\n# TYPE kvmscope_cpu_throttle_percent gauge");
        for (i, v) in samples.vcpus.iter().enumerate() {
            let _ = writeln!(
                out,
                "kvmscope_cpu_throttle_percent{{{vm},vcpu=\"{i}\"}} {}",
                v.throttle.percentage()
            );
        }
        let _ = writeln!(out, "# HELP kvmscope_dirty_limit_bytes_per_second The vCPU's dirty page rate limit in force (set-vcpu-dirty-limit, dirty-limit); only vCPUs with a limit have a line.\n# TYPE kvmscope_dirty_limit_bytes_per_second gauge");
        for (i, v) in samples.vcpus.iter().enumerate() {
            let limit = v.dirty_limit.limit_mb();
            if limit != 0 {
                let _ = writeln!(
                    out,
                    "kvmscope_dirty_limit_bytes_per_second{{{vm},vcpu=\"{i}\"}} {}",
                    limit * crate::vcpu::dirty_limit::MB
                );
            }
        }
        let _ = writeln!(out, "# HELP kvmscope_guest_progress_total The guest's own count of its work (pages touched, read or verified, page writes, exits; guest ABI progress), as the guest stores it (a guest that lowers it reads as a counter reset): its rate against itself shows what a migration or throttle cost it.\n# TYPE kvmscope_guest_progress_total counter");
        for (i, v) in samples.vcpus.iter().enumerate() {
            if let Some(n) = v.guest_progress() {
                let _ = writeln!(
                    out,
                    "kvmscope_guest_progress_total{{{vm},vcpu=\"{i}\"}} {n}"
                );
            }
        }
        let _ = writeln!(out, "# HELP kvmscope_guest_phase Latest guest phase marker ((seq << 8) | command code).\n# TYPE kvmscope_guest_phase gauge");
        for (i, v) in p.vcpus.iter().enumerate() {
            let _ = writeln!(out, "kvmscope_guest_phase{{{vm},vcpu=\"{i}\"}} {}", v.phase);
        }
    }
    let _ = writeln!(out, "# HELP kvmscope_sampler_ticks_total Points the sampler has taken.\n# TYPE kvmscope_sampler_ticks_total counter\nkvmscope_sampler_ticks_total{{{vm}}} {}", samples.last_seq());
    let tick = samples.last_tick_ns.load(Ordering::Relaxed) as f64 / 1e9;
    let _ = writeln!(out, "# HELP kvmscope_sampler_tick_seconds Time the sampler's last tick took.\n# TYPE kvmscope_sampler_tick_seconds gauge\nkvmscope_sampler_tick_seconds{{{vm}}} {tick}");
    samples.with_latest(|sources, latest| {
        let mut seen = HashSet::new();
        let mut pairs = sources.iter().zip(latest);
        let vm_source: Vec<Source<'_>> = pairs
            .next()
            .map(|(fd, sample)| Source::new(vm.as_str(), Values::Sampled(fd.schema(), sample)))
            .into_iter()
            .collect();
        let vm_stats = Whose::Kvm { vcpu: false };
        write_sources(
            &mut out,
            &vm_source,
            "kvmscope_kvm_vm_",
            vm_stats,
            &mut seen,
            &|_| true,
        );
        let vcpu_sources: Vec<Source<'_>> = pairs
            .enumerate()
            .map(|(i, (fd, sample))| {
                Source::new(vcpu_labels(&vm, i), Values::Sampled(fd.schema(), sample))
            })
            .collect();
        write_sources(
            &mut out,
            &vcpu_sources,
            "kvmscope_kvm_vcpu_",
            Whose::Kvm { vcpu: true },
            &mut seen,
            &|_| true,
        );
    });
    out
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use kvm_stats::{Base, Descriptor, StatType, Unit};

    use super::{write_sources, Source, Values, Whose};

    fn written(raw: u64, base: Base, exponent: i16) -> String {
        let d = Descriptor {
            name: "t".into(),
            flags: 0,
            kind: StatType::Cumulative,
            unit: Unit::Seconds,
            base,
            exponent,
            size: 1,
            offset: 0,
            bucket_size: 0,
        };
        let mut out = String::new();
        super::write_in_base_units(&mut out, raw, &d);
        out
    }

    fn listed(names: &[&str], value: u64) -> Vec<(Descriptor, Vec<u64>)> {
        names
            .iter()
            .map(|n| {
                let d = Descriptor {
                    name: (*n).into(),
                    flags: 0,
                    kind: StatType::Cumulative,
                    unit: Unit::None,
                    base: Base::Pow10,
                    exponent: 0,
                    size: 1,
                    offset: 0,
                    bucket_size: 0,
                };
                (d, vec![value])
            })
            .collect()
    }

    /// The page's sample lines (no `#` line) for `sources`, every stat kept.
    fn sample_lines(sources: &[Source<'_>]) -> Vec<String> {
        let mut out = String::new();
        let whose = Whose::Kvm { vcpu: false };
        write_sources(
            &mut out,
            sources,
            "p_",
            whose,
            &mut HashSet::new(),
            &|_: &str| true,
        );
        out.lines()
            .filter(|l| !l.starts_with('#'))
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn listed_sources_of_the_same_names_each_get_their_line_and_a_later_name_is_not_lost() {
        let (a, b, c) = (
            listed(&["x", "y"], 1),
            listed(&["x", "y"], 2),
            listed(&["x", "y", "z"], 3),
        );
        let source = |l: &str, v| Source::new(format!("vm=\"{l}\""), Values::Listed(v));
        let mut hidden = source("d", &b);
        hidden.hide = Some(|n: &str| n == "y");
        let sources = [source("a", &a), source("b", &b), hidden, source("c", &c)];
        assert_eq!(
            sample_lines(&sources),
            [
                "p_x_total{vm=\"a\"} 1",
                "p_x_total{vm=\"b\"} 2",
                "p_x_total{vm=\"d\"} 2",
                "p_x_total{vm=\"c\"} 3",
                "p_y_total{vm=\"a\"} 1",
                "p_y_total{vm=\"b\"} 2",
                "p_y_total{vm=\"c\"} 3",
                "p_z_total{vm=\"c\"} 3",
            ]
        );
    }

    /// A source that gives a stat another type or unit (a hostile QEMU
    /// monitor listed first saying `x` is a gauge) no longer decides how the
    /// others' `x` reads: each kind has its own family, each source its own
    /// line in its own kind's.
    #[test]
    fn a_source_that_gives_a_stat_another_type_does_not_retype_the_others() {
        let mut liar = listed(&["x"], 7);
        liar[0].0.kind = StatType::Instant;
        let honest = listed(&["x"], 1);
        let source = |l: &str, v| Source::new(format!("vm=\"{l}\""), Values::Listed(v));
        let sources = [source("liar", &liar), source("honest", &honest)];
        assert_eq!(
            sample_lines(&sources),
            ["p_x{vm=\"liar\"} 7", "p_x_total{vm=\"honest\"} 1"]
        );
        // The same name on the page of two kinds (a gauge named `y_total`
        // and a counter `y`): the first kind's family only, no second `# TYPE`.
        let gauge = listed(&["y_total"], 2);
        let mut gauge = gauge;
        gauge[0].0.kind = StatType::Instant;
        let counter = listed(&["y"], 3);
        let sources = [source("a", &gauge), source("b", &counter)];
        assert_eq!(sample_lines(&sources), ["p_y_total{vm=\"a\"} 2"]);
    }

    #[test]
    fn a_list_in_another_order_and_rules_that_alternate_still_give_each_source_its_own() {
        let first = listed(&["x", "y"], 1);
        let mut swapped = listed(&["y"], 5);
        swapped.extend(listed(&["x"], 6));
        let source = |l: &str, v| Source::new(format!("vm=\"{l}\""), Values::Listed(v));
        fn hiding(mut s: Source<'_>, rule: fn(&str) -> bool) -> Source<'_> {
            s.hide = Some(rule);
            s
        }
        let no_y = |s| hiding(s, |n| n == "y");
        let no_x = |s| hiding(s, |n| n == "x");
        let (first, swapped) = (&first, &swapped);
        let sources = [
            source("a", first),
            source("b", swapped),
            no_y(source("c", first)),
            no_x(source("d", swapped)),
            no_y(source("e", swapped)),
            no_x(source("f", first)),
        ];
        assert_eq!(
            sample_lines(&sources),
            [
                "p_x_total{vm=\"a\"} 1",
                "p_x_total{vm=\"b\"} 6",
                "p_x_total{vm=\"c\"} 1",
                "p_x_total{vm=\"e\"} 6",
                "p_y_total{vm=\"a\"} 1",
                "p_y_total{vm=\"b\"} 5",
                "p_y_total{vm=\"d\"} 5",
                "p_y_total{vm=\"f\"} 1",
            ]
        );
    }

    #[test]
    fn base_units_are_exact_decimals_for_powers_of_ten() {
        assert_eq!(written(3, Base::Pow10, -9), "0.000000003");
        assert_eq!(written(1_250_000_000, Base::Pow10, -9), "1.25");
        assert_eq!(written(5_000_000_000, Base::Pow10, -9), "5");
        assert_eq!(written(0, Base::Pow10, -9), "0");
        assert_eq!(written(u64::MAX, Base::Pow10, -9), "18446744073.709551615");
        assert_eq!(written(1_234, Base::Pow10, -3), "1.234");
        assert_eq!(written(7, Base::Pow10, -19), "0.0000000000000000007");
        // Past 10^19, and other bases, through f64 as before.
        assert_eq!(written(7, Base::Pow10, -20), format!("{}", 7e-20));
        assert_eq!(written(3, Base::Pow2, -1), "1.5");
        assert_eq!(written(3, Base::Pow2, 10), "3072");
    }
}
