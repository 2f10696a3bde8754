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

use super::deferred::{self, Pending, Progress};
use super::request::{Command, ErrorClass, StatsTarget, VcpuSelector, COMMANDS};
use super::{Context, Error, PROTOCOL_VERSION};
use crate::abi;
use crate::boot;
use crate::summary::result_json;
use crate::vcpu::{RunRequest, VcpuState, VmEvent};
use crate::workload::parse_sequence;
use crate::x86_64::paging;

/// How often a run-state request that the main loop has not answered yet
/// looks whether the server is stopping.
const STOP_CHECK: Duration = Duration::from_millis(20);

/// A `guest-command` whose reply waits for its commands to finish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuestWait {
    pub vcpu: usize,
    pub first: u64,
    pub last: u64,
}

/// What a command produced.
#[derive(Debug)]
pub enum Outcome {
    /// `{"return": value}`, with fds riding on the line.
    Return(Value, Vec<File>),
    Error(ErrorClass, String),
    /// The reply waits until [`Handler::check_wait`] gives it.
    Wait(Pending),
    /// Start streaming `SAMPLE` events after point `since`; `reply` is the return value.
    Subscribe {
        since: u64,
        reply: Value,
    },
    /// Stop streaming.
    Unsubscribe,
}

fn fail(class: ErrorClass, desc: impl Into<String>) -> Outcome {
    Outcome::Error(class, desc.into())
}

fn no_sampler() -> Outcome {
    fail(
        ErrorClass::GenericError,
        "the sampler is off (the VMM was started with --sample-interval off)",
    )
}

fn ret(value: Value) -> Outcome {
    Outcome::Return(value, Vec::new())
}

/// The control plane's view of the VM, with its own stats fds and samples.
pub struct Handler {
    ctx: Context,
    vm_stats: StatsFd,
    vcpu_stats: Vec<StatsFd>,
    vm_sample: Sample,
    vcpu_samples: Vec<Sample>,
    /// Set when the server is being dropped.
    stopping: Arc<AtomicBool>,
    /// A `query-readiness` worker is running.
    readiness_busy: Arc<AtomicBool>,
}

impl Handler {
    /// Opens the stats fds the handler reads for `query-stats`.
    ///
    /// # Errors
    /// A stats fd that cannot be opened, duplicated or read.
    pub fn new(ctx: Context, stopping: Arc<AtomicBool>) -> Result<Handler, Error> {
        let vm_stats = StatsFd::new(kvm_stats::ioctl::get_stats_fd(&ctx.vm_fd)?)?;
        let vcpu_stats = ctx
            .vcpu_stats
            .iter()
            .map(|f| Ok(StatsFd::new(f.try_clone().map_err(Error::Dup)?)?))
            .collect::<Result<Vec<_>, Error>>()?;
        let vm_sample = vm_stats.new_sample();
        let vcpu_samples = vcpu_stats.iter().map(StatsFd::new_sample).collect();
        Ok(Handler {
            ctx,
            vm_stats,
            vcpu_stats,
            vm_sample,
            vcpu_samples,
            stopping,
            readiness_busy: Arc::new(AtomicBool::new(false)),
        })
    }

    /// Migration event lines queued since the last call, for every client.
    pub fn migration_events(&self) -> Vec<Vec<u8>> {
        super::migrate::event_lines(&self.ctx)
    }

    /// The sampler's shared part, when it runs.
    pub fn samples(&self) -> Option<Arc<crate::sampler::Shared>> {
        self.ctx.samples.clone()
    }

    /// The line every client gets on connecting.
    pub fn greeting(&self) -> Value {
        json!({"QMP": {
            "version": {"package": concat!("kvmscope ", env!("CARGO_PKG_VERSION")), "protocol": PROTOCOL_VERSION},
            "capabilities": ["stats-fd"],
            "vm": {
                "pid": std::process::id(), "vcpus": self.ctx.vcpus.len(), "memory": self.ctx.memory,
                "backend": self.ctx.backend.kind, "stats-id": self.vm_stats.schema().id(),
            },
        }})
    }

    /// Runs one command.
    pub fn execute(&mut self, command: Command) -> Outcome {
        match command {
            Command::QmpCapabilities => ret(json!({})),
            Command::QueryCommands => ret(COMMANDS
                .iter()
                .map(|name| json!({ "name": name }))
                .collect()),
            Command::QueryVm => ret(self.query_vm()),
            Command::GetStatsFd { target, vcpu } => self.get_stats_fd(target, vcpu),
            Command::QueryStats {
                target,
                names,
                vcpus,
            } => self.query_stats(target, names, vcpus),
            Command::QueryStatsSchemas { target } => ret(self.query_schemas(target)),
            Command::QueryExits { vcpus } => self.per_vcpu(vcpus, |h, i| {
                let mut counters = h.ctx.vcpus[i].counters.to_json();
                counters["vcpu"] = json!(i);
                counters
            }),
            Command::GuestCommand {
                vcpu,
                command,
                wait,
            } => self.guest_command(vcpu, &command, wait),
            Command::QueryGuest { vcpus } => self.per_vcpu(vcpus, Handler::guest_state),
            Command::QuerySamples { since, max } => self.query_samples(since, max),
            Command::SubscribeSamples { since } => match &self.ctx.samples {
                Some(s) => {
                    let since = since.unwrap_or_else(|| s.last_seq());
                    Outcome::Subscribe {
                        since,
                        reply: json!({"since": since, "header": s.header.to_json()}),
                    }
                }
                None => no_sampler(),
            },
            Command::UnsubscribeSamples => Outcome::Unsubscribe,
            Command::QueryReadiness(args) => {
                deferred::start_readiness(&self.ctx, args, &self.readiness_busy)
            }
            Command::Pause => self.run_state(RunRequest::Pause),
            Command::Resume => self.run_state(RunRequest::Resume),
            Command::Quit => self.run_state(RunRequest::Quit),
            Command::Migration(c) => super::migrate::execute(&self.ctx, c),
        }
    }

    fn check_vcpus(&self, vcpus: Option<Vec<usize>>) -> Result<Vec<usize>, Outcome> {
        let n = self.ctx.vcpus.len();
        let list = vcpus.unwrap_or_else(|| (0..n).collect());
        match list.iter().find(|&&i| i >= n) {
            Some(i) => Err(fail(
                ErrorClass::VcpuNotFound,
                format!("vCPU {i} does not exist (the VM has {n})"),
            )),
            None => Ok(list),
        }
    }

    fn per_vcpu(
        &mut self,
        vcpus: Option<Vec<usize>>,
        f: impl Fn(&Handler, usize) -> Value,
    ) -> Outcome {
        match self.check_vcpus(vcpus) {
            Ok(list) => ret(list.into_iter().map(|i| f(self, i)).collect()),
            Err(e) => e,
        }
    }

    fn query_vm(&self) -> Value {
        let n = self.ctx.vcpus.len() as u64;
        let size = self.ctx.memory;
        let page = abi::PAGE_SIZE;
        let region =
            |name: &str, start: u64, len: u64| json!({"name": name, "start": start, "size": len});
        let layout = [
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
        json!({
            "pid": std::process::id(),
            "backend": self.ctx.backend.to_json(),
            "vcpus": n,
            "memory": {"size": size, "hugepages": self.ctx.hugepages, "layout": layout},
            "guest-abi": abi::ABI_VERSION,
            "stats-ids": {
                "vm": self.vm_stats.schema().id(),
                "vcpus": self.vcpu_stats.iter().map(|s| s.schema().id()).collect::<Vec<_>>(),
            },
        })
    }

    /// A fresh VM stats fd (KVM_GET_STATS_FD on the VM fd does not wait for
    /// anything), or duplicates of the vCPU stats files opened before the vCPUs
    /// first ran (KVM_GET_STATS_FD on a vCPU fd waits for the vCPU to leave
    /// KVM_RUN, which may take seconds; see docs/PROTOCOL.md).
    fn get_stats_fd(&self, target: StatsTarget, vcpu: Option<VcpuSelector>) -> Outcome {
        let open = |i: usize| -> Result<(Value, File), Outcome> {
            let file = self.ctx.vcpu_stats[i].try_clone().map_err(|e| {
                fail(
                    ErrorClass::GenericError,
                    format!("duplicating the vCPU {i} stats fd: {e}"),
                )
            })?;
            Ok((
                json!({"target": "vcpu", "vcpu": i, "id": self.vcpu_stats[i].schema().id()}),
                file,
            ))
        };
        let got: Result<Vec<(Value, File)>, Outcome> = match (target, vcpu) {
            (StatsTarget::Vm, _) => match kvm_stats::ioctl::get_stats_fd(&self.ctx.vm_fd) {
                Ok(file) => Ok(vec![(
                    json!({"target": "vm", "id": self.vm_stats.schema().id()}),
                    file,
                )]),
                Err(e) => Err(fail(ErrorClass::GenericError, crate::error_chain(&e))),
            },
            (StatsTarget::Vcpu, Some(VcpuSelector::One(i))) => self
                .check_vcpus(Some(vec![i]))
                .and_then(|_| open(i).map(|x| vec![x])),
            (StatsTarget::Vcpu, _) => (0..self.ctx.vcpus.len()).map(open).collect(),
        };
        match got {
            Ok(pairs) => {
                let (names, files): (Vec<Value>, Vec<File>) = pairs.into_iter().unzip();
                Outcome::Return(json!({ "fds": names }), files)
            }
            Err(e) => e,
        }
    }

    fn query_stats(
        &mut self,
        target: StatsTarget,
        names: Option<Vec<String>>,
        vcpus: Option<Vec<usize>>,
    ) -> Outcome {
        let filter = NameFilter::from_option(names);
        let read_failed =
            |e: kvm_stats::Error| fail(ErrorClass::GenericError, crate::error_chain(&e));
        if target == StatsTarget::Vm {
            return match self.vm_stats.read_sample(&mut self.vm_sample) {
                Ok(()) => ret(kvm_stats::json::query_stats(
                    [(self.vm_stats.schema(), &self.vm_sample)],
                    &filter,
                )),
                Err(e) => read_failed(e),
            };
        }
        let list = match self.check_vcpus(vcpus) {
            Ok(list) => list,
            Err(e) => return e,
        };
        for &i in &list {
            if let Err(e) = self.vcpu_stats[i].read_sample(&mut self.vcpu_samples[i]) {
                return read_failed(e);
            }
        }
        let sources = list
            .iter()
            .map(|&i| (self.vcpu_stats[i].schema(), &self.vcpu_samples[i]));
        ret(kvm_stats::json::query_stats(sources, &filter))
    }

    fn query_schemas(&self, target: Option<StatsTarget>) -> Value {
        let vm = target != Some(StatsTarget::Vcpu);
        let vcpu = target != Some(StatsTarget::Vm);
        let schemas = vm.then(|| self.vm_stats.schema()).into_iter().chain(
            self.vcpu_stats
                .first()
                .filter(|_| vcpu)
                .map(StatsFd::schema),
        );
        kvm_stats::json::query_stats_schemas(schemas)
    }

    fn guest_command(&mut self, vcpu: usize, text: &str, wait: bool) -> Outcome {
        if let Err(e) = self.check_vcpus(Some(vec![vcpu])) {
            return e;
        }
        let commands = match parse_sequence(text) {
            Ok(c) => c,
            Err(e) => return fail(ErrorClass::InvalidArgument, format!("command: {e}")),
        };
        let arena = boot::arena_size(self.ctx.memory);
        if let Some(e) = commands.iter().find_map(|c| c.to_guest(arena).err()) {
            return fail(ErrorClass::InvalidArgument, format!("command: {e}"));
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
            return fail(ErrorClass::InvalidArgument, desc);
        }
        let count = commands.len() as u64;
        let first = shared.push_commands(commands);
        let last = first + count - 1;
        if wait {
            return Outcome::Wait(Pending::Guest(GuestWait { vcpu, first, last }));
        }
        ret(json!({"vcpu": vcpu, "first-seq": first, "last-seq": last}))
    }

    /// Where a deferred reply stands: events to send now, and the reply once ready.
    pub fn check_wait(&self, pending: &Pending) -> Progress {
        match pending {
            Pending::Guest(w) => Progress {
                events: Vec::new(),
                done: self.check_guest_wait(w),
            },
            Pending::Readiness(rx) => deferred::poll_worker(rx),
        }
    }

    /// The sampler's points after `since` (the newest `max` of them).
    fn query_samples(&self, since: u64, max: Option<u64>) -> Outcome {
        let Some(s) = &self.ctx.samples else {
            return no_sampler();
        };
        let (mut points, dropped) = s.since(since);
        let skip = max.map_or(0, |m| {
            points
                .len()
                .saturating_sub(usize::try_from(m).unwrap_or(usize::MAX))
        });
        let skipped = points.drain(..skip).count() as u64;
        let samples: Vec<Value> = points.iter().map(|p| p.to_json(&s.header)).collect();
        ret(
            json!({"header": s.header.to_json(), "samples": samples, "dropped": dropped + skipped, "last-seq": s.last_seq()}),
        )
    }

    /// The reply to a waiting `guest-command`, once its last command finished
    /// or the vCPU stopped; `None` while it runs.
    fn check_guest_wait(&self, w: &GuestWait) -> Option<Outcome> {
        let shared = &self.ctx.vcpus[w.vcpu];
        let results = shared.results();
        if results.last().is_some_and(|r| r.seq >= w.last) {
            let mine: Vec<Value> = results
                .iter()
                .filter(|r| (w.first..=w.last).contains(&r.seq))
                .map(result_json)
                .collect();
            return Some(ret(
                json!({"vcpu": w.vcpu, "first-seq": w.first, "last-seq": w.last, "results": mine}),
            ));
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
        });
        let (state, detail) = match shared.state() {
            VcpuState::Booting => ("booting", None),
            VcpuState::Running { seq, command } => (
                "running",
                Some(("command", json!({"seq": seq, "command": command}))),
            ),
            VcpuState::Waiting => ("waiting", None),
            VcpuState::Paused => ("paused", None),
            VcpuState::Finished(how) => ("finished", Some(("outcome", json!(how)))),
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
                Ok(Err(e)) => return fail(ErrorClass::GenericError, e),
                Err(RecvTimeoutError::Timeout) if !self.stopping.load(Ordering::Acquire) => {}
                Err(_) => return fail(ErrorClass::GenericError, "the VMM is shutting down"),
            }
        }
    }
}
