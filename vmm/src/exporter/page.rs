//! The exporter's page: every provider's figures (each kvmscope VM's stats
//! fds read with one `pread` per scrape, each QEMU VM's latest `query-stats`),
//! the kvmscope VMMs' own stats, then every KVM stat of every VM and vCPU,
//! and the scrape's own cost.
//!
//! Names and units follow `crate::metrics` (the same `kvmscope_kvm_vm_*` and
//! `kvmscope_kvm_vcpu_*` families as a VMM's own `/metrics`), labelled by
//! `vm` (the VM's name), `pid` and `socket`, and `vcpu` on vCPU stats.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::provider::{Figures, Provider};
use crate::metrics::{write_sources, Whose};

/// How old the open-fd count on the page may be: counting walks
/// `/proc/self/fd`, a thousand entries on a host of 100 VMs.
const OPEN_FDS_MAX_AGE: Duration = Duration::from_secs(1);

/// What the page keeps from one scrape to the next: running totals about
/// the exporter itself, and the last page's buffer.
#[derive(Debug, Default)]
pub(crate) struct Kept {
    /// Scrapes served.
    scrapes: u64,
    /// The last page, rendered again in place once no reply holds it: a
    /// host's page is megabytes, and a fresh buffer each scrape cost a page
    /// fault per 4 KiB written and an `munmap` after.
    page: Option<Arc<String>>,
    /// The exporter's open fds, and when they were counted.
    open_fds: Option<(Instant, u64)>,
    /// `--stats` patterns have been checked against the first page with a VM
    /// on it (those that matched nothing said once in the log).
    patterns_checked: bool,
}

impl Kept {
    /// An empty buffer for the next page: the last one's where no reply
    /// holds it any more, else a new one of its size.
    fn buffer(&mut self) -> String {
        match self.page.take().map(Arc::try_unwrap) {
            Some(Ok(mut text)) => {
                text.clear();
                text
            }
            Some(Err(held)) => String::with_capacity(held.len() + 4096),
            None => String::new(),
        }
    }

    /// The exporter's open fds, counted at most once per `OPEN_FDS_MAX_AGE`.
    fn open_fds(&mut self) -> u64 {
        match self.open_fds {
            Some((at, n)) if at.elapsed() < OPEN_FDS_MAX_AGE => n,
            _ => {
                let n = super::targets::open_fds();
                self.open_fds = Some((Instant::now(), n));
                n
            }
        }
    }
}

/// Reads every provider and renders the page.
pub(crate) fn render(
    providers: &mut [Box<dyn Provider>],
    kept: &mut Kept,
    filter: &kvm_stats::NameFilter,
) -> Arc<String> {
    let started = Instant::now();
    let mut text = kept.buffer();
    let out = &mut text;
    let figures: Vec<Box<dyn Figures + '_>> = providers.iter_mut().map(|p| p.read()).collect();
    kept.scrapes += 1;
    for f in &figures {
        f.write_families(out);
    }
    let _ = writeln!(out, "# HELP kvmscope_exporter_mapped_bytes Guest memory the KVM MMU maps (pages_4k/2m/1g in bytes): the non-zero RAM a migration would send, estimated without a scan (no bound for a VM that migrated in, until its guest touches its pages again: docs/READINESS.md).\n# TYPE kvmscope_exporter_mapped_bytes gauge");
    for (labels, bytes) in figures.iter().flat_map(|f| f.mapped_bytes()) {
        let _ = writeln!(out, "kvmscope_exporter_mapped_bytes{{{labels}}} {bytes}");
    }
    // Until the first page with a VM on it, every stat name is noted, to
    // tell `--stats` patterns that match nothing (a typo shows no line).
    let noting = !kept.patterns_checked && !filter.is_all();
    let names = std::cell::RefCell::new(HashSet::new());
    let keep = |name: &str| {
        if noting {
            names.borrow_mut().insert(name.to_string());
        }
        filter.matches(name)
    };
    let mut seen = HashSet::new();
    // The VMMs' own stats first, `--stats` choosing among them by name too:
    // their files were read last, and their samples are still in the cache.
    let vms: Vec<_> = figures.iter().flat_map(|f| f.vmm_vm_stats()).collect();
    let own_vm = Whose::Own { vcpu: false };
    write_sources(out, &vms, "kvmscope_vmm_vm_", own_vm, &mut seen, &keep);
    let sums: Vec<_> = figures.iter().flat_map(|f| f.vmm_exit_sums()).collect();
    let whose = Whose::OwnVcpuSum;
    write_sources(out, &sums, "kvmscope_vmm_vm_", whose, &mut seen, &keep);
    let vcpus: Vec<_> = figures.iter().flat_map(|f| f.vmm_vcpu_stats()).collect();
    let own_vcpu = Whose::Own { vcpu: true };
    write_sources(
        out,
        &vcpus,
        "kvmscope_vmm_vcpu_",
        own_vcpu,
        &mut seen,
        &keep,
    );
    let vms: Vec<_> = figures.iter().flat_map(|f| f.vm_stats()).collect();
    let kvm_vm = Whose::Kvm { vcpu: false };
    write_sources(out, &vms, "kvmscope_kvm_vm_", kvm_vm, &mut seen, &keep);
    let vcpus: Vec<_> = figures.iter().flat_map(|f| f.vcpu_stats()).collect();
    let kvm_vcpu = Whose::Kvm { vcpu: true };
    write_sources(
        out,
        &vcpus,
        "kvmscope_kvm_vcpu_",
        kvm_vcpu,
        &mut seen,
        &keep,
    );
    drop(figures);
    let names = names.into_inner();
    if noting && !names.is_empty() {
        kept.patterns_checked = true;
        for pattern in filter.unmatched(names.iter().map(String::as_str)) {
            log::warn!("exporter: --stats {pattern}: no stat of the VMs read so far matches it (the names are KVM's and the VMMs' own stat names, e.g. pages_4k, exits, halt_*)");
        }
    }
    let _ = writeln!(out, "# HELP kvmscope_exporter_scrapes_total Scrapes this exporter served.\n# TYPE kvmscope_exporter_scrapes_total counter\nkvmscope_exporter_scrapes_total {}", kept.scrapes);
    let _ = writeln!(out, "# HELP kvmscope_exporter_open_fds Fds the exporter has open (stats fds, control connections and the rest), counted at most once a second.\n# TYPE kvmscope_exporter_open_fds gauge\nkvmscope_exporter_open_fds {}", kept.open_fds());
    let _ = writeln!(out, "# HELP kvmscope_exporter_fd_limit The exporter's soft limit on open files; a VM whose stats fds would leave fewer than 64 free is not attached (up 0, see the log).\n# TYPE kvmscope_exporter_fd_limit gauge\nkvmscope_exporter_fd_limit {}", super::targets::fd_limit());
    let _ = writeln!(out, "# HELP kvmscope_exporter_scrape_duration_seconds Time this scrape took to read every fd and render the page.\n# TYPE kvmscope_exporter_scrape_duration_seconds gauge\nkvmscope_exporter_scrape_duration_seconds {}", started.elapsed().as_secs_f64());
    let page = Arc::new(text);
    kept.page = Some(page.clone());
    page
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrapes(page: &str) -> &str {
        page.lines()
            .find(|l| l.starts_with("kvmscope_exporter_scrapes_total "))
            .unwrap()
    }

    #[test]
    fn a_page_a_reply_still_holds_is_never_written_over_and_a_free_one_is_reused() {
        let (mut kept, filter) = (Kept::default(), kvm_stats::NameFilter::all());
        let first = render(&mut [], &mut kept, &filter);
        let at = first.as_ptr();
        // A reply still sending the first page: the second is rendered
        // elsewhere, and the first reads as it did.
        let second = render(&mut [], &mut kept, &filter);
        assert_ne!(second.as_ptr(), at);
        assert_eq!(scrapes(&first), "kvmscope_exporter_scrapes_total 1");
        assert_eq!(scrapes(&second), "kvmscope_exporter_scrapes_total 2");
        // Every reply done: the third is rendered in the second's buffer.
        let (at, capacity) = (second.as_ptr(), second.capacity());
        drop((first, second));
        let third = render(&mut [], &mut kept, &filter);
        assert_eq!((third.as_ptr(), third.capacity()), (at, capacity));
        assert_eq!(scrapes(&third), "kvmscope_exporter_scrapes_total 3");
    }
}
