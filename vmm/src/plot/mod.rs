//! `kvmscope plot`: draws a series written by the sampler (JSON lines, or CSV
//! for a `.csv` file) as a chart a person reads at a glance: mapped guest
//! memory by page size above, exit rates per vCPU below, sharing one time
//! axis, with a labelled line wherever a vCPU starts a command.
//!
//! The chart is drawn with plotters, on its SVG backend or into an RGB buffer
//! that `png` encodes: `chart` draws the panels with the ranges and labels of
//! `axes`, the phase changes `markers` finds and the key `legend` draws.

mod axes;
mod chart;
mod error;
mod legend;
mod markers;
mod options;
mod png;

use std::fs;
use std::path::{Path, PathBuf};

use plotters::prelude::{IntoDrawingArea, SVGBackend};

use crate::sampler::record::{self, Point, SeriesHeader};

pub use chart::{rate_color, Rate, TOTAL_COLOR};
pub use error::PlotError;
pub use options::{
    ChartOptions, RateScale, DEFAULT_HEIGHT, DEFAULT_WIDTH, MAX_SIDE, MIN_HEIGHT, MIN_WIDTH,
};
pub use plotters::style::RGBColor;

/// The image format, chosen by the output file's extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// Scalable vector graphics (text drawn by the viewer).
    Svg,
    /// A bitmap (text drawn with a system font).
    Png,
}

impl Format {
    /// The format `path`'s extension names (case does not matter).
    ///
    /// # Errors
    /// The extension is missing or is neither `svg` nor `png`.
    pub(crate) fn from_path(path: &Path) -> Result<Self, PlotError> {
        let ext = path
            .extension()
            .ok_or_else(|| PlotError::NoOutputExtension {
                path: path.to_path_buf(),
            })?;
        match ext.to_string_lossy().to_ascii_lowercase().as_str() {
            "svg" => Ok(Format::Svg),
            "png" => Ok(Format::Png),
            _ => Err(PlotError::UnsupportedExtension {
                ext: ext.to_string_lossy().into_owned(),
            }),
        }
    }
}

/// What `kvmscope plot` draws, and where.
#[derive(Debug, Clone)]
pub struct PlotConfig {
    /// The series: JSON lines, or CSV when the name ends in `.csv`.
    pub input: PathBuf,
    /// The image; its extension picks the format.
    pub output: PathBuf,
    /// How the chart looks.
    pub chart: ChartOptions,
}

/// A chart written as SVG, with what it holds.
#[derive(Debug, Clone)]
pub struct Rendered {
    /// The SVG document.
    pub svg: String,
    /// Samples drawn.
    pub(crate) points: usize,
    /// Phase-marker lines drawn (changes close together share one).
    pub markers: usize,
    /// Phase changes those lines mark.
    pub(crate) changes: usize,
    /// vCPUs whose rates are drawn.
    pub vcpus: usize,
}

/// What `plot` wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlotOutcome {
    /// The image format.
    pub(crate) format: Format,
    /// Samples drawn.
    pub points: usize,
    /// Phase-marker lines drawn.
    pub markers: usize,
    /// Phase changes those lines mark (more than the lines where changes
    /// close together share one).
    pub(crate) changes: usize,
    /// vCPUs whose rates are drawn.
    pub(crate) vcpus: usize,
}

impl std::fmt::Display for PlotOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = |n: usize| if n == 1 { "" } else { "s" };
        write!(
            f,
            "{} sample{}, {} vCPU{}, {} phase marker{}",
            self.points,
            s(self.points),
            self.vcpus,
            s(self.vcpus),
            self.markers,
            s(self.markers)
        )?;
        if self.changes > self.markers {
            write!(
                f,
                " for {} phase changes (changes close together share a line and its label)",
                self.changes
            )?;
        }
        Ok(())
    }
}

/// The name a series goes by in titles and errors: its file name.
pub fn source_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// Reads a series: CSV when `path` ends in `.csv`, JSON lines otherwise.
///
/// # Errors
/// The file cannot be read or does not parse.
pub(crate) fn load_series(path: &Path) -> Result<(SeriesHeader, Vec<Point>), PlotError> {
    use std::io::Read as _;
    let read_error = |source| PlotError::ReadSeries {
        path: path.to_path_buf(),
        source,
    };
    // Bounded: `/dev/zero` or a file of gigabytes was read until memory ran out.
    let mut text = String::new();
    fs::File::open(path)
        .and_then(|f| {
            f.take(options::MAX_SERIES_BYTES + 1)
                .read_to_string(&mut text)
        })
        .map_err(read_error)?;
    if text.len() as u64 > options::MAX_SERIES_BYTES {
        return Err(PlotError::TooLarge {
            path: path.to_path_buf(),
        });
    }
    // A byte-order mark (an editor's, a spreadsheet's export) is not the
    // series' first character: its header was refused as no header.
    if text.starts_with('\u{feff}') {
        text.drain(..'\u{feff}'.len_utf8());
    }
    let is_csv = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("csv"));
    let parse = |text: &str| {
        if is_csv {
            record::parse_csv(text)
        } else {
            record::parse_jsonl(text)
        }
    };
    let parsed = match parse(&text) {
        // A series is written a line at a time: one whose last line has no
        // end and does not parse was cut while it was written (a VMM
        // killed, a full disk). What came before is whole.
        Err(_) if !text.ends_with('\n') && text.contains('\n') => {
            let whole = text.rfind('\n').map_or(0, |i| i + 1);
            log::warn!(
                "{}: its last line ({} bytes) has no end, cut while it was written: left out",
                path.display(),
                text.len() - whole
            );
            parse(&text[..whole])
        }
        parsed => parsed,
    };
    parsed.map_err(|source| PlotError::ParseSeries {
        path: path.to_path_buf(),
        read_as: if is_csv {
            "read as CSV, by its .csv name"
        } else {
            "read as JSON lines, since its name does not end in .csv"
        },
        source,
    })
}

/// Draws a series as SVG.
///
/// # Errors
/// The size is out of range, no sample has a finite time, or `opts.vcpu` is
/// not in the series.
pub fn render_svg(
    header: &SeriesHeader,
    points: &[Point],
    opts: &ChartOptions,
) -> Result<Rendered, PlotError> {
    let chart = chart::Chart::new(header, points, opts)?;
    let mut svg = String::new();
    let markers = {
        let root = SVGBackend::with_string(&mut svg, (opts.width, opts.height)).into_drawing_area();
        let markers = chart
            .draw(&root)
            .map_err(|e| PlotError::Draw(Box::new(e)))?;
        root.present().map_err(|e| PlotError::Draw(Box::new(e)))?;
        markers
    };
    Ok(Rendered {
        svg,
        points: chart.points.len(),
        markers,
        changes: chart.changes.len(),
        vcpus: chart.vcpus.len(),
    })
}

/// Draws a series as PNG, with its text in a system font (none if the
/// system has no font: a warning says so).
///
/// # Errors
/// As `render_svg`, and `PlotError::EncodePng` if the encoder fails.
pub fn render_png(
    header: &SeriesHeader,
    points: &[Point],
    opts: &ChartOptions,
) -> Result<(Vec<u8>, PlotOutcome), PlotError> {
    let chart = chart::Chart::new(header, points, opts)?;
    let (points, vcpus, changes) = (chart.points.len(), chart.vcpus.len(), chart.changes.len());
    let (png, markers) = png::render(chart, opts.width, opts.height)?;
    let outcome = PlotOutcome {
        format: Format::Png,
        points,
        markers,
        changes,
        vcpus,
    };
    Ok((png, outcome))
}

/// Reads `config.input`, draws it and writes `config.output`.
///
/// # Errors
/// Any `PlotError`: a bad output extension or size is reported before the
/// series is read.
pub fn plot(config: &PlotConfig) -> Result<PlotOutcome, PlotError> {
    let format = Format::from_path(&config.output)?;
    chart::check_size(&config.chart)?;
    let (header, points) = load_series(&config.input)?;
    let (bytes, outcome) = match format {
        Format::Svg => {
            let r = render_svg(&header, &points, &config.chart)?;
            let outcome = PlotOutcome {
                format,
                points: r.points,
                markers: r.markers,
                changes: r.changes,
                vcpus: r.vcpus,
            };
            (r.svg.into_bytes(), outcome)
        }
        Format::Png => render_png(&header, &points, &config.chart)?,
    };
    write_whole(&config.output, &bytes).map_err(|source| PlotError::WriteOutput {
        path: config.output.clone(),
        source,
    })?;
    Ok(outcome)
}

/// Writes `bytes` to `path` whole or not at all: into a temporary file
/// beside it, synced, then renamed over it, so that a stop, a crash or a
/// full disk mid-write leaves the image that was there (a write in place
/// truncated it first). The file that was there gives the new one its mode
/// (and, for root, its owner). Written in place as before: a path that is
/// a symlink or no regular file (`/dev/stdout`, a FIFO), and one whose
/// directory this user may not write in or whose file it may not replace
/// (another user's in a sticky `/tmp`).
fn write_whole(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::{ErrorKind, Write as _};
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    let old = match fs::symlink_metadata(path) {
        Ok(m) if !m.file_type().is_file() => return fs::write(path, bytes),
        Ok(m) => Some(m),
        Err(_) => None,
    };
    let denied = |e: &std::io::Error| e.kind() == ErrorKind::PermissionDenied;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        // Said of the image, not of the hidden temporary file beside it.
        return Err(std::io::Error::new(
            ErrorKind::NotFound,
            format!("its directory {} does not exist", dir.display()),
        ));
    }
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    // Dropped after the temporary file (declared before it): a stop that
    // came meanwhile ends the process once the file is renamed or removed.
    let _held = StopsHeld::new();
    // 0666 less the umask, as a file the write made, where none was.
    let made = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".tmp")
        .permissions(fs::Permissions::from_mode(0o666))
        .tempfile_in(dir);
    let mut temp = match made {
        Ok(t) => t,
        Err(e) if denied(&e) => return fs::write(path, bytes),
        Err(e) => return Err(e),
    };
    if let Some(m) = &old {
        temp.as_file()
            .set_permissions(fs::Permissions::from_mode(m.mode() & 0o7777))?;
        // Only root may give a file away; anyone else keeps their own.
        let _ = std::os::unix::fs::fchown(temp.as_file(), Some(m.uid()), Some(m.gid()));
    }
    temp.write_all(bytes)?;
    temp.as_file().sync_all()?;
    match temp.persist(path) {
        Ok(_) => Ok(()),
        Err(e) if denied(&e.error) => fs::write(path, bytes),
        Err(e) => Err(e.error),
    }
}

/// SIGINT and SIGTERM blocked in this thread while it lives, those of them
/// that were not blocked already; unblocked again when it goes, so that one
/// that came meanwhile takes effect then (by default it ends the process, as
/// it would have). A stop in the middle of [`write_whole`] left its hidden
/// temporary file beside the image.
struct StopsHeld(Vec<std::os::raw::c_int>);

impl StopsHeld {
    fn new() -> Self {
        use vmm_sys_util::signal::block_signal;
        let stops = [libc::SIGINT, libc::SIGTERM];
        StopsHeld(
            stops
                .into_iter()
                .filter(|&s| block_signal(s).is_ok())
                .collect(),
        )
    }
}

impl Drop for StopsHeld {
    fn drop(&mut self) {
        for &s in &self.0 {
            let _ = vmm_sys_util::signal::unblock_signal(s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_outcome_says_when_changes_share_a_marker() {
        let mut o = PlotOutcome {
            format: Format::Svg,
            points: 60,
            markers: 3,
            changes: 3,
            vcpus: 1,
        };
        assert_eq!(o.to_string(), "60 samples, 1 vCPU, 3 phase markers");
        o.changes = 4;
        assert_eq!(
            o.to_string(),
            "60 samples, 1 vCPU, 3 phase markers for 4 phase changes (changes close together share a line and its label)"
        );
    }

    #[test]
    fn format_follows_the_extension_in_any_case() {
        assert_eq!(
            Format::from_path(Path::new("a/b.SVG")).ok(),
            Some(Format::Svg)
        );
        assert_eq!(
            Format::from_path(Path::new("b.png")).ok(),
            Some(Format::Png)
        );
    }

    #[test]
    fn format_rejects_other_extensions_by_name() {
        let err = Format::from_path(Path::new("chart.pdf"))
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("unsupported output extension '.pdf': use .svg or .png")
        );
        assert!(matches!(
            Format::from_path(Path::new("chart")),
            Err(PlotError::NoOutputExtension { .. })
        ));
    }

    #[test]
    fn rate_scale_parses_its_two_names() {
        use clap::ValueEnum;
        assert_eq!(RateScale::from_str("log", false), Ok(RateScale::Log));
        assert_eq!(RateScale::from_str("linear", false), Ok(RateScale::Linear));
        assert!(RateScale::from_str("ln", false).is_err());
    }
}
