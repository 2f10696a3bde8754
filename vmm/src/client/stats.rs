//! `kvmscope stats`: receive stats fds from a running VMM and read the kernel's
//! statistics through them, and the VMM's own (provider `kvmscope`) beside
//! them, printing a table or QMP-like JSON.

use std::io::Write;
use std::path::PathBuf;

use kvm_stats::{NameFilter, Sample, StatsFd};

use super::{Client, Error, REPLY_TIMEOUT};
use crate::protocol::request::StatsProvider;
use crate::protocol::vm::StatsFdEntry;
use crate::protocol::{Message, StatsTarget, VcpuSelector};

/// What `kvmscope stats` shows.
#[derive(Debug, Clone)]
pub struct StatsConfig {
    /// The VMM's control socket.
    pub socket: PathBuf,
    /// The VM's stats.
    pub vm: bool,
    /// These vCPUs' stats.
    pub vcpus: Option<VcpuSelector>,
    /// Only these stats (all when `None`).
    pub names: Option<Vec<String>>,
    /// Print QEMU `query-stats`-shaped JSON instead of tables.
    pub json: bool,
}

/// A stats fd received over the socket: how the VMM named it, and the fd.
pub(crate) struct Received {
    /// KVM's stats, or the VMM's own.
    pub(crate) provider: StatsProvider,
    /// The reply's entry: its target, vCPU and id.
    pub(crate) entry: StatsFdEntry,
    /// The stats fd, its schema read.
    pub(crate) stats: StatsFd,
}

impl Received {
    /// `vm` or `vcpu N` (`, kvmscope` for the VMM's own), for headings.
    pub(crate) fn label(&self) -> String {
        let whose = match self.provider {
            StatsProvider::Kvmscope => ", kvmscope",
            _ => "",
        };
        match self.entry.vcpu {
            Some(i) => format!("vcpu {i}{whose}"),
            None => format!("vm{whose}"),
        }
    }

    /// How a table shows this file's values where their unit cannot say
    /// (the VMM's own instants, as dates); nothing for KVM's files.
    pub(crate) fn shown(&self) -> kvm_stats::format::Shown<'static> {
        match self.provider {
            StatsProvider::Kvmscope => &crate::vmmstats::value_text,
            _ => &|_, _| None,
        }
    }

    /// Whether `filter` keeps any of its stats (a table of none is left out).
    pub(crate) fn shows_any(&self, filter: &NameFilter) -> bool {
        !filter.select(self.stats.schema()).is_empty()
    }
}

/// Asks for the VM's stats fd (if `vm`) and the vCPUs' (if `vcpus`), KVM's
/// and, with `own`, the VMM's own after them (none from a VMM before the
/// `kvmscope` provider), and opens each received fd as a [`StatsFd`]
/// (reading its schema once).
///
/// # Errors
/// An error reply, a reply whose fds do not match the entries it names, or a
/// received fd that is not a readable stats file.
pub(crate) fn receive(
    client: &mut Client,
    vm: bool,
    vcpus: Option<VcpuSelector>,
    own: bool,
) -> Result<Vec<Received>, Error> {
    let mut requests = Vec::new();
    if vm {
        requests.push((StatsTarget::Vm, None));
    }
    if let Some(selector) = vcpus {
        requests.push((StatsTarget::Vcpu, Some(selector)));
    }
    let mut out = Vec::new();
    let mut budget = RECEIVED_BUDGET;
    // KVM's (the request names no provider, as from any client), then the
    // VMM's own when asked for.
    let mut providers = vec![(StatsProvider::Kvm, None)];
    if own {
        providers.push((StatsProvider::Kvmscope, Some(StatsProvider::Kvmscope)));
    }
    for (provider, asked) in providers {
        for (target, vcpu) in &requests {
            let files = match client.get_provider_stats_fd(asked, *target, *vcpu) {
                Ok(files) => files,
                // A VMM before the `kvmscope` provider: KVM's stats only.
                Err(Error::Remote { .. }) if asked.is_some() => break,
                Err(e) => return Err(e),
            };
            // One for the VM, one per vCPU the greeting names at most (a
            // greeting without any, an older VMM's: any number).
            let vcpus = client.greeting.qmp.kvmscope.vm.vcpus;
            let abi = usize::try_from(crate::abi::MAX_VCPUS).unwrap_or(usize::MAX);
            let most = match target {
                StatsTarget::Vcpu if vcpus > 0 => vcpus.min(abi),
                StatsTarget::Vcpu => abi,
                _ => 1,
            };
            if files.len() > most {
                return Err(Error::BadReply(format!(
                    "the reply names {} stats fds for a VM whose greeting names {vcpus} vCPUs",
                    files.len()
                )));
            }
            for (entry, file) in files {
                let what = match entry.vcpu {
                    Some(i) => format!("vCPU {i}"),
                    None => "the VM".to_string(),
                };
                let what = format!("{what} ({})", <&str>::from(provider));
                let is = fd_target(&file);
                // What the fd is, before a byte of it is read: a read of
                // another kind of file may block for ever (`/dev/kmsg`).
                let kind = stats_fd_kind(asked, *target);
                if !is_stats_kind(&file, &is, kind) {
                    return Err(Error::NotStatsKind {
                        what,
                        is: crate::units::peer_text(is.as_bytes(), 200),
                        kind,
                    });
                }
                let stats = within_budget(file, &mut budget).map_err(|e| match e {
                    Budgeted::Stats(source) => Error::NotStats { what, is, source },
                    Budgeted::Over => Error::BadReply(format!(
                        "its stats files hold more than the {RECEIVED_BUDGET} bytes of schema and data a client keeps for one VMM"
                    )),
                })?;
                out.push(Received {
                    provider,
                    entry,
                    stats,
                });
            }
        }
    }
    Ok(out)
}

/// Schema and data bytes a client keeps for all the stats fds it received
/// from one VMM: KVM's are about 4.5 KiB per fd, so this is thousands of
/// vCPUs' worth; a file's header says its sizes before they are read (two
/// fds of 1 GiB of names each were read whole).
const RECEIVED_BUDGET: u64 = 64 << 20;

/// The kind of file `provider`'s stats fd for `target` is (see
/// [`is_stats_kind`]): KVM's anon inodes (no provider named: KVM's), or the
/// VMM's own memfd.
pub(crate) fn stats_fd_kind(provider: Option<StatsProvider>, target: StatsTarget) -> &'static str {
    match (provider, target) {
        (Some(StatsProvider::Kvmscope), _) => crate::vmmstats::MEMFD_NAME,
        (_, StatsTarget::Vm) => "kvm-vm-stats",
        _ => "kvm-vcpu-stats",
    }
}

/// Whether a received fd, as [`fd_target`] names it, is a stats file of
/// `kind`: KVM's `anon_inode:kvm-vm-stats` or `anon_inode:kvm-vcpu-stats:N`,
/// or a VMM's own `/memfd:kvmscope-stats (deleted)` for
/// [`MEMFD_NAME`](crate::vmmstats::MEMFD_NAME).
pub(crate) fn is_stats_kind(file: &std::fs::File, link: &str, kind: &str) -> bool {
    if kind == crate::vmmstats::MEMFD_NAME {
        // Named so, and a memfd indeed: only shared memory has seals (a
        // file of that name in the VMM's mount namespace could be FUSE's,
        // whose read may never return).
        link.strip_prefix("/memfd:")
            .is_some_and(|n| n.split(' ').next() == Some(kind))
            && rustix::fs::fcntl_get_seals(file).is_ok()
    } else {
        let name = link.strip_prefix("anon_inode:").unwrap_or("");
        name == kind || name.split_once(':').is_some_and(|(k, _)| k == kind)
    }
}

/// A stats file whose id, schema and data fit what is left of `budget`
/// (taken from it): the sizes its header gives are weighed before anything
/// they size is read, and the schema is read with that header (a file
/// that changes between two reads gets no more), its id charged as well.
///
/// # Errors
/// The file's own errors, or `Over` with the bytes past the budget.
pub(crate) fn within_budget(file: std::fs::File, budget: &mut u64) -> Result<StatsFd, Budgeted> {
    let take = |budget: &mut u64, bytes: u64| {
        *budget = budget.checked_sub(bytes).ok_or(Budgeted::Over)?;
        Ok::<_, Budgeted>(())
    };
    let header = kvm_stats::Header::read(&file)?;
    let schema_bytes =
        u64::from(header.name_size) + u64::from(header.num_desc) * header.desc_stride();
    take(budget, schema_bytes)?;
    let schema = kvm_stats::Schema::read_after(&file, header)?;
    take(budget, schema.data_size())?;
    Ok(StatsFd::with_schema(file, schema)?)
}

/// Why [`within_budget`] refused a file.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Budgeted {
    /// The file itself.
    #[error(transparent)]
    Stats(#[from] kvm_stats::Error),
    /// More bytes than were left.
    #[error("its schema and data need more bytes than were left")]
    Over,
}

/// What a received fd is, as `/proc/self/fd` names it
/// (`anon_inode:kvm-vm-stats`, a path), for an error about it; a pipe's or
/// socket's inode number is left out (`pipe`, `socket`), so that the same
/// mistake reads the same each time (the exporter logs a reason once).
pub(crate) fn fd_target(file: &std::fs::File) -> String {
    use std::os::fd::AsRawFd;
    let link = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())).map_or_else(
        |_| "unknown".to_string(),
        |l| l.to_string_lossy().into_owned(),
    );
    without_inode(link)
}

fn without_inode(link: String) -> String {
    match link.strip_suffix(']').and_then(|l| l.rsplit_once(":[")) {
        Some((kind, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => {
            kind.to_string()
        }
        _ => link,
    }
}

/// One sample of each received fd.
///
/// # Errors
/// A read failure.
pub(crate) fn sample_all(received: &[Received]) -> Result<Vec<Sample>, Error> {
    received
        .iter()
        .map(|r| {
            let mut s = r.stats.new_sample();
            r.stats.read_sample(&mut s)?;
            Ok(s)
        })
        .collect()
}

/// Warns about names and patterns in `filter` that match no stat of the
/// received schemas.
pub(crate) fn warn_missing(received: &[Received], filter: &NameFilter) {
    let names = received
        .iter()
        .flat_map(|r| r.stats.schema().iter().map(|(_, d)| d.name.as_str()));
    let unmatched = filter.unmatched(names);
    if !unmatched.is_empty() {
        log::warn!(
            "--names: no stat read matches {} (`query-stats-schemas` lists every stat; the VM's and the vCPUs' differ, --vm and --vcpu choose which are read)",
            unmatched.join(", ")
        );
    }
}

/// The filter for `names` (`None`: every stat): names, `*` for any run of
/// characters.
///
/// # Errors
/// [`Error::BadPattern`] for a pattern no stat name could match.
pub(crate) fn names_filter(names: Option<Vec<String>>) -> Result<NameFilter, Error> {
    Ok(NameFilter::patterns(names.unwrap_or_default())?)
}

/// What a table of `r`'s sample shows of what `filter` keeps: all but the
/// readiness figures of a VMM's own VM file before its first measurement
/// ([`unmeasured`]); and whether any was left out so (the table then ends
/// with [`UNMEASURED`]).
pub(crate) fn table_filter(
    r: &Received,
    sample: &Sample,
    filter: &NameFilter,
) -> (NameFilter, bool) {
    let Some(hidden) = unmeasured(r, sample) else {
        return (filter.clone(), false);
    };
    let names = || r.stats.schema().iter().map(|(_, d)| d.name.as_str());
    let kept = NameFilter::names(
        names()
            .filter(|n| filter.matches(n) && !hidden(n))
            .map(str::to_string),
    );
    (kept, names().any(|n| filter.matches(n) && hidden(n)))
}

/// The line after a table that left out a VMM's readiness figures.
pub(crate) const UNMEASURED: &str = "(no readiness_* or prediction_* figure: this VMM has not measured readiness yet; `kvmscope readiness` measures it now, `run --readiness-every` a second after start and every period after)";

/// Runs `kvmscope stats`.
///
/// # Errors
/// Connecting, receiving or reading failed.
pub fn run(config: &StatsConfig, out: &mut dyn Write) -> Result<(), Error> {
    let mut client = Client::connect(&config.socket)?;
    client.bound_each_request(REPLY_TIMEOUT);
    let (vm, vcpus) = match (config.vm, config.vcpus) {
        (false, None) => (true, Some(VcpuSelector::All)),
        other => other,
    };
    let received = receive(&mut client, vm, vcpus, true)?;
    let (name, pid) = (
        client.greeting.qmp.kvmscope.vm.name.clone(),
        client.vmm_pid(),
    );
    drop(client);
    let samples = sample_all(&received)?;
    let filter = names_filter(config.names.clone())?;
    warn_missing(&received, &filter);
    if config.json {
        // Shaped as QEMU's `query-stats` reply, each entry naming its provider.
        let entries = received
            .iter()
            .zip(&samples)
            .filter(|(r, _)| r.shows_any(&filter))
            .filter_map(|(r, s)| {
                // Unmeasured readiness figures are left out, as from a table:
                // `prediction_converges: false` would read as a verdict. An
                // entry left with none goes, as one that matched none does.
                let (kept, _) = table_filter(r, s, &filter);
                if kept.select(r.stats.schema()).is_empty() {
                    return None;
                }
                let mut e = kvm_stats::json::stats_result(r.stats.schema(), s, &kept);
                e["provider"] = serde_json::json!(r.provider.name());
                Some(e)
            })
            .collect();
        let reply = Message::Return {
            value: serde_json::Value::Array(entries),
            id: None,
        };
        writeln!(out, "{}", serde_json::to_string(&reply).unwrap_or_default())?;
        return Ok(());
    }
    // The files' ids name the process (KVM's `kvm-PID`); the VM by its name.
    writeln!(out, "kvmscope stats: VM {name:?}, VMM pid {pid}")?;
    for (r, s) in received.iter().zip(&samples) {
        if !r.shows_any(&filter) {
            continue;
        }
        writeln!(out, "== {} ({}) ==", r.label(), r.stats.schema().id())?;
        let (kept, left_out) = table_filter(r, s, &filter);
        write!(
            out,
            "{}",
            kvm_stats::format::table_with(r.stats.schema(), s, &kept, r.shown())
        )?;
        if left_out {
            writeln!(out, "{UNMEASURED}")?;
        }
    }
    Ok(())
}

/// For the VMM's own VM file before its first readiness measurement: the
/// figures to leave out of a table, which would read as a measured zero
/// (`prediction_converges false`); the exporter leaves them off its page
/// too. `None` for every other file.
fn unmeasured(r: &Received, sample: &Sample) -> Option<fn(&str) -> bool> {
    let own_vm = r.provider == StatsProvider::Kvmscope && r.entry.vcpu.is_none();
    (own_vm && !crate::vmmstats::measured(r.stats.schema(), sample))
        .then_some(crate::vmmstats::is_readiness_figure)
}

#[cfg(test)]
mod tests {
    use super::{within_budget, without_inode, Budgeted};

    /// The id is weighed with the descriptors and data, from the header,
    /// before it is read: a file of no stats and a 512 KiB id costs that.
    #[test]
    fn a_files_id_descriptors_and_data_are_weighed_before_they_are_read() {
        let mut builder = kvm_stats::builder::StatsFileBuilder::new("kvm-1").counter("exits", 7);
        builder.name_size = 512 << 10;
        let file = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut &file, &builder.build()).unwrap();
        let mut budget = 1 << 20;
        assert!(matches!(
            within_budget(file.try_clone().unwrap(), &mut budget),
            Err(Budgeted::Over)
        ));
        let mut budget = 2 << 20;
        let fd = within_budget(file, &mut budget).unwrap();
        assert_eq!(fd.schema().len(), 1);
        // The id, one descriptor of 16 bytes and its name, 8 bytes of data.
        assert_eq!(budget, (2 << 20) - (512 << 10) - (16 + (512 << 10)) - 8);
    }

    #[test]
    fn a_pipes_or_sockets_inode_is_left_out_of_what_an_fd_is() {
        let kind = |l: &str| without_inode(l.to_string());
        assert_eq!(kind("pipe:[6329016]"), "pipe");
        assert_eq!(kind("socket:[12]"), "socket");
        assert_eq!(kind("anon_inode:kvm-vm-stats"), "anon_inode:kvm-vm-stats");
        assert_eq!(kind("anon_inode:[eventfd]"), "anon_inode:[eventfd]");
        assert_eq!(kind("/tmp/x:[1]y"), "/tmp/x:[1]y");
        assert_eq!(
            kind("/memfd:kvmscope-stats (deleted)"),
            "/memfd:kvmscope-stats (deleted)"
        );
    }
}
