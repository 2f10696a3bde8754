//! kvmscope VMMs as a provider: the stats fds discovery took from each
//! (`targets`), each read with one `pread` per scrape; a VM whose fd cannot be
//! read is dropped (its fds closed) and attached again by discovery.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard};

use kvm_stats::{Mapped, Sample, Schema, StatId, StatsFd};

use super::exit_sums::is_exit_counter;
use super::provider::{Figures, Provider};
use super::targets::{Registry, Target};
use crate::lock;
use crate::metrics::{label_value, Source, Values};
use crate::vmmstats::{self, VcpuStat, VmStat};

/// Every kvmscope VMM discovery attached, and what reading them has cost.
pub(crate) struct KvmscopeVms {
    registry: Arc<Mutex<Registry>>,
    /// The VMMs' exit counters per vCPU too, not only summed per VM.
    vcpu_exits: bool,
    /// Stats fds read, over all scrapes.
    fds_read: u64,
    /// Stats fd reads that failed (the VM is then dropped).
    read_errors: u64,
}

impl KvmscopeVms {
    /// The VMs of `registry`, which discovery keeps; their VMMs' exit
    /// counters summed per VM, and per vCPU too where `vcpu_exits`.
    pub(crate) fn new(registry: Arc<Mutex<Registry>>, vcpu_exits: bool) -> KvmscopeVms {
        KvmscopeVms {
            registry,
            vcpu_exits,
            fds_read: 0,
            read_errors: 0,
        }
    }
}

impl Provider for KvmscopeVms {
    fn read(&mut self) -> Box<dyn Figures + '_> {
        let mut reg = lock(&self.registry);
        let mut failed = Vec::new();
        // KVM's files of every VM, then the VMMs' own: those are read last
        // and their lines written first, so that their samples are still
        // in the cache (KVM's samples and lines are megabytes on a host of
        // 100 VMs); their mappings are asked for all at once before.
        for (path, t) in reg.targets.iter_mut() {
            if let Err(e) = t.read_kvm(&mut self.fds_read) {
                failed.push((path.clone(), e));
            }
        }
        reg.targets.values().for_each(Target::prefetch_own);
        for (path, t) in reg.targets.iter_mut() {
            if failed.iter().any(|(p, _)| p == path) {
                continue;
            }
            if let Err(e) = t.read_own(&mut self.fds_read) {
                failed.push((path.clone(), e));
            }
        }
        self.read_errors += failed.len() as u64;
        for (path, e) in failed {
            log::warn!(
                "exporter: dropping {}: reading its stats: {e}",
                path.display()
            );
            reg.targets.remove(&path);
        }
        Box::new(KvmscopeFigures {
            reg,
            vcpu_exits: self.vcpu_exits,
            fds_read: self.fds_read,
            read_errors: self.read_errors,
        })
    }
}

/// Stat `name`'s value in a VMM's own files, one file after another: the
/// name is looked up once per descriptor table (every VMM of one build
/// shares one), not once per file (hundreds per scrape).
struct OwnValue<'a> {
    name: &'static str,
    last: Option<(&'a Schema, Option<StatId>)>,
}

impl<'a> OwnValue<'a> {
    fn new(name: &'static str) -> OwnValue<'a> {
        OwnValue { name, last: None }
    }

    /// Its value in `file` (0 where the file has no such stat: an older VMM's).
    fn of(&mut self, file: &'a (StatsFd, Sample)) -> u64 {
        let (fd, sample) = file;
        let schema = fd.schema();
        let id = match self.last {
            Some((last, id)) if schema.shares_descriptors(last) => id,
            _ => {
                let id = schema.find(self.name);
                self.last = Some((schema, id));
                id
            }
        };
        id.and_then(|id| sample.values(id).first().copied())
            .unwrap_or(0)
    }
}

/// A migration's figures in a VMM's own VM stats, its status aside.
fn migration_figure(name: &str) -> bool {
    name.starts_with("migration_") && name != "migration_status"
}

/// What a VMM's own VM file leaves off the page: any `exits_*` stat always
/// (the page's `kvmscope_vmm_vm_exits_*` families are the vCPUs' counters
/// summed; a VM file's `exits_hlt`, or `exits_hlt_total`, would put one of
/// them on the page twice, which Prometheus refuses whole; our VMM's VM
/// file has none); the readiness figures until it has `MEASURED`, and a
/// migration's until one has begun (`MIGRATED`): a VMM that has not shows
/// none of them, rather than zeros that look like figures.
fn vm_file_hides<const MEASURED: bool, const MIGRATED: bool>(name: &str) -> bool {
    name.starts_with("exits_")
        || !MEASURED && vmmstats::is_readiness_figure(name)
        || !MIGRATED && migration_figure(name)
}

/// [`vm_file_hides`] for what this sample of the VM file says: `measured`
/// reads its `readiness_at_ns` (set once it has readiness figures, as
/// [`vmmstats::measured`] says), `status` its `migration_status`.
fn vm_file_hide<'a>(
    own: &'a (StatsFd, Sample),
    measured: &mut OwnValue<'a>,
    status: &mut OwnValue<'a>,
) -> fn(&str) -> bool {
    match (vmmstats::measured_at(measured.of(own)), status.of(own) != 0) {
        (true, true) => vm_file_hides::<true, true>,
        (false, true) => vm_file_hides::<false, true>,
        (true, false) => vm_file_hides::<true, false>,
        (false, false) => vm_file_hides::<false, false>,
    }
}

/// What a VMM's own vCPU file leaves off the page: its guest's progress
/// rate always (`guest_progress_per_second`: the page has the counter,
/// `..._guest_progress_total`, whose `rate()` Prometheus takes over any
/// range; a rate exported beside its counter is the anti-pattern
/// Prometheus's maintainers ask exporters to avoid), its exit counters
/// unless `EXITS` (`--vcpu-exits`), and its dirty limit's figures unless
/// `LIMITED` (`dirty_limit_bytes_per_second` 0: a limit of 0 bytes/s would
/// be a vCPU that may not write at all; QEMU's `query-vcpu-dirty-limit`
/// lists only the limited vCPUs too).
fn vcpu_file_hides<const EXITS: bool, const LIMITED: bool>(name: &str) -> bool {
    name == <&str>::from(VcpuStat::GuestProgressPerSecond)
        || !EXITS && is_exit_counter(name)
        || !LIMITED && name.starts_with("dirty_limit_")
}

/// [`vcpu_file_hides`] for what this sample of a vCPU file says.
fn vcpu_file_hide<'a>(
    own: &'a (StatsFd, Sample),
    limit: &mut OwnValue<'a>,
    vcpu_exits: bool,
) -> fn(&str) -> bool {
    let limited = limit.of(own) != 0;
    match (vcpu_exits, limited) {
        (true, true) => vcpu_file_hides::<true, true>,
        (false, true) => vcpu_file_hides::<false, true>,
        (true, false) => vcpu_file_hides::<true, false>,
        (false, false) => vcpu_file_hides::<false, false>,
    }
}

/// The registry, held while the page is written, with this scrape's samples.
struct KvmscopeFigures<'a> {
    reg: MutexGuard<'a, Registry>,
    vcpu_exits: bool,
    fds_read: u64,
    read_errors: u64,
}

impl Figures for KvmscopeFigures<'_> {
    /// `up`, info, guest RAM and mapped memory per VM (`up 0` for sockets
    /// that failed to attach), and the fds read.
    fn write_families(&self, out: &mut String) {
        let reg = &*self.reg;
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
        let _ = writeln!(out, "# HELP kvmscope_exporter_fds_read_total Stats fds read (one pread each) over all scrapes.\n# TYPE kvmscope_exporter_fds_read_total counter\nkvmscope_exporter_fds_read_total {}", self.fds_read);
        let _ = writeln!(out, "# HELP kvmscope_exporter_read_errors_total Stats fd reads that failed.\n# TYPE kvmscope_exporter_read_errors_total counter\nkvmscope_exporter_read_errors_total {}", self.read_errors);
    }

    fn mapped_bytes(&self) -> Vec<(&str, u64)> {
        self.reg
            .targets
            .values()
            .map(|t| {
                let (fd, sample) = &t.vm;
                (
                    t.labels.as_str(),
                    Mapped::from_sample(fd.schema(), sample).bytes(),
                )
            })
            .collect()
    }

    fn vm_stats(&self) -> Vec<Source<'_>> {
        self.reg
            .targets
            .values()
            .map(|t| Source::new(t.labels.as_str(), Values::Sampled(t.vm.0.schema(), &t.vm.1)))
            .collect()
    }

    fn vmm_vm_stats(&self) -> Vec<Source<'_>> {
        let mut measured = OwnValue::new(VmStat::ReadinessAtNs.into());
        let mut status = OwnValue::new(VmStat::MigrationStatus.into());
        self.reg
            .targets
            .values()
            .filter_map(|t| {
                let own = t.own.as_ref()?;
                let mut source = Source::new(
                    t.labels.as_str(),
                    Values::Sampled(own.vm.0.schema(), &own.vm.1),
                );
                source.hide = Some(vm_file_hide(&own.vm, &mut measured, &mut status));
                Some(source)
            })
            .collect()
    }

    fn vmm_exit_sums(&self) -> Vec<Source<'_>> {
        self.reg
            .targets
            .values()
            .filter_map(|t| {
                let sums = &t.own.as_ref()?.exit_sums;
                Some(Source::new(
                    t.labels.as_str(),
                    Values::Sampled(&sums.schema, &sums.sample),
                ))
            })
            .collect()
    }

    fn vmm_vcpu_stats(&self) -> Vec<Source<'_>> {
        let mut limit = OwnValue::new(VcpuStat::DirtyLimitBytesPerSecond.into());
        self.reg
            .targets
            .values()
            .filter_map(|t| {
                let own = &t.own.as_ref()?.vcpus;
                Some(vcpu_sources(&t.vcpu_labels, own).zip(own))
            })
            .flatten()
            .map(|(mut source, file)| {
                source.hide = Some(vcpu_file_hide(file, &mut limit, self.vcpu_exits));
                source
            })
            .collect()
    }

    fn vcpu_stats(&self) -> Vec<Source<'_>> {
        self.reg
            .targets
            .values()
            .flat_map(|t| vcpu_sources(&t.vcpu_labels, &t.vcpus))
            .collect()
    }
}

/// One source per vCPU stats file of a VM, each with its vCPU's labels
/// (`labels`, by index: made for every vCPU the VMM's greeting names, of
/// which the files are at most as many).
fn vcpu_sources<'a>(
    labels: &'a [String],
    vcpus: &'a [(StatsFd, Sample)],
) -> impl Iterator<Item = Source<'a>> {
    debug_assert!(labels.len() >= vcpus.len(), "a vCPU file without labels");
    labels.iter().zip(vcpus).map(|(labels, (fd, sample))| {
        Source::new(labels.as_str(), Values::Sampled(fd.schema(), sample))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exporter::targets::tests::{give_own_files, one_counter, target};

    #[test]
    fn a_vm_whose_kvm_file_fails_is_dropped_once_and_its_own_files_are_not_read() {
        let vm = one_counter("kvm-1", "pages_4k", 3);
        let vcpu = one_counter("kvm-1/vcpu-0", "exits", 1);
        let own_vm = one_counter("kvmscope-1/vm", "guest_stall_ns", 0);
        let own_vcpu = one_counter("kvmscope-1/vcpu-0", "exits_hlt", 2);
        let with_own = || {
            let mut t = target(&vm, &[&vcpu]);
            give_own_files(&mut t, &own_vm, &[&own_vcpu]);
            t
        };
        let (good, bad) = (with_own(), with_own());
        // The bad VM's vCPU file cut short under its reader: its read fails.
        bad.vcpus[0].0.file().set_len(8).unwrap();
        let registry = Arc::new(Mutex::new(Registry::default()));
        lock(&registry).targets.insert("good".into(), good);
        lock(&registry).targets.insert("bad".into(), bad);
        let mut vms = KvmscopeVms::new(Arc::clone(&registry), false);
        drop(vms.read());
        let reg = lock(&registry);
        let left: Vec<_> = reg.targets.keys().collect();
        assert_eq!(left, [std::path::Path::new("good")]);
        assert_eq!(vms.read_errors, 1, "one VM failed, counted once");
        // The good VM's four files, and the bad one's two KVM files (the
        // second of which failed); none of its own.
        assert_eq!(vms.fds_read, 6);
        let sums = &reg.targets[std::path::Path::new("good")]
            .own
            .as_ref()
            .unwrap()
            .exit_sums;
        let hlt = sums.schema.find("exits_hlt").unwrap();
        assert_eq!(sums.sample.u64(hlt), 2, "the good VM's own files were read");
    }
}
