#!/usr/bin/env python3
"""Scrape latency of `kvmscope run --metrics-addr` while other HTTP clients idle.

Starts a `kvmscope run` child serving /metrics, opens IDLE connections that
never finish a request (half of them send nothing, half send half a request
head), then times SCRAPES full scrapes one after another, each on a fresh
connection, and prints the latencies. The figures go in docs/BENCHMARKS.md.

    python3 scripts/scrape_latency.py --kvmscope target/release/kvmscope --idle 20
"""

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port, timeout, request=b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"):
    """One scrape on a fresh connection: (seconds, status line, body bytes)."""
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(request)
        chunks = []
        while True:
            data = s.recv(65536)
            if not data:
                break
            chunks.append(data)
    reply = b"".join(chunks)
    head, _, body = reply.partition(b"\r\n\r\n")
    return time.monotonic() - start, head.split(b"\r\n", 1)[0].decode(), len(body)


def wait_ready(port, child, limit=20.0):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if child.poll() is not None:
            sys.exit(f"kvmscope exited with {child.returncode} before serving")
        try:
            _, status, size = scrape(port, 5.0)
            if status.endswith("200 OK") and size > 0:
                return
        except OSError:
            pass
        time.sleep(0.05)
    sys.exit("kvmscope did not serve /metrics in time")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kvmscope", default="target/release/kvmscope")
    p.add_argument("--idle", type=int, default=20, help="idle connections held open")
    p.add_argument("--scrapes", type=int, default=10)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per scrape")
    args = p.parse_args()

    port = free_port()
    child = subprocess.Popen(
        [args.kvmscope, "run", "--memory", "64M", "--sample-interval", "10ms",
         "--metrics-addr", f"127.0.0.1:{port}", "--workload", "wait for=600s"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(port, child)
        idle = []
        for i in range(args.idle):
            s = socket.create_connection(("127.0.0.1", port))
            if i % 2:
                s.sendall(b"GET /metrics HTTP/1.1\r\nHo")
            idle.append(s)
        times = []
        for _ in range(args.scrapes):
            took, status, size = scrape(port, args.timeout)
            if not status.endswith("200 OK"):
                sys.exit(f"scrape answered {status!r}")
            times.append(took)
        bare = scrape(port, 10.0, b"GET /metrics HTTP/1.1\n\n")[1] if args.idle == 0 else "-"
        for s in idle:
            s.close()
        ms = sorted(t * 1e3 for t in times)
        print(f"idle={args.idle} scrapes={len(ms)} page={size} B "
              f"median={statistics.median(ms):.1f} ms max={ms[-1]:.1f} ms "
              f"first={times[0] * 1e3:.1f} ms bare-newline-request={bare!r}")
    except (OSError, socket.timeout) as e:
        print(f"idle={args.idle}: scrape failed: {e}")
    finally:
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()


if __name__ == "__main__":
    main()
