//! What the sampler records: one `Point` per tick, and the `SeriesHeader` that
//! says what the columns mean. Written as JSON lines or CSV, and read back by
//! `kvmscope plot` and the tests.
//!
//! JSON lines: the first line is the header (`"kind": "header"`), then one
//! `"kind": "sample"` object per tick. CSV: a header row, then one row per
//! (tick, vCPU), VM-wide columns repeated on each row of a tick.

use serde_json::Value;

use crate::exits::Reason;
pub use crate::protocol::samples::SeriesHeader;
use crate::protocol::samples::{HeaderRecord, Record, SampleRecord, VcpuRecord};

/// One vCPU in one tick.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct VcpuPoint {
    /// Latest phase marker: `(seq << 8) | command code`, 0 before the first.
    pub phase: u64,
    /// Values of `SeriesHeader::kvm_stats`, in order.
    pub kvm: Vec<u64>,
    /// Our exit counters, in `Reason::ALL` order.
    pub ours: Vec<u64>,
    /// KVM `exits` per second since the previous tick.
    pub exits_per_s: f64,
    /// Our exits per second since the previous tick.
    pub our_exits_per_s: f64,
    /// The guest's own count of its work (guest ABI `progress`; 0 without).
    pub progress: u64,
    /// That count per second since the previous tick.
    pub progress_per_s: f64,
    /// vCPU time the guest lost to dirty tracking so far, ns: over the
    /// observations (readiness windows, migrations) that ended, and so far
    /// in those still open.
    pub stall_ns: u64,
    /// Time the vCPU slept for a throttle or dirty limit so far, ns.
    pub throttled_ns: u64,
}

/// The CSV columns after the exit rates (a series written before they
/// existed lacks them; they read as 0 there).
pub const GUEST_COLUMNS: [&str; 4] = ["progress", "progress_per_s", "stall_ns", "throttled_ns"];

/// One tick.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Point {
    /// Tick number, from 0.
    pub seq: u64,
    /// Seconds since the sampler started (monotonic clock).
    pub time_s: f64,
    /// Guest memory KVM maps with 4 KiB pages (the VM's `pages_4k` stat).
    pub pages_4k: u64,
    /// With 2 MiB pages (`pages_2m`).
    pub pages_2m: u64,
    /// With 1 GiB pages (`pages_1g`).
    pub pages_1g: u64,
    /// Each vCPU, by index.
    pub vcpus: Vec<VcpuPoint>,
}

/// A record that does not read back.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParseError {
    /// A line that is not the record it should be (what is shown escaped
    /// and cut: it quotes the file, which may carry terminal escapes or a
    /// cell of 100 MB).
    #[error("line {line}: {}", crate::units::peer_text(what.as_bytes(), 300))]
    Bad {
        /// Line number, from 1.
        line: usize,
        /// What is wrong with it.
        what: String,
    },
    /// The series does not start with its header.
    #[error("no header record: the first line must be the series header")]
    NoHeader,
}

impl Point {
    /// Bytes of guest memory the MMU maps.
    pub fn mapped_bytes(&self) -> u64 {
        let (pages_4k, pages_2m, pages_1g) = (self.pages_4k, self.pages_2m, self.pages_1g);
        kvm_stats::Mapped {
            pages_4k,
            pages_2m,
            pages_1g,
        }
        .bytes()
    }
}

/// The names of our counters, in column order.
pub fn our_names() -> Vec<&'static str> {
    Reason::ALL.iter().map(|r| r.label()).collect()
}

impl SeriesHeader {
    /// The header as a record, with our counters' names.
    pub(crate) fn to_record(&self) -> HeaderRecord {
        HeaderRecord {
            header: self.clone(),
            our_counters: our_names().iter().map(|s| s.to_string()).collect(),
        }
    }

    /// The header as a JSON-lines record.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self.to_record()).unwrap_or(Value::Null)
    }

    /// The CSV header row.
    pub fn csv_columns(&self) -> String {
        csv_column_names(&self.kvm_stats).join(",")
    }
}

/// The CSV columns of a series with `kvm_stats`, in their order (a CSV is
/// read by place: the reader checks them against these).
fn csv_column_names(kvm_stats: &[String]) -> Vec<String> {
    let mut cols: Vec<String> = [
        "seq",
        "time_s",
        "pages_4k",
        "pages_2m",
        "pages_1g",
        "mapped_bytes",
        "vcpu",
        "phase",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    cols.extend(kvm_stats.iter().map(|s| format!("kvm_{s}")));
    cols.extend(our_names().iter().map(|s| format!("our_{s}")));
    cols.push("exits_per_s".into());
    cols.push("our_exits_per_s".into());
    cols.extend(GUEST_COLUMNS.iter().map(|s| s.to_string()));
    cols
}

impl Point {
    /// The tick as a record, its stats named by `header`.
    pub(crate) fn to_record(&self, header: &SeriesHeader) -> SampleRecord {
        sample_record(self, header)
    }

    /// The tick as a JSON-lines record.
    pub fn to_json(&self, header: &SeriesHeader) -> Value {
        serde_json::to_value(self.to_record(header)).unwrap_or(Value::Null)
    }

    /// The tick as CSV rows, one per vCPU, each ending in a newline.
    pub fn to_csv(&self) -> String {
        let mut out = String::new();
        for (i, v) in self.vcpus.iter().enumerate() {
            let mut cells = vec![
                self.seq.to_string(),
                format!("{:.6}", self.time_s),
                self.pages_4k.to_string(),
                self.pages_2m.to_string(),
                self.pages_1g.to_string(),
                self.mapped_bytes().to_string(),
                i.to_string(),
                v.phase.to_string(),
            ];
            cells.extend(v.kvm.iter().chain(&v.ours).map(u64::to_string));
            cells.push(format!("{:.3}", v.exits_per_s));
            cells.push(format!("{:.3}", v.our_exits_per_s));
            cells.push(v.progress.to_string());
            cells.push(format!("{:.3}", v.progress_per_s));
            cells.push(v.stall_ns.to_string());
            cells.push(v.throttled_ns.to_string());
            out.push_str(&cells.join(","));
            out.push('\n');
        }
        out
    }
}

/// A point as its record, the vCPUs' stats and counters named.
fn sample_record(p: &Point, header: &SeriesHeader) -> SampleRecord {
    let ours = our_names();
    let vcpus = p
        .vcpus
        .iter()
        .map(|v| VcpuRecord {
            phase: v.phase,
            kvm: header
                .kvm_stats
                .iter()
                .cloned()
                .zip(v.kvm.iter().copied())
                .collect(),
            ours: ours
                .iter()
                .map(|s| s.to_string())
                .zip(v.ours.iter().copied())
                .collect(),
            exits_per_s: v.exits_per_s,
            our_exits_per_s: v.our_exits_per_s,
            progress: v.progress,
            progress_per_s: v.progress_per_s,
            stall_ns: v.stall_ns,
            throttled_ns: v.throttled_ns,
        })
        .collect();
    SampleRecord {
        seq: p.seq,
        time_s: p.time_s,
        pages_4k: p.pages_4k,
        pages_2m: p.pages_2m,
        pages_1g: p.pages_1g,
        mapped_bytes: p.mapped_bytes(),
        vcpus,
    }
}

/// A record as its point, its vCPUs' KVM stats in `header`'s column order.
fn into_point(r: SampleRecord, header: &SeriesHeader, line: usize) -> Result<Point, ParseError> {
    let vcpus = r
        .vcpus
        .into_iter()
        .map(|v| {
            let kvm = header
                .kvm_stats
                .iter()
                .map(|n| {
                    v.kvm.get(n).copied().ok_or_else(|| ParseError::Bad {
                        line,
                        what: format!("a vCPU lacks the KVM stat '{n}' the header names"),
                    })
                })
                .collect::<Result<_, _>>()?;
            // A counter this version has but an older series lacks reads as 0.
            let ours = our_names()
                .iter()
                .map(|n| v.ours.get(*n).copied().unwrap_or(0))
                .collect();
            Ok(VcpuPoint {
                phase: v.phase,
                kvm,
                ours,
                exits_per_s: v.exits_per_s,
                our_exits_per_s: v.our_exits_per_s,
                progress: v.progress,
                progress_per_s: v.progress_per_s,
                stall_ns: v.stall_ns,
                throttled_ns: v.throttled_ns,
            })
        })
        .collect::<Result<_, ParseError>>()?;
    Ok(Point {
        seq: r.seq,
        time_s: r.time_s,
        pages_4k: r.pages_4k,
        pages_2m: r.pages_2m,
        pages_1g: r.pages_1g,
        vcpus,
    })
}

/// Reads a JSON-lines series back.
///
/// # Errors
/// The first line that is not a valid record, naming it.
pub fn parse_jsonl(text: &str) -> Result<(SeriesHeader, Vec<Point>), ParseError> {
    let mut header = None;
    let mut points = Vec::new();
    for (i, raw) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let line = i + 1;
        let record: Record = serde_json::from_str(raw).map_err(|e| ParseError::Bad {
            line,
            what: format!("not a series record: {e}"),
        })?;
        match (record, &header) {
            (Record::Header(h), None) => header = Some(h.header),
            (Record::Sample(s), Some(h)) => points.push(into_point(s, h, line)?),
            (Record::Sample(_), None) => return Err(ParseError::NoHeader),
            (Record::Header(_), Some(_)) => {
                return Err(ParseError::Bad {
                    line,
                    what: "a second header record".into(),
                })
            }
        }
    }
    Ok((header.ok_or(ParseError::NoHeader)?, points))
}

/// Reads a CSV series back (the columns say which stats it holds; the
/// header fields a CSV cannot carry are left empty).
///
/// # Errors
/// The first row that does not fit the header row, naming it.
pub fn parse_csv(text: &str) -> Result<(SeriesHeader, Vec<Point>), ParseError> {
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let (_, head) = lines.next().ok_or(ParseError::NoHeader)?;
    let cols: Vec<&str> = head.split(',').collect();
    let kvm_stats: Vec<String> = cols
        .iter()
        .filter_map(|c| c.strip_prefix("kvm_"))
        .map(str::to_string)
        .collect();
    let ours = our_names().len();
    let rates_end = 8 + kvm_stats.len() + ours + 2;
    let guest = cols.len() == rates_end + GUEST_COLUMNS.len() && cols[rates_end..] == GUEST_COLUMNS;
    let width = rates_end + if guest { GUEST_COLUMNS.len() } else { 0 };
    if cols.len() != width || cols[..2] != ["seq", "time_s"] {
        return Err(ParseError::Bad {
            line: 1,
            what: format!("unexpected CSV columns ({} of them)", cols.len()),
        });
    }
    // Read by place: columns in another order (a spreadsheet's) would be
    // read as others (8 MiB as about 2 TiB).
    let expected = csv_column_names(&kvm_stats);
    if let Some((k, (found, want))) = cols
        .iter()
        .zip(&expected)
        .enumerate()
        .find(|(_, (c, e))| *c != e)
    {
        return Err(ParseError::Bad {
            line: 1,
            what: format!(
                "column {} is '{found}' where a series has '{want}': the columns are read in the order kvmscope writes them",
                k + 1
            ),
        });
    }
    let mut points: Vec<Point> = Vec::new();
    for (i, row) in lines {
        let line = i + 1;
        let cells: Vec<&str> = row.split(',').collect();
        if cells.len() != width {
            return Err(ParseError::Bad {
                line,
                what: format!("{} cells, the header has {width}", cells.len()),
            });
        }
        let int = |k: usize| {
            cells[k].parse::<u64>().map_err(|_| ParseError::Bad {
                line,
                what: format!("column '{}' is not a whole number: {}", cols[k], cells[k]),
            })
        };
        let float = |k: usize| {
            cells[k].parse::<f64>().map_err(|_| ParseError::Bad {
                line,
                what: format!("column '{}' is not a number: {}", cols[k], cells[k]),
            })
        };
        let seq = int(0)?;
        if points.last().map(|p| p.seq) != Some(seq) {
            points.push(Point {
                seq,
                time_s: float(1)?,
                pages_4k: int(2)?,
                pages_2m: int(3)?,
                pages_1g: int(4)?,
                vcpus: Vec::new(),
            });
        }
        let k0 = 8 + kvm_stats.len();
        let point = points.last_mut().ok_or(ParseError::NoHeader)?;
        // A sample's rows are its vCPUs in order: a row of another vCPU
        // (rows sorted by vCPU, or one left out) would be read as the next.
        let vcpu = int(6)?;
        if vcpu != point.vcpus.len() as u64 {
            return Err(ParseError::Bad {
                line,
                what: format!(
                    "sample {seq}'s row of vCPU {vcpu} where vCPU {} comes: a sample's rows are read in vCPU order, one a vCPU",
                    point.vcpus.len()
                ),
            });
        }
        let (int_or_0, float_or_0) = (
            |k: usize| if guest { int(k) } else { Ok(0) },
            |k: usize| if guest { float(k) } else { Ok(0.0) },
        );
        point.vcpus.push(VcpuPoint {
            phase: int(7)?,
            kvm: (8..k0).map(int).collect::<Result<_, _>>()?,
            ours: (k0..k0 + ours).map(int).collect::<Result<_, _>>()?,
            exits_per_s: float(rates_end - 2)?,
            our_exits_per_s: float(rates_end - 1)?,
            progress: int_or_0(rates_end)?,
            progress_per_s: float_or_0(rates_end + 1)?,
            stall_ns: int_or_0(rates_end + 2)?,
            throttled_ns: int_or_0(rates_end + 3)?,
        });
    }
    let vcpus = points.first().map_or(0, |p| p.vcpus.len());
    let header = SeriesHeader {
        version: 1,
        name: String::new(),
        backend: Value::Null,
        quiet_stats: Vec::new(),
        vcpus,
        memory: 0,
        interval_ms: 0.0,
        kvm_stats,
    };
    Ok((header, points))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sample_series() -> (SeriesHeader, Vec<Point>) {
        let header = SeriesHeader {
            version: 1,
            name: "test-vm".into(),
            backend: json!({"kind": "pvm"}),
            quiet_stats: vec!["io_exits".into()],
            vcpus: 2,
            memory: 64 << 20,
            interval_ms: 100.0,
            kvm_stats: vec!["exits".into(), "pf_fixed".into()],
        };
        let v = |n: u64| VcpuPoint {
            phase: n,
            kvm: vec![n * 10, n],
            ours: (0..Reason::ALL.len() as u64).map(|i| i + n).collect(),
            exits_per_s: 12.5,
            our_exits_per_s: 2.25,
            progress: n * 1000,
            progress_per_s: 250.5,
            stall_ns: n * 7,
            throttled_ns: n * 11,
        };
        let points = vec![
            Point {
                seq: 1,
                time_s: 0.1,
                pages_4k: 5,
                pages_2m: 1,
                pages_1g: 0,
                vcpus: vec![v(1), v(2)],
            },
            Point {
                seq: 2,
                time_s: 0.2,
                pages_4k: 9,
                pages_2m: 1,
                pages_1g: 0,
                vcpus: vec![v(3), v(4)],
            },
        ];
        (header, points)
    }

    #[test]
    fn jsonl_round_trips() {
        let (h, pts) = sample_series();
        let mut text = h.to_json().to_string() + "\n";
        for p in &pts {
            text += &(p.to_json(&h).to_string() + "\n");
        }
        assert_eq!(parse_jsonl(&text).unwrap(), (h, pts));
    }

    #[test]
    fn jsonl_names_the_vm_and_refuses_a_second_header_or_a_missing_stat() {
        let (h, pts) = sample_series();
        let head = h.to_json();
        assert_eq!(head["name"], "test-vm");
        assert_eq!(head["kind"], "header");
        let twice = format!("{head}\n{head}\n");
        let err = parse_jsonl(&twice).unwrap_err().to_string();
        assert!(err.contains("line 2: a second header"), "{err}");
        let mut sample = pts[0].to_json(&h);
        sample["vcpus"][1]["kvm"]
            .as_object_mut()
            .unwrap()
            .remove("pf_fixed");
        let err = parse_jsonl(&format!("{head}\n{sample}\n"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("line 2") && err.contains("'pf_fixed'"),
            "{err}"
        );
        let err = parse_jsonl(&format!("{head}\n{{\"kind\":\"sample\"}}\n"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("line 2: not a series record: missing field"),
            "{err}"
        );
    }

    #[test]
    fn a_series_without_a_name_reads_with_an_empty_one() {
        let (h, _) = sample_series();
        let mut head = h.to_json();
        head.as_object_mut().unwrap().remove("name");
        let (back, _) = parse_jsonl(&format!("{head}\n")).unwrap();
        assert_eq!(back.name, "");
    }

    #[test]
    fn csv_round_trips_the_points() {
        let (h, pts) = sample_series();
        let mut text = h.csv_columns() + "\n";
        for p in &pts {
            text += &p.to_csv();
        }
        let (h2, pts2) = parse_csv(&text).unwrap();
        assert_eq!(pts2, pts);
        assert_eq!(h2.kvm_stats, h.kvm_stats);
    }

    /// A sample's rows are read in vCPU order, each checked against its
    /// `vcpu` cell: rows sorted by vCPU (a spreadsheet's) were read as other
    /// vCPUs' and other samples'.
    #[test]
    fn csv_rows_out_of_vcpu_order_are_refused_naming_the_row() {
        let (h, pts) = sample_series();
        let rows: Vec<String> = pts
            .iter()
            .flat_map(|p| p.to_csv().lines().map(str::to_string).collect::<Vec<_>>())
            .collect();
        assert!(rows.len() >= 4, "two samples of two vCPUs");
        // Sorted by the vcpu column: sample 1's vCPU 0, sample 2's vCPU 0, ...
        let mut sorted = rows.clone();
        sorted.sort_by_key(|r| r.split(',').nth(6).map(str::to_string));
        let text = h.csv_columns() + "\n" + &sorted.join("\n") + "\n";
        match parse_csv(&text) {
            Err(ParseError::Bad { line, what }) => {
                assert!(what.contains("row of vCPU 1 where vCPU 0 comes"), "{what}");
                assert_eq!(
                    line, 4,
                    "sample 1 again, after sample 2's first row: {what}"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn older_series_without_a_newer_counter_reads_it_as_zero() {
        let (h, pts) = sample_series();
        let mut json = pts[0].to_json(&h);
        json["vcpus"][0]["ours"]
            .as_object_mut()
            .unwrap()
            .remove("dirty_ring_full");
        json["vcpus"][0]["exits_per_s"] = Value::Null;
        let text = format!("{}\n{}\n", h.to_json(), json);
        let (_, back) = parse_jsonl(&text).unwrap();
        let i = Reason::ALL
            .iter()
            .position(|r| *r == Reason::DirtyRingFull)
            .unwrap();
        assert_eq!(back[0].vcpus[0].ours[i], 0);
        assert!(back[0].vcpus[0].exits_per_s.is_nan());
    }

    #[test]
    fn mapped_bytes_saturate_on_hostile_counts() {
        let p = Point {
            pages_4k: u64::MAX,
            pages_2m: 1,
            ..Point::default()
        };
        assert_eq!(p.mapped_bytes(), u64::MAX);
    }

    #[test]
    fn mapped_bytes_weigh_each_page_size() {
        let p = Point {
            pages_4k: 2,
            pages_2m: 1,
            pages_1g: 1,
            ..Point::default()
        };
        assert_eq!(p.mapped_bytes(), 8192 + (2 << 20) + (1 << 30));
    }

    #[test]
    fn parse_errors_name_the_line() {
        assert_eq!(parse_jsonl("").unwrap_err(), ParseError::NoHeader);
        let (h, _) = sample_series();
        let text = h.to_json().to_string() + "\n{\"kind\": \"sample\", \"seq\": 1}\n";
        assert!(matches!(
            parse_jsonl(&text),
            Err(ParseError::Bad { line: 2, .. })
        ));
        let text = h.csv_columns() + "\n1,2,3\n";
        assert!(matches!(
            parse_csv(&text),
            Err(ParseError::Bad { line: 2, .. })
        ));
        assert!(matches!(
            parse_jsonl("not json"),
            Err(ParseError::Bad { line: 1, .. })
        ));
    }

    #[test]
    fn a_samples_page_carries_the_series_records_and_decodes_back() {
        use crate::protocol::samples::SamplesPage;
        let (h, pts) = sample_series();
        let page = SamplesPage {
            header: h.to_record(),
            samples: pts.iter().map(|p| p.to_record(&h)).collect(),
            dropped: 3,
            more: false,
            last_seq: 2,
        };
        let wire = serde_json::to_value(&page).unwrap();
        // The same records as --samples-out writes.
        assert_eq!(wire["header"], h.to_json());
        assert_eq!(wire["samples"][1], pts[1].to_json(&h));
        assert_eq!(wire["last-seq"], 2);
        let back: SamplesPage = serde_json::from_value(wire).unwrap();
        assert_eq!(back, page);
        assert_eq!(back.header.header, h);
        assert_eq!(back.samples[0].vcpus[1].kvm["pf_fixed"], 2);
    }
}
