//! How the values of flags are read, where clap's own parsers do not say
//! enough: each refuses what the VMM would refuse, naming the bound.

use std::path::PathBuf;
use std::time::Duration;

use kvmscope::units::{Bandwidth, Period, Size, Span};

/// A `--names` entry: a stat name, `*` for any run of characters.
pub(crate) fn stat_pattern(text: &str) -> Result<String, String> {
    kvm_stats::NameFilter::patterns(vec![text.to_string()])
        .map(|_| text.to_string())
        .map_err(|e| e.to_string())
}

/// Guest RAM (`run`, `demo`): a size the guest ABI takes (at least its
/// minimum, whole 2 MiB pages, at most what its page tables cover), so that
/// a missing unit (`--memory 64`: 64 bytes) is a command-line error.
pub(crate) fn guest_memory(text: &str) -> Result<Size, String> {
    use kvmscope::memory::{check_size, Error};
    let size: Size = text
        .parse()
        .map_err(|e: kvmscope::units::UnitError| e.to_string())?;
    match check_size(size.0) {
        Ok(()) => Ok(size),
        Err(e @ Error::TooSmall { .. }) => Err(format!("{e} (a unit: 64M, 1G)")),
        Err(e) => Err(e.to_string()),
    }
}

/// An address to serve HTTP on: an IP address and a port (no name is
/// looked up: which of a name's addresses to bind would be a guess).
pub(crate) fn listen_addr(text: &str) -> Result<std::net::SocketAddr, String> {
    text.parse().map_err(|_| {
        format!("'{text}' is not an IP address and port: use e.g. 127.0.0.1:9100, 0.0.0.0:9100 or [::1]:9100 (host names such as localhost are not looked up)")
    })
}

/// A duration flag's value, parsed as `T` (a `Period`, a `Span`), of at
/// most `most` (its duration given by `of`); `why` says what the bound is.
fn duration_at_most<T: std::str::FromStr<Err = kvmscope::units::UnitError>>(
    text: &str,
    most: Duration,
    of: fn(&T) -> Duration,
    why: &str,
) -> Result<T, String> {
    let value: T = text
        .parse()
        .map_err(|e: kvmscope::units::UnitError| e.to_string())?;
    if of(&value) > most {
        return Err(format!("'{text}' is more than {why}"));
    }
    Ok(value)
}

/// `run --fault-cost`: a duration of at most a second.
pub(crate) fn fault_cost(text: &str) -> Result<Period, String> {
    duration_at_most(
        text,
        Duration::from_secs(1),
        |p: &Period| p.0,
        "1s (a write fault costs microseconds)",
    )
}

/// `run --samples-out`: a name whose extension says the format.
pub(crate) fn samples_file(text: &str) -> Result<PathBuf, String> {
    let path = PathBuf::from(text);
    kvmscope::sampler::export::check_extension(&path).map_err(|e| e.to_string())?;
    Ok(path)
}

/// `readiness --calc-time`: a window of at most 10 minutes, as the VMM
/// takes it (`query-readiness`' `calc-time`), refused here rather than by
/// the VMM.
pub(crate) fn calc_time(text: &str) -> Result<Span, String> {
    use kvmscope::protocol::request::MAX_SECONDS;
    duration_at_most(
        text,
        Duration::from_secs_f64(MAX_SECONDS),
        |s: &Span| s.0,
        &format!("{}m, the longest window", MAX_SECONDS / 60.0),
    )
}

/// `--max-downtime` (`readiness`, `migrate`): at most `downtime-limit`'s
/// most, refused here rather than by the VMM.
pub(crate) fn max_downtime(text: &str) -> Result<Period, String> {
    let most = kvmscope::protocol::MAX_DOWNTIME_LIMIT_MS;
    duration_at_most(
        text,
        Duration::from_millis(most),
        |p: &Period| p.0,
        &format!("{}s, the longest downtime-limit (QEMU's)", most / 1000),
    )
}

/// `readiness --bandwidth`: at most what `query-readiness` takes (1e13
/// B/s), refused here rather than by the VMM.
pub(crate) fn readiness_bandwidth(text: &str) -> Result<Bandwidth, String> {
    let b: Bandwidth = text
        .parse()
        .map_err(|e: kvmscope::units::UnitError| e.to_string())?;
    use kvmscope::protocol::request::MAX_BANDWIDTH;
    if b.0 > MAX_BANDWIDTH {
        return Err(format!(
            "'{text}' is more than 80Tbit ({MAX_BANDWIDTH:e} B/s), the fastest link a prediction takes"
        ));
    }
    Ok(b)
}

/// `--vcpus`: from 1 to the guest ABI's most (KVM's own limit, which may be
/// lower, is checked when the VM is made).
pub(crate) fn vcpu_count(text: &str) -> Result<usize, String> {
    let most = kvmscope::abi::MAX_VCPUS;
    match text.parse::<i128>() {
        Ok(n) if (1..=i128::from(most)).contains(&n) => {
            usize::try_from(n).map_err(|e| e.to_string())
        }
        Ok(_) => Err(format!("a VM has from 1 to {most} vCPUs")),
        Err(e) => Err(format!("not a number of vCPUs: {e}")),
    }
}

/// `watch --count`: at least one refresh (clap's range said "0 is not in
/// 1..18446744073709551615").
pub(crate) fn refresh_count(text: &str) -> Result<u64, String> {
    match text.parse::<u64>() {
        Ok(0) => Err("at least 1 refresh (leave --count out to refresh until stopped)".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("not a number of refreshes: {e}")),
    }
}

/// `--name`: a VM's name labels its metrics and answers `query-name`; an
/// empty one would label it `vm=""`.
pub(crate) fn non_empty_name(text: &str) -> Result<String, String> {
    if text.trim().is_empty() {
        Err("a VM's name cannot be empty (leave --name out for the default)".into())
    } else {
        Ok(text.to_string())
    }
}
