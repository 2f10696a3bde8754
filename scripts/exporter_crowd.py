#!/usr/bin/env python3
"""The exporter over a directory crowded with sockets that accept and say nothing.

Binds N sockets that never answer (their backlog accepts) in one directory,
optionally gives them to another user (`--other-owner`, root only), starts
`kvmscope exporter` over that directory and a second one, and 5 s in starts a
real VMM in the second. Samples the exporter's threads, fds and RSS every
0.2 s, and prints their peaks, when the VM showed up (seconds after the
exporter started), how many silent sockets the page showed as down by then,
and one scrape's time (docs/EXPORTER.md "Limits", docs/BENCHMARKS.md).

    scripts/exporter_crowd.py --kvmscope target/release/kvmscope -n 5000 --other-owner
"""

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request


def proc_counts(pid):
    try:
        threads = len(os.listdir(f"/proc/{pid}/task"))
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        with open(f"/proc/{pid}/status") as f:
            rss = int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))
        return threads, fds, rss
    except (OSError, AttributeError):
        return 0, 0, 0


def page(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return r.read().decode()
    except OSError:
        return ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kvmscope", default="target/release/kvmscope")
    ap.add_argument("-n", type=int, default=5000, help="silent sockets")
    ap.add_argument("--other-owner", action="store_true",
                    help="give the silent sockets to uid 65534 (root only)")
    ap.add_argument("--limit", type=float, default=120.0, help="seconds to wait for the VM")
    args = ap.parse_args()
    exe = os.path.abspath(args.kvmscope)
    with tempfile.TemporaryDirectory() as top:
        silent_dir, vm_dir = os.path.join(top, "silent"), os.path.join(top, "vms")
        os.mkdir(silent_dir)
        os.mkdir(vm_dir)
        listeners = []
        for i in range(args.n):
            path = os.path.join(silent_dir, f"s{i:05d}.sock")
            s = socket.socket(socket.AF_UNIX)
            s.bind(path)
            s.listen(64)
            listeners.append(s)
            if args.other_owner:
                os.chown(path, 65534, 65534)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        exporter = subprocess.Popen(
            [exe, "exporter", "--listen", f"127.0.0.1:{port}", "--vm-sockets", silent_dir,
             "--vm-sockets", vm_dir, "--attach-timeout", "2s"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        started = time.monotonic()
        vmm = None
        peaks = [0, 0, 0]
        up_at = down_then = None
        try:
            while time.monotonic() - started < args.limit:
                for k, v in enumerate(proc_counts(exporter.pid)):
                    peaks[k] = max(peaks[k], v)
                if vmm is None and time.monotonic() - started >= 5:
                    vmm = subprocess.Popen(
                        [exe, "run", "--memory", "64M", "--socket", os.path.join(vm_dir, "late.sock")],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                text = page(port)
                if vmm is not None and re.search(r'kvmscope_exporter_vm_up\{vm="late".* 1$', text, re.M):
                    up_at = time.monotonic() - started
                    down_then = len(re.findall(r"kvmscope_exporter_vm_up\{.* 0$", text, re.M))
                    break
                time.sleep(0.2)
            t = time.monotonic()
            page(port)
            scrape = time.monotonic() - t
            alive = exporter.poll() is None
        finally:
            exporter.terminate()
            exporter.wait()
            if vmm is not None:
                vmm.terminate()
                vmm.wait()
            for s in listeners:
                s.close()
    print(f"silent sockets {args.n} ({'another user' if args.other_owner else 'the same user'}'s): "
          f"exporter threads at most {peaks[0]}, fds {peaks[1]}, RSS {peaks[2] / 1024:.1f} MB; "
          f"the VM started 5 s in was up at {'%.1f s' % up_at if up_at else 'never (within %.0f s)' % args.limit}"
          f"{'' if down_then is None else f' with {down_then} silent sockets tried'}; "
          f"one scrape {scrape * 1e3:.1f} ms; exporter {'alive' if alive else 'DEAD'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
