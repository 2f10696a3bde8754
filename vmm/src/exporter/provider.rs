//! What the page asks of every kind of VM it shows: a provider (kvmscope VMMs
//! over their stats fds, QEMU over QMP, the next one) is one type that, once
//! per scrape, hands the page its figures. The page writes each provider's own
//! families as they come, then the kvmscope VMMs' own stats, then every KVM
//! stat of every provider's VMs and vCPUs together (one family per stat, as
//! the text format wants).
//!
//! A provider must not wait on any peer in [`Provider::read`]: whatever needs a
//! request is fetched by the provider's own threads beforehand.

use crate::metrics::Source;

/// One kind of VM on the exporter's page.
pub(crate) trait Provider: Send {
    /// This scrape's figures, held until the page is written (a provider
    /// reading fds reads them here, one `pread` each).
    fn read(&mut self) -> Box<dyn Figures + '_>;
}

/// One provider's figures for one scrape.
pub(crate) trait Figures {
    /// The provider's own families (up, info, its own counters), each whole.
    fn write_families(&self, out: &mut String);
    /// The KVM stats of each VM, labelled.
    fn vm_stats(&self) -> Vec<Source<'_>>;
    /// The KVM stats of each vCPU, labelled (`vcpu` among them).
    fn vcpu_stats(&self) -> Vec<Source<'_>>;
    /// The guest memory each VM's KVM MMU maps (`pages_4k/2m/1g` in bytes),
    /// labelled, for the VMs whose stats have them.
    fn mapped_bytes(&self) -> Vec<(&str, u64)> {
        Vec::new()
    }
    /// The VMM's own VM stats (provider `kvmscope`), where it has them.
    fn vmm_vm_stats(&self) -> Vec<Source<'_>> {
        Vec::new()
    }
    /// The VMM's own exit counters summed over each VM's vCPUs (families of
    /// their own: no VM file of the VMM has them).
    fn vmm_exit_sums(&self) -> Vec<Source<'_>> {
        Vec::new()
    }
    /// The VMM's own vCPU stats.
    fn vmm_vcpu_stats(&self) -> Vec<Source<'_>> {
        Vec::new()
    }
}
