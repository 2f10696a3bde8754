#!/usr/bin/env python3
"""What `kvmscope run --readiness-every` costs its guest: two VMs at once,
one untracked and one measuring readiness every PERIOD (a WINDOW-long
dirty-rate window each time, `--dirty-log ring`, which logs only during the
windows), both running the same workload; the guests' own counts of their
work, compared. The loss per window, scaled, gives the cost at any period.

    cargo build --release -p kvmscope
    python3 scripts/bench_periodic.py --kvmscope target/release/kvmscope --period 10s --seconds 40
"""

import argparse
import json
import os
import socket
import subprocess
import tempfile
import time


def call(sock, command, arguments):
    s = socket.socket(socket.AF_UNIX)
    s.connect(sock)
    f = s.makefile("rb")
    f.readline()
    s.sendall(b'{"execute":"qmp_capabilities"}')
    f.readline()
    s.sendall(json.dumps({"execute": command, "arguments": arguments}).encode())
    while True:
        r = json.loads(f.readline())
        if "event" not in r:
            s.close()
            return r["return"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kvmscope", default="target/release/kvmscope")
    ap.add_argument("--period", default="10s")
    ap.add_argument("--window", default="1s")
    ap.add_argument("--seconds", type=int, default=40)
    ap.add_argument("--workload", default="dirty ws=64M rate=max for={s}s",
                    help="the guests' workload ({s}: --seconds)")
    a = ap.parse_args()
    exe = os.path.abspath(a.kvmscope)
    work = a.workload.format(s=a.seconds)
    with tempfile.TemporaryDirectory(prefix="kvmscope-periodic-") as d:
        socks = [os.path.join(d, "plain.sock"), os.path.join(d, "measured.sock")]
        extra = [[], ["--dirty-log", "ring", "--readiness-every", a.period, "--readiness-window", a.window]]
        vms = [subprocess.Popen([exe, "run", "--socket", s, "--memory", "256M", "--sample-interval", "off"] + x,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for s, x in zip(socks, extra)]
        try:
            while not all(os.path.exists(s) for s in socks):
                time.sleep(0.05)
            for s in socks:
                call(s, "guest-command", {"vcpu": 0, "command": "touch size=64M", "wait": True})
            for s in socks:
                call(s, "guest-command", {"vcpu": 0, "command": work})
            time.sleep(a.seconds + 0.5)
            done = []
            for s in socks:
                while True:
                    g = call(s, "query-guest", {"vcpus": [0]})[0]
                    if g.get("last-result", {}).get("seq") == 2:
                        done.append(g["last-result"])
                        break
                    time.sleep(0.1)
        finally:
            for v in vms:
                v.kill()
                v.wait()
    plain, measured = (r["values"][0] for r in done)
    loss = 1 - measured / plain
    print(f"{a.seconds} s, readiness every {a.period} with a {a.window} window: untracked {plain / 1e6:.1f} M writes, "
          f"measured {measured / 1e6:.1f} M: {100 * loss:.2f} % less")


if __name__ == "__main__":
    main()
