//! `kvmscope readiness`: asks a running VMM for its migration-readiness
//! figures (`query-readiness`) and prints the report, with a progress bar for
//! the scan when stderr is a terminal.

use std::io::{IsTerminal, Write};
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

fn progress_bar(done: u64, total: u64) -> String {
    let width = 40;
    let fraction = |scale: u64| {
        done.min(total)
            .saturating_mul(scale)
            .checked_div(total)
            .unwrap_or(scale)
    };
    let filled =
        usize::try_from(fraction(u64::try_from(width).unwrap_or(u64::MAX))).unwrap_or(width);
    format!(
        "\rscanning guest RAM [{}{}] {:>3}%",
        "#".repeat(filled),
        " ".repeat(width - filled),
        fraction(100)
    )
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
    let tty = std::io::stderr().is_terminal();
    let reply = client
        .read_reply_after_events(|event| {
            if tty && event["event"] == "READINESS_PROGRESS" {
                let n = |k: &str| event["data"][k].as_u64().unwrap_or(0);
                eprint!("{}", progress_bar(n("done"), n("total")));
            }
            Ok(())
        })?
        .value;
    if tty && config.scan {
        eprintln!();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_bar_fills_with_the_fraction_done() {
        assert!(progress_bar(0, 100).contains("[                                        ]   0%"));
        assert!(progress_bar(50, 100).contains(&format!(
            "[{}{}]  50%",
            "#".repeat(20),
            " ".repeat(20)
        )));
        assert!(progress_bar(100, 100).ends_with("100%"));
        assert!(progress_bar(0, 0).ends_with("100%"));
    }
}
