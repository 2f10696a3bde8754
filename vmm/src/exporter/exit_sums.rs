//! A VMM's own exit counters summed over its vCPUs: what the exporter's page
//! always shows (`kvmscope_vmm_vm_exits_<reason>_total`, twelve lines per
//! VM); the per-vCPU counters only with `--vcpu-exits` (twelve per vCPU: on a
//! host of 4-vCPU VMs they were most of the VMMs' own lines, and a fleet's
//! dashboards ask for exits per VM).

use kvm_stats::{Descriptor, Sample, StatId, StatType, StatsFd};

use crate::exits::Reason;

/// Whether a VMM vCPU stat is one of the exit counters the page sums per VM
/// (`exits_<reason>` of a known reason): the page shows them per vCPU only
/// with `--vcpu-exits`.
pub(crate) fn is_exit_counter(name: &str) -> bool {
    name.strip_prefix("exits_")
        .is_some_and(|reason| Reason::ALL.iter().any(|r| r.label() == reason))
}

/// The exit counters of one VMM's vCPU files, summed.
#[derive(Debug, Default)]
pub(crate) struct ExitSums {
    /// Each counter's descriptor (the first vCPU file's) and its sum, as
    /// the page's listed sources take them.
    pub(crate) sums: Vec<(Descriptor, Vec<u64>)>,
    /// Where each counter is in each vCPU file that has it alike: `(v, id)`
    /// for vCPU `v`'s file, per counter.
    ids: Vec<Vec<(usize, StatId)>>,
}

impl ExitSums {
    /// The counters of `vcpus`' files: each known reason's `exits_<reason>`
    /// (at most twelve, whatever a VMM's files hold) that the first file has
    /// as a single-valued cumulative stat, looked up by name in the others
    /// and summed where they have it with the same type and scale (a VMM's
    /// vCPU files share one layout; one that does not still sums right).
    pub(crate) fn of(vcpus: &[(StatsFd, Sample)]) -> ExitSums {
        let Some((first, _)) = vcpus.first() else {
            return ExitSums::default();
        };
        let (sums, ids) = Reason::ALL
            .iter()
            .filter_map(|r| {
                let name = format!("exits_{}", r.label());
                let d = first.schema().get(first.schema().find(&name)?)?;
                let alike = |o: &Descriptor| {
                    o.kind == StatType::Cumulative
                        && o.size == 1
                        && (o.unit, o.base, o.exponent) == (d.unit, d.base, d.exponent)
                };
                if !alike(d) {
                    return None;
                }
                let ids = vcpus
                    .iter()
                    .enumerate()
                    .filter_map(|(v, (fd, _))| {
                        let id = fd.schema().find(&name)?;
                        alike(fd.schema().get(id)?).then_some((v, id))
                    })
                    .collect();
                Some(((d.clone(), vec![0]), ids))
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
                .filter_map(|&(v, id)| vcpus.get(v)?.1.values(id).first().copied())
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

    fn vcpu(name: &str, io_out: u64, hlt: u64) -> (StatsFd, Sample) {
        read(
            &StatsFileBuilder::new(name)
                .counter("exits_io_out", io_out)
                .counter("guest_stall_ns", 7)
                .counter("exits_hlt", hlt),
        )
    }

    /// Each counter's name and sum over `vcpus`' samples.
    fn summed(vcpus: &[(StatsFd, Sample)]) -> Vec<(String, u64)> {
        let mut sums = ExitSums::of(vcpus);
        sums.update(vcpus);
        sums.sums
            .iter()
            .map(|(d, v)| (d.name.clone(), v[0]))
            .collect()
    }

    #[test]
    fn each_exit_counter_is_summed_over_the_vcpus_and_nothing_else_is() {
        let vcpus = [
            vcpu("kvmscope-1/vcpu-0", 3, 1),
            vcpu("kvmscope-1/vcpu-1", 40, 0),
            vcpu("kvmscope-1/vcpu-2", 500, 2),
        ];
        let got = summed(&vcpus);
        assert_eq!(got, [("exits_io_out".into(), 543), ("exits_hlt".into(), 3)]);
    }

    #[test]
    fn a_vcpu_file_without_a_counter_adds_nothing_to_it() {
        let odd = read(&StatsFileBuilder::new("kvmscope-1/vcpu-1").counter("exits_hlt", 9));
        let vcpus = [vcpu("kvmscope-1/vcpu-0", 3, 1), odd];
        assert_eq!(
            summed(&vcpus),
            [("exits_io_out".into(), 3), ("exits_hlt".into(), 10)]
        );
    }

    #[test]
    fn only_known_reasons_single_valued_and_alike_are_summed() {
        use kvm_stats::{Base, Unit};
        // A VMM's file with names of its own, a histogram and a scaled
        // counter: none of them is summed, whatever their number.
        let mut b = StatsFileBuilder::new("kvmscope-1/vcpu-0")
            .counter("exits_made_up", 1)
            .counter("exits_io_out", 2);
        for i in 0..100 {
            b = b.counter(&format!("exits_x{i}"), 1);
        }
        b = b.stat(
            "exits_hlt",
            StatType::Cumulative,
            Unit::None,
            Base::Pow10,
            0,
            &[1, 2],
        );
        let odd = StatsFileBuilder::new("kvmscope-1/vcpu-1").stat(
            "exits_io_out",
            StatType::Cumulative,
            Unit::Bytes,
            Base::Pow10,
            0,
            &[5],
        );
        let vcpus = [read(&b), read(&odd)];
        let got = summed(&vcpus);
        // vCPU 1's io_out is in another unit: left out of the sum.
        assert_eq!(got, [("exits_io_out".into(), 2)]);
        assert!(is_exit_counter("exits_io_out") && is_exit_counter("exits_hlt"));
        assert!(!is_exit_counter("exits_made_up") && !is_exit_counter("exits"));
    }

    #[test]
    fn no_vcpus_no_sums() {
        assert!(ExitSums::of(&[]).sums.is_empty());
    }
}
