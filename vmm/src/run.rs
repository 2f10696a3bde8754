//! `kvmscope run`: boot the guest, run the workloads, stop in order, summarise.

use std::time::{Duration, Instant};

use crate::boot;
use crate::control;
use crate::sampler::{self, Sampler, SamplerConfig};
use crate::summary::{kvm_growth, Mapped, Summary, VcpuSummary};
use crate::vcpu::{Control, Outcome, RunRequest, VmEvent};
use crate::vm::{self, Vm, VmConfig};
use crate::workload::{parse_workload, SpecError, Workload};

/// The workload `kvmscope run` gives vCPU 0 when none is named.
pub const DEMO_WORKLOAD: &str = "touch size=16M; touch-zero offset=16M size=8M; read offset=24M size=8M; dirty ws=16M rate=20000/s for=200ms; exits count=1000";

/// Everything `kvmscope run` needs.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub vm: VmConfig,
    pub workloads: Vec<Workload>,
    /// When the process started, for start-up timing.
    pub process_start: Instant,
    /// How long to wait for vCPUs to stop.
    pub stop_timeout: Duration,
    /// Turn SIGINT/SIGTERM into an orderly stop (the binary; the caller must have
    /// called `signals::block_termination` before starting any thread).
    pub handle_signals: bool,
    /// Serve the control socket at this path; the VM then runs until `quit` or a signal.
    pub socket: Option<std::path::PathBuf>,
    /// Run the sampler thread.
    pub sampler: Option<SamplerConfig>,
    /// Serve the sampler's readings as Prometheus text at this address (needs the sampler).
    pub metrics_addr: Option<std::net::SocketAddr>,
}

/// Why a run could not happen.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Vm(#[from] vm::Error),
    #[error("starting the sampler")]
    Sampler(#[from] sampler::Error),
    #[error("starting the metrics server")]
    Metrics(#[from] crate::metrics::Error),
    #[error("--metrics-addr needs the sampler")]
    MetricsWithoutSampler,
    #[error("starting the control socket")]
    Control(#[from] control::Error),
    #[error("starting the signal thread")]
    Signals(#[source] std::io::Error),
    #[error("workload for vCPU {vcpu}: {source}")]
    Workload { vcpu: usize, source: SpecError },
}

impl RunConfig {
    /// A run of the demo workload on a default VM.
    pub fn demo() -> Self {
        let demo = parse_workload(DEMO_WORKLOAD)
            .unwrap_or_else(|e| unreachable!("the demo workload parses: {e}"));
        RunConfig {
            vm: VmConfig::default(),
            workloads: vec![demo],
            process_start: Instant::now(),
            stop_timeout: Duration::from_secs(1),
            handle_signals: false,
            socket: None,
            sampler: None,
            metrics_addr: None,
        }
    }
}

/// Checks every workload against the VM (vCPU targets, arena ranges) before
/// anything runs, and queues them.
fn queue_workloads(vm: &Vm, workloads: &[Workload]) -> Result<(), Error> {
    let arena = boot::arena_size(vm.config.memory);
    let mut per_vcpu = vec![Vec::new(); vm.config.vcpus];
    for w in workloads {
        let targets = w
            .target
            .resolve(vm.config.vcpus)
            .map_err(|source| Error::Workload { vcpu: 0, source })?;
        for &vcpu in &targets {
            for c in &w.commands {
                c.to_guest(arena)
                    .map_err(|source| Error::Workload { vcpu, source })?;
                per_vcpu[vcpu].push(c.clone());
            }
        }
    }
    for (i, cmds) in per_vcpu.into_iter().enumerate() {
        vm.push_commands(i, cmds);
    }
    Ok(())
}

/// What the main loop saw.
#[derive(Default)]
struct Watch {
    signal: Option<i32>,
    first_done: Option<Instant>,
}

/// Waits until every vCPU has run out of work (unless `serving` a control
/// socket), one fails, a signal arrives or a client asks to quit.
fn wait_until_done(vm: &mut Vm, watch: &mut Watch, serving: bool) {
    let n = vm.vcpus.len();
    let mut idle = vec![false; n];
    loop {
        match vm.next_event(Duration::from_secs(1)) {
            Some(VmEvent::Idle(i)) => idle[i] = true,
            Some(VmEvent::CommandDone(i, _)) => {
                watch.first_done.get_or_insert_with(Instant::now);
                idle[i] = false;
            }
            Some(VmEvent::Finished(_, outcome)) if outcome != Outcome::Stopped => return,
            Some(VmEvent::Finished(..)) => {}
            Some(VmEvent::Signal(sig)) => {
                watch.signal = Some(sig);
                return;
            }
            Some(VmEvent::Control(request, reply)) => {
                match request {
                    RunRequest::Pause => vm.control_all(Control::Pause),
                    RunRequest::Resume => vm.control_all(Control::Run),
                    RunRequest::Quit => {
                        let _ = reply.send(Ok(()));
                        return;
                    }
                }
                let _ = reply.send(Ok(()));
            }
            Some(VmEvent::Console(..)) | None => {}
        }
        if !serving && idle.iter().all(|&b| b) && vm.vcpus.iter().all(|v| v.shared.queued() == 0) {
            return;
        }
    }
}

/// Boots the guest, runs the workloads and returns the summary. A guest
/// failure is in the summary (`Summary::failure`), not an error.
///
/// # Errors
/// The VM could not be built, or a workload does not fit it.
pub fn run(config: RunConfig) -> Result<Summary, Error> {
    let mut vm = Vm::new(config.vm.clone())?;
    queue_workloads(&vm, &config.workloads)?;
    let mut vm_before = vm.vm_stats.new_sample();
    vm.vm_stats
        .read_sample(&mut vm_before)
        .map_err(vm::Error::Stats)?;
    let mut before = Vec::new();
    for s in &vm.vcpu_stats {
        let mut sample = s.new_sample();
        s.read_sample(&mut sample).map_err(vm::Error::Stats)?;
        before.push(sample);
    }
    if config.handle_signals {
        crate::signals::forward_termination(vm.event_sender()).map_err(Error::Signals)?;
    }
    let mut sampler = match &config.sampler {
        Some(c) => Some(Sampler::start(
            c.clone(),
            &vm.fd_file()?,
            &vm.vcpu_fds,
            vm.vcpus.iter().map(|v| v.shared.clone()).collect(),
            vm.config.memory,
        )?),
        None => None,
    };
    let metrics = match (&config.metrics_addr, &sampler) {
        (Some(addr), Some(s)) => Some(crate::metrics::MetricsServer::start(
            *addr,
            s.shared.clone(),
        )?),
        (Some(_), None) => return Err(Error::MetricsWithoutSampler),
        (None, _) => None,
    };
    if let Some(m) = &metrics {
        log::info!("metrics at http://{}/metrics", m.addr);
    }
    let started = Instant::now();
    vm.start()?;
    let server = match &config.socket {
        Some(path) => {
            let mut context = control::Context::new(&vm)?;
            context.samples = sampler.as_ref().map(|s| s.shared.clone());
            Some(control::Server::start(path, context)?)
        }
        None => None,
    };
    let mut watch = Watch::default();
    wait_until_done(&mut vm, &mut watch, server.is_some());
    drop(server);
    // One last point after the guest stopped, so the series ends with the final state.
    let sampler_result = sampler.as_mut().map_or(Ok(()), Sampler::stop);
    drop(metrics);
    let stuck = vm.stop(config.stop_timeout);
    let mut vm_after = vm.vm_stats.new_sample();
    vm.vm_stats
        .read_sample(&mut vm_after)
        .map_err(vm::Error::Stats)?;
    let mut vcpus = Vec::new();
    for (i, (stats, older)) in vm.vcpu_stats.iter().zip(&before).enumerate() {
        let mut newer = stats.new_sample();
        stats.read_sample(&mut newer).map_err(vm::Error::Stats)?;
        let shared = &vm.vcpus[i].shared;
        vcpus.push(VcpuSummary {
            index: i,
            outcome: vm.vcpus[i].outcome().cloned(),
            kvm: kvm_growth(stats, older, &newer),
            ours: shared.counters.to_json(),
            results: shared.results(),
        });
    }
    sampler_result?;
    let since = |t: Option<Instant>| t.map(|t| t.saturating_duration_since(config.process_start));
    Ok(Summary {
        backend: vm.backend.clone(),
        memory: vm.config.memory,
        hugepages: vm.config.hugepages,
        elapsed: started.elapsed(),
        to_first_exit: since(
            vm.vcpus
                .iter()
                .filter_map(|v| v.shared.first_exit.get().copied())
                .min(),
        ),
        to_first_done: since(watch.first_done),
        before: Mapped::from_sample(&vm.vm_stats, &vm_before),
        after: Mapped::from_sample(&vm.vm_stats, &vm_after),
        vcpus,
        signal: watch.signal,
        stuck,
    })
}
