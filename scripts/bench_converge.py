#!/usr/bin/env python3
"""A migration that cannot converge by itself, made to converge two ways:
`kvmscope migrate --converge auto` (the throttle the readiness model chose,
from the start) against `--converge auto-converge` (QEMU's blind steps).

The source (256 MiB, `--dirty-log bitmap`) sweeps 128 MiB over and over
(`touch size=128M`, each sweep fault-bound while tracked: about 1.5 GB/s of
dirtying), the link is capped at 100 MB/s, the downtime limit 300 ms. Each
cell is a fresh source and destination; the figures are the final
`query-migrate` and `migrate --predict`'s predicted-vs-actual.

    cargo build --release -p kvmscope
    python3 scripts/bench_converge.py --kvmscope target/release/kvmscope
"""

import argparse
import json
import os
import subprocess
import tempfile
import time


def cell(exe, how, bandwidth):
    with tempfile.TemporaryDirectory(prefix="kvmscope-conv-") as d:
        src_sock, uri = os.path.join(d, "src.sock"), "unix:" + os.path.join(d, "in.sock")
        sweeps = "; ".join(["touch size=128M"] * 4000)
        src = subprocess.Popen([exe, "run", "--socket", src_sock, "--memory", "256M", "--dirty-log", "bitmap",
                                "--sample-interval", "off", "--workload", sweeps],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        dst = subprocess.Popen([exe, "run", "--incoming", uri, "--sample-interval", "off"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while not os.path.exists(src_sock):
                if time.monotonic() > deadline:
                    raise SystemExit("the source did not start")
                time.sleep(0.05)
            time.sleep(2)  # the sweeps under way, the destination listening
            out = subprocess.run([exe, "migrate", "--socket", src_sock, "--to", uri, "--bandwidth", bandwidth,
                                  "--max-downtime", "300ms", "--predict", "--json", "--converge", how],
                                 capture_output=True, text=True, timeout=300)
        finally:
            for p in (src, dst):
                p.kill()
                p.wait()
    return json.loads(out.stdout[out.stdout.index("{"):])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kvmscope", default="target/release/kvmscope")
    ap.add_argument("--bandwidth", default="100MB/s")
    args = ap.parse_args()
    exe = os.path.abspath(args.kvmscope)
    for how in ("auto", "auto-converge"):
        j = cell(exe, how, args.bandwidth)
        fields = j.get("x-predicted", {}).get("fields", {})
        pred = {k: v.get("predicted") for k, v in fields.items()}
        print(f"--converge {how}: {j.get('status')}, total {j.get('total-time')} ms, downtime {j.get('downtime')} ms, "
              f"transferred {j['ram']['transferred'] / 1e6:.0f} MB in {j['ram']['dirty-sync-count']} passes, "
              f"throttle {j.get('cpu-throttle-percentage')} %, vCPU time throttled "
              f"{j.get('x-cpu-throttled', {}).get('total-ms', 0):.0f} ms, guest stall "
              f"{j.get('x-guest-stall', {}).get('total-ms', 0):.0f} ms; predicted {pred}")


if __name__ == "__main__":
    main()
