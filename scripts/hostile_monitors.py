#!/usr/bin/env python3
"""What hostile QEMU monitors cost `kvmscope exporter`'s memory.

Starts N fake QMP monitors (threads of this script, each on its own socket)
that greet as QEMU 7.2 and answer `query-stats` for the `vm` target with one
line of about 7.9 MB in one of these shapes (the exporter takes lines up to
8 MiB):

  tiny     results of 512 stats `{"name":"a"}`
  buckets  results of 512 stats of 65 buckets each
  bucket   results of 512 stats of one bucket `{"name":"a","value":[0]}`
  empty    results of 512 stats `{}`
  zeros    one histogram of 3.7 million zeros

then runs `kvmscope exporter --qmp-socket ...` over them for `--secs`,
sampling its RSS every 20 ms, and prints the peak and the exporter's
warnings (docs/EXPORTER.md, "What a monitor's reply costs the exporter's
memory"; docs/BENCHMARKS.md).

    scripts/hostile_monitors.py --kvmscope target/release/kvmscope --shape tiny -n 3
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

LINE = int(7.9 * (1 << 20))
GREETING = {
    "QMP": {
        "version": {"qemu": {"micro": 19, "minor": 2, "major": 7}, "package": ""},
        "capabilities": ["oob"],
    }
}
SCHEMA = [
    {
        "provider": "kvm",
        "target": "vm",
        "stats": [
            {"name": "a", "type": "cumulative", "exponent": 0, "base": 10},
            {"name": "h", "type": "linear-histogram", "exponent": 0, "base": 10, "bucket-size": 1},
        ],
    }
]


def reply(shape):
    """The `query-stats` reply line of `shape`, about LINE bytes."""
    if shape == "zeros":
        head = b'{"return": [{"provider": "kvm", "stats": [{"name": "h", "value": ['
        n = (LINE - len(head)) // 2
        return head + b"0," * (n - 1) + b"0]}]}]}\n"
    one = {
        "tiny": b'{"name":"a"}',
        "buckets": b'{"name":"h","value":[' + b",".join([b"0"] * 65) + b"]}",
        "bucket": b'{"name":"a","value":[0]}',
        "empty": b"{}",
    }[shape]
    entry = b'{"provider":"kvm","stats":[' + b",".join([one] * 512) + b"]}"
    n = min(4096, (LINE - 20) // (len(entry) + 1))
    return b'{"return":[' + b",".join([entry] * n) + b"]}\n"


def serve(conn, big):
    """Greets, then answers each request line by its command."""
    with conn:
        conn.sendall(json.dumps(GREETING).encode() + b"\n")
        buf = b""
        while True:
            while b"\n" not in buf:
                data = conn.recv(65536)
                if not data:
                    return
                buf += data
            line, buf = buf.split(b"\n", 1)
            try:
                cmd = json.loads(line).get("execute")
            except ValueError:
                cmd = None
            if cmd == "query-stats":
                out = big
            elif cmd == "query-stats-schemas":
                out = json.dumps({"return": SCHEMA}).encode() + b"\n"
            elif cmd == "query-name":
                out = b'{"return": {"name": "hostile"}}\n'
            elif cmd == "query-cpus-fast":
                out = b'{"return": []}\n'
            else:
                out = b'{"return": {}}\n'
            conn.sendall(out)


def monitor(path, big):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.listen(4)

    def accept():
        while True:
            conn, _ = s.accept()
            threading.Thread(target=serve, args=(conn, big), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()


def rss_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kvmscope", default="target/release/kvmscope")
    ap.add_argument("--shape", choices=["tiny", "buckets", "bucket", "empty", "zeros"], default="tiny")
    ap.add_argument("-n", type=int, default=3, help="monitors")
    ap.add_argument("--secs", type=float, default=10)
    ap.add_argument("--port", type=int, default=19377)
    a = ap.parse_args()
    big = reply(a.shape)
    with tempfile.TemporaryDirectory(prefix="hostile-monitors-") as tmp:
        sockets = []
        for i in range(a.n):
            path = os.path.join(tmp, f"m{i}.qmp")
            monitor(path, big)
            sockets.append(path)
        os.makedirs(os.path.join(tmp, "vms"))
        cmd = [a.kvmscope, "exporter", "--listen", f"127.0.0.1:{a.port}",
               "--vm-sockets", os.path.join(tmp, "vms"), "--qmp-interval", "1s"]
        for p in sockets:
            cmd += ["--qmp-socket", p]
        log = open(os.path.join(tmp, "exporter.log"), "w+")
        exporter = subprocess.Popen(cmd, stdout=log, stderr=log)
        peak = 0
        until = time.monotonic() + a.secs
        while time.monotonic() < until and exporter.poll() is None:
            peak = max(peak, rss_kb(exporter.pid))
            time.sleep(0.02)
        alive = exporter.poll() is None
        exporter.terminate()
        exporter.wait(timeout=10)
        log.seek(0)
        warnings = sorted({l.split("] ", 1)[-1].split(": ", 2)[-1].strip()
                           for l in log if "WARN" in l})
    print(json.dumps({
        "shape": a.shape,
        "monitors": a.n,
        "line_bytes": len(big),
        "peak_rss_mb": round(peak / 1024, 1),
        "exporter_alive_at_end": alive,
        "warnings": warnings[:5],
    }, indent=1))
    return 0 if alive else 1


if __name__ == "__main__":
    sys.exit(main())
