"""The experiments: each runs its part of a matrix (scripts/experiments_matrix.py)
on fresh VMs and returns CSV rows (dicts keyed by the matrix's COLUMNS)."""

import os
import statistics
import subprocess
import time

from experiments_converge import run_converge
from experiments_migration import run_migration
from experiments_published import run_published
from experiments_stall import run_stall
from experiments_vm import Vm, log

MIB = 1 << 20
PAGE = 4096


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
        "sampled_pages": rep["sampled"]["pages"], "sampled_read": rep["sampled"]["pages_read"],
        "scan_nonzero": nonzero, "scan_nonzero_arena": scan["nonzero_in_arena"],
        "scan_zero": scan["zero_pages"], "scan_unbacked": scan["unbacked_pages"],
        "mapped_ratio": ratio(mapped), "resident_ratio": ratio(rep["resident"]["pages"]),
        "written_ratio": ratio(written["pages"]) if written else "",
        "sampled_ratio": ratio(rep["sampled"]["pages"]),
        "mapped_us": rep["mapped"]["took_us"], "resident_us": rep["resident"]["took_us"],
        "written_us": written["took_us"] if written else "", "sampled_us": rep["sampled"]["took_us"],
        "scan_us": scan["took_us"],
    }


def run_estimates(binary, m):
    """Estimates against the scan: sizes x hugepages x dirty log x fill x fraction."""
    rows = []
    for mem in m["sizes"]:
        for hp in (False, True):
            for dl in m["dirty_logs"]:
                for write in ("nonzero", "zero"):
                    for frac in m["fractions"]:
                        rows.append(estimate_cell(binary, mem, hp, dl, write, frac))
    return rows


def estimate_cell(binary, mem, hp, dl, write, frac):
    with Vm(binary, mem, hugepages=hp, dirty_log=dl) as vm:
        size = touch_size(vm.arena["size"], frac)
        cmd = "touch" if write == "nonzero" else "touch-zero"
        res = vm.guest("%s offset=0 size=%d" % (cmd, size))[0]
        rep = vm.readiness(scan=True)
        arena_pages = vm.arena["size"] // PAGE
    row = {"memory": mem, "memory_bytes": rep["ram"]["bytes"], "hugepages": int(hp), "dirty_log": dl or "off",
           "write": write, "fraction": frac, "arena_pages": arena_pages, "touched_pages": res["values"][0],
           "nonzero_written": res["values"][0] if write == "nonzero" else 0, "touch_s": round(res["host_time_s"], 4)}
    row.update(estimate_fields(rep))
    log("estimates %s hp=%d dirty-log=%s %s %.3g: mapped %s resident %s written %s scan %s"
        % (mem, hp, dl or "off", write, frac, row["mapped_pages"], row["resident_pages"], row["written_pages"] or "-",
           row["scan_nonzero"]))
    return row


def run_cost(binary, m):
    """What each figure costs: sizes x dirty-log mode x amount touched x fill."""
    rows = []
    for mem in m["cost_sizes"]:
        for dl in ("bitmap", "ring"):
            for touched in m["cost_touched"]:
                for fill in ("nonzero", "zero"):
                    rows.append(cost_cell(binary, m, mem, dl, touched, fill))
    return rows


def sync_us(rep):
    """What syncing the written-since-boot log took, None where the VM keeps none."""
    written = rep["written_since_boot"]
    return round(written["took_us"], 2) if written else None


def cost_cell(binary, m, mem, dl, touched, fill):
    with Vm(binary, mem, dirty_log=dl) as vm:
        if touched.endswith("%"):
            size = touch_size(vm.arena["size"], float(touched[:-1]) / 100)
        else:
            size = int(touched[:-1]) * MIB
        vm.guest("%s offset=0 size=%d" % ("touch" if fill == "nonzero" else "touch-zero", size))
        first = vm.readiness(scan=True)
        reps = [vm.readiness(scan=True) for _ in range(m["cost_repeats"])]
    med = lambda f: round(statistics.median(f(r) for r in reps), 2)  # noqa: E731
    row = {"memory": mem, "memory_bytes": first["ram"]["bytes"], "dirty_log": dl, "touched": touched, "fill": fill,
           "touched_pages": size // PAGE, "repeats": len(reps),
           "mapped_us": med(lambda r: r["mapped"]["took_us"]),
           "mincore_us": med(lambda r: r["resident"]["took_us"]),
           "scan_us": med(lambda r: r["scan"]["took_us"]),
           "scan_first_us": round(first["scan"]["took_us"], 2),
           # Only a bitmap VM keeps a log from boot; a ring VM logs only while
           # observed, so it has no written-since-boot figure to sync.
           "sync_first_us": sync_us(first), "sync_idle_us": med(sync_us) if sync_us(first) is not None else None,
           "resident_pages": first["resident"]["pages"], "scan_nonzero": first["scan"]["nonzero_pages"]}
    row["scan_gb_per_s"] = round(row["resident_pages"] * PAGE / (row["scan_us"] * 1e3), 3)
    sync = "-" if row["sync_first_us"] is None else "%.0f/%.0f us" % (row["sync_first_us"], row["sync_idle_us"])
    log("cost %s %s %s %s: mapped %.1f us, mincore %.0f us, scan %.0f us, sync %s"
        % (mem, dl, touched, fill, row["mapped_us"], row["mincore_us"], row["scan_us"], sync))
    return row


def expected_distinct(ws_pages, writes):
    """Distinct pages hit by `writes` uniform picks among `ws_pages`."""
    return ws_pages * (1 - (1 - 1 / ws_pages) ** writes)


def dirty_spec(ws, rate, seconds, seed):
    r = "max" if rate == "max" else "%d/s" % rate
    return "dirty offset=0 ws=%d rate=%s for=%dms seed=%d" % (ws, r, round(seconds * 1000), seed)


def steady_cell(vm, rate, ws, seed, calc_time):
    """The dirty rate over a window inside a longer paced run: measured against
    the collision-expected rate (and the raw rate)."""
    seq = vm.start(dirty_spec(ws, rate, calc_time + 0.5, seed))
    vm.wait_running(seq)
    rep = vm.readiness(scan=False, calc_time=calc_time)
    res = vm.result(seq)
    d = rep["dirty_rate"]
    raw = rate * d["window_s"]
    return dirty_row("steady", d, res, rate, ws, seed, raw)


def contained_cell(vm, rate, ws, seed, calc_time):
    """A whole paced run inside a window 0.2 s longer: measured pages against the
    distinct pages the guest counted itself, and the collision formula for its
    exact number of writes."""
    vm.send_readiness(False, calc_time + 0.2)
    time.sleep(0.1)  # the window opens within a few ms of the request
    seq = vm.start(dirty_spec(ws, rate, calc_time, seed), side=True)
    rep = vm.readiness_reply()
    res = vm.result(seq)
    return dirty_row("contained", rep["dirty_rate"], res, rate, ws, seed, res["values"][0])


def dirty_row(kind, d, res, rate, ws, seed, raw):
    writes, _, distinct = res["values"]
    expect = expected_distinct(ws // PAGE, raw)
    row = {"kind": kind, "mode": d["mode"], "rate": rate, "ws_bytes": ws, "ws_pages": ws // PAGE, "seed": seed,
           "window_s": round(d["window_s"], 4), "measured_pages": d["pages"],
           "measured_rate": round(d["pages_per_s"], 1), "raw_expected_pages": round(raw, 1),
           "expected_pages": round(expect, 1), "expected_rate": round(expect / d["window_s"], 1),
           "ratio_expected": round(d["pages"] / expect, 4), "ratio_raw": round(d["pages"] / raw, 4),
           "guest_writes": writes, "guest_seconds": round(res["host_time_s"], 4), "guest_distinct": distinct,
           "guest_rate": round(writes / res["host_time_s"], 1), "took_us": round(d["took_us"], 1)}
    if kind == "contained":
        row["ratio_guest"] = round(d["pages"] / distinct, 4)
    log("dirtyrate %s %s ws=%dM rate=%s: measured %d pages (%.0f/s), expected %.0f (x%.3f)%s"
        % (kind, d["mode"], ws // MIB, rate, d["pages"], d["pages_per_s"], expect, row["ratio_expected"],
           ", guest counted %d (x%.3f)" % (distinct, row["ratio_guest"]) if kind == "contained" else ""))
    return row


def run_dirtyrate(binary, m):
    """Measured dirty rate against what the guest generated: mode x ws x rate."""
    rows = []
    for mode in ("bitmap", "ring"):
        for ws in m["working_sets"]:
            with Vm(binary, m["dirty_memory"], dirty_log=mode) as vm:
                vm.guest("touch offset=0 size=%d" % ws)
                for rate in m["rates"]:
                    for rep in range(m["dirty_repeats"]):
                        rows.append(steady_cell(vm, rate, ws, 1 + rep, m["calc_time"]))
                    rows.append(contained_cell(vm, rate, ws, 100, m["calc_time"]))
    return rows


def run_observer(binary, m):
    """What measuring costs a guest that writes as fast as it can: its write
    rate before, during and after a dirty-rate window, per tracking mode."""
    rows = []
    for ws in m["observer_ws"]:
        for mode in m["observer_modes"]:
            rows.append(observer_cell(binary, m, ws, mode))
    return rows


def observer_cell(binary, m, ws, mode):
    secs = m["observer_seconds"]
    with Vm(binary, m["dirty_memory"], dirty_log=None if mode == "off" else mode) as vm:
        vm.guest("touch offset=0 size=%d" % ws)
        before = vm.guest(dirty_spec(ws, "max", secs, 1))[0]
        if mode == "off":
            during, d = vm.guest(dirty_spec(ws, "max", secs, 2))[0], None
        else:
            vm.send_readiness(False, secs + 0.2)
            time.sleep(0.1)
            seq = vm.start(dirty_spec(ws, "max", secs, 2), side=True)
            d = vm.readiness_reply()["dirty_rate"]
            during = vm.result(seq)
        after = vm.guest(dirty_spec(ws, "max", secs, 3))[0]
    rate = lambda r: round(r["values"][0] / r["host_time_s"], 1)  # noqa: E731
    row = {"mode": mode, "ws_bytes": ws, "ws_pages": ws // PAGE, "seconds": secs, "before_rate": rate(before),
           "during_rate": rate(during), "after_rate": rate(after), "guest_distinct": during["values"][2]}
    if d is not None:
        row.update(measured_pages=d["pages"], ratio_guest=round(d["pages"] / during["values"][2], 4),
                   window_s=round(d["window_s"], 4))
    log("observer %s ws=%dM: %.3g writes/s before, %.3g during, %.3g after"
        % (mode, ws // MIB, row["before_rate"], row["during_rate"], row["after_rate"]))
    return row


def run_misleads(binary, m):
    """Workloads where the mapped-page estimate is far from the scan."""
    rows = []
    for case, truth, cmd, what in m["cases"]:
        for hp in (False, True):
            for dl in m["dirty_logs"]:
                with Vm(binary, m["misleads_memory"], hugepages=hp, dirty_log=dl) as vm:
                    vm.guest(cmd)
                    rep = vm.readiness(scan=True)
                    # The estimate a prediction takes where nobody scans.
                    used = vm.readiness(scan=False)["estimate_used"]
                row = {"case": case, "what": what, "workload": cmd, "hugepages": int(hp), "dirty_log": dl or "off",
                       "nonzero_written": truth, "estimate_used": used}
                row.update(estimate_fields(rep))
                for est in ("mapped", "resident", "written", "sampled"):
                    v = row["%s_pages" % est]
                    row["%s_excess_mib" % est] = round((v - row["scan_nonzero"]) * PAGE / MIB, 2) if v != "" else ""
                rows.append(row)
                log("misleads %s hp=%d dirty-log=%s: mapped x%s resident x%s written x%s sampled x%s"
                    % (case, hp, dl or "off", row["mapped_ratio"], row["resident_ratio"], row["written_ratio"] or "-",
                       row["sampled_ratio"]))
    return rows


def run_series(binary, m, out):
    """Sampled runs drawn by `kvmscope plot`: a guest writing as fast as it can,
    measured for one second with each dirty-tracking mode."""
    made = []
    ws, secs = m["series_ws"], m["series_seconds"]
    for mode in ("bitmap", "ring"):
        series = os.path.join(out, "series-%s.jsonl" % mode)
        with Vm(binary, m["dirty_memory"], dirty_log=mode, samples_out=series, sample_interval="50ms") as vm:
            vm.guest("touch offset=0 size=%d" % ws)
            vm.guest("wait for=300ms")
            seq = vm.start(dirty_spec(ws, "max", secs, 1))
            vm.wait_running(seq)
            time.sleep(secs / 3)
            vm.readiness(scan=False, calc_time=secs / 3)
            vm.result(seq)
            vm.guest("wait for=300ms")
        svg = os.path.join(out, "series-%s.svg" % mode)
        title = "dirty rate=max ws=%dM for %gs, dirty-%s window in the middle third" % (ws // MIB, secs, mode)
        subprocess.run([binary, "plot", series, "--output", svg, "--title", title], check=True,
                       stdout=subprocess.DEVNULL)
        made.append(svg)
        log("series %s -> %s" % (mode, svg))
    return made


EXPERIMENTS = {"estimates": run_estimates, "cost": run_cost, "dirtyrate": run_dirtyrate,
               "observer": run_observer, "misleads": run_misleads, "migration": run_migration, "converge": run_converge, "published": run_published,
               "stall": run_stall}
