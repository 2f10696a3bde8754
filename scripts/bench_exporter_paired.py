#!/usr/bin/env python3
"""What the VMMs' own stats add to an exporter's scrape, with the host's noise shared.

Starts N VMs (4 vCPUs, 64 MiB, idle) of PLAIN, a kvmscope without stats of
its own (e.g. 939ba05), and N of each VMM build given, each set in its own
directory; then one exporter per (exporter build, VM set) pair asked for, all
at once, and scrapes them in turn, round after round, so that a slow moment of
the host falls on every exporter alike (scripts/bench_exporter_ab.sh runs them
one after another, and its rounds moved by +-15 %). Prints, per exporter: the
page's series, the wall time and the exporter's own scrape time (medians),
and its CPU per scrape; then each exporter's figures against the one reading
PLAIN's VMs with the same build.

    scripts/bench_exporter_paired.py --plain /tmp/kvmscope-939ba05 \\
        --build old=/tmp/kvmscope-ad771af --build new=target/release/kvmscope
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_exporter import (cpu_seconds, free_port, metric_sum, scrape,  # noqa: E402
                            start_exporter, wait_for_vms)


def start_vms(exe, d, n, vcpus):
    # Hundreds of VMs starting at once on a small host: builds before
    # --boot-timeout counted only a vCPU's own time (after 4a2bc92) took a
    # guest that had waited seconds for a CPU for one that never checks in.
    children = [subprocess.Popen(
        [exe, "run", "--socket", os.path.join(d, f"vm{i}.sock"), "--memory", "64M",
         "--vcpus", str(vcpus), "--sample-interval", "off", "--boot-timeout", "off"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(n)]
    return children


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plain", required=True, help="a VMM without stats of its own")
    ap.add_argument("--build", action="append", required=True, metavar="NAME=BINARY",
                    help="an exporter and VMM build; repeatable")
    ap.add_argument("--vms", type=int, default=100)
    ap.add_argument("--vcpus", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--extra", default="", help="exporter options, space-separated")
    args = ap.parse_args()
    builds = [(b.split("=", 1)[0], os.path.abspath(b.split("=", 1)[1])) for b in args.build]
    extra = args.extra.split()
    children, exporters = [], []
    with tempfile.TemporaryDirectory() as top:
        try:
            sets = {"plain": os.path.join(top, "plain")}
            for name, _ in builds:
                sets[name] = os.path.join(top, name)
            for name, d in sets.items():
                os.mkdir(d)
                exe = os.path.abspath(args.plain) if name == "plain" else dict(builds)[name]
                children += start_vms(exe, d, args.vms, args.vcpus)
            # Each build's exporter over the plain VMs and over its own.
            for name, exe in builds:
                for vms in ("plain", name):
                    port = free_port()
                    p = start_exporter(exe, sets[vms], port, extra)
                    exporters.append({"label": f"{name} exporter, {vms} VMs", "build": name,
                                      "vms": vms, "port": port, "proc": p,
                                      "walls": [], "own": []})
            for e in exporters:
                page = wait_for_vms(e["port"], args.vms, limit=300)
                e["series"] = sum(1 for l in page.splitlines() if l and not l.startswith("#"))
                e["cpu0"] = cpu_seconds(e["proc"].pid)
            for _ in range(args.rounds):
                for e in exporters:
                    took, page = scrape(e["port"])
                    e["walls"].append(took)
                    e["own"].append(metric_sum(page, "kvmscope_exporter_scrape_duration_seconds"))
            for e in exporters:
                e["cpu"] = (cpu_seconds(e["proc"].pid) - e["cpu0"]) / args.rounds
        finally:
            for e in exporters:
                e["proc"].terminate()
            for c in children:
                c.terminate()
            for p in [e["proc"] for e in exporters] + children:
                p.wait(timeout=30)
    print(f"{args.vms} VMs x {args.vcpus} vCPUs per set, {args.rounds} rounds, "
          f"exporters scraped in turn; medians (ms)")
    for e in exporters:
        e["wall"] = statistics.median(e["walls"]) * 1e3
        e["own_ms"] = statistics.median(e["own"]) * 1e3
        e["cpu_ms"] = e["cpu"] * 1e3
        print(f"{e['label']}: {e['series']} series; wall {e['wall']:.2f}, "
              f"own {e['own_ms']:.2f}, CPU {e['cpu_ms']:.2f}")
    for name, _ in builds:
        base = next(e for e in exporters if e["build"] == name and e["vms"] == "plain")
        own = next(e for e in exporters if e["build"] == name and e["vms"] == name)
        # Too few rounds can measure no CPU at all: no ratio then.
        rise = {k: f"{100 * (own[k] / base[k] - 1):+.0f} %" if base[k] else "n/a" for k in ("wall", "own_ms", "cpu_ms")}
        print(f"{name}: with the VMMs' own stats: wall {rise['wall']}, own {rise['own_ms']}, CPU {rise['cpu_ms']}; "
              f"series {own['series'] - base['series']:+d}")


if __name__ == "__main__":
    main()
