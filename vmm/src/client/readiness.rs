//! `kvmscope readiness`: asks a running VMM for its migration-readiness
//! figures (`query-readiness`) and prints the report, with a progress bar for
//! the scan when stderr is a terminal.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use super::{Client, Error};
use crate::protocol::request::ReadinessRequest;

/// Longest line of a VMM's readiness report shown whole: its per-vCPU
/// lists run to a few thousand characters for 256 vCPUs.
pub(crate) const REPORT_WIDTH: usize = 16 << 10;

/// What `kvmscope readiness` asks for.
#[derive(Debug, Clone)]
pub struct ReadinessConfig {
    /// The VMM's control socket.
    pub socket: PathBuf,
    /// Also count non-zero pages exactly (pauses the guest for the scan).
    pub scan: bool,
    /// Dirty-rate window; `None` leaves it to the VMM (1 s with dirty logging).
    pub calc_time: Option<Duration>,
    /// Bytes per second, 0 for unlimited; `None`: the VMM's migration
    /// parameters (`max-bandwidth`, unlimited unless set).
    pub bandwidth: Option<f64>,
    /// `None`: the VMM's `downtime-limit`.
    pub max_downtime: Option<Duration>,
    /// Print the report as JSON instead of text.
    pub json: bool,
}

/// The scan's progress bar; indicatif draws it only when stderr is a terminal.
fn scan_bar() -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(0);
    let style =
        indicatif::ProgressStyle::with_template("scanning guest RAM [{bar:40}] {percent:>3}%")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
    bar.set_style(style.progress_chars("## "));
    bar
}

/// Runs the query and prints the report (text, or JSON with `json`).
///
/// # Errors
/// A transport failure, or the VMM's error reply as `Remote`.
pub fn readiness(config: &ReadinessConfig, out: &mut dyn Write) -> Result<(), Error> {
    let mut client = Client::connect(&config.socket)?;
    let args = ReadinessRequest {
        scan: config.scan,
        calc_time: config.calc_time.map(|t| t.as_secs_f64()),
        bandwidth: config.bandwidth,
        max_downtime: config.max_downtime.map(|d| d.as_secs_f64()),
    };
    let mut bar: Option<indicatif::ProgressBar> = None;
    let report = client.query_readiness(args, |progress| {
        let bar = bar.get_or_insert_with(scan_bar);
        bar.set_length(progress.total);
        bar.set_position(progress.done);
    })?;
    if let Some(bar) = bar {
        bar.finish();
    }
    if config.json {
        // The figures without the text, members in the wire's (sorted) order.
        let mut value =
            serde_json::to_value(&report).map_err(|e| Error::BadReply(e.to_string()))?;
        if let Some(obj) = value.as_object_mut() {
            obj.remove("text");
        }
        writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&value).unwrap_or_default()
        )?;
    } else {
        // The VMM's report, shown on the user's terminal.
        write!(
            out,
            "{}",
            crate::units::peer_lines(&report.text, REPORT_WIDTH, 1000)
        )?;
    }
    Ok(())
}
