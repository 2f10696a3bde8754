//! A VMM's own exit counters summed over its vCPUs: what the exporter's page
//! always shows (`kvmscope_vmm_vm_exits_<reason>_total`, twelve lines per
//! VM); the per-vCPU counters only with `--vcpu-exits` (twelve per vCPU: on a
//! host of 4-vCPU VMs they were most of the VMMs' own lines, and a fleet's
//! dashboards ask for exits per VM).

use kvm_stats::{Descriptor, Sample, Schema, StatId, StatType, StatsFd};

/// Whether a VMM vCPU stat is one of its exit counters.
pub(crate) fn is_exit_counter(name: &str) -> bool {
    name.starts_with("exits_")
}

/// The exit counters of one VMM's vCPU files, summed.
#[derive(Debug, Default)]
pub(crate) struct ExitSums {
    /// Each counter's descriptor (the first vCPU file's) and its sum, as
    /// the page's listed sources take them.
    pub(crate) sums: Vec<(Descriptor, Vec<u64>)>,
    /// Where each counter is in each vCPU file: `ids[k][v]` for counter `k`
    /// in vCPU `v`'s file, `None` where that file lacks it.
    ids: Vec<Vec<Option<StatId>>>,
}

impl ExitSums {
    /// The counters of `vcpus`' files: every single-valued cumulative stat
    /// named `exits_*` of the first file, looked up by name in the others
    /// (a VMM's vCPU files share one layout; one that does not still sums
    /// right). A name the VMM's VM file `vm` has itself is left to it: the
    /// page would otherwise carry one series twice, and Prometheus refuses
    /// such a page whole.
    pub(crate) fn of(vm: &Schema, vcpus: &[(StatsFd, Sample)]) -> ExitSums {
        let Some((first, _)) = vcpus.first() else {
            return ExitSums::default();
        };
        let (sums, ids) = first
            .schema()
            .iter()
            .filter(|(_, d)| {
                is_exit_counter(&d.name)
                    && d.kind == StatType::Cumulative
                    && d.size == 1
                    && vm.find(&d.name).is_none()
            })
            .map(|(_, d)| {
                let ids = vcpus
                    .iter()
                    .map(|(fd, _)| {
                        fd.schema()
                            .find(&d.name)
                            .filter(|&id| fd.schema().get(id).is_some_and(|o| o.size == 1))
                    })
                    .collect();
                ((d.clone(), vec![0]), ids)
            })
            .unzip();
        ExitSums { sums, ids }
    }

    /// Sums the counters of `vcpus`' latest samples (the files `of` was
    /// given, in the same order).
    pub(crate) fn update(&mut self, vcpus: &[(StatsFd, Sample)]) {
        for ((_, sum), ids) in self.sums.iter_mut().zip(&self.ids) {
            sum[0] = ids
                .iter()
                .zip(vcpus)
                .filter_map(|(id, (_, sample))| sample.values((*id)?).first().copied())
                .fold(0u64, u64::saturating_add);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvm_stats::builder::StatsFileBuilder;

    fn read(b: &StatsFileBuilder) -> (StatsFd, Sample) {
        use std::io::{Seek, Write};
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&b.build()).unwrap();
        f.rewind().unwrap();
        let fd = StatsFd::new(f).unwrap();
        let mut sample = fd.new_sample();
        fd.read_sample(&mut sample).unwrap();
        (fd, sample)
    }

    fn vm(counters: &[&str]) -> Schema {
        let b = counters.iter().fold(
            StatsFileBuilder::new("kvmscope-1").counter("published_at_ns", 1),
            |b, c| b.counter(c, 5),
        );
        read(&b).0.schema().clone()
    }

    fn vcpu(name: &str, io_out: u64, hlt: u64) -> (StatsFd, Sample) {
        read(
            &StatsFileBuilder::new(name)
                .counter("exits_io_out", io_out)
                .counter("guest_stall_ns", 7)
                .counter("exits_hlt", hlt),
        )
    }

    #[test]
    fn each_exit_counter_is_summed_over_the_vcpus_and_nothing_else_is() {
        let vcpus = [
            vcpu("kvmscope-1/vcpu-0", 3, 1),
            vcpu("kvmscope-1/vcpu-1", 40, 0),
            vcpu("kvmscope-1/vcpu-2", 500, 2),
        ];
        let mut sums = ExitSums::of(&vm(&[]), &vcpus);
        sums.update(&vcpus);
        let got: Vec<(&str, u64)> = sums
            .sums
            .iter()
            .map(|(d, v)| (d.name.as_str(), v[0]))
            .collect();
        assert_eq!(got, [("exits_io_out", 543), ("exits_hlt", 3)]);
    }

    #[test]
    fn a_vcpu_file_without_a_counter_adds_nothing_to_it() {
        let odd = read(&StatsFileBuilder::new("kvmscope-1/vcpu-1").counter("exits_hlt", 9));
        let vcpus = [vcpu("kvmscope-1/vcpu-0", 3, 1), odd];
        let mut sums = ExitSums::of(&vm(&[]), &vcpus);
        sums.update(&vcpus);
        let got: Vec<u64> = sums.sums.iter().map(|(_, v)| v[0]).collect();
        assert_eq!(got, [3, 10]);
    }

    #[test]
    fn a_counter_the_vm_file_has_itself_is_not_summed() {
        let vcpus = [
            vcpu("kvmscope-1/vcpu-0", 3, 1),
            vcpu("kvmscope-1/vcpu-1", 4, 1),
        ];
        let sums = ExitSums::of(&vm(&["exits_hlt"]), &vcpus);
        let names: Vec<&str> = sums.sums.iter().map(|(d, _)| d.name.as_str()).collect();
        assert_eq!(names, ["exits_io_out"]);
    }

    #[test]
    fn no_vcpus_no_sums() {
        assert!(ExitSums::of(&vm(&[]), &[]).sums.is_empty());
    }
}
