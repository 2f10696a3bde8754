#!/usr/bin/env python3
"""What `kvmscope run --readiness-every` costs its guest, from the guest's
own count of its work (guest ABI 3's progress), in one VM: a VM started
with `--dirty-log ring --readiness-every PERIOD --readiness-window WINDOW`
runs a steady workload on vCPU 0 while this script reads the guest's count
(`query-guest`, no exit, no kick) every 100 ms. The VM's untracked pace is
the median of its one-second rates (the windows take one second in
PERIOD); each window's cost is the work the guest did not do against that
pace from the window's start until its pace is back (the window and what
follows it: the ring's pages made writable again). The cost at any period
is the loss per window over the period. One VM, so no second VM shares the
host's two cores with it (an earlier version compared two VMs at once, and
their noise, +-17 %, hid the effect).

    cargo build --release -p kvmscope
    python3 scripts/bench_periodic.py --kvmscope target/release/kvmscope --period 10s --periods 4
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from experiments_published import own_stats  # noqa: E402
from experiments_vm import Vm  # noqa: E402

WORKLOADS = {
    "dirty": "dirty ws=64M rate=max for={s}s",
    "touch": "touch size=64M",
}
# Bytes of commands per guest-command request (requests are at most 64 KiB).
REQUEST_BYTES = 60_000
SAMPLE_S = 0.1


def seconds(text):
    units = {"ms": 1e-3, "s": 1.0, "m": 60.0}
    for suffix in ("ms", "s", "m"):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * units[suffix]
    return float(text)


def start(vm, name, run_s):
    if name == "dirty":
        vm.start(WORKLOADS[name].format(s=int(run_s) + 5))
        return
    # A touch of 64 MiB takes a few ms: enough of them to outlast the run.
    command = WORKLOADS[name]
    left = int(run_s * 400)
    while left > 0:
        n = min(left, REQUEST_BYTES // (len(command) + 2))
        vm.call("guest-command", vcpu=0, command="; ".join([command] * n))
        left -= n


def windows(vm):
    """The end of the latest published measurement, s since the epoch (0: none)."""
    return own_stats(vm).get("readiness_at_ns", 0) / 1e9


def measure(exe, name, period, window, periods):
    vm = Vm(exe, "256M", dirty_log="ring",
            extra=["--readiness-every", "%gs" % period, "--readiness-window", "%gs" % window])
    try:
        vm.guest("touch size=64M")
        run_s = period * periods + 2.0
        start(vm, name, run_s)
        time.sleep(0.5)
        samples, ends = [], set()
        t_end = time.monotonic() + run_s
        while time.monotonic() < t_end:
            g = vm.call("query-guest", vcpus=[0])[0]
            samples.append((time.monotonic(), time.time(), g["progress"]))
            at = windows(vm)
            if at:
                ends.add(at)
            time.sleep(SAMPLE_S)
    finally:
        vm.close()
    return analyse(name, samples, sorted(ends), period, window)


def analyse(name, samples, ends, period, window):
    rates = [(t1, (c1 - c0) / (t1 - t0)) for (t0, _, c0), (t1, _, c1) in zip(samples, samples[1:])]
    per_s = [(c1 - c0) / (t1 - t0) for (t0, _, c0), (t1, _, c1) in zip(samples[::10], samples[10::10])]
    pace = statistics.median(per_s)
    span = samples[-1][0] - samples[0][0]
    done = samples[-1][2] - samples[0][2]
    overall = 1 - done / (pace * span)
    # Each window: from its start (its end less the window) until the pace
    # is back (three samples in a row within 5 % of it), the work not done.
    offset = samples[0][1] - samples[0][0]  # wall clock - monotonic
    losses = []
    for end in ends:
        t_start = end - offset - window
        lost, back, steady = 0.0, None, 0
        for (t0, r) in rates:
            if t0 < t_start:
                continue
            lost += (pace - r) * SAMPLE_S
            steady = steady + 1 if r >= 0.95 * pace else 0
            if t0 > t_start + window and steady >= 3:
                back = t0 - t_start
                break
        if back is not None:
            losses.append((lost / pace, back))
    per_window = statistics.mean(l for l, _ in losses) if losses else float("nan")
    return {
        "workload": name, "pace": pace, "overall_loss_pct": 100 * overall, "windows": len(losses),
        "lost_s_per_window": per_window, "back_s": statistics.mean(b for _, b in losses) if losses else float("nan"),
        "period_s": period, "at_60s_pct": 100 * per_window / 60.0, "at_period_pct": 100 * per_window / period,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kvmscope", default="target/release/kvmscope")
    ap.add_argument("--period", default="10s", help="--readiness-every (default 10s)")
    ap.add_argument("--window", default="500ms", help="--readiness-window (default 500ms, as kvmscope run's)")
    ap.add_argument("--periods", type=int, default=4, help="periods to watch (default 4)")
    ap.add_argument("--workloads", default="dirty,touch", help="of: " + ", ".join(WORKLOADS))
    a = ap.parse_args()
    exe = os.path.abspath(a.kvmscope)
    for name in a.workloads.split(","):
        r = measure(exe, name, seconds(a.period), seconds(a.window), a.periods)
        print("%(workload)s: untracked pace %(pace).0f units/s; %(windows)d windows, each costing %(lost_s_per_window).3f s "
              "of the guest's work (pace back %(back_s).2f s after the window began): %(at_period_pct).2f %% at a "
              "%(period_s)g s period (%(overall_loss_pct).2f %% over the whole run), %(at_60s_pct).2f %% at one window "
              "a minute" % r)


if __name__ == "__main__":
    main()
