#!/usr/bin/env python3
"""A migration destination (`kvmscope run --incoming`) against misbehaving
peers, standard library only (docs/BENCHMARKS.md, docs/MIGRATION.md "Limits").

  stall    a fake source sends its header and config, takes READY, starts a
           RAM section and stops mid-page, connection open; then SIGTERM (or
           `quit` on the control socket): how long until the process exits,
           and its status.
  idle     N peers connect and say nothing, then a fake source sends its
           header and config: how long until its READY.

    python3 scripts/bench_incoming.py --kvmscope target/release/kvmscope stall
    python3 scripts/bench_incoming.py --kvmscope K idle --peers 500 --tcp --limit 60

A figure past --limit is printed as `> LIMIT` (the process is then killed).
"""

import argparse
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

from experiments_vm import unix_listening

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEED = os.path.join(ROOT, "fuzz/corpus/migration_stream/ok-config-only")
REPLY_READY = 1


def header_and_config():
    """Stream header and config section of a 64 MiB, one-vCPU guest (72 bytes)."""
    with open(SEED, "rb") as f:
        return f.read()[:72]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Dest:
    """A `kvmscope run --incoming` child in a fresh directory."""

    def __init__(self, kvmscope, tcp, extra=()):
        self.dir = tempfile.mkdtemp(prefix="kvmscope-bench-incoming-")
        self.ctl = os.path.join(self.dir, "ctl.sock")
        if tcp:
            self.addr = ("127.0.0.1", free_port())
            uri = "tcp:%s:%d" % self.addr
        else:
            self.addr = os.path.join(self.dir, "incoming.sock")
            uri = "unix:" + self.addr
        self.tcp = tcp
        self.stderr = open(os.path.join(self.dir, "stderr"), "w+")
        self.proc = subprocess.Popen(
            [kvmscope, "run", "--sample-interval", "off", "--incoming", uri, "--socket", self.ctl,
             *extra],
            stdout=subprocess.DEVNULL, stderr=self.stderr)
        deadline = time.monotonic() + 20
        while not self.listening():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                sys.exit("the destination did not start listening")
            time.sleep(0.01)

    def listening(self):
        if not self.tcp:
            return unix_listening(self.addr)
        port = "%04X" % self.addr[1]
        with open("/proc/net/tcp") as f:
            return any(l.split()[1].endswith(":" + port) and l.split()[3] == "0A"
                       for l in f.readlines()[1:])

    def connect(self, wait=True):
        """A connection; with wait=False, a nonblocking connect that may still
        be pending (past the listen backlog of a destination that does not accept)."""
        s = socket.socket(socket.AF_INET if self.tcp else socket.AF_UNIX)
        if wait:
            s.connect(self.addr)
        else:
            s.setblocking(False)
            s.connect_ex(self.addr)
        return s

    def wait_exit(self, limit):
        try:
            return self.proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            return None

    def error(self):
        self.stderr.seek(0)
        lines = [l.strip() for l in self.stderr if l.startswith("kvmscope: ")]
        return lines[-1] if lines else ""

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def read_reply(s, limit):
    s.settimeout(limit)
    head = b""
    while len(head) < 12:
        chunk = s.recv(12 - len(head))
        if not chunk:
            raise ConnectionError("closed")
        head += chunk
    return struct.unpack("<4sII", head)[1]


def stall_mid_page(dest):
    s = dest.connect()
    s.sendall(header_and_config())
    if read_reply(s, 30) != REPLY_READY:
        sys.exit("no READY")
    run = struct.pack("<IIQ", 2, 0, 16 + 4096) + struct.pack("<QII", 0, 1, 2) + b"\xab" * 100
    s.sendall(run)
    return s


def quit_over_qmp(path):
    c = socket.socket(socket.AF_UNIX)
    c.settimeout(10)
    c.connect(path)
    f = c.makefile("rwb")
    f.readline()  # greeting
    for cmd in ("qmp_capabilities", "quit"):
        f.write(json.dumps({"execute": cmd}).encode() + b"\n")
        f.flush()
        f.readline()
    return c


def bench_stall(args):
    for how in ("SIGTERM", "quit"):
        dest = Dest(args.kvmscope, args.tcp)
        try:
            src = stall_mid_page(dest)
            time.sleep(args.settle)  # the stall itself, as in the issue
            t0 = time.monotonic()
            if how == "SIGTERM":
                dest.proc.send_signal(signal.SIGTERM)
            else:
                try:
                    quit_over_qmp(dest.ctl)
                except OSError as e:
                    print("  quit: no answer (%s)" % e)
            status = dest.wait_exit(args.limit)
            took = time.monotonic() - t0
            if status is None:
                print("%-8s after a %.0f s stall mid-page: still running > %.0f s (killed)"
                      % (how, args.settle, args.limit))
            else:
                print("%-8s after a %.0f s stall mid-page: exited %d in %.0f ms: %s"
                      % (how, args.settle, status, took * 1e3, dest.error()))
            src.close()
        finally:
            dest.close()


def bench_idle(args):
    dest = Dest(args.kvmscope, args.tcp)
    try:
        idle = [dest.connect(wait=False) for _ in range(args.peers)]
        t0 = time.monotonic()
        s = socket.socket(socket.AF_INET if dest.tcp else socket.AF_UNIX)
        s.settimeout(args.limit)
        try:
            s.connect(dest.addr)
            s.sendall(header_and_config())
            code = read_reply(s, args.limit)
            took = time.monotonic() - t0
            print("%d idle %s peers, then a source: reply %d after %.0f ms"
                  % (args.peers, "TCP" if args.tcp else "unix", code, took * 1e3))
        except OSError as e:
            print("%d idle %s peers, then a source: no READY in %.0f s (%s)"
                  % (args.peers, "TCP" if args.tcp else "unix", args.limit, e))
        for p in idle:
            p.close()
    finally:
        dest.close()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kvmscope", default=os.path.join(ROOT, "target/release/kvmscope"))
    p.add_argument("--tcp", action="store_true", help="listen on TCP loopback, not a unix socket")
    p.add_argument("--limit", type=float, default=30, help="seconds to wait at most")
    sub = p.add_subparsers(dest="what", required=True)
    s = sub.add_parser("stall")
    s.add_argument("--settle", type=float, default=2, help="seconds the source is silent first")
    i = sub.add_parser("idle")
    i.add_argument("--peers", type=int, default=50)
    args = p.parse_args()
    {"stall": bench_stall, "idle": bench_idle}[args.what](args)


if __name__ == "__main__":
    main()
