//! What each control command does, against the VM the [`Context`] reaches.
//!
//! Everything here is quick and never waits on a vCPU: stats are read from
//! stats fds opened once, results and states come from the vCPUs' shared
//! parts, and run-state changes go to the main loop, which answers at once.

use std::fs::File;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

use kvm_stats::{NameFilter, Sample, StatsFd};
use serde_json::{json, Value};

use super::context::Context;
use super::deferred;
use super::error::Error;
use super::outcome::{GuestWait, Outcome, Pending, Progress};
use crate::abi;
use crate::boot;
use crate::messages::{RunRequest, VmEvent};
use crate::protocol::events::EventKind;
use crate::protocol::guest::GuestCommandReply;
use crate::protocol::reply::{
    vcpu_from_qom_path, vcpu_qom_path, CommandInfo, CpuInfoFast, GreetingBody, GreetingVm,
    KvmscopeGreeting, NameInfo, StatusInfo, VersionInfo,
};
use crate::protocol::request::{
    CapabilitiesArgs, GetStatsFdArgs, GuestCommandArgs, QueryStatsArgs, ReadinessArgs, SchemasArgs,
    StatsProvider,
};
use crate::protocol::vm::{
    MemoryInfo, RegionInfo, StatsFdEntry, StatsFds, StatsIds, VcpuExits, VmInfo,
};
use crate::protocol::{
    Command, ErrorClass, Event, Greeting, Message, StatsTarget, VcpuRef, VcpuSelector,
    PROTOCOL_VERSION,
};
use crate::summary::{result_json, result_reply};
use crate::vcpu::VcpuState;
use crate::workload::parse_sequence;
use crate::x86_64::paging;

/// How often a run-state request that the main loop has not answered yet
/// looks whether the server is stopping.
const STOP_CHECK: Duration = Duration::from_millis(20);

/// How long a `query-readiness` waits for the periodic measurement it
/// stopped to let the slot go (it looks every 50 ms; a scan in progress
/// stops within about 20 ms of reading).
const READINESS_QUEUE_LIMIT: Duration = Duration::from_secs(5);

/// Most sampler points one `query-samples` reply carries; ask again with
/// `since` for more (docs/PROTOCOL.md, "Limits").
pub const SAMPLES_PAGE: usize = 1024;

/// Most bytes of points one `query-samples` reply carries (at least one
/// point): a VM of many vCPUs gets fewer points per page, not a larger page.
pub const SAMPLES_PAGE_BYTES: usize = 4 << 20;

fn fail(class: ErrorClass, desc: impl Into<String>) -> Outcome {
    Outcome::Error(class, desc.into())
}

fn no_sampler() -> Outcome {
    Outcome::generic("the sampler is off (the VMM was started with --sample-interval off)")
}

fn ret(value: Value) -> Outcome {
    Outcome::Return(value, Vec::new())
}

/// The control plane's view of the VM, with its own stats fds and samples.
pub(crate) struct Handler {
    ctx: Context,
    /// KVM's stats fds (provider `kvm`).
    kvm: ProviderFds,
    /// The VMM's own (provider `kvmscope`, `crate::vmmstats`).
    own: ProviderFds,
    /// Set when the server is being dropped.
    stopping: Arc<AtomicBool>,
    /// A `query-readiness` worker is running.
    readiness_busy: Arc<AtomicBool>,
    /// What stops the periodic measurement, when the last one started was
    /// periodic: a client's `query-readiness` goes first.
    /// (A cell: a queued request that starts, in [`Handler::check_wait`],
    /// makes the running one a client's.)
    periodic_stop: std::cell::Cell<Option<Arc<AtomicBool>>>,
    /// When the next periodic readiness measurement is due (`run --readiness-every`).
    periodic_due: Option<std::time::Instant>,
    /// Run-state changes told to clients so far, and whether the last one
    /// told said the guest runs.
    told: (u64, bool),
}

/// One provider's stats fds, each with the sample it is read into.
struct ProviderFds {
    vm: StatsFd,
    vcpus: Vec<StatsFd>,
    vm_sample: Sample,
    vcpu_samples: Vec<Sample>,
}

impl ProviderFds {
    fn new(vm: StatsFd, vcpus: Vec<StatsFd>) -> ProviderFds {
        ProviderFds {
            vm_sample: vm.new_sample(),
            vcpu_samples: vcpus.iter().map(StatsFd::new_sample).collect(),
            vm,
            vcpus,
        }
    }

    /// `query-stats` entries for the target: the VM's, or vCPUs `list`'s.
    fn results(
        &mut self,
        target: StatsTarget,
        list: &[usize],
        filter: &NameFilter,
    ) -> Result<Value, kvm_stats::Error> {
        if target == StatsTarget::Vm {
            self.vm.read_sample(&mut self.vm_sample)?;
            return Ok(kvm_stats::json::query_stats(
                [(self.vm.schema(), &self.vm_sample)],
                filter,
            ));
        }
        for &i in list {
            self.vcpus[i].read_sample(&mut self.vcpu_samples[i])?;
        }
        let sources = list
            .iter()
            .map(|&i| (self.vcpus[i].schema(), &self.vcpu_samples[i]));
        Ok(kvm_stats::json::query_stats(sources, filter))
    }
}

impl Handler {
    /// Opens the stats fds the handler reads for `query-stats`.
    ///
    /// # Errors
    /// A stats fd that cannot be opened, duplicated or read.
    pub(crate) fn new(ctx: Context, stopping: Arc<AtomicBool>) -> Result<Handler, Error> {
        let vm_stats = ctx.open_vm_stats()?;
        let vcpu_stats = ctx
            .vcpu_stats
            .iter()
            .map(|f| Ok(StatsFd::new(f.try_clone().map_err(Error::Dup)?)?))
            .collect::<Result<Vec<_>, Error>>()?;
        let kvm = ProviderFds::new(vm_stats, vcpu_stats);
        let own_vm = StatsFd::new(ctx.vmm_stats.vm().reader()?)?;
        let own_vcpus = ctx
            .vmm_stats
            .vcpus()
            .iter()
            .map(|f| Ok(StatsFd::new(f.reader()?)?))
            .collect::<Result<Vec<_>, Error>>()?;
        let own = ProviderFds::new(own_vm, own_vcpus);
        let (state, changes) = ctx.run_state.get_with_changes();
        let ctx_periodic = ctx.periodic;
        Ok(Handler {
            told: (changes, state.is_running()),
            ctx,
            kvm,
            own,
            stopping,
            readiness_busy: Arc::new(AtomicBool::new(false)),
            periodic_stop: std::cell::Cell::new(None),
            // The first a second in: the figures are there soon after start.
            periodic_due: ctx_periodic.map(|_| std::time::Instant::now() + Duration::from_secs(1)),
        })
    }

    /// Event lines for every client since the last call: `STOP` and `RESUME`
    /// when the guest stopped or started running (as QEMU sends them: a user's
    /// `stop`/`cont`, a readiness scan's or a migration's hold, an incoming
    /// migration's start), then what the migration queued.
    pub(crate) fn broadcast_events(&mut self) -> Vec<Vec<u8>> {
        // Migration events first: every stamp is then at most the count read next.
        let migration = super::migrate::event_lines(&self.ctx);
        let (_, changes, shutdown_stop) = self.ctx.run_state.get_with_changes_and_shutdown_stop();
        // A VMM that stops (`quit`, a signal) with its guest running says so
        // with SHUTDOWN alone, as QEMU does: that stop is no STOP (a user's
        // `stop` just before a `quit` still is one).
        let (mut told, mut running) = self.told;
        let mut lines = Vec::new();
        // The run-state changes before `upto`, as events. Each change flips
        // running, so the count alone says which were which.
        let mut changes_to = |upto: u64, lines: &mut Vec<Vec<u8>>| {
            while told < upto.min(changes) {
                told += 1;
                running = !running;
                let kind = if running {
                    EventKind::Resume
                } else if shutdown_stop && told == changes {
                    continue;
                } else {
                    EventKind::Stop
                };
                lines.push(Message::Event(Event::of(&kind)).to_line());
            }
        };
        // A migration event follows the changes that came before it was queued.
        for (stamp, line) in migration {
            changes_to(stamp, &mut lines);
            lines.push(line);
        }
        changes_to(changes, &mut lines);
        self.told = (told, running);
        lines
    }

    /// The sampler's shared part, when it runs.
    pub(crate) fn samples(&self) -> Option<Arc<crate::sampler::Shared>> {
        self.ctx.samples.clone()
    }

    /// The line every client gets on connecting.
    pub(crate) fn greeting(&self) -> Greeting {
        Greeting {
            qmp: GreetingBody {
                version: VersionInfo::ours(),
                capabilities: Vec::new(),
                kvmscope: KvmscopeGreeting {
                    protocol: PROTOCOL_VERSION,
                    features: vec!["stats-fd".into()],
                    vm: GreetingVm {
                        name: self.ctx.name.clone(),
                        pid: std::process::id(),
                        vcpus: self.ctx.vcpus.len(),
                        memory: self.ctx.memory,
                        backend: self.ctx.backend.kind.to_string(),
                        stats_id: self.kvm.vm.schema().id().to_string(),
                    },
                },
            },
        }
    }

    /// Called on the plane's periodic sweep: starts the periodic readiness
    /// measurement when it is due and the guest runs (a paused guest, or one
    /// migrated away, has nothing to measure: its figures stay as they were,
    /// their age growing; a postmigrate source published a fresh "converges"
    /// every period for a guest that had left).
    pub(crate) fn on_sweep(&mut self) {
        if let (Some(periodic), Some(due)) = (self.ctx.periodic, self.periodic_due) {
            let now = std::time::Instant::now();
            if now >= due {
                let state = self.ctx.run_state.get();
                if !state.is_running() {
                    // Due still: taken at the first sweep after the guest
                    // runs again, not a whole period later.
                    log::debug!("control: periodic readiness waits: the VM is {state:?}");
                    return;
                }
                if let Some(stop) =
                    deferred::periodic_readiness(&self.ctx, periodic, &self.readiness_busy)
                {
                    self.periodic_stop.set(Some(stop));
                }
                self.periodic_due = Some(deferred::next_due(due, now, periodic.period));
            }
        }
    }

    /// Runs one command (capability negotiation is the plane's business).
    pub(crate) fn execute(&mut self, command: Command) -> Outcome {
        if needs_the_guest(&command)
            && self.ctx.run_state.get() == crate::runstate::RunState::Inmigrate
        {
            // A command queued here would be lost to the guest's own queue
            // when it arrives (and `wait` given the source's result under
            // the same number); a window would measure a guest not there.
            return Outcome::generic(format!(
                "the guest is still arriving (inmigrate): {} needs it; ask again once query-status says running",
                command.name()
            ));
        }
        match command {
            Command::QmpCapabilities(a) => negotiate(&a),
            Command::QueryCommands(_) => Outcome::ret(
                Command::names()
                    .iter()
                    .map(|n| CommandInfo {
                        name: (*n).to_string(),
                    })
                    .collect::<Vec<_>>(),
            ),
            Command::QueryVersion(_) => Outcome::ret(VersionInfo::ours()),
            Command::QueryStatus(_) => {
                let status = self.ctx.run_state.get();
                Outcome::ret(StatusInfo {
                    running: status.is_running(),
                    singlestep: false,
                    status,
                })
            }
            Command::QueryName(_) => Outcome::ret(NameInfo {
                name: Some(self.ctx.name.clone()),
            }),
            Command::QueryCpusFast(_) => Outcome::ret(self.cpus_fast()),
            // QEMU's `KvmInfo`: a kvmscope VM runs on KVM or not at all.
            Command::QueryKvm(_) => {
                Outcome::ret(serde_json::json!({"enabled": true, "present": true}))
            }
            Command::QueryVm(_) => Outcome::ret(self.query_vm()),
            Command::GetStatsFd(a) => self.get_stats_fd(&a),
            Command::QueryStats(a) => self.query_stats(a),
            Command::QueryStatsSchemas(a) => self.query_schemas(&a),
            Command::QueryExits(a) => self.per_vcpu(a.vcpus, |h, i| {
                serde_json::to_value(VcpuExits::of(i, &h.ctx.vcpus[i].counters)).unwrap_or_default()
            }),
            Command::GuestCommand(a) => self.guest_command(&a),
            Command::QueryGuest(a) => self.per_vcpu(a.vcpus, Handler::guest_state),
            Command::QuerySamples(a) => self.query_samples(a.since, a.max),
            Command::SubscribeSamples(a) => match &self.ctx.samples {
                Some(s) => {
                    let since = a.since.unwrap_or_else(|| s.last_seq());
                    Outcome::Subscribe {
                        since,
                        reply: s.subscribed(since),
                    }
                }
                None => no_sampler(),
            },
            Command::UnsubscribeSamples(_) => Outcome::Unsubscribe,
            Command::QueryReadiness(r) => match r.check() {
                Ok(args) => self.client_readiness(args),
                Err(desc) => Outcome::generic(desc),
            },
            Command::Pause(_) | Command::Stop(_) => self.run_state(RunRequest::Pause),
            Command::Resume(_) | Command::Cont(_) => self.run_state(RunRequest::Resume),
            Command::Quit(_) => self.run_state(RunRequest::Quit),
            Command::Migrate(_)
            | Command::MigrateSetParameters(_)
            | Command::QueryMigrateParameters(_)
            | Command::MigrateSetCapabilities(_)
            | Command::QueryMigrateCapabilities(_)
            | Command::QueryMigrate(_)
            | Command::MigrateCancel(_) => super::migrate::execute(&self.ctx, command),
            Command::SetVcpuDirtyLimit(a) => {
                let period = self
                    .ctx
                    .migration
                    .as_ref()
                    .map_or(crate::vcpu::dirty_limit::DEFAULT_PERIOD_MS, |(m, _)| {
                        m.parameters().x_vcpu_dirty_limit_period
                    });
                limit_outcome(self.ctx.dirty_limits.set(a.cpu_index, a.dirty_rate, period))
            }
            Command::CancelVcpuDirtyLimit(a) => {
                limit_outcome(self.ctx.dirty_limits.cancel(a.cpu_index))
            }
            Command::QueryVcpuDirtyLimit(_) => Outcome::ret(self.ctx.dirty_limits.query()),
            Command::CalcDirtyRate(a) => {
                let target = super::dirty_rate::Target {
                    mem: self.ctx.mem.clone(),
                    dirty: self.ctx.dirty.clone(),
                    vcpus: self.ctx.vcpus.clone(),
                };
                match self.ctx.dirty_rate.start(&a, target) {
                    Ok(()) => Outcome::ret(serde_json::json!({})),
                    Err(e) => Outcome::generic(e.to_string()),
                }
            }
            Command::QueryDirtyRate(_) => Outcome::ret(self.ctx.dirty_rate.query()),
        }
    }

    fn cpus_fast(&self) -> Vec<CpuInfoFast> {
        self.ctx
            .vcpus
            .iter()
            .map(|v| CpuInfoFast {
                cpu_index: v.index,
                qom_path: vcpu_qom_path(v.index),
                thread_id: v.tid.get().copied().map_or(0, i64::from),
                target: "x86_64".into(),
            })
            .collect()
    }

    /// vCPU indexes from references (indexes or QOM paths), all when `None`.
    /// An index the VM lacks is an error; a QOM path that names none of its
    /// vCPUs matches nothing, as a filter does in QEMU. A vCPU named twice
    /// is taken once (QEMU filters its vCPUs by the list), where first named.
    fn resolve_vcpus(&self, refs: Option<Vec<VcpuRef>>) -> Result<Vec<usize>, Outcome> {
        let n = self.ctx.vcpus.len();
        let Some(refs) = refs else {
            return Ok((0..n).collect());
        };
        let mut list = Vec::with_capacity(refs.len().min(n));
        let mut named = vec![false; n];
        let mut take = |i: usize, list: &mut Vec<usize>| {
            if !std::mem::replace(&mut named[i], true) {
                list.push(i);
            }
        };
        for r in refs {
            match r {
                VcpuRef::Index(i) if i < n => take(i, &mut list),
                VcpuRef::Index(i) => {
                    return Err(fail(
                        ErrorClass::DeviceNotFound,
                        format!("vCPU {i} does not exist (the VM has {n})"),
                    ))
                }
                VcpuRef::QomPath(p) => {
                    if let Some(i) = vcpu_from_qom_path(&p).filter(|&i| i < n) {
                        take(i, &mut list);
                    }
                }
            }
        }
        Ok(list)
    }

    /// vCPU `i`, if the VM has it.
    fn check_vcpu(&self, i: usize) -> Result<usize, Outcome> {
        let n = self.ctx.vcpus.len();
        match i < n {
            true => Ok(i),
            false => Err(fail(
                ErrorClass::DeviceNotFound,
                format!("vCPU {i} does not exist (the VM has {n})"),
            )),
        }
    }

    fn per_vcpu(
        &mut self,
        vcpus: Option<Vec<VcpuRef>>,
        f: impl Fn(&Handler, usize) -> Value,
    ) -> Outcome {
        match self.resolve_vcpus(vcpus) {
            Ok(list) => ret(list.into_iter().map(|i| f(self, i)).collect()),
            Err(e) => e,
        }
    }

    fn query_vm(&self) -> VmInfo {
        let n = self.ctx.vcpus.len() as u64;
        let size = self.ctx.memory;
        let page = abi::PAGE_SIZE;
        let region = |name: &str, start: u64, size: u64| RegionInfo {
            name: name.to_string(),
            start,
            size,
        };
        let layout = vec![
            region("gdt", abi::GDT_ADDR, page),
            region("tss", abi::TSS_ADDR, page),
            region(
                "page-tables",
                abi::PML4_ADDR,
                abi::PD_ADDR + abi::MAX_PD_PAGES * page - abi::PML4_ADDR,
            ),
            region("mailboxes", abi::MAILBOX_BASE, n * page),
            region("image", abi::IMAGE_BASE, abi::IMAGE_MAX),
            region("stacks", abi::STACK_BASE, n * abi::STACK_SIZE),
            region("arena", abi::ARENA_BASE, boot::arena_size(size)),
            region("mmio-test-page", paging::mmio_addr(size), page),
        ];
        VmInfo {
            pid: std::process::id(),
            backend: self.ctx.backend.info(),
            vcpus: n,
            memory: MemoryInfo {
                size,
                hugepages: self.ctx.hugepages,
                layout,
            },
            guest_abi: abi::ABI_VERSION,
            fault_cost: Some(crate::protocol::vm::FaultCostInfo {
                ns: crate::units::nanos(crate::vcpu::stall::fault_cost()),
                source: <&str>::from(crate::vcpu::stall::fault_cost_source()).to_string(),
            }),
            stats_ids: StatsIds {
                vm: self.kvm.vm.schema().id().to_string(),
                vcpus: self
                    .kvm
                    .vcpus
                    .iter()
                    .map(|s| s.schema().id().to_string())
                    .collect(),
            },
        }
    }

    /// A fresh VM stats fd (KVM_GET_STATS_FD on the VM fd does not wait for
    /// anything), or duplicates of the vCPU stats files opened before the vCPUs
    /// first ran (KVM_GET_STATS_FD on a vCPU fd waits for the vCPU to leave
    /// KVM_RUN, which may take seconds; see docs/PROTOCOL.md). With provider
    /// `kvmscope`, read-only fds of the VMM's own stats files instead.
    fn get_stats_fd(&self, args: &GetStatsFdArgs) -> Outcome {
        let own = match args.provider {
            None | Some(StatsProvider::Kvm) => false,
            Some(StatsProvider::Kvmscope) => true,
            Some(StatsProvider::Cryptodev) => {
                return Outcome::generic(
                    "this VMM has no cryptodev stats; providers are kvm and kvmscope",
                )
            }
        };
        let fds = if own { &self.own } else { &self.kvm };
        let open = |i: usize| -> Result<(StatsFdEntry, File), Outcome> {
            let file = if own {
                self.ctx.vmm_stats.vcpus()[i]
                    .reader()
                    .map_err(|e| Outcome::generic(crate::error_chain(&e)))?
            } else {
                self.ctx.vcpu_stats[i].try_clone().map_err(|e| {
                    Outcome::generic(format!("duplicating the vCPU {i} stats fd: {e}"))
                })?
            };
            Ok((
                StatsFdEntry {
                    target: StatsTarget::Vcpu,
                    vcpu: Some(i),
                    qom_path: Some(vcpu_qom_path(i)),
                    id: fds.vcpus[i].schema().id().to_string(),
                },
                file,
            ))
        };
        let vm_file = || -> Result<File, Outcome> {
            if own {
                self.ctx
                    .vmm_stats
                    .vm()
                    .reader()
                    .map_err(|e| Outcome::generic(crate::error_chain(&e)))
            } else {
                kvm_stats::ioctl::get_stats_fd(&self.ctx.vm_fd)
                    .map_err(|e| Outcome::generic(crate::error_chain(&e)))
            }
        };
        let got: Result<Vec<(StatsFdEntry, File)>, Outcome> = match (args.target, args.vcpu) {
            (StatsTarget::Cryptodev, _) => Err(Outcome::generic(
                "this VMM has no cryptodev stats; targets are vm and vcpu",
            )),
            (StatsTarget::Vm, _) => vm_file().map(|file| {
                vec![(
                    StatsFdEntry {
                        target: StatsTarget::Vm,
                        vcpu: None,
                        qom_path: None,
                        id: fds.vm.schema().id().to_string(),
                    },
                    file,
                )]
            }),
            (StatsTarget::Vcpu, Some(VcpuSelector::One(i))) => {
                self.check_vcpu(i).and_then(|i| open(i).map(|x| vec![x]))
            }
            (StatsTarget::Vcpu, _) => (0..self.ctx.vcpus.len()).map(open).collect(),
        };
        match got {
            Ok(pairs) => {
                let (fds, files): (Vec<StatsFdEntry>, Vec<File>) = pairs.into_iter().unzip();
                let reply = serde_json::to_value(StatsFds { fds }).unwrap_or_default();
                Outcome::Return(reply, files)
            }
            Err(e) => e,
        }
    }

    /// `query-stats`, QEMU's way: each provider asked (every one when none
    /// is: `kvm`, then `kvmscope`) gives its entries, vCPU results carry their
    /// `qom-path`, and targets or providers that match nothing give `[]` (no
    /// entry with empty `stats`).
    fn query_stats(&mut self, args: QueryStatsArgs) -> Outcome {
        let list = match args.target {
            StatsTarget::Cryptodev => return ret(json!([])),
            StatsTarget::Vm => Vec::new(),
            StatsTarget::Vcpu => match self.resolve_vcpus(args.vcpus.clone()) {
                Ok(list) => list,
                Err(e) => return e,
            },
        };
        let mut results = Vec::new();
        for (provider, filter) in stats_filters(&args) {
            let fds = match provider {
                StatsProvider::Kvm => &mut self.kvm,
                StatsProvider::Kvmscope => &mut self.own,
                StatsProvider::Cryptodev => continue,
            };
            match fds.results(args.target, &list, &filter) {
                Ok(Value::Array(entries)) => results.extend(of_provider(entries, provider)),
                Ok(_) => {}
                Err(e) => return Outcome::generic(crate::error_chain(&e)),
            }
        }
        results.retain(|e| e["stats"].as_array().is_some_and(|s| !s.is_empty()));
        for e in &mut results {
            if let Some(i) = e["vcpu"].as_u64().and_then(|i| usize::try_from(i).ok()) {
                e["qom-path"] = json!(vcpu_qom_path(i));
            }
        }
        ret(Value::Array(results))
    }

    fn query_schemas(&self, args: &SchemasArgs) -> Outcome {
        let vm = matches!(args.target, None | Some(StatsTarget::Vm));
        let vcpu = matches!(args.target, None | Some(StatsTarget::Vcpu));
        let mut out = Vec::new();
        for (provider, fds) in [
            (StatsProvider::Kvm, &self.kvm),
            (StatsProvider::Kvmscope, &self.own),
        ] {
            if args.provider.is_some_and(|p| p != provider) {
                continue;
            }
            let schemas = vm
                .then(|| fds.vm.schema())
                .into_iter()
                .chain(fds.vcpus.first().filter(|_| vcpu).map(StatsFd::schema));
            if let Value::Array(entries) = kvm_stats::json::query_stats_schemas(schemas) {
                out.extend(of_provider(entries, provider));
            }
        }
        ret(Value::Array(out))
    }

    fn guest_command(&mut self, args: &GuestCommandArgs) -> Outcome {
        let (vcpu, wait) = (args.vcpu, args.wait);
        if let Err(e) = self.check_vcpu(vcpu) {
            return e;
        }
        let commands = match parse_sequence(&args.command) {
            Ok(c) => c,
            Err(e) => return Outcome::generic(format!("command: {e}")),
        };
        let arena = boot::arena_size(self.ctx.memory);
        if let Some(e) = commands.iter().find_map(|c| c.to_guest(arena).err()) {
            return Outcome::generic(format!("command: {e}"));
        }
        let shared = &self.ctx.vcpus[vcpu];
        if let VcpuState::Finished(how) = shared.state() {
            return fail(
                ErrorClass::GenericError,
                format!("vCPU {vcpu} has stopped ({how})"),
            );
        }
        if wait && commands.len() > crate::vcpu::RESULTS_KEPT {
            let desc = format!("with wait, at most {} commands at once (the results a vCPU keeps); split the sequence", crate::vcpu::RESULTS_KEPT);
            return Outcome::generic(desc);
        }
        let count = commands.len() as u64;
        let first = match shared.push_commands(commands) {
            Ok(first) => first,
            Err(full) => return Outcome::generic(full.to_string()),
        };
        let last = first + count - 1;
        if wait {
            return Outcome::Wait(Pending::Guest(GuestWait { vcpu, first, last }));
        }
        Outcome::ret(&GuestCommandReply {
            vcpu,
            first_seq: first,
            last_seq: last,
            results: None,
        })
    }

    /// A client's `query-readiness`: started now, or, while the periodic
    /// measurement runs, once that one has stopped for it (a client who
    /// asks gets an answer; the periodic figures come again a period on).
    fn client_readiness(&mut self, args: ReadinessArgs) -> Outcome {
        let running = self.readiness_busy.load(Ordering::Acquire);
        if running && self.stop_periodic() {
            Outcome::Wait(Pending::ReadinessQueued {
                args,
                until: std::time::Instant::now() + READINESS_QUEUE_LIMIT,
            })
        } else {
            deferred::start_readiness(&self.ctx, args, &self.readiness_busy)
        }
    }

    /// Asks the periodic measurement last started, if any, to stop (it
    /// stops for a client's); whether there was one to ask.
    fn stop_periodic(&self) -> bool {
        let periodic = self.periodic_stop.take();
        if let Some(stop) = &periodic {
            stop.store(true, Ordering::Release);
        }
        let asked = periodic.is_some();
        self.periodic_stop.set(periodic);
        asked
    }

    /// Where a deferred reply stands: events to send now, and the reply once
    /// ready. A queued `query-readiness` becomes a running one here.
    pub(crate) fn check_wait(&self, pending: &mut Pending) -> Progress {
        match pending {
            Pending::Guest(w) => Progress {
                events: Vec::new(),
                done: self.check_guest_wait(w),
            },
            Pending::Readiness(rx, _) => deferred::poll_worker(rx),
            Pending::ReadinessQueued { args, until } => {
                let waiting = |done| Progress {
                    events: Vec::new(),
                    done,
                };
                if self.readiness_busy.load(Ordering::Acquire) {
                    // A periodic one started since (its slot came free as
                    // it fell due) stops for this one too.
                    self.stop_periodic();
                    if std::time::Instant::now() < *until {
                        return waiting(None);
                    }
                    return waiting(Some(Outcome::generic(
                        "a readiness measurement is already running; try again when it is done",
                    )));
                }
                match deferred::start_readiness(&self.ctx, *args, &self.readiness_busy) {
                    Outcome::Wait(started) => {
                        // The one running now is this client's.
                        self.periodic_stop.set(None);
                        *pending = started;
                        waiting(None)
                    }
                    other => waiting(Some(other)),
                }
            }
        }
    }

    /// A page of the sampler's points after `since`: the oldest
    /// [`SAMPLES_PAGE`] (with `more` set when there are others), or the newest
    /// `max` of them, and no more than [`SAMPLES_PAGE_BYTES`] of them. Built
    /// only up to the page, serialized as it is built, so a reply stays
    /// bounded however large the ring or the VM (docs/PROTOCOL.md, "Limits").
    fn query_samples(&self, since: u64, max: Option<u64>) -> Outcome {
        let Some(s) = &self.ctx.samples else {
            return no_sampler();
        };
        let newest = max.is_some();
        let max = max.map_or(SAMPLES_PAGE, |m| {
            usize::try_from(m).unwrap_or(usize::MAX).min(SAMPLES_PAGE)
        });
        let page = s.page(since, max, newest);
        match s.page_reply(page, SAMPLES_PAGE_BYTES, newest) {
            Ok(raw) => Outcome::ReturnRaw(raw),
            Err(e) => Outcome::generic(format!("encoding the page: {e}")),
        }
    }

    /// The reply to a waiting `guest-command`, once its last command finished
    /// or the vCPU stopped; `None` while it runs.
    fn check_guest_wait(&self, w: &GuestWait) -> Option<Outcome> {
        let shared = &self.ctx.vcpus[w.vcpu];
        let results = shared.results();
        if results.last().is_some_and(|r| r.seq >= w.last) {
            let mine = results
                .iter()
                .filter(|r| (w.first..=w.last).contains(&r.seq))
                .map(result_reply)
                .collect();
            return Some(Outcome::ret(&GuestCommandReply {
                vcpu: w.vcpu,
                first_seq: w.first,
                last_seq: w.last,
                results: Some(mine),
            }));
        }
        match shared.state() {
            VcpuState::Finished(how) => Some(fail(
                ErrorClass::GenericError,
                format!(
                    "vCPU {} stopped before its commands finished ({how})",
                    w.vcpu
                ),
            )),
            _ => None,
        }
    }

    fn guest_state(&self, i: usize) -> Value {
        let shared = &self.ctx.vcpus[i];
        let mut v = json!({
            "vcpu": i,
            "queued": shared.queued(),
            "phase": shared.phase.load(Ordering::Relaxed),
            "last-result": shared.results().last().map(result_json),
            "progress": shared.guest_progress(),
            "progress-per-second": shared.progress_per_second(),
        });
        let (state, detail) = match shared.state() {
            VcpuState::Booting => ("booting", None),
            VcpuState::Running { seq, command } => (
                "running",
                Some(("command", json!({"seq": seq, "command": command}))),
            ),
            VcpuState::Waiting => ("waiting", None),
            VcpuState::Paused => ("paused", None),
            VcpuState::Finished(how) => ("finished", Some(("outcome", json!(how.to_string())))),
        };
        v["state"] = json!(state);
        if let Some((key, value)) = detail {
            v[key] = value;
        }
        v
    }

    /// Asks the main loop for a run-state change and waits for its answer,
    /// which comes at once unless the main loop has stopped listening because
    /// the VMM is shutting down (then the server is stopping too).
    fn run_state(&self, request: RunRequest) -> Outcome {
        let (tx, rx) = channel();
        if self.ctx.main.send(VmEvent::Control(request, tx)).is_err() {
            return fail(ErrorClass::GenericError, "the VMM is shutting down");
        }
        loop {
            match rx.recv_timeout(STOP_CHECK) {
                Ok(Ok(())) => return ret(json!({})),
                Ok(Err(e)) => return fail(ErrorClass::GenericError, e.to_string()),
                Err(RecvTimeoutError::Timeout) if !self.stopping.load(Ordering::Acquire) => {}
                Err(_) => return fail(ErrorClass::GenericError, "the VMM is shutting down"),
            }
        }
    }
}

/// `qmp_capabilities`: this server offers no capabilities to enable (QEMU's
/// `oob` included), so any named is refused.
/// Commands that act on the guest or measure it, refused while it is still
/// arriving (a destination's `inmigrate`); queries and the migration's own
/// commands are answered.
fn needs_the_guest(command: &Command) -> bool {
    matches!(
        command,
        Command::GuestCommand(_) | Command::QueryReadiness(_) | Command::CalcDirtyRate(_)
    )
}

/// A dirty-limit command's reply (QEMU's errors are all `GenericError`).
fn limit_outcome(r: Result<(), crate::vcpu::limits::LimitError>) -> Outcome {
    match r {
        Ok(()) => Outcome::ret(json!({})),
        Err(e) => Outcome::generic(crate::error_chain(&e)),
    }
}

fn negotiate(args: &CapabilitiesArgs) -> Outcome {
    match args.enable.first() {
        None => Outcome::Negotiated,
        Some(c) => {
            let shown: String = c.chars().take(64).collect();
            Outcome::generic(format!(
                "Capability '{shown}' not available (this server offers none)"
            ))
        }
    }
}

/// Each entry of a provider's `StatsResult`s or `StatsSchema`s, its
/// `provider` member set.
fn of_provider(entries: Vec<Value>, provider: StatsProvider) -> impl Iterator<Item = Value> {
    entries.into_iter().map(move |mut e| {
        e["provider"] = json!(provider.name());
        e
    })
}

/// The providers a `query-stats` asks for, each with its stat-name filter:
/// every provider (kvm first) when it names none, as QEMU; a provider's
/// `names` given more than once add up, and one entry without `names` asks
/// for every stat; kvmscope's top-level `names` narrows each (both apply).
fn stats_filters(args: &QueryStatsArgs) -> Vec<(StatsProvider, NameFilter)> {
    let asked: Vec<(StatsProvider, Option<Vec<String>>)> = match &args.providers {
        None => vec![(StatsProvider::Kvm, None), (StatsProvider::Kvmscope, None)],
        Some(list) => {
            let mut asked: Vec<(StatsProvider, Option<Vec<String>>)> = Vec::new();
            for r in list {
                match asked.iter_mut().find(|(p, _)| *p == r.provider) {
                    // A request without names asks for every stat.
                    Some((_, names)) => {
                        *names = match (names.take(), &r.names) {
                            (Some(mut a), Some(b)) => {
                                a.extend(b.iter().cloned());
                                Some(a)
                            }
                            _ => None,
                        }
                    }
                    None => asked.push((r.provider, r.names.clone())),
                }
            }
            asked
        }
    };
    asked
        .into_iter()
        .map(|(provider, names)| {
            let names = match (names, args.names.clone()) {
                (Some(a), Some(b)) => Some(a.into_iter().filter(|n| b.contains(n)).collect()),
                (a, b) => a.or(b),
            };
            (provider, NameFilter::from_option(names))
        })
        .collect()
}
