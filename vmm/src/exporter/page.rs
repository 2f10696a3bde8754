//! The exporter's page: every KVM stat of every VM and vCPU it reads, one
//! `pread` per stats fd per scrape, plus the figures that matter for
//! migration decisions and the scrape's own cost.
//!
//! Names and units follow `crate::metrics` (the same `kvmscope_kvm_vm_*` and
//! `kvmscope_kvm_vcpu_*` families as a VMM's own `/metrics`), labelled by
//! `vm` (the VM's name), `pid` and `socket`, and `vcpu` on vCPU stats.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::time::Instant;

use kvm_stats::{Mapped, Sample, StatsFd};

use super::qemu::QemuVm;
use super::targets::Registry;
use crate::metrics::{label_value, write_sources};

/// Running totals the page reports about the exporter itself.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// Scrapes served.
    pub(crate) scrapes: u64,
    /// Stats fds read, over all scrapes.
    pub(crate) fds_read: u64,
    /// Stats fd reads that failed (the VM is then dropped).
    pub(crate) read_errors: u64,
    /// The last page's length: the next one is allocated at that size.
    pub(crate) last_len: usize,
}

/// Reads every attached VM's stats fds and renders the page. A VM whose fd
/// cannot be read is dropped from the registry (and its fds closed).
pub(crate) fn render(
    reg: &mut Registry,
    qemu: &[QemuVm],
    counters: &mut Counters,
    filter: &kvm_stats::NameFilter,
) -> String {
    let started = Instant::now();
    let mut failed = Vec::new();
    for (path, t) in reg.targets.iter_mut() {
        let reads = std::iter::once(&mut t.vm).chain(t.vcpus.iter_mut());
        for (fd, sample) in reads {
            counters.fds_read += 1;
            if let Err(e) = fd.read_sample(sample) {
                counters.read_errors += 1;
                failed.push((path.clone(), e));
                break;
            }
        }
    }
    for (path, e) in failed {
        log::warn!(
            "exporter: dropping {}: reading its stats: {e}",
            path.display()
        );
        reg.targets.remove(&path);
    }
    counters.scrapes += 1;
    let mut out = String::with_capacity(counters.last_len + 4096);
    write_vms(&mut out, reg);
    write_qemu_vms(&mut out, qemu);
    write_kvm_stats(&mut out, reg, qemu, filter);
    let _ = writeln!(out, "# HELP kvmscope_exporter_scrapes_total Scrapes this exporter served.\n# TYPE kvmscope_exporter_scrapes_total counter\nkvmscope_exporter_scrapes_total {}", counters.scrapes);
    let _ = writeln!(out, "# HELP kvmscope_exporter_fds_read_total Stats fds read (one pread each) over all scrapes.\n# TYPE kvmscope_exporter_fds_read_total counter\nkvmscope_exporter_fds_read_total {}", counters.fds_read);
    let _ = writeln!(out, "# HELP kvmscope_exporter_open_fds Fds the exporter has open (stats fds, control connections and the rest).\n# TYPE kvmscope_exporter_open_fds gauge\nkvmscope_exporter_open_fds {}", super::targets::open_fds());
    let _ = writeln!(out, "# HELP kvmscope_exporter_fd_limit The exporter's soft limit on open files; a VM whose stats fds would leave fewer than 64 free is not attached (up 0, see the log).\n# TYPE kvmscope_exporter_fd_limit gauge\nkvmscope_exporter_fd_limit {}", super::targets::fd_limit());
    let _ = writeln!(out, "# HELP kvmscope_exporter_read_errors_total Stats fd reads that failed.\n# TYPE kvmscope_exporter_read_errors_total counter\nkvmscope_exporter_read_errors_total {}", counters.read_errors);
    let _ = writeln!(out, "# HELP kvmscope_exporter_scrape_duration_seconds Time this scrape took to read every fd and render the page.\n# TYPE kvmscope_exporter_scrape_duration_seconds gauge\nkvmscope_exporter_scrape_duration_seconds {}", started.elapsed().as_secs_f64());
    counters.last_len = out.len();
    out
}

/// `up`, info, guest RAM and mapped memory per VM; `up 0` for sockets that
/// failed to attach.
fn write_vms(out: &mut String, reg: &Registry) {
    let _ = writeln!(out, "# HELP kvmscope_exporter_vm_up 1 for a VM whose stats fds this exporter reads, 0 for a socket it could not attach to (see the log).\n# TYPE kvmscope_exporter_vm_up gauge");
    for t in reg.targets.values() {
        let _ = writeln!(out, "kvmscope_exporter_vm_up{{{}}} 1", t.labels);
    }
    for path in reg.failures.iter().filter(|(_, f)| f.down).map(|(p, _)| p) {
        let _ = writeln!(
            out,
            "kvmscope_exporter_vm_up{{socket=\"{}\"}} 0",
            label_value(&path.to_string_lossy())
        );
    }
    let _ = writeln!(out, "# HELP kvmscope_exporter_vm_info The VM's provider (kvmscope: stats fds, no vCPU kicked) and KVM backend.\n# TYPE kvmscope_exporter_vm_info gauge");
    for t in reg.targets.values() {
        let _ = writeln!(
            out,
            "kvmscope_exporter_vm_info{{{},provider=\"kvmscope\",backend=\"{}\",vcpus=\"{}\"}} 1",
            t.labels,
            label_value(&t.backend),
            t.vcpus.len()
        );
    }
    let _ = writeln!(out, "# HELP kvmscope_exporter_guest_memory_bytes Guest RAM of the VM.\n# TYPE kvmscope_exporter_guest_memory_bytes gauge");
    for t in reg.targets.values() {
        let _ = writeln!(
            out,
            "kvmscope_exporter_guest_memory_bytes{{{}}} {}",
            t.labels, t.memory
        );
    }
    let _ = writeln!(out, "# HELP kvmscope_exporter_mapped_bytes Guest memory the KVM MMU maps (pages_4k/2m/1g in bytes): the non-zero RAM a migration would send, estimated without a scan.\n# TYPE kvmscope_exporter_mapped_bytes gauge");
    for t in reg.targets.values() {
        let (fd, sample) = &t.vm;
        let mapped = Mapped::from_sample(fd.schema(), sample);
        let _ = writeln!(
            out,
            "kvmscope_exporter_mapped_bytes{{{}}} {}",
            t.labels,
            mapped.bytes()
        );
    }
}

/// QEMU VMs: `up`, info (provider `qemu-qmp`), and how old their figures are.
fn write_qemu_vms(out: &mut String, qemu: &[QemuVm]) {
    if qemu.is_empty() {
        return;
    }
    let _ = writeln!(out, "# HELP kvmscope_exporter_qemu_up 1 for a QEMU monitor whose last query-stats answered, else 0.\n# TYPE kvmscope_exporter_qemu_up gauge");
    for q in qemu {
        let up = u8::from(q.at.is_some() && q.error.is_none());
        let _ = writeln!(out, "kvmscope_exporter_qemu_up{{{}}} {up}", q.labels);
    }
    let _ = writeln!(out, "# HELP kvmscope_exporter_qemu_info A QEMU VM read over QMP query-stats (provider qemu-qmp): values are as old as kvmscope_exporter_qemu_age_seconds; vCPU stats only with --qmp-vcpus. vcpu_kicks=\"1\": this QEMU (before 8.1) kicks every vCPU out of the guest for each refresh of them; 8.1 and later pread a stats fd kept open.\n# TYPE kvmscope_exporter_qemu_info gauge");
    for q in qemu.iter().filter(|q| q.at.is_some()) {
        let (major, minor, micro) = q.version;
        let _ = writeln!(
            out,
            "kvmscope_exporter_qemu_info{{{},provider=\"qemu-qmp\",qemu_version=\"{major}.{minor}.{micro}\",vcpus_read=\"{}\",vcpu_kicks=\"{}\"}} 1",
            q.labels,
            q.vcpus.len(),
            u8::from(!q.vcpus.is_empty() && q.vcpu_query_kicks())
        );
    }
    let _ = writeln!(out, "# HELP kvmscope_exporter_qemu_age_seconds Age of the QEMU VM's figures on this page.\n# TYPE kvmscope_exporter_qemu_age_seconds gauge");
    for q in qemu {
        if let Some(at) = q.at {
            let _ = writeln!(
                out,
                "kvmscope_exporter_qemu_age_seconds{{{}}} {}",
                q.labels,
                at.elapsed().as_secs_f64()
            );
        }
    }
}

/// Every KVM stat, grouped by stat across all VMs (the text format wants one
/// family together), VM stats then vCPU stats.
fn write_kvm_stats(
    out: &mut String,
    reg: &Registry,
    qemu: &[QemuVm],
    filter: &kvm_stats::NameFilter,
) {
    let mut vms: Vec<(&StatsFd, &Sample)> = Vec::new();
    let mut vm_labels_of = Vec::new();
    let mut vcpus: Vec<(&StatsFd, &Sample)> = Vec::new();
    let mut vcpu_labels_of = Vec::new();
    for t in reg.targets.values() {
        let labels = &t.labels;
        vms.push((&t.vm.0, &t.vm.1));
        vm_labels_of.push(labels.clone());
        for (i, (fd, sample)) in t.vcpus.iter().enumerate() {
            vcpus.push((fd, sample));
            vcpu_labels_of.push(format!("{labels},vcpu=\"{i}\""));
        }
    }
    let read: Vec<&QemuVm> = qemu.iter().filter(|q| q.at.is_some()).collect();
    let qemu_vms: Vec<(String, &[_])> = read
        .iter()
        .map(|q| (q.labels.clone(), q.vm.as_slice()))
        .collect();
    let qemu_vcpus: Vec<(String, &[_])> = read
        .iter()
        .flat_map(|q| {
            let labels = &q.labels;
            q.vcpus.iter().enumerate().map(move |(i, (path, r))| {
                let vcpu = format!("{labels},vcpu=\"{i}\",qom_path=\"{}\"", label_value(path));
                (vcpu, r.as_slice())
            })
        })
        .collect();
    let mut seen = HashSet::new();
    let keep = |name: &str| filter.matches(name);
    write_sources(
        out,
        &vms,
        "kvmscope_kvm_vm_",
        &vm_labels_of,
        &qemu_vms,
        &mut seen,
        &keep,
    );
    write_sources(
        out,
        &vcpus,
        "kvmscope_kvm_vcpu_",
        &vcpu_labels_of,
        &qemu_vcpus,
        &mut seen,
        &keep,
    );
}
