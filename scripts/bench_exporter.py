#!/usr/bin/env python3
"""Scale of `kvmscope exporter`: N small VMs, one exporter, and the QMP way for comparison.

Starts N `kvmscope run --socket DIR/vmI.sock` children (64 MiB, 1 to 4 vCPUs
each, idle: waiting for commands), then one exporter on DIR, and measures:

- per scrape of the whole page: wall time (client side), the exporter's own
  `kvmscope_exporter_scrape_duration_seconds`, and its CPU time (utime+stime
  from /proc/PID/stat over many scrapes);
- the page's size, and the same with `--stats` keeping a few stats;
- `signal_exits` summed over every vCPU before and after the scrapes: a
  scrape must kick no vCPU;
- the same VM and vCPU statistics the QMP way: `query-stats` (vm and vcpu
  targets) on every control socket, per round, over connections held open;
- the exporter's memory (VmRSS) and open fds, per VM and per stats fd.

    cargo build --release -p kvmscope
    python3 scripts/bench_exporter.py --kvmscope target/release/kvmscope --vms 100

`--vmm-kvmscope OLD` runs the VMs with another binary: with one that has no
stats of its own (before the `kvmscope` provider), the page has KVM's stats
only, which measures what the VMM's own stats add to a scrape.
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

TICK = os.sysconf("SC_CLK_TCK")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port):
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        chunks = []
        while True:
            data = s.recv(1 << 20)
            if not data:
                break
            chunks.append(data)
    took = time.monotonic() - start
    reply = b"".join(chunks)
    _, _, body = reply.partition(b"\r\n\r\n")
    return took, body.decode()


def metric_sum(page, name, must=""):
    total = 0.0
    for line in page.splitlines():
        if line.startswith(name + "{") and must in line:
            total += float(line.rsplit(" ", 1)[1])
        elif line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def status_kb(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


class Qmp:
    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX)
        self.s.settimeout(30)
        self.s.connect(path)
        self.f = self.s.makefile("rb")
        self.f.readline()
        self.call({"execute": "qmp_capabilities"})

    def call(self, req):
        self.s.sendall(json.dumps(req).encode())
        while True:
            reply = json.loads(self.f.readline())
            if "event" not in reply:
                return reply


def start_exporter(exe, d, port, extra):
    p = subprocess.Popen([exe, "exporter", "--listen", f"127.0.0.1:{port}",
                          "--vm-sockets", d] + extra,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return p


def wait_for_vms(port, n, limit=120):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            _, page = scrape(port)
            if metric_sum(page, "kvmscope_exporter_vm_up", "vm=") >= n:
                return page
        except OSError:
            pass
        time.sleep(0.2)
    sys.exit(f"the exporter did not attach {n} VMs")


def measure(exe, d, n, scrapes, extra):
    port = free_port()
    exp = start_exporter(exe, d, port, extra)
    try:
        page = wait_for_vms(port, n)
        kicks_before = metric_sum(page, "kvmscope_kvm_vcpu_signal_exits_total")
        cpu0 = cpu_seconds(exp.pid)
        walls, own = [], []
        for _ in range(scrapes):
            took, page = scrape(port)
            walls.append(took)
            own.append(metric_sum(page, "kvmscope_exporter_scrape_duration_seconds"))
        cpu = (cpu_seconds(exp.pid) - cpu0) / scrapes
        kicks_after = metric_sum(page, "kvmscope_kvm_vcpu_signal_exits_total")
        fds = len(os.listdir(f"/proc/{exp.pid}/fd"))
        return {
            "page_bytes": len(page.encode()),
            "series": sum(1 for l in page.splitlines() if l and not l.startswith("#")),
            "wall_ms_median": statistics.median(walls) * 1e3,
            "wall_ms_p90": sorted(walls)[int(0.9 * (len(walls) - 1))] * 1e3,
            "own_ms_median": statistics.median(own) * 1e3,
            "cpu_ms_per_scrape": cpu * 1e3,
            "signal_exits_added": kicks_after - kicks_before,
            "rss_kb": status_kb(exp.pid, "VmRSS"),
            "fds": fds,
        }
    finally:
        exp.terminate()
        exp.wait(timeout=10)


def qmp_way(socks, rounds, port_for_kicks):
    conns = [Qmp(s) for s in socks]
    _, page = scrape(port_for_kicks)
    before = metric_sum(page, "kvmscope_kvm_vcpu_signal_exits_total")
    walls = []
    for _ in range(rounds):
        start = time.monotonic()
        for c in conns:
            c.call({"execute": "query-stats", "arguments": {"target": "vm"}})
            c.call({"execute": "query-stats", "arguments": {"target": "vcpu"}})
        walls.append(time.monotonic() - start)
    _, page = scrape(port_for_kicks)
    after = metric_sum(page, "kvmscope_kvm_vcpu_signal_exits_total")
    for c in conns:
        c.s.close()
    return {"wall_ms_median": statistics.median(walls) * 1e3,
            "signal_exits_added": after - before}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kvmscope", default="target/release/kvmscope")
    ap.add_argument("--vms", type=int, default=100)
    ap.add_argument("--scrapes", type=int, default=200)
    ap.add_argument("--vcpus", type=int, default=0,
                    help="vCPUs of every VM (default: 1 to 4 in turn)")
    ap.add_argument("--vmm-kvmscope", default=None,
                    help="run the VMs with this binary instead (e.g. one without "
                         "the VMM's own stats, to see what they add to a scrape)")
    args = ap.parse_args()
    exe = os.path.abspath(args.kvmscope)
    vmm_exe = os.path.abspath(args.vmm_kvmscope or args.kvmscope)
    children = []
    with tempfile.TemporaryDirectory() as d:
        socks = []
        try:
            for i in range(args.vms):
                sock = os.path.join(d, f"vm{i}.sock")
                vcpus = args.vcpus or 1 + i % 4
                children.append(subprocess.Popen(
                    [vmm_exe, "run", "--socket", sock, "--memory", "64M", "--vcpus", str(vcpus),
                     "--sample-interval", "off"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
                socks.append(sock)
            deadline = time.monotonic() + 120
            while not all(os.path.exists(s) for s in socks):
                if time.monotonic() > deadline:
                    sys.exit("not every VMM started")
                time.sleep(0.1)
            vcpus = sum(args.vcpus or 1 + i % 4 for i in range(args.vms))
            # The exporter's baseline memory, with no VM.
            with tempfile.TemporaryDirectory() as empty:
                port = free_port()
                e = start_exporter(exe, empty, port, [])
                wait_for_vms(port, 0)
                base_rss = status_kb(e.pid, "VmRSS")
                e.terminate()
                e.wait(timeout=10)
            full = measure(exe, d, args.vms, args.scrapes, [])
            few = measure(exe, d, args.vms, args.scrapes, ["--stats", "pages_*,exits,signal_exits"])
            port = free_port()
            e = start_exporter(exe, d, port, [])
            wait_for_vms(port, args.vms)
            qmp = qmp_way(socks, 20, port)
            e.terminate()
            e.wait(timeout=10)
        finally:
            for c in children:
                c.terminate()
            for c in children:
                c.wait(timeout=30)
    stats_fds = args.vms + vcpus
    print(json.dumps({"vms": args.vms, "vcpus": vcpus, "stats_fds": stats_fds,
                      "full": full, "filtered": few, "qmp": qmp,
                      "base_rss_kb": base_rss}, indent=1))
    print(f"{args.vms} VMs, {vcpus} vCPUs, {stats_fds} stats fds, {args.scrapes} scrapes each")
    for label, r in (("every stat", full), ("--stats pages_*,exits,signal_exits", few)):
        print(f"{label}: page {r['page_bytes'] / 1e6:.2f} MB ({r['series']} series); "
              f"wall median {r['wall_ms_median']:.2f} ms, p90 {r['wall_ms_p90']:.2f} ms; "
              f"exporter's own {r['own_ms_median']:.2f} ms; CPU {r['cpu_ms_per_scrape']:.2f} ms/scrape; "
              f"signal_exits added {r['signal_exits_added']:.0f}")
    per_vm = (full["rss_kb"] - base_rss) / args.vms
    print(f"memory: RSS {full['rss_kb']} KiB with the VMs, {base_rss} KiB with none: "
          f"{per_vm:.1f} KiB per VM, {(full['rss_kb'] - base_rss) / stats_fds:.1f} KiB per stats fd; "
          f"{full['fds']} fds open")
    print(f"QMP way (query-stats vm + vcpu on every socket, connections held): "
          f"{qmp['wall_ms_median']:.1f} ms per round; signal_exits added {qmp['signal_exits_added']:.0f} "
          f"over 20 rounds; ratio to the exporter's wall {qmp['wall_ms_median'] / full['wall_ms_median']:.1f}x")


if __name__ == "__main__":
    main()
