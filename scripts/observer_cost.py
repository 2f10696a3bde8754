#!/usr/bin/env python3
"""What dirty tracking costs a guest that nobody observes.

Runs `kvmscope run` with no dirty tracking, `--dirty-log ring` and
`--dirty-log bitmap`, nobody asking anything of the VMM, on the two workloads
of issue 20: `touch size=64M` repeated (time per sweep after the first, which
maps the pages) and `dirty ws=64M rate=max for=2s` (page writes done). Runs
alternate between the modes, so that a busy host slows them alike. Prints a
markdown table of medians and ranges, and each mode against no tracking.

  python3 scripts/observer_cost.py --kvmscope target/release/kvmscope --runs 5
"""

import argparse
import json
import statistics
import subprocess
import sys

SWEEPS = 5
WORKLOAD = "; ".join(["touch size=64M"] * SWEEPS + ["dirty ws=64M rate=max for=2s"])
MODES = {"none": [], "ring": ["--dirty-log", "ring"], "bitmap": ["--dirty-log", "bitmap"]}


def run(binary, mode, memory):
    cmd = [binary, "run", "--memory", memory, "--json", "--workload", WORKLOAD] + MODES[mode]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)
    commands = json.loads(out.stdout)["vcpus"][0]["commands"]
    sweeps = [c["host_time_s"] * 1e3 for c in commands[1:SWEEPS]]
    writes = commands[SWEEPS]["values"][0]
    return statistics.median(sweeps), writes


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kvmscope", default="target/release/kvmscope")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--memory", default="512M")
    args = ap.parse_args()
    got = {m: [] for m in MODES}
    for i in range(args.runs):
        for mode in MODES:
            got[mode].append(run(args.kvmscope, mode, args.memory))
            print("run %d %-6s sweep %.2f ms, %d writes" % ((i,) + (mode,) + got[mode][-1]),
                  file=sys.stderr)
    base_sweep = statistics.median(s for s, _ in got["none"])
    base_writes = statistics.median(w for _, w in got["none"])
    print("| mode (nobody observing) | touch 64M sweep, ms (median, range) | vs none "
          "| dirty rate=max 2 s, M writes (median, range) | vs none |")
    print("|---|---|---|---|---|")
    for mode, rows in got.items():
        sweeps = [s for s, _ in rows]
        writes = [w / 1e6 for _, w in rows]
        print("| %s | %.2f (%.2f-%.2f) | %+.1f %% | %.1f (%.1f-%.1f) | %+.1f %% |" % (
            mode, statistics.median(sweeps), min(sweeps), max(sweeps),
            (statistics.median(sweeps) / base_sweep - 1) * 100,
            statistics.median(writes), min(writes), max(writes),
            (statistics.median(writes) * 1e6 / base_writes - 1) * 100))


if __name__ == "__main__":
    main()
