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

/// The most a `query-readiness` may take before its client gives up on a
/// VMM that does not answer (one that negotiated and went silent held
/// `kvmscope readiness` and `migrate --predict` for ever): its window
/// (1 s when not given), the wait for the VMM's calibration (10 s at
/// most), a scan's second per GiB of guest RAM (17 ms per 128 MiB
/// measured), and 30 s to spare.
pub(crate) fn request_limit(memory: u64, calc_time: Option<Duration>, scan: bool) -> Duration {
    let window = calc_time.unwrap_or(Duration::from_secs(1));
    let gib = memory.div_ceil(1 << 30);
    let scan = if scan {
        Duration::from_secs(gib)
    } else {
        Duration::ZERO
    };
    window + Duration::from_secs(40) + scan
}

/// Runs the query and prints the report (text, or JSON with `json`).
///
/// # Errors
/// A transport failure, or the VMM's error reply as `Remote`.
pub fn readiness(config: &ReadinessConfig, out: &mut dyn Write) -> Result<(), Error> {
    let mut client = Client::connect(&config.socket)?;
    let memory = client.greeting.qmp.kvmscope.vm.memory;
    let limit = request_limit(memory, config.calc_time, config.scan);
    client.bound_each_request(limit);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_readiness_request_may_take_its_window_the_calibration_and_its_scan() {
        let s = Duration::from_secs;
        // A 2 s window, no scan: 2 + 40 s.
        assert_eq!(request_limit(16 << 30, Some(s(2)), false), s(42));
        // The default 1 s window and a scan of 16 GiB: 1 + 40 + 16 s; a
        // part of a GiB counts whole.
        assert_eq!(request_limit(16 << 30, None, true), s(57));
        assert_eq!(request_limit((1 << 30) + 1, None, true), s(43));
    }
}
