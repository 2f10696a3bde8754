#!/usr/bin/env python3
"""A migration that cannot converge by itself, made to converge:
`kvmscope migrate --converge auto` (what the readiness model chose, from the
start) against QEMU's ways, `--converge auto-converge` (blind throttle steps)
and `--converge dirty-limit` (every vCPU limited to `vcpu-dirty-limit`, 1 MB/s
by default, after two periods of dirtying too fast).

The source (256 MiB) sweeps 128 MiB on vCPU 0 over and over (`touch
size=128M`, each sweep fault-bound while tracked: about 1.5 GB/s of
dirtying); the link is capped at 100 MB/s, the downtime limit 300 ms.
- bitmap cells: one vCPU, `--dirty-log bitmap`: auto (a CPU throttle) and
  auto-converge;
- ring cells: `--dirty-log ring`, two vCPUs, vCPU 1 reading 64 MiB over and
  over (it dirties nothing): auto (a dirty limit), dirty-limit and
  auto-converge. vCPU 1's progress is its reads completed per second, as the
  guest reports them, during the migration against the 2 s before it.

Each cell is a fresh source and destination; the figures are the final
`query-migrate` and `migrate --predict`'s predicted-vs-actual.

    cargo build --release -p kvmscope
    python3 scripts/bench_converge.py --kvmscope target/release/kvmscope
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kvmscope_client  # noqa: E402


def reads_done(conn):
    """vCPU 1's commands done so far: the sequence number of the one it is
    running, or of its last result between two."""
    g, _ = conn.execute("query-guest", {"vcpus": [1]})
    return max(g[0].get("command", {}).get("seq", 0), (g[0].get("last-result") or {}).get("seq", 0))


def progress(sock, stop, out):
    """vCPU 1's reads per second over the 2 s before `stop` is first armed
    (out["before"]), then until the migration leaves the source (out["during"])."""
    conn = kvmscope_client.Connection(sock, 5)
    t0, n0 = time.monotonic(), reads_done(conn)
    stop["armed"].wait()
    t1, n1 = time.monotonic(), reads_done(conn)
    out["before"] = (n1 - n0) / (t1 - t0)
    last = (t1, n1)
    while not stop["done"].is_set():
        try:
            m, _ = conn.execute("query-migrate")
            if m.get("status") in ("completed", "failed", "cancelled"):
                break
            now = (time.monotonic(), reads_done(conn))
            if now[1] >= last[1]:
                last = now
        except (RuntimeError, OSError):
            break
        time.sleep(0.1)
    out["during"] = (last[1] - n1) / max(last[0] - t1, 1e-6)


def cell(exe, how, bandwidth, mode):
    ring = mode == "ring"
    with tempfile.TemporaryDirectory(prefix="kvmscope-conv-") as d:
        src_sock, uri = os.path.join(d, "src.sock"), "unix:" + os.path.join(d, "in.sock")
        sweeps = "; ".join(["touch size=128M"] * 4000)
        cmd = [exe, "run", "--socket", src_sock, "--memory", "256M", "--sample-interval", "off",
               "--workload", sweeps]
        if ring:
            cmd += ["--dirty-log", "ring", "--vcpus", "2"]
        else:
            cmd += ["--dirty-log", "bitmap"]
        src = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        dst = subprocess.Popen([exe, "run", "--incoming", uri, "--sample-interval", "off"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while not os.path.exists(src_sock):
                if time.monotonic() > deadline:
                    raise SystemExit("the source did not start")
                time.sleep(0.05)
            if ring:
                conn = kvmscope_client.Connection(src_sock, 5)
                for _ in range(16):  # requests are at most 64 KiB, queues 32,768 commands
                    conn.execute("guest-command", {"vcpu": 1, "command": "; ".join(["read offset=128M size=64M"] * 2000)})
            time.sleep(1)  # the sweeps under way, the destination listening
            stop = {"armed": threading.Event(), "done": threading.Event()}
            reads = {}
            watcher = threading.Thread(target=progress, args=(src_sock, stop, reads)) if ring else None
            if watcher:
                watcher.start()
            time.sleep(2)
            stop["armed"].set()
            out = subprocess.run([exe, "migrate", "--socket", src_sock, "--to", uri, "--bandwidth", bandwidth,
                                  "--max-downtime", "300ms", "--predict", "--json", "--converge", how],
                                 capture_output=True, text=True, timeout=300)
            stop["done"].set()
            if watcher:
                watcher.join()
        finally:
            for p in (src, dst):
                p.kill()
                p.wait()
    j = json.loads(out.stdout[out.stdout.index("{"):])
    j["reads"] = reads if ring else None
    return j


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kvmscope", default="target/release/kvmscope")
    ap.add_argument("--bandwidth", default="100MB/s")
    ap.add_argument("--only", choices=("bitmap", "ring"), help="run one kind of cell")
    args = ap.parse_args()
    exe = os.path.abspath(args.kvmscope)
    cells = [("bitmap", "auto"), ("bitmap", "auto-converge"),
             ("ring", "auto"), ("ring", "dirty-limit"), ("ring", "auto-converge")]
    for mode, how in cells:
        if args.only and mode != args.only:
            continue
        j = cell(exe, how, args.bandwidth, mode)
        fields = j.get("x-predicted", {}).get("fields", {})
        pred = {k: v.get("predicted") for k, v in fields.items()}
        per_vcpu = [round(v["ms"]) for v in j.get("x-cpu-throttled", {}).get("vcpus", [])]
        r = j["reads"]
        quiet = "" if not r else (f"; vCPU 1 reads/s {r['before']:.1f} before, {r['during']:.1f} during "
                                  f"({100 * r['during'] / max(r['before'], 1e-9):.1f} %)")
        print(f"{mode} --converge {how}: {j.get('status')}, total {j.get('total-time')} ms, downtime {j.get('downtime')} ms, "
              f"transferred {j['ram']['transferred'] / 1e6:.0f} MB in {j['ram']['dirty-sync-count']} passes, "
              f"throttle {j.get('cpu-throttle-percentage')} %, dirty-limit throttle/round "
              f"{j.get('dirty-limit-throttle-time-per-round')} us, vCPU time throttled "
              f"{j.get('x-cpu-throttled', {}).get('total-ms', 0):.0f} ms {per_vcpu}, guest stall "
              f"{j.get('x-guest-stall', {}).get('total-ms', 0):.0f} ms{quiet}; predicted {pred}", flush=True)


if __name__ == "__main__":
    main()
