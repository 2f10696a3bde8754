#!/usr/bin/env python3
"""How long a fresh control client waits while other clients misbehave.

Starts `kvmscope run --socket` children (2 vCPUs, a 1 ms sampler so that a
page of samples is large) and, for each case, times a fresh client from
connect to its `query-status` reply:

- idle:    64 negotiated clients hold every slot and send nothing;
- hangup:  N clients each send `query-samples` and hang up at once;
- reading: one client pages every sampler point out with `query-samples`
           (`since`, `more`), reading at its own pace: how many bytes, pages
           and seconds it took.

The figures go in docs/BENCHMARKS.md.

    python3 scripts/control_abuse.py --kvmscope target/release/kvmscope
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

NEGOTIATE = b'{"execute":"qmp_capabilities"}'


def start_vmm(exe, sock):
    child = subprocess.Popen(
        [exe, "run", "--socket", sock, "--memory", "64M", "--vcpus", "2",
         "--sample-interval", "1ms", "--sample-buffer", "8192"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while not os.path.exists(sock):
        if time.monotonic() > deadline or child.poll() is not None:
            sys.exit("kvmscope did not start")
        time.sleep(0.01)
    return child


class Conn:
    """A negotiated connection that reads reply lines, skipping events."""

    def __init__(self, sock, timeout=60):
        self.s = socket.socket(socket.AF_UNIX)
        self.s.settimeout(timeout)
        self.s.connect(sock)
        self.f = self.s.makefile("rb")
        json.loads(self.f.readline())
        self.call(NEGOTIATE)

    def call(self, request):
        self.s.sendall(request)
        while True:
            line = self.f.readline()
            if not line:
                raise RuntimeError("the VMM closed the connection")
            reply = json.loads(line)
            if "event" not in reply:
                return reply, len(line)

    def close(self):
        self.f.close()
        self.s.close()


def fresh_client_wait(sock):
    start = time.monotonic()
    c = Conn(sock)
    reply, _ = c.call(b'{"execute":"query-status"}')
    took = time.monotonic() - start
    c.close()
    assert reply["return"]["status"] == "running", reply
    return took


def wait_for_points(sock, points):
    c = Conn(sock)
    while True:
        r, _ = c.call(b'{"execute":"query-samples","arguments":{"max":1}}')
        if r["return"]["last-seq"] >= points:
            c.close()
            return
        time.sleep(0.05)


def case_idle(sock, repeats):
    held = [Conn(sock) for _ in range(64)]
    time.sleep(1.1)  # idle past the eviction minimum
    waits = [fresh_client_wait(sock) for _ in range(repeats)]
    for c in held:
        c.close()
    return {"case": "idle", "clients": 64, "fresh_client_s": waits}


def case_hangup(sock, n, repeats):
    waits = []
    for _ in range(repeats):
        for _ in range(n):
            s = socket.socket(socket.AF_UNIX)
            s.connect(sock)
            s.sendall(NEGOTIATE + b'{"execute":"query-samples"}')
            s.close()
        waits.append(fresh_client_wait(sock))
    return {"case": "hangup", "clients": n, "fresh_client_s": waits}


def case_reading(sock):
    c = Conn(sock)
    since, points, pages, size = 0, 0, 0, 0
    start = time.monotonic()
    target = None
    while True:
        r, n = c.call(json.dumps({"execute": "query-samples",
                                  "arguments": {"since": since}}).encode())
        page = r["return"]
        target = target or page["last-seq"]
        pages, size = pages + 1, size + n
        points += len(page["samples"])
        if page["samples"]:
            since = page["samples"][-1]["seq"]
        if since >= target or not page["more"]:
            break
    took = time.monotonic() - start
    c.close()
    return {"case": "reading", "points": points, "pages": pages,
            "bytes": size, "seconds": took}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kvmscope", default="target/release/kvmscope")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--hangups", type=int, nargs="+", default=[100, 200, 400])
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as d:
        sock = os.path.join(d, "vm.sock")
        child = start_vmm(args.kvmscope, sock)
        try:
            wait_for_points(sock, 4096)
            results.append(case_idle(sock, args.repeats))
            for n in args.hangups:
                results.append(case_hangup(sock, n, args.repeats))
            results.append(case_reading(sock))
            c = Conn(sock)
            c.s.sendall(b'{"execute":"quit"}')
            c.close()
            child.wait(timeout=10)
        finally:
            if child.poll() is None:
                child.kill()
    for r in results:
        if "fresh_client_s" in r:
            w = [x * 1e3 for x in r["fresh_client_s"]]
            print(f"{r['case']:8} {r['clients']:4} clients: fresh client answered in "
                  f"median {statistics.median(w):.2f} ms, worst {max(w):.2f} ms "
                  f"({len(w)} runs)")
        else:
            print(f"reading: {r['points']} points in {r['pages']} pages, "
                  f"{r['bytes'] / 1e6:.1f} MB, {r['seconds'] * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
