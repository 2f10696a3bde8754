//! An exporter over one socket directory, and its page, for the exporter tests.

use std::path::Path;
use std::time::Duration;

use kvmscope::exporter::{Exporter, ExporterConfig};

/// An exporter on a free local port reading every socket in `dir`, every
/// stat (the VMMs' exit counters per vCPU too), no QEMU monitor.
pub fn over(dir: &Path, attach_timeout: Duration) -> Exporter {
    start(config(dir, attach_timeout))
}

/// The configuration `over` starts with.
pub fn config(dir: &Path, attach_timeout: Duration) -> ExporterConfig {
    ExporterConfig {
        listen: ([127, 0, 0, 1], 0).into(),
        dirs: vec![dir.to_path_buf()],
        sockets: vec![],
        attach_timeout,
        stats: kvm_stats::NameFilter::all(),
        qmp_sockets: vec![],
        qmp_interval: Duration::from_secs(5),
        qmp_vcpus: false,
        vcpu_exits: true,
    }
}

/// An exporter as `config` says.
pub fn start(config: ExporterConfig) -> Exporter {
    Exporter::start(config).expect("the exporter starts")
}

/// The exporter's page now.
pub fn page(e: &Exporter) -> String {
    super::scrape(e.addr.port()).expect("the exporter serves its page")
}

/// `kvmscope_exporter_vm_up` of the VM whose socket path holds `socket`.
pub fn up(page: &str, socket: &str) -> Option<f64> {
    page.lines()
        .filter(|l| l.starts_with("kvmscope_exporter_vm_up{") && l.contains(socket))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}
