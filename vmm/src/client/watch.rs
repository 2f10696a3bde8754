//! `kvmscope watch`: a live, top-like view of selected stats with per-second
//! rates, read through stats fds received once.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use kvm_stats::NameFilter;

use super::stats::{receive, sample_all, warn_missing};
use super::{Client, Error, REPLY_TIMEOUT};
use crate::control::request::VcpuSelector;

/// Shown when no `--names` are given: what the guest's workloads move.
pub const DEFAULT_NAMES: &[&str] = &[
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
    pub socket: PathBuf,
    pub interval: Duration,
    /// Stats to show (`DEFAULT_NAMES` when `None`).
    pub names: Option<Vec<String>>,
    /// Stop after this many refreshes.
    pub count: Option<u64>,
    pub vm: bool,
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
    let pid = client.greeting["QMP"]["vm"]["pid"].as_u64().unwrap_or(0);
    let (vm, vcpus) = match (config.vm, config.vcpus) {
        (false, None) => (true, Some(VcpuSelector::All)),
        other => other,
    };
    let received = receive(&mut client, vm, vcpus)?;
    // Everything from here on comes from the kernel, through the fds.
    drop(client);
    let names = config
        .names
        .clone()
        .unwrap_or_else(|| DEFAULT_NAMES.iter().map(|s| s.to_string()).collect());
    let filter = NameFilter::names(names);
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
        for ((r, old), new) in received.iter().zip(&older).zip(&newer) {
            let schema = r.stats.schema();
            let delta = kvm_stats::delta(schema, old, new);
            writeln!(out, "== {} ({}) ==", r.label(), schema.id())?;
            write!(
                out,
                "{}",
                kvm_stats::format::delta_table(schema, &delta, &filter)
            )?;
        }
        out.flush()?;
        older = newer;
    }
    Ok(())
}
