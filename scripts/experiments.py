#!/usr/bin/env python3
"""Migration-readiness experiments: runs a matrix of VMs through the control
socket, writes CSV and SVG charts, and regenerates docs/EXPERIMENTS.md.

Standard library only. Each matrix cell is a fresh `kvmscope run --socket`
child (killed when the script ends, however it ends), driven with
`guest-command` and measured with `query-readiness`:

  estimates  non-zero estimates (mapped, resident, written) against the scan:
             guest size x touched fraction x zero/non-zero x --hugepages x dirty log
  cost       what each figure costs as the guest grows
  dirtyrate  measured dirty rate against what the guest generated, both modes
  observer   what measuring costs a guest that writes as fast as it can
  misleads   workloads where the mapped-page estimate is far off
  migration  readiness predictions against real live migrations to a second
             kvmscope (experiments_migration.py)
  converge   the migration part's throttled cells: guests that cannot converge,
             with --converge auto, dirty-limit and auto-converge side by side
             (experiments_converge.py)
  published  the prediction a VMM publishes in its own stats (run
             --readiness-every), read at a random moment, against the
             migration started then (experiments_published.py)
  (series)   two sampled runs drawn with `kvmscope plot`

    python3 scripts/experiments.py --docs               # full matrix into docs/experiments/, and the doc
    python3 scripts/experiments.py --small --out /tmp/x # the CI matrix (well under 2 minutes)
    python3 scripts/experiments.py --replot --docs      # charts and doc from the CSVs only
    python3 scripts/experiments.py --part stall --set stall_repeats=1 --set 'stall_windows=[2.0]' --out /tmp/y
"""

import argparse
import contextlib
import csv
import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import experiments_report  # noqa: E402
from experiments_matrix import COLUMNS, FULL, SMALL  # noqa: E402
from experiments_runs import EXPERIMENTS, run_series  # noqa: E402
from experiments_vm import Vm, kill_all, log  # noqa: E402


def cell(v):
    """A CSV cell: floats to 2 decimals from 100 up, else 6 significant digits."""
    if not isinstance(v, float):
        return v
    return round(v, 2) if abs(v) >= 100 else float("%.6g" % v)


def write_csv(path, columns, rows):
    """Writes the CSV whole or not at all (a stop mid-write leaves the last one)."""
    part = path + ".part"
    try:
        with open(part, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=columns, extrasaction="raise")
            w.writeheader()
            for r in rows:
                w.writerow({k: cell(v) for k, v in r.items()})
        os.replace(part, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(part)
        raise


# The signal that asked the run to stop (0: none). Its handler raises
# SystemExit, which Python swallows when it lands in a `__del__` (a closed
# VM's socket or process being collected): checked again after every row.
STOPPED = 0


def stop(signum, _frame):
    global STOPPED
    STOPPED = signum
    sys.exit(128 + signum)


def machine(binary):
    """Where and with what the figures were made."""
    def sh(*cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return "?"
    with open("/proc/cpuinfo") as f:
        cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "?")
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "nproc": os.cpu_count(), "cpu": cpu, "kernel": platform.release(),
            "kvm_modules": " ".join(sorted(m for m in os.listdir("/sys/module") if m.startswith("kvm"))),
            "memory_gib": round(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / (1 << 30), 1),
            "thp": sh("cat", "/sys/kernel/mm/transparent_hugepage/enabled"),
            "kvmscope": sh(binary, "--version"), "commit": sh("git", "-C", ROOT, "describe", "--always", "--dirty"),
            "python": platform.python_version()}


def find_binary(path):
    """The kvmscope binary: the one named, else target/release/kvmscope (built if missing)."""
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
    """The backend's description; exits if the binary predates query-readiness."""
    with Vm(binary, "16M") as vm:
        names = {c["name"] for c in vm.call("query-commands")}
        backend = vm.backend.get("description", vm.backend.get("kind"))
    if "query-readiness" not in names:
        sys.exit("experiments: %s has no query-readiness command; rebuild it" % binary)
    return backend


def run(a):
    binary = find_binary(a.kvmscope)
    m = {**(SMALL if a.small else FULL), **a.set}
    meta = machine(binary)
    meta.update(backend=check_binary(binary), matrix="small" if a.small else "full", changed=a.set,
                command="python3 scripts/experiments.py " + " ".join(sys.argv[1:]))
    seconds = {}
    for name in a.only:
        t = time.monotonic()
        rows = []
        # Written after every row of the parts that hand them out as they
        # end: a run cut short (a time limit, a signal) keeps what it did,
        # and meta.json says the CSV is cut and where.
        path = os.path.join(a.out, name + ".csv")
        written = 0  # rows in the CSV on disk (a stop may land in a write)
        try:
            for row in EXPERIMENTS[name](binary, m):
                rows.append(row)
                write_csv(path, COLUMNS[name], rows)
                written = len(rows)
                if STOPPED:
                    break
        except BaseException as e:
            seconds[name] = round(time.monotonic() - t, 1)
            if written == 0:  # no earlier run's CSV left beside this run's record
                write_csv(path, COLUMNS[name], [])
            # The stop signal's handler raises SystemExit.
            why = "signal %d" % STOPPED if STOPPED else repr(e)
            write_meta(a, meta, seconds, {name: "cut after %d rows: %s" % (written, why)})
            raise
        if not rows:  # a part with no cells still leaves its header
            write_csv(path, COLUMNS[name], rows)
        seconds[name] = round(time.monotonic() - t, 1)
        if STOPPED:
            write_meta(a, meta, seconds, {name: "cut after %d rows: signal %d" % (written, STOPPED)})
            sys.exit(128 + STOPPED)
    if a.series:
        t = time.monotonic()
        run_series(binary, m, a.out)
        seconds["series"] = round(time.monotonic() - t, 1)
    write_meta(a, meta, seconds, {})


def write_meta(a, meta, seconds, cut):
    """meta.json for what ran (`seconds`); `cut`: a part whose CSV stops
    short, with why (its record says so, as `cut`)."""
    path = os.path.join(a.out, "meta.json")
    meta = merged_meta(path, meta, list(seconds), partial=set(a.only) != set(EXPERIMENTS) or bool(cut))
    for name, why in cut.items():
        meta["parts"][name]["cut"] = why
    seconds = {**meta.get("seconds", {}), **seconds}
    seconds["total"] = round(sum(v for k, v in seconds.items() if k != "total"), 1)
    meta["seconds"] = seconds
    with open(path + ".part", "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    os.replace(path + ".part", path)


def merged_meta(path, meta, ran, partial):
    """meta.json's record: what this run ran, each part's own date, commit
    and command (`parts`), and on a partial rerun what the earlier runs
    recorded (their parts, timings and any other notes) kept. `commit` and
    `command`, which the doc's run table shows, then name each part's."""
    old = {}
    if partial and os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
    parts = old.get("parts", {})
    for name in old.get("seconds", {}):
        if name != "total" and name not in parts:  # recorded before parts were
            parts[name] = {k: old.get(k, "?") for k in ("date", "commit", "command")}
    for p in parts.values():
        if "machine" not in p and "cpu" in old:  # recorded before machines were, on the earlier run's
            p["machine"] = "%s CPUs, %s, kernel %s" % (old.get("nproc"), old["cpu"], old.get("kernel"))
    for name in ran:
        parts[name] = {k: meta[k] for k in ("date", "commit", "command", "matrix")}
        parts[name]["machine"] = "%s CPUs, %s, kernel %s" % (meta["nproc"], meta["cpu"], meta["kernel"])
        if meta.get("changed"):
            parts[name]["changed"] = meta["changed"]
    out = {**old, **meta, "parts": parts}
    if len(parts) > 1 and len({(p["commit"], p["command"]) for p in parts.values()}) > 1:
        by = lambda key: "; ".join("%s: %s (%s)" % (n, p[key], p["date"]) for n, p in parts.items())  # noqa: E731
        out["commit"], out["command"] = by("commit"), by("command")
    return out


def settings(p, pairs, known):
    """--set's KEY=JSON pairs, each key a setting of the matrices and each value JSON."""
    out = {}
    for pair in pairs:
        key, eq, text = pair.partition("=")
        if not eq:
            p.error("--set %r: expected KEY=JSON" % pair)
        if key not in known:
            p.error("--set %r: no setting %r (known: %s)" % (pair, key, ", ".join(sorted(known))))
        try:
            out[key] = json.loads(text)
        except ValueError as e:
            p.error("--set %r: the value is not JSON (%s)" % (pair, e))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kvmscope", help="the kvmscope binary (default: target/release/kvmscope, built if missing)")
    p.add_argument("--out", default=os.path.join(ROOT, "docs", "experiments"),
                   help="directory for CSV, charts and meta.json (default: docs/experiments in the source tree, "
                        "whose committed files a run replaces: give a directory of your own to keep them)")
    p.add_argument("--small", action="store_true", help="the tiny CI matrix")
    p.add_argument("--only", "--part", dest="only", default=",".join(EXPERIMENTS),
                   help="experiments to run, comma-separated, of: %s (default: all; --small runs each in seconds, "
                        "the full matrix takes minutes to an hour per part)" % ", ".join(EXPERIMENTS))
    p.add_argument("--set", action="append", default=[], metavar="KEY=JSON",
                   help="change one setting of the matrix (scripts/experiments_matrix.py), the value in JSON, "
                        "e.g. stall_repeats=1 or 'converge_cells=[[\"random\", \"ring\", \"auto\"]]'; repeatable")
    p.add_argument("--no-series", dest="series", action="store_false", help="skip the sampled runs drawn by `kvmscope plot`")
    p.add_argument("--replot", action="store_true", help="run nothing: charts (and --docs) from the CSVs in --out")
    p.add_argument("--docs", action="store_true", help="regenerate the generated parts of docs/EXPERIMENTS.md")
    p.add_argument("--docs-path", default=os.path.join(ROOT, "docs", "EXPERIMENTS.md"), help="the doc --docs rewrites")
    a = p.parse_args()
    a.only = [n.strip() for n in a.only.split(",") if n.strip()]
    bad = [n for n in a.only if n not in EXPERIMENTS]
    if bad:
        p.error("unknown experiment(s) %s (known: %s)" % (", ".join(bad), ", ".join(EXPERIMENTS)))
    a.set = settings(p, a.set, FULL.keys() | SMALL.keys())
    os.makedirs(a.out, exist_ok=True)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)
    try:
        if not a.replot:
            run(a)
    finally:
        kill_all()
    if STOPPED:  # a stop swallowed past the last check: no charts or doc
        return 128 + STOPPED
    charts = experiments_report.charts(a.out)
    log("charts: %s" % ", ".join(os.path.basename(c) for c in charts))
    if a.docs:
        experiments_report.update_docs(a.out, a.docs_path)
        log("updated %s" % a.docs_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
