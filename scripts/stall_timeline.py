#!/usr/bin/env python3
"""When, within and after a readiness window, the guest loses its work, and
what KVM's vCPU stats counted meanwhile: the guest's own count read every
few milliseconds (`query-guest`, no exit) on every vCPU, as pace per bin
against its pace over the half second before the window; KVM's vCPU stats
(one `pread` each, no kick) before, at the window's end and after; the
stall the VMM reported; the VMM's debug log lines about the dirty log.

A cell: one VM whose vCPU 0 writes `dirty ws=WS rate=max` (and, with
`reader`, whose vCPU 1 reads the whole arena, a word a page, over and over), one window.

    python3 scripts/stall_timeline.py --kvmscope target/release/kvmscope \\
        --cell bitmap:64M:0.5 --cell ring:512M:2:reader --json /tmp/t.json
"""

import argparse
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from experiments_stall import parse_size, start_all  # noqa: E402
from experiments_vm import Vm  # noqa: E402

BEFORE_S = 0.5
AFTER_S = 1.0
BIN_S = 0.05
EVERY_S = 0.004


def kvm_stats(vm):
    """Each vCPU's KVM stats, {name: value} (scalars only)."""
    rows = vm.side("query-stats", target="vcpu", providers=[{"provider": "kvm"}])
    out = []
    for r in rows:
        out.append({s["name"]: s["value"] for s in r["stats"] if isinstance(s["value"], int)})
    return out


def delta(a, b):
    return [{k: v[k] - u.get(k, 0) for k in v if v[k] != u.get(k, 0)} for u, v in zip(a, b)]


def cell(binary, mode, ws, window, reader):
    vcpus = 2 if reader else 1
    memory = "%dM" % max(256, 2 * ws // (1 << 20) + 64)
    with Vm(binary, memory, dirty_log=mode, vcpus=vcpus) as vm:
        vm.guest("touch size=%d" % ws)
        if reader:
            arena = vm.arena["size"]
            vm.guest("read size=%d" % arena, vcpu=1)  # its first pass maps the pages
            start_all(vm, "; ".join(["read size=%d" % arena] * 20000), vcpu=1)
        vm.start("dirty ws=%d rate=max for=60s" % ws)
        time.sleep(1.0)
        samples, stats, reply = [], {}, {}

        def sample():
            g = vm.side("query-guest", vcpus=list(range(vcpus)))
            samples.append((time.monotonic(), [x.get("progress") or 0 for x in g]))

        t0 = time.monotonic()
        stats["start"] = kvm_stats(vm)
        while time.monotonic() < t0 + BEFORE_S:
            sample()
            time.sleep(EVERY_S)
        stats["window"] = kvm_stats(vm)
        start = time.monotonic()

        def ask():
            try:
                reply["r"] = vm.readiness(False, window)
            except Exception as e:  # noqa: BLE001 (re-raised below, in this thread)
                reply["error"] = e
            reply["t"] = time.monotonic()

        th = threading.Thread(target=ask)
        th.start()
        while th.is_alive():
            sample()
            time.sleep(EVERY_S)
        th.join()
        if "error" in reply:
            raise reply["error"]
        stats["end"] = kvm_stats(vm)
        end = reply["t"]
        while time.monotonic() < end + AFTER_S:
            sample()
            time.sleep(EVERY_S)
        stats["after"] = kvm_stats(vm)
        with open(vm.log_path) as f:
            log_lines = [line.rstrip() for line in f if "dirty" in line or "stall" in line or "fault" in line]
    return summarize(mode, ws, window, reader, samples, stats, reply["r"], start, end, log_lines)


def summarize(mode, ws, window, reader, samples, stats, r, start, end, log_lines):
    vcpus = len(samples[0][1])
    before = [s for s in samples if s[0] < start]
    if len(before) < 2 or before[-1][0] <= before[0][0]:
        raise RuntimeError("fewer than two readings of the guest's count before the window")
    paces = [(before[-1][1][v] - before[0][1][v]) / (before[-1][0] - before[0][0]) for v in range(vcpus)]
    bins = []  # (from the window's start, s; each vCPU's pace against before, %)
    t = start - 0.2
    while t < end + AFTER_S - BIN_S:
        inside = [s for s in samples if t <= s[0] < t + BIN_S]
        if len(inside) >= 2:
            dt = inside[-1][0] - inside[0][0]
            bins.append((round(t - start, 3), [round(100 * (inside[-1][1][v] - inside[0][1][v]) / dt / paces[v])
                                               if paces[v] else None for v in range(vcpus)]))
        t += BIN_S

    def lost(a, b, v):
        """Seconds of work lost on vCPU v from a to b (times), at the pace before."""
        xs = [s for s in samples if a <= s[0] <= b]
        if len(xs) < 2 or not paces[v]:
            return None
        return round((xs[-1][0] - xs[0][0]) - (xs[-1][1][v] - xs[0][1][v]) / paces[v], 3)

    stall = r.get("guest_stall") or {}
    out = {
        "cell": "%s %dM %.1fs%s" % (mode, ws >> 20, window, " reader" if reader else ""),
        "window_s": round(end - start, 3),
        "reported_ms": stall.get("total_ms"),
        "stall": stall,
        "lost_in_window_s": [lost(start, end, v) for v in range(vcpus)],
        "lost_first_100ms_s": [lost(start, start + 0.1, v) for v in range(vcpus)],
        "lost_after_0.3s_s": [lost(end, end + 0.3, v) for v in range(vcpus)],
        "lost_after_1s_s": [lost(end, end + AFTER_S, v) for v in range(vcpus)],
        "stats_before": delta(stats["start"], stats["window"]),
        "stats_window": delta(stats["window"], stats["end"]),
        "stats_after": delta(stats["end"], stats["after"]),
        "bins": bins,
        "log": log_lines[-20:],
    }
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kvmscope", default="target/release/kvmscope")
    ap.add_argument("--cell", action="append", required=True, metavar="MODE:WS:WINDOW[:reader]")
    ap.add_argument("--json", help="write every cell's figures here")
    a = ap.parse_args()
    binary = os.path.abspath(a.kvmscope)
    results = []
    for spec in a.cell:
        parts = spec.split(":")
        if len(parts) not in (3, 4) or parts[0] not in ("bitmap", "ring") or parts[3:] not in ([], ["reader"]):
            ap.error("--cell %r: expected MODE:WS:WINDOW[:reader], MODE bitmap or ring" % spec)
        res = cell(binary, parts[0], parse_size(parts[1]), float(parts[2]), parts[3:] == ["reader"])
        results.append(res)
        print(json.dumps({k: v for k, v in res.items() if k not in ("bins", "log", "stall")}))
        print("  bins (s from the window's start: pace %):",
              " ".join("%+.2f:%s" % (t, "/".join(str(p) for p in ps)) for t, ps in res["bins"]))
        print("  stall:", json.dumps(res["stall"]))
        for line in res["log"]:
            print("  log:", line)
        sys.stdout.flush()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
