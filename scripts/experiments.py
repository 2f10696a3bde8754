#!/usr/bin/env python3
"""Migration-readiness experiments: runs a matrix of VMs through the control
socket, writes CSV and SVG charts, and regenerates docs/EXPERIMENTS.md.

Standard library only. Each matrix cell is a fresh `kvmscope run --socket`
child (killed when the script ends, however it ends), driven with
`guest-command` and measured with `query-readiness`:

  estimates  non-zero estimates (mapped, resident, written) against the scan:
             guest sizes x touched fraction x zero/non-zero writes x
             --hugepages x dirty logging
  cost       what each figure costs as the guest grows
  dirtyrate  measured dirty rate against the rate the guest generated
  misleads   workloads where the mapped-page estimate is far off

    python3 scripts/experiments.py                      # full matrix into docs/experiments/
    python3 scripts/experiments.py --docs               # ... and regenerate docs/EXPERIMENTS.md
    python3 scripts/experiments.py --small --out /tmp/x # the CI matrix (well under 2 minutes)
    python3 scripts/experiments.py --replot --docs      # charts and docs from the CSVs only
"""

import argparse
import csv
import ctypes
import datetime
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from kvmscope_client import Connection  # noqa: E402  (the socket and fd receive code)
import experiments_report  # noqa: E402
from experiments_matrix import FULL, SMALL, COLUMNS  # noqa: E402

MIB = 1 << 20
PAGE = 4096
LIVE = set()  # VMs not yet closed, killed on the way out


def log(msg):
    print("[%7.1fs] %s" % (time.monotonic() - START, msg), file=sys.stderr, flush=True)


START = time.monotonic()


def die_with_parent():
    """In the child before exec: SIGKILL when this script dies, even by SIGKILL."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Vm:
    """One `kvmscope run --socket` child and a connection to it."""

    def __init__(self, binary, memory, hugepages=False, dirty_log=None, samples_out=None, sample_interval="off"):
        self.dir = tempfile.mkdtemp(prefix="kvmscope-exp-")
        self.socket = os.path.join(self.dir, "ctl.sock")
        args = [binary, "run", "--socket", self.socket, "--memory", memory, "--sample-interval", sample_interval]
        args += ["--hugepages"] if hugepages else []
        args += ["--dirty-log", dirty_log] if dirty_log else []
        args += ["--samples-out", samples_out] if samples_out else []
        self.log_path = os.path.join(self.dir, "run.log")
        with open(self.log_path, "w") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         preexec_fn=die_with_parent)
        LIVE.add(self)
        self.conn = self._connect(time.monotonic() + 30)
        info = self.call("query-vm")
        self.arena = next(r for r in info["memory"]["layout"] if r["name"] == "arena")
        self.backend = info["backend"]

    def _connect(self, deadline):
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("kvmscope run exited with %s before serving: %s" % (self.proc.returncode, self.log_tail()))
            try:
                return Connection(self.socket, 900)
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() > deadline:
                    raise RuntimeError("kvmscope run did not serve %s within 30 s" % self.socket)
                time.sleep(0.01)

    def log_tail(self):
        try:
            with open(self.log_path) as f:
                return f.read()[-2000:]
        except OSError:
            return "(no log)"

    def call(self, execute, /, **arguments):
        """Runs a command and returns its value; event lines (progress) are skipped."""
        req = {"execute": execute, "arguments": arguments}
        self.conn.sock.sendall(json.dumps(req).encode() + b"\n")
        while True:
            reply, fds = self.conn.read_line()
            for fd in fds:
                os.close(fd)
            if "event" not in reply:
                break
        if "error" in reply:
            raise RuntimeError("%s: %s: %s" % (execute, reply["error"]["class"], reply["error"]["desc"]))
        return reply["return"]

    def guest(self, command, vcpu=0):
        """Runs workload commands to the end; their results (each checked ok)."""
        results = self.call("guest-command", vcpu=vcpu, command=command, wait=True)["results"]
        for r in results:
            if r["status"] != "ok":
                raise RuntimeError("guest command %r: %s" % (r["command"], r["status"]))
        return results

    def start(self, command, vcpu=0):
        """Queues a workload command without waiting; its sequence number."""
        return self.call("guest-command", vcpu=vcpu, command=command)["last-seq"]

    def wait_running(self, seq, vcpu=0, limit=10.0):
        """Waits (bounded) until the vCPU is running command `seq` or has finished it."""
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            g = self.call("query-guest", vcpus=[vcpu])[0]
            last = g.get("last-result") or {}
            if g["state"] == "running" or last.get("seq", 0) >= seq:
                return
            time.sleep(0.002)
        raise RuntimeError("command %d did not start within %.0f s" % (seq, limit))

    def result(self, seq, vcpu=0, limit=60.0):
        """Waits (bounded) for the result of command `seq`."""
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            last = self.call("query-guest", vcpus=[vcpu])[0].get("last-result") or {}
            if last.get("seq") == seq:
                if last["status"] != "ok":
                    raise RuntimeError("guest command %r: %s" % (last["command"], last["status"]))
                return last
            time.sleep(0.02)
        raise RuntimeError("no result for command %d within %.0f s" % (seq, limit))

    def readiness(self, scan, calc_time=0.0):
        return self.call("query-readiness", scan=scan, **{"calc-time": calc_time})

    def close(self):
        LIVE.discard(self)
        try:
            self.call("quit")
        except (OSError, RuntimeError):
            pass
        try:
            self.conn.sock.close()
            self.proc.wait(timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def kill_all():
    for vm in list(LIVE):
        vm.proc.kill()
        vm.proc.wait()
        shutil.rmtree(vm.dir, ignore_errors=True)
    LIVE.clear()


# ---- the experiments -------------------------------------------------------------


def touch_size(arena_bytes, fraction):
    """`fraction` of the arena, in whole 2 MiB blocks (at least one)."""
    return max(int(arena_bytes * fraction) // (2 * MIB), 1) * 2 * MIB


def estimate_fields(rep):
    """The figures every estimates/misleads row carries, from a readiness report."""
    scan, written = rep["scan"], rep["written_since_boot"]
    nonzero = scan["nonzero_pages"]
    mapped = rep["mapped"]["bytes"] // PAGE
    ratio = lambda est: round(est / nonzero, 4) if nonzero else ""  # noqa: E731
    return {
        "ram_pages": rep["ram"]["pages"],
        "mapped_pages": mapped, "mapped_4k": rep["mapped"]["pages_4k"], "mapped_2m": rep["mapped"]["pages_2m"],
        "resident_pages": rep["resident"]["pages"],
        "written_pages": written["pages"] if written else "",
        "scan_nonzero": nonzero, "scan_nonzero_arena": scan["nonzero_in_arena"],
        "scan_zero": scan["zero_pages"], "scan_unbacked": scan["unbacked_pages"],
        "mapped_ratio": ratio(mapped), "resident_ratio": ratio(rep["resident"]["pages"]),
        "written_ratio": ratio(written["pages"]) if written else "",
        "mapped_us": rep["mapped"]["took_us"], "resident_us": rep["resident"]["took_us"],
        "written_us": written["took_us"] if written else "", "scan_us": scan["took_us"],
    }


def run_estimates(binary, m):
    rows = []
    for mem in m["sizes"]:
        for hp in (False, True):
            for dl in m["dirty_logs"]:
                for write in ("nonzero", "zero"):
                    for frac in m["fractions"]:
                        with Vm(binary, mem, hugepages=hp, dirty_log=dl) as vm:
                            size = touch_size(vm.arena["size"], frac)
                            cmd = "touch" if write == "nonzero" else "touch-zero"
                            res = vm.guest("%s offset=0 size=%d" % (cmd, size))
                            rep = vm.readiness(scan=True)
                        row = {"memory": mem, "memory_bytes": rep["ram"]["bytes"], "hugepages": int(hp),
                               "dirty_log": dl or "off", "write": write, "fraction": frac,
                               "touched_pages": res[0]["values"][0],
                               "nonzero_written": res[0]["values"][0] if write == "nonzero" else 0,
                               "arena_pages": vm.arena["size"] // PAGE, "touch_s": round(res[0]["host_time_s"], 4)}
                        row.update(estimate_fields(rep))
                        rows.append(row)
                        log("estimates %s hp=%d dirty-log=%s %s %.3g: mapped %s resident %s scan %s"
                            % (mem, hp, dl or "off", write, frac, row["mapped_pages"], row["resident_pages"], row["scan_nonzero"]))
    return rows


def run_cost(binary, m):
    rows = []
    for mem in m["cost_sizes"]:
        for dl in ("bitmap", "ring"):
            for touched in m["cost_touched"]:
                with Vm(binary, mem, dirty_log=dl) as vm:
                    size = int(touched[:-1]) * MIB if touched.endswith("M") else touch_size(vm.arena["size"], float(touched[:-1]) / 100)
                    vm.guest("touch offset=0 size=%d" % size)
                    first = vm.readiness(scan=True)
                    reps = [vm.readiness(scan=True) for _ in range(m["cost_repeats"])]
                med = lambda f: round(statistics.median(f(r) for r in reps), 2)  # noqa: E731
                row = {"memory": mem, "memory_bytes": first["ram"]["bytes"], "dirty_log": dl, "touched": touched,
                       "touched_pages": size // PAGE, "repeats": len(reps),
                       "mapped_us": med(lambda r: r["mapped"]["took_us"]),
                       "mincore_us": med(lambda r: r["resident"]["took_us"]),
                       "scan_us": med(lambda r: r["scan"]["took_us"]),
                       "scan_first_us": round(first["scan"]["took_us"], 2),
                       "sync_first_us": round(first["written_since_boot"]["took_us"], 2),
                       "sync_idle_us": med(lambda r: r["written_since_boot"]["took_us"]),
                       "resident_pages": first["resident"]["pages"], "scan_nonzero": first["scan"]["nonzero_pages"]}
                row["scan_gb_per_s"] = round(row["resident_pages"] * PAGE / (row["scan_us"] * 1e3), 3)
                rows.append(row)
                log("cost %s %s touched %s: mapped %.1f us, mincore %.0f us, scan %.0f us, sync %.0f/%.0f us"
                    % (mem, dl, touched, row["mapped_us"], row["mincore_us"], row["scan_us"], row["sync_first_us"], row["sync_idle_us"]))
    return rows


def expected_distinct(ws_pages, writes):
    """Distinct pages hit by `writes` uniform picks among `ws_pages`."""
    return ws_pages * (1 - (1 - 1 / ws_pages) ** writes)


def dirty_cell(vm, mode, rate, ws, seed, calc_time):
    """One dirty-rate measurement while the guest dirties `ws` bytes at `rate`."""
    ws_pages = ws // PAGE
    if rate == "max":  # dirty as fast as it can for exactly the window
        spec, length = "rate=max", calc_time
    else:
        spec, length = "rate=%d/s" % rate, calc_time + 0.5
    seq = vm.start("dirty offset=0 ws=%d %s for=%dms seed=%d" % (ws, spec, length * 1000, seed))
    vm.wait_running(seq)
    rep = vm.readiness(scan=False, calc_time=calc_time) if mode != "off" else None
    res = vm.result(seq)
    writes, _, distinct = res["values"]
    guest_rate = writes / res["host_time_s"]
    row = {"mode": mode, "rate": rate, "ws_bytes": ws, "ws_pages": ws_pages, "seed": seed,
           "guest_writes": writes, "guest_seconds": round(res["host_time_s"], 4), "guest_distinct": distinct,
           "guest_rate": round(guest_rate, 1)}
    if rep is None:
        return row
    d = rep["dirty_rate"]
    r = guest_rate if rate == "max" else rate
    raw, expect = r * d["window_s"], expected_distinct(ws_pages, r * d["window_s"])
    row.update({"window_s": round(d["window_s"], 4), "measured_pages": d["pages"],
                "measured_rate": round(d["pages_per_s"], 1), "raw_expected_pages": round(raw, 1),
                "expected_pages": round(expect, 1), "expected_rate": round(expect / d["window_s"], 1),
                "ratio_expected": round(d["pages"] / expect, 4), "ratio_raw": round(d["pages"] / raw, 4),
                "took_us": round(d["took_us"], 1)})
    return row


def run_dirtyrate(binary, m):
    rows = []
    for mode in ("bitmap", "ring"):
        for ws in m["working_sets"]:
            with Vm(binary, m["dirty_memory"], dirty_log=mode) as vm:
                vm.guest("touch offset=0 size=%d" % ws)
                for rate in m["rates"]:
                    for rep in range(m["dirty_repeats"]):
                        row = dirty_cell(vm, "dirty-" + mode, rate, ws, 1 + rep, m["calc_time"])
                        rows.append(row)
                        log("dirtyrate %s ws=%dM rate=%s: measured %.0f/s expected %.0f/s (x%.3f), raw %s/s"
                            % (mode, ws // MIB, rate, row["measured_rate"], row["expected_rate"], row["ratio_expected"], rate))
    ws = m["max_ws"]
    for mode in ("off", "bitmap", "ring"):  # the observer effect on a write-heavy guest
        with Vm(binary, m["dirty_memory"], dirty_log=None if mode == "off" else mode) as vm:
            vm.guest("touch offset=0 size=%d" % ws)
            row = dirty_cell(vm, "off" if mode == "off" else "dirty-" + mode, "max", ws, 1, m["calc_time"])
            rows.append(row)
            log("dirtyrate %s rate=max: guest %.0f writes/s" % (mode, row["guest_rate"]))
    return rows


def run_misleads(binary, m):
    rows = []
    for case, truth, cmd, what in m["cases"]:
        for hp in (False, True):
            for dl in m["dirty_logs"]:
                with Vm(binary, m["misleads_memory"], hugepages=hp, dirty_log=dl) as vm:
                    vm.guest(cmd)
                    rep = vm.readiness(scan=True)
                row = {"case": case, "what": what, "workload": cmd, "hugepages": int(hp), "dirty_log": dl or "off",
                       "nonzero_written": truth}
                row.update(estimate_fields(rep))
                for est in ("mapped", "resident", "written"):
                    v = row["%s_pages" % est]
                    row["%s_excess_mib" % est] = round((v - row["scan_nonzero"]) * PAGE / MIB, 2) if v != "" else ""
                rows.append(row)
                log("misleads %s hp=%d dirty-log=%s: mapped x%s resident x%s written x%s"
                    % (case, hp, dl or "off", row["mapped_ratio"], row["resident_ratio"], row["written_ratio"] or "-"))
    return rows


def run_series(binary, m, out):
    """A sampled run for `kvmscope plot`: a max-rate dirtier measured with each mode."""
    made = []
    for mode in ("bitmap", "ring"):
        series = os.path.join(out, "series-%s.jsonl" % mode)
        with Vm(binary, m["dirty_memory"], dirty_log=mode, samples_out=series, sample_interval="50ms") as vm:
            vm.guest("touch offset=0 size=%d" % m["max_ws"])
            vm.guest("wait for=300ms")
            seq = vm.start("dirty offset=0 ws=%d rate=max for=3s" % m["max_ws"])
            vm.wait_running(seq)
            time.sleep(1.0)  # one second undisturbed, then the window
            vm.readiness(scan=False, calc_time=1.0)
            vm.result(seq)
            vm.guest("wait for=300ms")
        svg = os.path.join(out, "series-%s.svg" % mode)
        title = "dirty rate=max, ws=%dM; query-readiness calc-time 1s (dirty-%s) from t~1.3s" % (m["max_ws"] // MIB, mode)
        subprocess.run([binary, "plot", series, "--output", svg, "--title", title], check=True)
        made.append(svg)
        log("series %s -> %s" % (mode, svg))
    return made


EXPERIMENTS = {"estimates": run_estimates, "cost": run_cost, "dirtyrate": run_dirtyrate, "misleads": run_misleads}


def write_csv(path, columns, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="raise")
        w.writeheader()
        for r in rows:
            w.writerow({k: (round(v, 2) if isinstance(v, float) and abs(v) >= 100 else v) for k, v in r.items()})


def machine(binary):
    def sh(*cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return "?"
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "nproc": os.cpu_count(), "cpu": cpu, "kernel": platform.release(),
            "kvm_modules": " ".join(sorted(m for m in os.listdir("/sys/module") if m.startswith("kvm"))),
            "kvmscope": sh(binary, "--version"), "commit": sh("git", "-C", ROOT, "describe", "--always", "--dirty"),
            "python": platform.python_version()}


def find_binary(path):
    if path:
        if not os.access(path, os.X_OK):
            sys.exit("experiments: %s is not an executable" % path)
        return path
    path = os.path.join(ROOT, "target", "release", "kvmscope")
    if not os.access(path, os.X_OK):
        log("building %s" % path)
        subprocess.run(["cargo", "build", "--release", "-p", "kvmscope"], cwd=ROOT, check=True)
    return path


def check_binary(binary):
    with Vm(binary, "16M") as vm:
        names = {c["name"] for c in vm.call("query-commands")}
        backend = vm.backend.get("description", vm.backend.get("kind"))
    if "query-readiness" not in names:
        sys.exit("experiments: %s has no query-readiness command; rebuild it" % binary)
    return backend


def run(a, out):
    binary = find_binary(a.kvmscope)
    m = SMALL if a.small else FULL
    meta = machine(binary)
    meta.update(backend=check_binary(binary), matrix="small" if a.small else "full",
                command="python3 scripts/experiments.py " + " ".join(sys.argv[1:]), seconds={})
    for name in a.only:
        t = time.monotonic()
        rows = EXPERIMENTS[name](binary, m)
        write_csv(os.path.join(out, name + ".csv"), COLUMNS[name], rows)
        meta["seconds"][name] = round(time.monotonic() - t, 1)
    if a.series:
        t = time.monotonic()
        run_series(binary, m, out)
        meta["seconds"]["series"] = round(time.monotonic() - t, 1)
    meta["seconds"]["total"] = round(time.monotonic() - START, 1)
    path = os.path.join(out, "meta.json")
    old = json.load(open(path)) if os.path.exists(path) and a.only != list(EXPERIMENTS) else {}
    old_seconds = old.get("seconds", {})
    old.update(meta)
    old["seconds"] = {**old_seconds, **meta["seconds"]}
    with open(path, "w") as f:
        json.dump(old, f, indent=1)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kvmscope", help="the kvmscope binary (default: target/release/kvmscope, built if missing)")
    p.add_argument("--out", default=os.path.join(ROOT, "docs", "experiments"), help="directory for CSV, charts and meta.json")
    p.add_argument("--small", action="store_true", help="the tiny CI matrix")
    p.add_argument("--only", default=",".join(EXPERIMENTS), help="experiments to run, comma-separated: %s" % ",".join(EXPERIMENTS))
    p.add_argument("--no-series", dest="series", action="store_false", help="skip the sampled runs drawn by `kvmscope plot`")
    p.add_argument("--replot", action="store_true", help="run nothing: charts (and --docs) from the CSVs in --out")
    p.add_argument("--docs", action="store_true", help="regenerate the tables of docs/EXPERIMENTS.md (or --docs-path)")
    p.add_argument("--docs-path", default=os.path.join(ROOT, "docs", "EXPERIMENTS.md"), help=argparse.SUPPRESS)
    a = p.parse_args()
    a.only = [n.strip() for n in a.only.split(",") if n.strip()]
    bad = [n for n in a.only if n not in EXPERIMENTS]
    if bad:
        p.error("unknown experiment(s) %s" % ", ".join(bad))
    os.makedirs(a.out, exist_ok=True)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda s, f: sys.exit(128 + s))
    try:
        if not a.replot:
            run(a, a.out)
    finally:
        kill_all()
    charts = experiments_report.charts(a.out)
    log("charts: %s" % ", ".join(os.path.basename(c) for c in charts))
    if a.docs:
        experiments_report.update_docs(a.out, a.docs_path)
        log("updated %s" % a.docs_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
