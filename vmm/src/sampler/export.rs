//! `--samples-out`: the series written as it is taken, CSV or JSON lines by
//! extension, flushed after every point so a crash loses at most one interval.

use std::fs::File;
use std::io::{BufWriter, Write};
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
    /// The file could not be created.
    #[error("creating samples file {0}")]
    Create(PathBuf, #[source] std::io::Error),
    /// A write to the file failed.
    #[error("writing samples file {0}")]
    Write(PathBuf, #[source] std::io::Error),
}

/// File formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// One header row of column names, then one row per sample.
    Csv,
    /// A header object, then one JSON object per sample, one per line.
    JsonLines,
}

/// The format a path's extension asks for.
///
/// # Errors
/// `Extension` for anything else.
pub fn format_of(path: &Path) -> Result<Format, Error> {
    match path.extension().and_then(|e| e.to_str()) {
        Some("csv") => Ok(Format::Csv),
        Some("jsonl" | "json" | "ndjson") => Ok(Format::JsonLines),
        _ => Err(Error::Extension(path.to_path_buf())),
    }
}

/// An open samples file.
pub struct Writer {
    path: PathBuf,
    format: Format,
    out: BufWriter<File>,
}

impl Writer {
    /// Creates (truncates) the file and writes the header.
    ///
    /// # Errors
    /// A bad extension, or the file cannot be created or written.
    pub fn create(path: &Path, header: &SeriesHeader) -> Result<Writer, Error> {
        let format = format_of(path)?;
        let file = File::create(path).map_err(|e| Error::Create(path.to_path_buf(), e))?;
        let mut w = Writer {
            path: path.to_path_buf(),
            format,
            out: BufWriter::new(file),
        };
        let head = match format {
            Format::Csv => header.csv_columns(),
            Format::JsonLines => header.to_json().to_string(),
        };
        w.line(&head)?;
        w.flush()?;
        Ok(w)
    }

    fn line(&mut self, text: &str) -> Result<(), Error> {
        writeln!(self.out, "{text}").map_err(|e| Error::Write(self.path.clone(), e))
    }

    /// Appends a point and flushes it to the kernel.
    ///
    /// # Errors
    /// The write failed.
    pub fn write(&mut self, header: &SeriesHeader, point: &Point) -> Result<(), Error> {
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
    pub fn flush(&mut self) -> Result<(), Error> {
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
}
