#!/usr/bin/env python3
"""Live-migration benchmarks: two kvmscope processes on this host, a unix
socket between them, the figures read from `query-migrate`.

    cargo build --release -p kvmscope
    python3 scripts/bench_migration.py                 # every case, full sizes
    python3 scripts/bench_migration.py --case booted --booted-memory 4G

Cases (docs/BENCHMARKS.md has the figures and the machine):
  booted     a guest that only booted (16 GiB): total time and downtime
  nonzero    1 GiB of non-zero pages: send rate against a plain copy of the
             same bytes through a socket pair, in the same run
  idle       an idle 1 GiB guest with 256 MiB written: downtime
  converges  a guest dirtying 20,000 pages/s over a 10 Gbit/s-capped link
  diverges   a guest dirtying faster than a 1 Gbit/s link: never completes,
             says why, and the source's guest runs on (then cancelled)

No figure is asserted; the script prints them (and --json writes them).
"""

import argparse
import json
import mmap
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvmscope_client import Connection  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Vmm:
    """A `kvmscope run` process with a control socket."""

    def __init__(self, binary, workdir, name, args):
        self.socket = os.path.join(workdir, name + ".sock")
        self.log = open(os.path.join(workdir, name + ".log"), "w")
        cmd = [binary, "run", "--socket", self.socket, "--sample-interval", "off"] + args
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        self.conn = None

    def connect(self, timeout=60):
        deadline = time.time() + timeout
        while True:
            try:
                self.conn = Connection(self.socket, 60)
                return self
            except (FileNotFoundError, ConnectionRefusedError):
                if self.proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError("%s did not come up" % self.socket)
                time.sleep(0.01)

    def run(self, command, arguments=None):
        value, fds = self.conn.execute(command, arguments or {})
        for fd in fds:
            os.close(fd)
        return value

    def guest(self, vcpu, command, wait=True):
        return self.run("guest-command", {"vcpu": vcpu, "command": command, "wait": wait})

    def quit(self):
        try:
            if self.conn is None:
                self.connect(5)
            self.run("quit")
        except (RuntimeError, OSError):
            self.proc.kill()
        self.proc.wait(timeout=30)


def pair(binary, workdir, memory, vcpus=1, extra=()):
    """A source with its socket up, and a destination waiting for it."""
    src = Vmm(binary, workdir, "src", ["--memory", memory, "--vcpus", str(vcpus)] + list(extra)).connect()
    uri = "unix:" + os.path.join(workdir, "incoming.sock")
    dst = Vmm(binary, workdir, "dst", ["--incoming", uri])
    deadline = time.time() + 30
    while not os.path.exists(uri[5:]):
        if time.time() > deadline:
            raise RuntimeError("the destination did not listen")
        time.sleep(0.01)
    return src, dst, uri


def migrate(src, uri, params, limit=600):
    src.run("migrate-set-parameters", params)
    src.run("migrate", {"uri": uri})
    deadline = time.time() + limit
    while True:
        info = src.run("query-migrate")
        if info.get("status") in ("completed", "failed", "cancelled"):
            return info
        if time.time() > deadline:
            src.run("migrate_cancel")
        time.sleep(0.005)


def socketpair_rate(nbytes, fresh=False, chunk=4 << 20):
    """Bytes/s of a plain copy of `nbytes` through a unix socket pair, into
    one reused buffer, or (`fresh`) into new anonymous memory as a migration
    destination must (the kernel backs and zeroes every page)."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    data = os.urandom(chunk)

    def drain():
        target = memoryview(mmap.mmap(-1, nbytes) if fresh else bytearray(chunk))
        left = nbytes
        while left > 0:
            at = nbytes - left if fresh else 0
            n = b.recv_into(target[at:], min(chunk, left))
            if n == 0:
                break
            left -= n

    t = threading.Thread(target=drain)
    t.start()
    start = time.perf_counter()
    sent = 0
    while sent < nbytes:
        a.sendall(data[: min(chunk, nbytes - sent)])
        sent += min(chunk, nbytes - sent)
    t.join()
    took = time.perf_counter() - start
    a.close()
    b.close()
    return nbytes / took


def summary(info):
    ram = info.get("ram", {})
    return {
        "status": info.get("status"),
        "total_ms": info.get("total-time"),
        "setup_ms": info.get("setup-time"),
        "downtime_ms": info.get("downtime"),
        "expected_downtime_ms": info.get("expected-downtime"),
        "transferred": ram.get("transferred"),
        "duplicate": ram.get("duplicate"),
        "normal": ram.get("normal"),
        "passes": ram.get("dirty-sync-count"),
        "mbps": ram.get("mbps"),
        "dirty_pages_rate": ram.get("dirty-pages-rate"),
        "error": info.get("error-desc"),
        "not_converging": info.get("x-not-converging"),
    }


def case_booted(a, work):
    src, dst, uri = pair(a.bin, work, a.booted_memory)
    try:
        return summary(migrate(src, uri, {}))
    finally:
        dst.quit()
        src.quit()


def case_nonzero(a, work):
    src, dst, uri = pair(a.bin, work, "2G")
    try:
        src.guest(0, "touch size=1G")
        info = migrate(src, uri, {})
        out = summary(info)
        ours = info["ram"]["mbps"] * 1e6 / 8
        # The baselines vary run to run on a shared machine: best of three.
        base = max(socketpair_rate(info["ram"]["normal-bytes"]) for _ in range(3))
        fresh = max(socketpair_rate(info["ram"]["normal-bytes"], fresh=True) for _ in range(3))
        out.update(
            send_rate_MBps=ours / 1e6,
            socketpair_MBps=base / 1e6,
            ratio=base / ours,
            socketpair_fresh_MBps=fresh / 1e6,
            ratio_fresh=fresh / ours,
        )
        return out
    finally:
        dst.quit()
        src.quit()


def case_idle(a, work):
    src, dst, uri = pair(a.bin, work, "1G")
    try:
        src.guest(0, "touch size=256M")
        return summary(migrate(src, uri, {}))
    finally:
        dst.quit()
        src.quit()


def case_converges(a, work):
    src, dst, uri = pair(a.bin, work, "1G", vcpus=2)
    try:
        src.guest(0, "touch size=256M")
        src.guest(1, "dirty offset=512M ws=256M rate=20000/s for=120s", wait=False)
        time.sleep(1)
        params = {"max-bandwidth": 1250000000, "downtime-limit": 300}
        return summary(migrate(src, uri, params))
    finally:
        dst.quit()
        src.quit()


def case_diverges(a, work):
    src, dst, uri = pair(a.bin, work, "1G", vcpus=2)
    try:
        src.guest(0, "touch size=64M")
        src.guest(1, "dirty offset=512M ws=256M rate=max for=120s", wait=False)
        time.sleep(1)
        src.run("migrate-set-parameters", {"max-bandwidth": 125000000, "downtime-limit": 300})
        src.run("migrate", {"uri": uri})
        time.sleep(a.diverge_seconds)
        during = src.run("query-migrate")
        src.run("migrate_cancel")
        while src.run("query-migrate").get("status") not in ("cancelled", "failed", "completed"):
            time.sleep(0.01)
        after = src.run("query-migrate")
        check = src.guest(0, "verify size=64M")["results"][0]["values"]
        out = summary(during)
        out.update(final_status=after.get("status"), source_verify_bad_pages=check[2])
        return out
    finally:
        dst.quit()
        src.quit()


CASES = {
    "booted": case_booted,
    "nonzero": case_nonzero,
    "idle": case_idle,
    "converges": case_converges,
    "diverges": case_diverges,
}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "kvmscope"))
    p.add_argument("--case", action="append", choices=sorted(CASES), help="run only these (repeatable)")
    p.add_argument("--booted-memory", default="16G")
    p.add_argument("--diverge-seconds", type=float, default=8.0)
    p.add_argument("--json", help="also write the figures to this file")
    a = p.parse_args()
    results = {}
    for name in a.case or list(CASES):
        work = tempfile.mkdtemp(prefix="kvmscope-bench-")
        try:
            results[name] = CASES[name](a, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        print("%-10s %s" % (name, json.dumps(results[name])), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
