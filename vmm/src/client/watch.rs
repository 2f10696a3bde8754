//! `kvmscope watch`: a live, top-like view of selected stats with per-second
//! rates, read through stats fds received once.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use super::stats::{names_filter, receive, sample_all, table_filter, warn_missing, UNMEASURED};
use super::{Client, Error, REPLY_TIMEOUT};
use crate::abi;
use crate::protocol::samples::{SampleRecord, SeriesHeader};
use crate::protocol::VcpuSelector;
use crate::units::format_bytes;

/// Shown when no `--names` are given: what the guest's workloads move.
pub(crate) const DEFAULT_NAMES: &[&str] = &[
    "pages_4k",
    "pages_2m",
    "pages_1g",
    "remote_tlb_flush",
    "mmu_shadow_zapped",
    "mmu_pte_write",
    "exits",
    "io_exits",
    "mmio_exits",
    "halt_exits",
    "irq_exits",
    "signal_exits",
    "pf_taken",
    "pf_fixed",
    "pf_emulate",
    "insn_emulation",
];

/// What `kvmscope watch` shows, and how often.
#[derive(Debug, Clone)]
pub struct WatchConfig {
    /// The VMM's control socket.
    pub socket: PathBuf,
    /// Time between refreshes.
    pub interval: Duration,
    /// Stats to show (`DEFAULT_NAMES` when `None`).
    pub names: Option<Vec<String>>,
    /// Stop after this many refreshes.
    pub count: Option<u64>,
    /// Show the VM's stats.
    pub vm: bool,
    /// Show these vCPUs' stats.
    pub vcpus: Option<VcpuSelector>,
    /// Clear the screen before each refresh (when writing to a terminal).
    pub clear: bool,
}

/// Runs `kvmscope watch`: fds are received once, then each refresh is one
/// `pread` per fd and a delta against the previous refresh.
///
/// # Errors
/// Connecting, receiving or reading failed.
pub fn run(config: &WatchConfig, out: &mut dyn Write) -> Result<(), Error> {
    let mut client = Client::connect(&config.socket)?;
    client.bound_each_request(REPLY_TIMEOUT);
    let pid = u64::from(client.vmm_pid());
    let name = client.greeting.qmp.kvmscope.vm.name.clone();
    let (vm, vcpus) = match (config.vm, config.vcpus) {
        (false, None) => (true, Some(VcpuSelector::All)),
        other => other,
    };
    let received = receive(&mut client, vm, vcpus, true)?;
    // The stats come from the kernel, through the fds; the connection stays
    // for the sampler's derived values (mapped bytes, our exit rates,
    // phases), when the VMM runs a sampler, and to see the VMM go: the fds
    // keep the VM's stats readable (and still) after it exits.
    let mut link = Link::probe(client, pid);
    let names = config
        .names
        .clone()
        .unwrap_or_else(|| DEFAULT_NAMES.iter().map(|s| s.to_string()).collect());
    let filter = names_filter(Some(names))?;
    if config.names.is_some() {
        warn_missing(&received, &filter);
    }
    let mut older = sample_all(&received)?;
    let mut refresh = 0u64;
    while config.count.is_none_or(|n| refresh < n) {
        std::thread::sleep(config.interval);
        let newer = sample_all(&received)?;
        refresh += 1;
        // Asked before anything is drawn: a VMM that exited ends the view.
        let sampled = link.refresh()?;
        if config.clear {
            write!(out, "\x1b[H\x1b[2J")?;
        }
        writeln!(
            out,
            "kvmscope watch: VM {name:?}, VMM pid {pid}, every {:?}, refresh {refresh}",
            config.interval
        )?;
        match (&link, sampled) {
            (Link::Sampler(d), fresh) => d.show(fresh, out)?,
            (Link::Dropped(_), _) => writeln!(
                out,
                "(the VMM closed this client's connection and runs on: its stats are still read through the fds, its sampler no longer)"
            )?,
            (Link::Plain(..), _) => {}
        }
        for ((r, old), new) in received.iter().zip(&older).zip(&newer) {
            if !r.shows_any(&filter) {
                continue;
            }
            let schema = r.stats.schema();
            let delta = kvm_stats::delta(schema, old, new);
            writeln!(out, "== {} ({}) ==", r.label(), schema.id())?;
            let (kept, left_out) = table_filter(r, new, &filter);
            write!(
                out,
                "{}",
                kvm_stats::format::delta_table_with(schema, &delta, &kept, r.shown())
            )?;
            if left_out {
                writeln!(out, "{UNMEASURED}")?;
            }
        }
        out.flush()?;
        older = newer;
    }
    Ok(())
}

/// What the connection to the VMM still gives after the fds came.
enum Link {
    /// The sampler's values, asked for each refresh.
    Sampler(Derived),
    /// No sampler: kept open only to see the VMM (this pid) go.
    Plain(Client, u64),
    /// The VMM closed the connection and ran on (it dropped this client,
    /// or it is on its way out: its pid is looked at every refresh).
    Dropped(u64),
}

impl Link {
    /// The sampler's values if the VMM runs a sampler; else the plain
    /// connection.
    fn probe(mut client: Client, pid: u64) -> Link {
        match client.query_samples(0, Some(1)) {
            Ok(page) => Link::Sampler(Derived::new(client, pid, page.header.header)),
            Err(_) => Link::Plain(client, pid),
        }
    }

    /// Asks the sampler for its newest point, or looks whether the VMM hung
    /// up; returns whether the sampler had a new point. A hang-up by a VMM
    /// that is gone ends the view ([`Error::VmmExited`]); one that runs on
    /// leaves the view on its fds.
    fn refresh(&mut self) -> Result<bool, Error> {
        let (result, pid) = match self {
            Link::Sampler(d) => (d.take(), d.pid),
            Link::Plain(c, pid) => (c.take_events().map(|_| false), *pid),
            Link::Dropped(pid) if gone(*pid) => return Err(Error::VmmExited(*pid)),
            Link::Dropped(_) => return Ok(false),
        };
        match result {
            Err(Error::Closed) if gone(pid) => Err(Error::VmmExited(pid)),
            Err(Error::Closed) => {
                // A VMM closes its clients first when it stops, then ends
                // its run: not gone yet is not running on.
                *self = Link::Dropped(pid);
                Ok(false)
            }
            other => other,
        }
    }
}

/// Whether process `pid` has exited (a VMM runs on this host: its fds came
/// over a Unix socket): no such process, or one that is a zombie (exited,
/// its parent has not reaped it yet).
fn gone(pid: u64) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    // "PID (COMM) STATE ...": COMM may hold spaces and parentheses.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next());
    matches!(state, Some("Z" | "X"))
}

/// The sampler's derived values, read with `query-samples` each refresh.
struct Derived {
    client: Client,
    pid: u64,
    last: u64,
    /// The newest point seen, shown again (marked) when no tick came since.
    point: Option<SampleRecord>,
    backend: String,
    quiet: Vec<String>,
}

impl Derived {
    fn new(client: Client, pid: u64, header: SeriesHeader) -> Derived {
        Derived {
            client,
            pid,
            last: 0,
            point: None,
            // The VMM's words, shown on the user's terminal.
            backend: header.backend_info().map_or_else(
                || "?".to_string(),
                |b| crate::units::peer_text(b.description.as_bytes(), 200),
            ),
            quiet: header
                .quiet_stats
                .iter()
                .map(|q| crate::units::peer_text(q.as_bytes(), 100))
                .collect(),
        }
    }

    /// Asks for the points since the last; whether a new one came.
    fn take(&mut self) -> Result<bool, Error> {
        let page = self.client.query_samples(self.last, Some(1))?;
        let Some(p) = page.samples.into_iter().last() else {
            return Ok(false);
        };
        self.last = p.seq;
        self.point = Some(p);
        Ok(true)
    }

    fn show(&self, fresh: bool, out: &mut dyn Write) -> Result<(), Error> {
        let Some(p) = &self.point else {
            writeln!(out, "== sampler (no tick yet, backend {}) ==", self.backend)?;
            return Ok(());
        };
        let stale = if fresh {
            ""
        } else {
            ", no new tick since the last refresh"
        };
        writeln!(
            out,
            "== sampler (tick {}{stale}, backend {}) ==",
            self.last, self.backend
        )?;
        writeln!(
            out,
            "mapped          {:>12}   4k={} 2m={} 1g={}",
            format_bytes(p.mapped_bytes),
            p.pages_4k,
            p.pages_2m,
            p.pages_1g
        )?;
        for (i, v) in p.vcpus.iter().enumerate() {
            // The guest marks a command as it starts it: the last one
            // started, which may have ended (the series has no vCPU state).
            let (seq, code) = abi::phase_parts(v.phase);
            let phase = match abi::command_name(code) {
                Some(name) => format!("#{seq} {name}"),
                None => "-".to_string(),
            };
            // A rate the sampler could not take (null) shows as 0.
            let rate = |r: f64| if r.is_nan() { 0.0 } else { r };
            writeln!(
                out,
                "vcpu{i:<3}  last command {phase:<14} KVM exits {:>10.1}/s   our exits {:>10.1}/s",
                rate(v.exits_per_s),
                rate(v.our_exits_per_s)
            )?;
        }
        if !self.quiet.is_empty() {
            writeln!(
                out,
                "note: on this backend {} stay 0 even when the event happens",
                self.quiet.join(", ")
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::gone;

    #[test]
    fn a_process_is_gone_once_it_exited_even_before_it_is_reaped() {
        assert!(!gone(u64::from(std::process::id())));
        assert!(gone(u64::from(u32::MAX)), "no such process");
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = u64::from(child.id());
        // Not reaped: a zombie until `wait`.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !gone(pid) {
            assert!(
                std::time::Instant::now() < deadline,
                "pid {pid} never read as gone"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        child.wait().unwrap();
    }
}
