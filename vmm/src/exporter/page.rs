//! The exporter's page: every provider's figures (each kvmscope VM's stats
//! fds read with one `pread` per scrape, each QEMU VM's latest `query-stats`),
//! then every KVM stat of every VM and vCPU, and the scrape's own cost.
//!
//! Names and units follow `crate::metrics` (the same `kvmscope_kvm_vm_*` and
//! `kvmscope_kvm_vcpu_*` families as a VMM's own `/metrics`), labelled by
//! `vm` (the VM's name), `pid` and `socket`, and `vcpu` on vCPU stats.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::time::Instant;

use super::provider::{Figures, Provider};
use crate::metrics::write_sources;

/// Running totals the page reports about the exporter itself.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// Scrapes served.
    pub(crate) scrapes: u64,
    /// The last page's length: the next one is allocated at that size.
    pub(crate) last_len: usize,
}

/// Reads every provider and renders the page.
pub(crate) fn render(
    providers: &mut [Box<dyn Provider>],
    counters: &mut Counters,
    filter: &kvm_stats::NameFilter,
) -> String {
    let started = Instant::now();
    let figures: Vec<Box<dyn Figures + '_>> = providers.iter_mut().map(|p| p.read()).collect();
    counters.scrapes += 1;
    let mut out = String::with_capacity(counters.last_len + 4096);
    for f in &figures {
        f.write_families(&mut out);
    }
    let keep = |name: &str| filter.matches(name);
    let mut seen = HashSet::new();
    let vms: Vec<_> = figures.iter().flat_map(|f| f.vm_stats()).collect();
    write_sources(&mut out, &vms, "kvmscope_kvm_vm_", &mut seen, &keep);
    let vcpus: Vec<_> = figures.iter().flat_map(|f| f.vcpu_stats()).collect();
    write_sources(&mut out, &vcpus, "kvmscope_kvm_vcpu_", &mut seen, &keep);
    // The VMMs' own stats, `--stats` choosing among them by name too.
    let vms: Vec<_> = figures.iter().flat_map(|f| f.vmm_vm_stats()).collect();
    write_sources(&mut out, &vms, "kvmscope_vmm_vm_", &mut seen, &keep);
    let vcpus: Vec<_> = figures.iter().flat_map(|f| f.vmm_vcpu_stats()).collect();
    write_sources(&mut out, &vcpus, "kvmscope_vmm_vcpu_", &mut seen, &keep);
    drop(figures);
    let _ = writeln!(out, "# HELP kvmscope_exporter_scrapes_total Scrapes this exporter served.\n# TYPE kvmscope_exporter_scrapes_total counter\nkvmscope_exporter_scrapes_total {}", counters.scrapes);
    let _ = writeln!(out, "# HELP kvmscope_exporter_open_fds Fds the exporter has open (stats fds, control connections and the rest).\n# TYPE kvmscope_exporter_open_fds gauge\nkvmscope_exporter_open_fds {}", super::targets::open_fds());
    let _ = writeln!(out, "# HELP kvmscope_exporter_fd_limit The exporter's soft limit on open files; a VM whose stats fds would leave fewer than 64 free is not attached (up 0, see the log).\n# TYPE kvmscope_exporter_fd_limit gauge\nkvmscope_exporter_fd_limit {}", super::targets::fd_limit());
    let _ = writeln!(out, "# HELP kvmscope_exporter_scrape_duration_seconds Time this scrape took to read every fd and render the page.\n# TYPE kvmscope_exporter_scrape_duration_seconds gauge\nkvmscope_exporter_scrape_duration_seconds {}", started.elapsed().as_secs_f64());
    counters.last_len = out.len();
    out
}
