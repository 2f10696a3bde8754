//! `--samples-out`: the series written as it is taken, CSV or JSON lines by
//! extension, flushed after every point so a crash loses at most one interval.
//!
//! Nothing on disk changes until the run's start-up has passed: the series is
//! written under a temporary name in the target's directory and moved into
//! place (`Staged::commit`, one rename) once every start-up check passed; a
//! start-up that fails removes the temporary file and leaves the old one as it
//! was. An existing file is replaced only if it is empty or a kvmscope series
//! (its first line is a series header), unless the caller forces it.

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use super::record::{Point, SeriesHeader};

/// Why the export failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file name's extension names no format.
    #[error(
        "samples file {0}: unknown extension; use .csv, or .jsonl/.json/.ndjson for JSON lines"
    )]
    Extension(PathBuf),
    /// The file exists and is not a series (without `--force`).
    #[error("samples file {0} exists and is not a kvmscope samples file; refusing to overwrite it (pass --force to replace it)")]
    NotSamples(PathBuf),
    /// The path is not a regular file.
    #[error("samples file {0} exists and is not a regular file")]
    NotRegular(PathBuf),
    /// The existing file could not be looked at.
    #[error("looking at the existing samples file {0}")]
    Inspect(PathBuf, #[source] std::io::Error),
    /// The directory the file goes in is not there.
    #[error("samples file {0}: its directory {1} does not exist")]
    NoDirectory(PathBuf, PathBuf),
    /// The temporary file could not be created.
    #[error("creating a temporary samples file {0}")]
    Create(PathBuf, #[source] std::io::Error),
    /// A write to the file failed.
    #[error("writing samples file {0}")]
    Write(PathBuf, #[source] std::io::Error),
    /// The rename into place failed.
    #[error("moving the samples file into place at {0}")]
    Commit(PathBuf, #[source] std::io::Error),
}

/// Where to write the series.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination {
    /// The file to write.
    pub path: PathBuf,
    /// Replace an existing file even if it is not a kvmscope series (`--force`).
    pub force: bool,
}

impl From<PathBuf> for Destination {
    fn from(path: PathBuf) -> Self {
        Destination { path, force: false }
    }
}

/// Whether `line` (a file's first line) is the header a series export starts
/// with: the JSON-lines header record, or the CSV header row.
pub fn is_series_header(line: &str) -> bool {
    if line.starts_with("seq,time_s,pages_4k,pages_2m,pages_1g,mapped_bytes,") {
        return true;
    }
    serde_json::from_str::<serde_json::Value>(line)
        .is_ok_and(|v| v.get("kind").and_then(|k| k.as_str()) == Some("header"))
}

/// Most bytes of an existing file read to find its first line.
const FIRST_LINE_MAX: u64 = 1 << 20;

/// Checks that `dest` may be written: it does not exist, or it is a regular
/// file that is empty or a series (or `force`). Returns the path to rename
/// onto: a symbolic link's target, so that the link stays.
///
/// # Errors
/// `NotRegular`, `NotSamples`, or `Inspect` when it cannot be looked at.
pub(crate) fn check_destination(dest: &Destination) -> Result<PathBuf, Error> {
    let path = &dest.path;
    let inspect = |e| Error::Inspect(path.clone(), e);
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(path.clone()),
        Err(e) => return Err(inspect(e)),
    };
    // Never open a FIFO or a device (opening a FIFO blocks), nor rename over one.
    if !meta.is_file() {
        return Err(Error::NotRegular(path.clone()));
    }
    let real = std::fs::canonicalize(path).map_err(inspect)?;
    if dest.force || meta.len() == 0 {
        return Ok(real);
    }
    let mut head = Vec::new();
    File::open(&real)
        .and_then(|f| f.take(FIRST_LINE_MAX).read_to_end(&mut head))
        .map_err(inspect)?;
    let first = head.split(|&b| b == b'\n').next().unwrap_or_default();
    match std::str::from_utf8(first) {
        Ok(line) if is_series_header(line.trim_end_matches('\r')) => Ok(real),
        _ => Err(Error::NotSamples(path.clone())),
    }
}

/// A series written under a temporary name (`tempfile`'s, created with
/// `O_EXCL` next to the target), until `commit` moves it into place. Dropped
/// uncommitted, the temporary file is removed.
#[derive(Debug)]
pub(crate) struct Staged {
    temp: Option<tempfile::TempPath>,
    target: PathBuf,
}

impl Staged {
    /// Moves the series into place, replacing any old file (one rename).
    ///
    /// # Errors
    /// The rename failed (the temporary file is then removed).
    pub(crate) fn commit(&mut self) -> Result<(), Error> {
        if let Some(temp) = self.temp.take() {
            temp.persist(&self.target)
                .map_err(|e| Error::Commit(self.target.clone(), e.error))?;
        }
        Ok(())
    }
}

/// Creates `dir/.NAME.PID.XXXXXX.tmp` next to `target` (so that the rename
/// stays on one filesystem). The pid in the name lets a later run tell a
/// temporary left by a killed process from a live one's.
fn create_temp(target: &Path) -> Result<tempfile::NamedTempFile, Error> {
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let dir = match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        // Said of the series, not of the hidden temporary file beside it.
        return Err(Error::NoDirectory(target.to_path_buf(), dir.to_path_buf()));
    }
    tempfile::Builder::new()
        .prefix(&format!(".{name}.{}.", std::process::id()))
        .suffix(".tmp")
        .tempfile_in(dir)
        .map_err(|e| Error::Create(dir.join(format!(".{name}.*.tmp")), e))
}

/// Removes the temporary files of earlier runs for `target` whose process is
/// gone (killed before it could commit or clean up: SIGKILL, a crash). A file
/// of a live process is left alone. Best effort.
fn remove_stale_temps(target: &Path) {
    let (Some(dir), Some(name)) = (target.parent(), target.file_name()) else {
        return;
    };
    let prefix = format!(".{}.", name.to_string_lossy());
    let Ok(entries) = std::fs::read_dir(if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    }) else {
        return;
    };
    for e in entries.flatten() {
        let file = e.file_name().to_string_lossy().into_owned();
        // `PID.XXXXXX` (or `PID` alone, as older runs named them).
        let Some(pid) = file
            .strip_prefix(&prefix)
            .and_then(|rest| rest.strip_suffix(".tmp"))
            .and_then(|rest| rest.split('.').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        let gone = !Path::new("/proc").join(pid.to_string()).exists();
        if gone && e.file_type().is_ok_and(|t| t.is_file()) {
            match std::fs::remove_file(e.path()) {
                Ok(()) => log::info!(
                    "removed {}, left by process {pid}, which is gone",
                    e.path().display()
                ),
                Err(err) => log::warn!("cannot remove {}: {err}", e.path().display()),
            }
        }
    }
}

/// File formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// One header row of column names, then one row per sample.
    Csv,
    /// A header object, then one JSON object per sample, one per line.
    JsonLines,
}

/// The format a path's extension asks for.
///
/// # Errors
/// `Extension` for anything else.
pub(crate) fn format_of(path: &Path) -> Result<Format, Error> {
    match path.extension().and_then(|e| e.to_str()) {
        Some("csv") => Ok(Format::Csv),
        Some("jsonl" | "json" | "ndjson") => Ok(Format::JsonLines),
        _ => Err(Error::Extension(path.to_path_buf())),
    }
}

/// Whether `path` names a samples file kvmscope writes (`.csv`, `.jsonl`,
/// `.json`, `.ndjson`): for the command line, before anything starts.
///
/// # Errors
/// `Extension`, naming the kinds it takes.
pub fn check_extension(path: &Path) -> Result<(), Error> {
    format_of(path).map(|_| ())
}

/// An open samples file.
pub(crate) struct Writer {
    path: PathBuf,
    format: Format,
    out: BufWriter<File>,
}

impl Writer {
    /// Checks `dest` (`check_destination`), creates a temporary file next to
    /// it and writes the header there. The series reaches `dest` when the
    /// returned `Staged` is committed.
    ///
    /// # Errors
    /// A bad extension, a file that must not be replaced, or the temporary
    /// file cannot be created or written.
    pub(crate) fn create(
        dest: &Destination,
        header: &SeriesHeader,
    ) -> Result<(Writer, Staged), Error> {
        let format = format_of(&dest.path)?;
        let target = check_destination(dest)?;
        remove_stale_temps(&target);
        let (file, temp) = create_temp(&target)?.into_parts();
        let staged = Staged {
            temp: Some(temp),
            target,
        };
        let mut w = Writer {
            path: dest.path.clone(),
            format,
            out: BufWriter::new(file),
        };
        let head = match format {
            Format::Csv => header.csv_columns(),
            Format::JsonLines => header.to_json().to_string(),
        };
        w.line(&head)?;
        w.flush()?;
        Ok((w, staged))
    }

    fn line(&mut self, text: &str) -> Result<(), Error> {
        writeln!(self.out, "{text}").map_err(|e| Error::Write(self.path.clone(), e))
    }

    /// Appends a point and flushes it to the kernel.
    ///
    /// # Errors
    /// The write failed.
    pub(crate) fn write(&mut self, header: &SeriesHeader, point: &Point) -> Result<(), Error> {
        match self.format {
            Format::Csv => self
                .out
                .write_all(point.to_csv().as_bytes())
                .map_err(|e| Error::Write(self.path.clone(), e))?,
            Format::JsonLines => self.line(&point.to_json(header).to_string())?,
        }
        self.flush()
    }

    /// Flushes buffered output.
    ///
    /// # Errors
    /// The write failed.
    pub(crate) fn flush(&mut self) -> Result<(), Error> {
        self.out
            .flush()
            .map_err(|e| Error::Write(self.path.clone(), e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_follows_the_extension() {
        assert_eq!(format_of(Path::new("a.csv")).unwrap(), Format::Csv);
        assert_eq!(format_of(Path::new("a.jsonl")).unwrap(), Format::JsonLines);
        assert!(matches!(
            format_of(Path::new("a.txt")),
            Err(Error::Extension(_))
        ));
        assert!(matches!(
            format_of(Path::new("noext")),
            Err(Error::Extension(_))
        ));
    }

    fn header() -> SeriesHeader {
        SeriesHeader {
            version: 1,
            name: "test-vm".into(),
            backend: serde_json::json!({"kind": "pvm"}),
            quiet_stats: vec![],
            vcpus: 1,
            memory: 32 << 20,
            interval_ms: 10.0,
            kvm_stats: vec!["exits".into()],
        }
    }

    /// A fresh directory for one test.
    fn dir(test: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("kvmscope-export-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn both_export_headers_are_recognised_and_other_text_is_not() {
        let h = header();
        assert!(is_series_header(&h.csv_columns()));
        assert!(is_series_header(&h.to_json().to_string()));
        for other in [
            "",
            "my notes",
            "{\"kind\": \"sample\"}",
            "seq,time_s",
            "[1, 2]",
        ] {
            assert!(!is_series_header(other), "{other}");
        }
    }

    #[test]
    fn a_missing_empty_or_series_file_may_be_replaced() {
        let d = dir("replaceable");
        let missing: Destination = d.join("new.csv").into();
        assert_eq!(check_destination(&missing).unwrap(), missing.path);
        std::fs::write(d.join("empty.csv"), "").unwrap();
        assert!(check_destination(&d.join("empty.csv").into()).is_ok());
        let series = format!("{}\n1,2,3\n", header().to_json());
        std::fs::write(d.join("old.jsonl"), series).unwrap();
        assert!(check_destination(&d.join("old.jsonl").into()).is_ok());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn another_file_is_refused_unless_forced() {
        let d = dir("refused");
        let path = d.join("notes.csv");
        std::fs::write(&path, "my precious notes\n").unwrap();
        let err = check_destination(&path.clone().into()).unwrap_err();
        assert!(matches!(err, Error::NotSamples(_)), "{err}");
        assert!(err.to_string().contains("--force"), "{err}");
        let forced = Destination {
            path: path.clone(),
            force: true,
        };
        assert!(check_destination(&forced).is_ok());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_directory_or_fifo_is_refused_even_when_forced() {
        let d = dir("special");
        let fifo = d.join("pipe.csv");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: `c` is a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        for path in [d.clone(), fifo] {
            let forced = Destination { path, force: true };
            let err = check_destination(&forced).unwrap_err();
            assert!(matches!(err, Error::NotRegular(_)), "{err}");
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn the_series_reaches_its_path_only_on_commit() {
        let d = dir("staged");
        let path = d.join("series.csv");
        std::fs::write(&path, "").unwrap();
        let (mut w, mut staged) = Writer::create(&path.clone().into(), &header()).unwrap();
        w.flush().unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "",
            "untouched until commit"
        );
        staged.commit().unwrap();
        assert!(is_series_header(
            std::fs::read_to_string(&path)
                .unwrap()
                .lines()
                .next()
                .unwrap()
        ));
        assert_eq!(names(&d), ["series.csv"], "no temporary file left");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_series_whose_directory_is_missing_is_refused_naming_it() {
        let d = dir("nodir");
        let path = d.join("missing").join("series.jsonl");
        let e = Writer::create(&path.clone().into(), &header())
            .err()
            .unwrap();
        assert_eq!(
            e.to_string(),
            format!(
                "samples file {}: its directory {} does not exist",
                path.display(),
                d.join("missing").display()
            )
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn temporaries_of_gone_processes_are_removed_and_a_live_ones_kept() {
        let d = dir("stale");
        let path = d.join("series.csv");
        // No process has a pid this high (pid_max is at most 2^22).
        let stale = d.join(".series.csv.4294967295.tmp");
        let stale_named = d.join(".series.csv.4294967295.x7Kq2p.tmp");
        // pid 1 is always alive.
        let live = d.join(".series.csv.1.tmp");
        let other = d.join(".other.csv.4294967295.tmp");
        for f in [&stale, &stale_named, &live, &other] {
            std::fs::write(f, "x").unwrap();
        }
        let created = Writer::create(&path.clone().into(), &header()).unwrap();
        drop(created);
        assert_eq!(
            names(&d),
            [".other.csv.4294967295.tmp", ".series.csv.1.tmp"],
            "only the stale temporaries of this target went"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn an_uncommitted_series_leaves_the_old_file_and_no_temporary() {
        let d = dir("dropped");
        let path = d.join("series.jsonl");
        let old = format!("{}\n", header().to_json());
        std::fs::write(&path, &old).unwrap();
        let created = Writer::create(&path.clone().into(), &header()).unwrap();
        drop(created);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), old);
        assert_eq!(names(&d), ["series.jsonl"]);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
