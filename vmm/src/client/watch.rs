//! `kvmscope watch`: a live, top-like view of selected stats with per-second
//! rates, read through stats fds received once.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use super::stats::{names_filter, receive, sample_all, table_filter, warn_missing, UNMEASURED};
use super::{Client, Error, REPLY_TIMEOUT};
use crate::abi;
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
    client.set_timeout(Some(REPLY_TIMEOUT))?;
    let pid = u64::from(client.greeting.qmp.kvmscope.vm.pid);
    let (vm, vcpus) = match (config.vm, config.vcpus) {
        (false, None) => (true, Some(VcpuSelector::All)),
        other => other,
    };
    let received = receive(&mut client, vm, vcpus, true)?;
    // The stats come from the kernel, through the fds; the connection stays
    // only for the sampler's derived values (mapped bytes, our exit rates,
    // phases), when the VMM runs a sampler.
    let mut sampler = Derived::probe(client);
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
        if config.clear {
            write!(out, "\x1b[H\x1b[2J")?;
        }
        writeln!(
            out,
            "kvmscope watch: VMM pid {pid}, every {:?}, refresh {refresh}",
            config.interval
        )?;
        if let Some(d) = sampler.as_mut() {
            d.show(out)?;
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

/// The sampler's derived values, read with `query-samples` each refresh.
struct Derived {
    client: Client,
    last: u64,
    backend: String,
    quiet: Vec<String>,
}

impl Derived {
    /// Keeps the connection if the VMM runs a sampler.
    fn probe(mut client: Client) -> Option<Derived> {
        let page = client.query_samples(0, Some(1)).ok()?;
        let header = page.header.header;
        Some(Derived {
            client,
            last: 0,
            backend: header
                .backend_info()
                .map_or_else(|| "?".to_string(), |b| b.description),
            quiet: header.quiet_stats,
        })
    }

    fn show(&mut self, out: &mut dyn Write) -> Result<(), Error> {
        let page = self.client.query_samples(self.last, Some(1))?;
        let Some(p) = page.samples.last() else {
            return Ok(());
        };
        self.last = p.seq;
        writeln!(
            out,
            "== sampler (tick {}, backend {}) ==",
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
