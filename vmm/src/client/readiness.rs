//! `kvmscope readiness`: asks a running VMM for its migration-readiness
//! figures (`query-readiness`) and prints the report, with a progress bar for
//! the scan when stderr is a terminal.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::json;

use super::{Client, Error};

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
    let mut args = json!({ "scan": config.scan });
    if let Some(b) = config.bandwidth {
        args["bandwidth"] = json!(b);
    }
    if let Some(d) = config.max_downtime {
        args["max-downtime"] = json!(d.as_secs_f64());
    }
    if let Some(t) = config.calc_time {
        args["calc-time"] = json!(t.as_secs_f64());
    }
    client.send_line(
        json!({"execute": "query-readiness", "arguments": args})
            .to_string()
            .as_bytes(),
    )?;
    let mut bar: Option<indicatif::ProgressBar> = None;
    let reply = client
        .read_reply_after_events(|event| {
            if event["event"] == "READINESS_PROGRESS" {
                let n = |k: &str| event["data"][k].as_u64().unwrap_or(0);
                let bar = bar.get_or_insert_with(scan_bar);
                bar.set_length(n("total"));
                bar.set_position(n("done"));
            }
            Ok(())
        })?
        .value;
    if let Some(bar) = bar {
        bar.finish();
    }
    if let Some((class, desc)) = super::error_reply(&reply) {
        return Err(Error::Remote { class, desc });
    }
    let mut report = reply
        .get("return")
        .cloned()
        .ok_or_else(|| Error::BadReply(reply.to_string()))?;
    if config.json {
        if let Some(obj) = report.as_object_mut() {
            obj.remove("text");
        }
        writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&report).unwrap_or_default()
        )?;
    } else {
        write!(out, "{}", report["text"].as_str().unwrap_or_default())?;
    }
    Ok(())
}
