//! A VMM's own exit counters summed over its vCPUs: what the exporter's page
//! always shows (`kvmscope_vmm_vm_exits_<reason>_total`, twelve lines per
//! VM); the per-vCPU counters only with `--vcpu-exits` (twelve per vCPU: on a
//! host of 4-vCPU VMs they were most of the VMMs' own lines, and a fleet's
//! dashboards ask for exits per VM).

use kvm_stats::builder::StatsFileBuilder;
use kvm_stats::{Descriptor, Sample, Schema, StatId, StatType, StatsFd};

use crate::exits::Reason;

/// Whether a VMM vCPU stat is one of the exit counters the page sums per VM
/// (`exits_<reason>` of a known reason): the page shows them per vCPU only
/// with `--vcpu-exits`.
pub(crate) fn is_exit_counter(name: &str) -> bool {
    name.strip_prefix("exits_")
        .is_some_and(|reason| Reason::ALL.iter().any(|r| r.label() == reason))
}

/// The exit counters of one VMM's vCPU files, summed: a sample in a stats
/// layout of their own (one single-valued counter per reason summed, as the
/// first vCPU file describes it), which the page reads as it reads a file's.
/// VMs of one build have the same layout, and the exporter makes them share
/// one descriptor table, as it does their files'.
#[derive(Debug)]
pub(crate) struct ExitSums {
    /// The sums' layout.
    pub(crate) schema: Schema,
    /// The sums, as of the latest samples.
    pub(crate) sample: Sample,
    /// What goes into each sum.
    adds: Adds,
}

/// What goes into each sum of [`ExitSums`].
#[derive(Debug)]
enum Adds {
    /// Every vCPU file has each summed counter at the same place (files of
    /// one layout, as one VMM's are): `(word, id)`, stat `id` of every file
    /// into word `word` of the sums. One short table per VM, which a page
    /// of a hundred VMs reads once per scrape.
    Alike(Vec<(u32, StatId)>),
    /// Files that differ: `(word, v, id)`, stat `id` of vCPU `v`'s file
    /// into word `word`.
    Each(Vec<(u32, u32, StatId)>),
}

impl Default for ExitSums {
    /// No sums (KVM's files, a VMM without vCPU files): an empty layout,
    /// made once per process.
    fn default() -> ExitSums {
        static EMPTY: std::sync::OnceLock<ExitSums> = std::sync::OnceLock::new();
        let empty = EMPTY.get_or_init(|| {
            ExitSums::in_layout(&StatsFileBuilder::new("kvmscope-exporter/exit-sums"))
        });
        ExitSums {
            schema: empty.schema.clone(),
            sample: empty.sample.clone(),
            adds: Adds::Alike(Vec::new()),
        }
    }
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
        let summed: Vec<&Descriptor> = Reason::ALL
            .iter()
            .filter_map(|r| {
                first
                    .schema()
                    .get(first.schema().find(&format!("exits_{}", r.label()))?)
            })
            .filter(|d| d.kind == StatType::Cumulative && d.size == 1)
            .collect();
        let builder = summed.iter().fold(
            StatsFileBuilder::new("kvmscope-exporter/exit-sums"),
            |b, d| b.stat(&d.name, d.kind, d.unit, d.base, d.exponent, &[0]),
        );
        // Each vCPU file's (word, id) pairs.
        let per_vcpu: Vec<Vec<(u32, StatId)>> = vcpus
            .iter()
            .map(|(fd, _)| {
                let schema = fd.schema();
                (0u32..)
                    .zip(&summed)
                    .filter_map(|(word, d)| {
                        let id = schema.find(&d.name)?;
                        let o = schema.get(id)?;
                        let alike = o.kind == d.kind
                            && o.size == 1
                            && (o.unit, o.base, o.exponent) == (d.unit, d.base, d.exponent);
                        alike.then_some((word, id))
                    })
                    .collect()
            })
            .collect();
        let mut sums = ExitSums::in_layout(&builder);
        sums.adds = match per_vcpu.split_first() {
            Some((first, rest)) if rest.iter().all(|adds| adds == first) => {
                Adds::Alike(first.clone())
            }
            _ => Adds::Each(
                (0u32..)
                    .zip(&per_vcpu)
                    .flat_map(|(v, adds)| adds.iter().map(move |&(word, id)| (word, v, id)))
                    .collect(),
            ),
        };
        sums
    }

    /// No sums yet, laid out as `builder` says.
    fn in_layout(builder: &StatsFileBuilder) -> ExitSums {
        // A layout this module made from descriptors a schema accepted:
        // reading it back cannot fail.
        let schema = Schema::read(&builder.build()).expect("exit sums' own layout");
        let sample = Sample::new(&schema);
        ExitSums {
            schema,
            sample,
            adds: Adds::Alike(Vec::new()),
        }
    }

    /// Sums the counters of `vcpus`' latest samples (the files `of` was
    /// given, in the same order).
    pub(crate) fn update(&mut self, vcpus: &[(StatsFd, Sample)]) {
        let sums = self.sample.words_mut();
        sums.fill(0);
        let mut add = |word: u32, sample: &Sample, id: StatId| {
            let sum = usize::try_from(word).ok().and_then(|w| sums.get_mut(w));
            if let (Some(sum), Some(&value)) = (sum, sample.values(id).first()) {
                *sum = sum.saturating_add(value);
            }
        };
        match &self.adds {
            Adds::Alike(adds) => {
                for (_, sample) in vcpus {
                    for &(word, id) in adds {
                        add(word, sample, id);
                    }
                }
            }
            Adds::Each(adds) => {
                for &(word, v, id) in adds {
                    if let Some((_, sample)) = usize::try_from(v).ok().and_then(|v| vcpus.get(v)) {
                        add(word, sample, id);
                    }
                }
            }
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
        sums.schema
            .iter()
            .map(|(id, d)| (d.name.clone(), sums.sample.values(id)[0]))
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
        assert!(ExitSums::of(&[]).schema.is_empty());
    }
}
