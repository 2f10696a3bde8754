#!/usr/bin/env python3
"""How long a fresh control client waits while other clients misbehave.

Starts `kvmscope run --socket` children (2 vCPUs, a 1 ms sampler so that a
page of samples is large) and, for each case, times a fresh client from
connect to its `query-status` reply:

- idle:    64 negotiated clients hold every slot and send nothing;
- hangup:  N clients each send `query-samples` and hang up at once;
- reading: one client pages every sampler point out with `query-samples`
           (`since`, `more`), reading at its own pace: how many bytes, pages
           and seconds it took;
- unread:  (`--unread N`, its own VMM of `--unread-vcpus` vCPUs) N clients
           each ask for a whole page of samples and never read it; an
           active client's `query-status` round trips meanwhile, a fresh
           client's wait, and the VMM's RSS before, at its peak, and 2 s
           after the N clients hang up.

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


def start_vmm(exe, sock, vcpus=2):
    child = subprocess.Popen(
        [exe, "run", "--socket", sock, "--memory", "64M", "--vcpus", str(vcpus),
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


def rss_mb(pid):
    """The process's resident and peak resident memory, MB."""
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            fields[key] = value.split()
    return int(fields["VmRSS"][0]) / 1024, int(fields["VmHWM"][0]) / 1024


def case_unread(exe, n, vcpus, points):
    with tempfile.TemporaryDirectory() as d:
        sock = os.path.join(d, "vm.sock")
        child = start_vmm(exe, sock, vcpus)
        try:
            wait_for_points(sock, points)
            active = Conn(sock)
            page, size = active.call(b'{"execute":"query-samples"}')
            rss_before, _ = rss_mb(child.pid)
            silent = []
            rtts = []
            for _ in range(n):
                s = socket.socket(socket.AF_UNIX)
                s.connect(sock)
                s.sendall(NEGOTIATE + b'{"execute":"query-samples"}')
                silent.append(s)
                start = time.monotonic()
                active.call(b'{"execute":"query-status"}')
                rtts.append(time.monotonic() - start)
            end = time.monotonic() + 2
            while time.monotonic() < end:
                start = time.monotonic()
                active.call(b'{"execute":"query-status"}')
                rtts.append(time.monotonic() - start)
                time.sleep(0.01)
            fresh = fresh_client_wait(sock)
            _, peak = rss_mb(child.pid)
            for s in silent:
                s.close()
            time.sleep(2)
            rss_after, _ = rss_mb(child.pid)
            active.close()
        finally:
            child.kill()
            child.wait()
    return {"case": "unread", "clients": n, "vcpus": vcpus, "page_bytes": size,
            "active_rtt_s": rtts, "fresh_s": fresh, "rss_before_mb": rss_before,
            "rss_peak_mb": peak, "rss_after_mb": rss_after}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kvmscope", default="target/release/kvmscope")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--hangups", type=int, nargs="+", default=[100, 200, 400])
    ap.add_argument("--unread", type=int, default=60,
                    help="clients that ask for a page and never read it (0: skip)")
    ap.add_argument("--unread-vcpus", type=int, default=8)
    ap.add_argument("--only-unread", action="store_true")
    args = ap.parse_args()
    results = []
    if args.unread:
        results.append(case_unread(args.kvmscope, args.unread, args.unread_vcpus, 8192))
    if not args.only_unread:
        results += other_cases(args)
    report(results)


def other_cases(args):
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
    return results


def report(results):
    for r in results:
        if r["case"] == "unread":
            w = sorted(x * 1e3 for x in r["active_rtt_s"])
            print(f"unread   {r['clients']:4} clients x {r['page_bytes'] / 1e6:.1f} MB pages "
                  f"({r['vcpus']} vCPUs): active query-status median {statistics.median(w):.2f} ms, "
                  f"worst {w[-1]:.0f} ms; fresh client {r['fresh_s'] * 1e3:.0f} ms; "
                  f"RSS {r['rss_before_mb']:.0f} MB before, {r['rss_peak_mb']:.0f} MB peak, "
                  f"{r['rss_after_mb']:.0f} MB 2 s after they hang up")
        elif "fresh_client_s" in r:
            w = [x * 1e3 for x in r["fresh_client_s"]]
            print(f"{r['case']:8} {r['clients']:4} clients: fresh client answered in "
                  f"median {statistics.median(w):.2f} ms, worst {max(w):.2f} ms "
                  f"({len(w)} runs)")
        else:
            print(f"reading: {r['points']} points in {r['pages']} pages, "
                  f"{r['bytes'] / 1e6:.1f} MB, {r['seconds'] * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
