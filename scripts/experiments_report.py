"""Charts (SVG, drawn with matplotlib in charts.py) and the generated parts of
docs/EXPERIMENTS.md, from the CSVs the experiments wrote. Nothing here runs a VM: `experiments.py --replot --docs`
redraws and rewrites from the files alone."""

import csv
import json
import os
import re
import statistics

import experiments_report_converge
import experiments_report_migration
import experiments_report_published
from charts import Series, bar_chart, bytes_label, line_chart

PAGE = 4096
MIB = 1 << 20


def num(v):
    if v == "":
        return None
    for kind in (int, float):
        try:
            return kind(v)
        except ValueError:
            pass
    return v


def load(out, name):
    path = os.path.join(out, name + ".csv")
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return [{k: num(v) for k, v in r.items()} for r in csv.DictReader(f)]


def pick(rows, **want):
    return [r for r in rows if all(r.get(k) == v for k, v in want.items())]


def one(rows, **want):
    got = pick(rows, **want)
    return got[0] if got else None


def mean(xs):
    xs = [x for x in xs if x is not None]
    return statistics.mean(xs) if xs else None


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def size_ticks(lo, hi):
    """Powers of 4 bytes spanning [lo, hi] (of 2 if that gives too few),
    labelled 4M, 16M, 64M, ..."""
    for factor in (4, 2):
        ticks, v = [], 1 << 20
        while v <= hi * 1.01:
            if v >= lo * 0.99:
                ticks.append((v, bytes_label(v)))
            v *= factor
        if len(ticks) >= 3:
            break
    return ticks


# ---- charts -------------------------------------------------------------------------

def logged_mode(rows):
    """The dirty-log mode the rows' written-since-boot figures come from: the
    bitmap (the only mode that logs from boot); CSVs written before a ring VM
    logged only while observed hold ring rows instead."""
    return "bitmap" if pick(rows, dirty_log="bitmap") else "ring"


def est_series(rows):  # (estimate, hugepages, dirty log, legend)
    dl = logged_mode(rows)
    return [
        ("mapped", 0, "off", "mapped, 4K pages"),
        ("mapped", 1, "off", "mapped, --hugepages"),
        ("mapped", 1, dl, "mapped, --hugepages + dirty %s" % dl),
        ("resident", 0, "off", "resident (mincore), 4K"),
        ("resident", 1, "off", "resident (mincore), --hugepages"),
        ("written", 0, dl, "written since boot (dirty %s)" % dl),
    ]


def chart_estimates(rows, out):
    made = []
    if not rows:
        return made
    xs = [r["touched_pages"] * PAGE for r in rows]
    ticks = size_ticks(min(xs), max(xs))
    series = []
    for est, hp, dl, name in est_series(rows):
        pts = [(r["touched_pages"] * PAGE, r[est + "_ratio"]) for r in pick(rows, write="nonzero", hugepages=hp, dirty_log=dl)]
        if any(y is not None for _, y in pts):
            series.append(Series(name, pts))
    path = os.path.join(out, "estimates-nonzero.svg")
    line_chart(path, "Non-zero writes: each estimate / the scan's non-zero pages", "memory the guest wrote (non-zero)",
               "estimate / scan (log)", series, xlog=True, ylog=True, xticks=ticks, hlines=[(1, "exact")],
               yfmt=lambda v: "%g" % v)
    made.append(path)
    series = []
    for est, hp, dl, name in est_series(rows):
        pts = [(r["touched_pages"] * PAGE, (r[est + "_pages"] - r["scan_nonzero"]) * PAGE)
               for r in pick(rows, write="zero", hugepages=hp, dirty_log=dl) if r[est + "_pages"] is not None]
        if pts:
            series.append(Series(name, pts))
    series.append(Series("what was written (all zeros)", [(x, x) for x in sorted(set(xs))], dashed=True, color="#777"))
    path = os.path.join(out, "estimates-zero.svg")
    line_chart(path, "Zero writes: how much each estimate counts as non-zero (the scan: none)", "memory the guest wrote (zeros)",
               "estimate - scan (log)", series, xlog=True, ylog=True, xticks=ticks, yfmt=bytes_label, ybase2=True)
    made.append(path)
    return made


def chart_cost(rows, out):
    if not rows:
        return []
    sizes = sorted({r["memory_bytes"] for r in rows})
    per = lambda f, **w: [(s, median(f(r) for r in pick(rows, memory_bytes=s, **w))) for s in sizes]  # noqa: E731
    touched = sorted({r["touched"] for r in rows}, key=lambda t: (t.endswith("%"), t))
    series = [Series("mapped estimate (one pread)", per(lambda r: r["mapped_us"])),
              Series("resident (mincore)", per(lambda r: r["mincore_us"]))]
    for t in touched:
        for fill, label in (("nonzero", "non-zero"), ("zero", "zeros")):
            series.append(Series("scan, %s %s written" % (t, label), per(lambda r: r["scan_us"], touched=t, fill=fill)))
    t = touched[0]
    # A ring VM logs only while observed: only the bitmap VM has a log from boot to sync.
    series.append(Series("bitmap sync after %s written" % t, per(lambda r: r["sync_first_us"], touched=t, dirty_log="bitmap"),
                         dashed=True))
    series.append(Series("bitmap sync, nothing new", per(lambda r: r["sync_idle_us"], dirty_log="bitmap"), dashed=True))
    path = os.path.join(out, "cost.svg")
    line_chart(path, "What each figure costs as the guest grows", "guest RAM", "time (log)", series,
               xlog=True, ylog=True, xticks=[(s, bytes_label(s)) for s in sizes], yfmt=fmt_us, width=1000)
    return [path]


def dirty_groups(rows):
    keys = sorted({(r["ws_bytes"], r["rate"]) for r in rows})
    return keys, ["ws %s\n%s/s" % (bytes_label(ws), rate) for ws, rate in keys]


def chart_dirtyrate(rows, out):
    if not rows:
        return []
    keys, labels = dirty_groups(rows)
    series = []
    for mode in ("dirty-bitmap", "dirty-ring"):
        series.append(Series("%s: measured / collision-expected" % mode[6:],
                             [mean(r["ratio_expected"] for r in pick(rows, kind="steady", mode=mode, ws_bytes=ws, rate=rt))
                              for ws, rt in keys]))
    for mode in ("dirty-bitmap", "dirty-ring"):
        series.append(Series("%s: measured / guest's own count" % mode[6:],
                             [mean(r["ratio_guest"] for r in pick(rows, kind="contained", mode=mode, ws_bytes=ws, rate=rt))
                              for ws, rt in keys]))
    path = os.path.join(out, "dirtyrate.svg")
    bar_chart(path, "Measured dirty rate against what the guest generated", "ratio", labels, series,
              band=(0.9, 1.1, "within 10%"), hlines=[(1, "")], width=1100, yfmt=lambda v: "%.2f" % v,
              xlabel="working set and paced write rate (pages/s)", dots=True)
    return [path]


def chart_observer(rows, out):
    if not rows:
        return []
    wss = sorted({r["ws_bytes"] for r in rows})
    modes = [m for m in ("off", "bitmap", "ring", "ring:65536") if pick(rows, mode=m)]
    series = [Series("no dirty logging", [v(one(rows, mode="off", ws_bytes=w), "during_rate") for w in wss], color="#777")]
    colors = {"bitmap": "#0072B2", "ring": "#D55E00", "ring:65536": "#009E73"}
    for m in modes[1:]:
        for phase in ("before", "during"):
            series.append(Series("%s, %s the window" % (m if m != "ring" else "ring (4096 entries)", phase),
                                 [v(one(rows, mode=m, ws_bytes=w), phase + "_rate") for w in wss]))
    for s in series[1:]:
        s.color = colors.get(s.name.split(",")[0].split(" (")[0])
        s.opacity = 0.45 if "before" in s.name else 1.0
    path = os.path.join(out, "observer.svg")
    bar_chart(path, "A guest writing as fast as it can: its write rate under each tracking mode", "guest writes per second (log)",
              ["working set %s" % bytes_label(w) for w in wss], series, ylog=True, width=1100)
    return [path]


def v(row, key):
    return row[key] if row else None


def chart_misleads(rows, out):
    if not rows:
        return []
    cases = list(dict.fromkeys(r["case"] for r in rows))
    combos = [("mapped", 0, "off", "mapped, 4K pages"), ("mapped", 1, "off", "mapped, --hugepages"),
              ("resident", 1, "off", "resident, --hugepages"), ("sampled", 1, "off", "sampled, --hugepages"),
              ("written", 0, logged_mode(rows), "written (dirty %s)" % logged_mode(rows))]
    series = [Series(name, [excess_mib(one(rows, case=c, hugepages=hp, dirty_log=dl), est) for c in cases])
              for est, hp, dl, name in combos]
    path = os.path.join(out, "misleads.svg")
    bar_chart(path, "Where the estimates mislead: pages counted non-zero that are not", "estimate - scan (MiB)",
              cases, series, width=1100, xlabel="workload (see the table)")
    return [path]


def excess_mib(row, est):
    if row is None or row[est + "_pages"] is None:
        return None
    return (row[est + "_pages"] - row["scan_nonzero"]) * PAGE / MIB


def charts(out):
    """Draws every chart the CSVs in `out` allow; the paths written."""
    made = []
    made += chart_estimates(load(out, "estimates"), out)
    made += chart_cost(load(out, "cost"), out)
    made += chart_dirtyrate(load(out, "dirtyrate"), out)
    made += chart_observer(load(out, "observer"), out)
    made += chart_misleads(load(out, "misleads"), out)
    made += experiments_report_migration.chart(load(out, "migration"), out)
    return [p for p in made if os.path.exists(p)]


# ---- docs ---------------------------------------------------------------------------

def fmt_us(us):
    if us is None:
        return "–"
    if us < 1000:
        return "%.3g µs" % us
    if us < 1e6:
        return "%.3g ms" % (us / 1e3)
    return "%.3g s" % (us / 1e6)


def fmt_ratio(x):
    if x is None:
        return "–"
    if x >= 100:
        return "{:,.0f}".format(x)
    return "%.3g" % x


def fmt_int(x):
    return "–" if x is None else "{:,}".format(int(round(x)))


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def block_run(meta):
    s = meta.get("seconds", {})
    runtime = ", ".join("%s %s s" % (k, s[k]) for k in s if k != "total") + "; total %s s" % s.get("total", "?")
    machine = "%s CPUs (`nproc`), %s, %s GiB RAM" % (meta.get("nproc"), meta.get("cpu"), meta.get("memory_gib"))
    parts = meta.get("parts", {})
    machines = {p.get("machine") for p in parts.values()}
    if len(machines) > 1:
        # Parts run on different hosts: each part's, the newest run's first.
        machine += " (the newest run, %s); by part: %s" % (meta.get("date", "?"), "; ".join(
            "%s: %s" % (n, p.get("machine", "?")) for n, p in parts.items()))
    return table(["", ""], [
        ("command", "`%s`" % meta.get("command", "?")),
        ("date", meta.get("date", "?")),
        ("machine", machine),
        ("kernel", "`%s`, modules %s" % (meta.get("kernel"), meta.get("kvm_modules"))),
        ("backend", meta.get("backend", "?")),
        ("host THP", "`%s`" % meta.get("thp", "?")),
        ("kvmscope", "%s, commit %s (release build)" % (meta.get("kvmscope"), meta.get("commit"))),
        ("matrix", meta.get("matrix", "?")),
        ("runtime", runtime),
    ])


def block_estimates(rows):
    dl = logged_mode(rows)
    keys = list(dict.fromkeys((r["memory"], r["fraction"], r["write"]) for r in rows))
    out = []
    for mem, frac, write in keys:
        base = one(rows, memory=mem, fraction=frac, write=write, hugepages=0, dirty_log="off")
        ratio = lambda est, hp, dl: fmt_ratio(v(one(rows, memory=mem, fraction=frac, write=write, hugepages=hp, dirty_log=dl), est + "_ratio"))  # noqa: E731,E501
        out.append((mem, "%g%% (%s)" % (frac * 100, bytes_label(base["touched_pages"] * PAGE)), write,
                    fmt_int(base["scan_nonzero"]), ratio("mapped", 0, "off"), ratio("mapped", 1, "off"),
                    ratio("mapped", 1, dl), ratio("resident", 0, "off"), ratio("resident", 1, "off"),
                    ratio("written", 0, dl), fmt_us(base["scan_us"])))
    header = ["guest", "arena written", "writes", "scan: non-zero pages", "mapped ÷ scan, 4K", "mapped, THP",
              "mapped, THP + %s" % dl, "resident ÷ scan, 4K", "resident, THP", "written ÷ scan (%s)" % dl, "scan took"]
    return table(header, out)


def block_cost(rows):
    sizes = sorted({r["memory_bytes"] for r in rows})
    touched = sorted({r["touched"] for r in rows}, key=lambda t: (t.endswith("%"), t))
    out = []
    for s in sizes:
        g = pick(rows, memory_bytes=s)
        cells = [bytes_label(s), fmt_us(median(r["mapped_us"] for r in g)), fmt_us(median(r["mincore_us"] for r in g))]
        for t in touched:
            for fill in ("nonzero", "zero"):
                cells.append(fmt_us(median(r["scan_us"] for r in pick(g, touched=t, fill=fill))))
        for t in touched:
            cells.append(fmt_us(median(r["sync_first_us"] for r in pick(g, touched=t, dirty_log="bitmap"))))
        cells.append(fmt_us(median(r["sync_idle_us"] for r in pick(g, dirty_log="bitmap"))))
        out.append(cells)
    header = ["guest", "mapped (pread)", "mincore"]
    header += ["scan, %s %s" % (t, "non-zero" if f == "nonzero" else "zeros") for t in touched for f in ("nonzero", "zero")]
    header += ["bitmap sync after %s" % t for t in touched]
    header += ["bitmap sync, nothing new"]
    return table(header, out)


def block_dirtyrate(rows):
    keys, _ = dirty_groups(rows)
    out = []
    for ws, rate in keys:
        st = pick(rows, kind="steady", ws_bytes=ws, rate=rate)
        exp = mean(r["expected_rate"] for r in st)
        cells = [bytes_label(ws), fmt_int(rate), fmt_int(exp)]
        for mode in ("dirty-bitmap", "dirty-ring"):
            m = pick(st, mode=mode)
            rates = [r["measured_rate"] for r in m]
            cells += ["%s (%s–%s)" % (fmt_int(mean(rates)), fmt_int(min(rates)), fmt_int(max(rates))) if rates else "–",
                      fmt_ratio(mean(r["ratio_expected"] for r in m)), fmt_ratio(mean(r["ratio_raw"] for r in m))]
        ct = pick(rows, kind="contained", ws_bytes=ws, rate=rate)
        cells.append(" / ".join("%s ÷ %s" % (fmt_int(r["measured_pages"]), fmt_int(r["guest_distinct"])) for r in ct))
        out.append(cells)
    header = ["working set", "rate R (pages/s)", "collision-expected (pages/s)", "bitmap measured (pages/s)",
              "÷ expected", "÷ R", "ring measured (pages/s)", "÷ expected", "÷ R",
              "whole run in window: measured ÷ guest-counted pages (bitmap / ring)"]
    return table(header, out) + "\n" + dirty_summary(rows)


def dirty_summary(rows):
    lines = []
    for mode in ("dirty-bitmap", "dirty-ring"):
        st = pick(rows, kind="steady", mode=mode)
        ct = pick(rows, kind="contained", mode=mode)
        if not st:
            continue
        worst = max(abs(r["ratio_expected"] - 1) for r in st)
        gap = max((r["measured_pages"] - r["guest_distinct"] for r in ct), default=None)
        low = min((r["measured_pages"] - r["guest_distinct"] for r in ct), default=None)
        off = fmt_signed(low) if low == gap else "%s to %s" % (fmt_signed(low), fmt_signed(gap))
        lines.append("- `%s`: %d windows, every one within %.1f%% of the collision-expected rate; %d whole runs inside "
                     "the window measured %s pages against the guest's own count."
                     % (mode, len(st), worst * 100, len(ct), off))
    return "\n".join(lines) + "\n"


def fmt_signed(x):
    return "–" if x is None else "%+d" % x


def block_observer(rows):
    out = []
    for ws in sorted({r["ws_bytes"] for r in rows}):
        off = one(rows, mode="off", ws_bytes=ws)
        for r in pick(rows, ws_bytes=ws):
            slow = off["before_rate"] / r["during_rate"] if off and r["during_rate"] else None
            out.append((bytes_label(ws), r["mode"], compact_rate(r["before_rate"]), compact_rate(r["during_rate"]),
                        compact_rate(r["after_rate"]), "%.3g×" % slow if slow else "–",
                        fmt_ratio(r["ratio_guest"]) if r["ratio_guest"] is not None else "–"))
    header = ["working set", "dirty log", "writes/s before", "during the window", "after", "slowdown during (vs none)",
              "measured ÷ guest-counted pages"]
    return table(header, out)


def compact_rate(x):
    if x is None:
        return "–"
    for div, suf in ((1e6, "M"), (1e3, "k")):
        if x >= div:
            return "%.3g%s" % (x / div, suf)
    return "%.0f" % x


def block_misleads(rows):
    dl = logged_mode(rows)
    out = []
    used = lambda row: "`%s`" % row["estimate_used"] if row and row.get("estimate_used") else "–"  # noqa: E731
    for case in dict.fromkeys(r["case"] for r in rows):
        get = lambda hp, dl: one(rows, case=case, hugepages=hp, dirty_log=dl)  # noqa: E731
        base, thp = get(0, "off"), get(1, "off")
        cell = lambda row, est: fmt_ratio(v(row, est + "_ratio"))  # noqa: E731
        out.append(("`%s`" % case, base["what"], fmt_int(base["nonzero_written"]), fmt_int(base["scan_nonzero"]),
                    cell(base, "mapped"), cell(thp, "mapped"), cell(get(1, dl), "mapped"), cell(base, "resident"),
                    cell(thp, "resident"), cell(get(0, dl), "written"), cell(base, "sampled"), cell(thp, "sampled"),
                    "%s / %s" % (used(base), used(thp)),
                    "%.1f / %.1f" % (round(excess_mib(base, "mapped"), 1) + 0.0, round(excess_mib(thp, "mapped"), 1) + 0.0)))
    header = ["case", "workload", "pages left non-zero", "scan: non-zero (all RAM)", "mapped ÷ scan, 4K", "mapped, THP",
              "mapped, THP + %s" % dl, "resident ÷ scan, 4K", "resident, THP", "written ÷ scan (%s)" % dl,
              "sampled ÷ scan, 4K", "sampled, THP", "prediction's estimate without a scan (4K / THP)",
              "mapped − scan, MiB (4K / THP)"]
    return table(header, out)


def block_stall(rows):
    out = []
    for r in rows:
        rep, lost, thr = v(r, "reported_s"), v(r, "time_lost_s"), v(r, "throughput_lost_s")
        ev, et = v(r, "error_vs_time"), v(r, "error_vs_throughput")
        work, ew = r.get("work_lost_s"), r.get("error_vs_work")  # absent from runs before it
        cpu, ec, wait = r.get("work_lost_on_cpu_s"), r.get("error_vs_on_cpu"), r.get("waited_s")
        pct = lambda e: "%+.0f %%" % (100 * e) if e is not None else "–"  # noqa: E731
        num = lambda x: "%.3f" % x if x is not None else "–"  # noqa: E731
        out.append(("`%s`" % r["workload"], r["dirty_log"], "%.1f s" % float(r["window_s"]),
                    str(r.get("repeats") or 1), "%.3f" % rep, num(r.get("counted_s")), num(work), pct(ew), num(cpu), pct(ec), num(wait),
                    num(lost), num(thr), pct(ev), pct(et)))
    header = ["workload", "dirty log", "window", "runs (medians)", "reported stall (the reply), s",
              "counted stall (running total, same span as the loss), s", "work lost (guest's count), s",
              "counted vs work lost", "work lost on its vCPU's clock, s", "counted vs that",
              "extra wait for a CPU, s", "guest time lost, s", "throughput lost, s", "reported vs time lost",
              "reported vs throughput lost"]
    on_cpu = [r for r in rows if r.get("error_vs_on_cpu") is not None]
    within_cpu = sum(1 for r in on_cpu if abs(r["error_vs_on_cpu"]) <= 0.25)
    cells = [r for r in rows if r.get("error_vs_work") is not None]
    within = sum(1 for r in cells if abs(r["error_vs_work"]) <= 0.25)
    lossy = [r for r in rows if (r.get("work_lost_s") or 0) > 0.05 * float(r["window_s"])]
    unseen = sum(1 for r in lossy if v(r, "reported_s") <= 0.0)
    zero = [r for r in rows if v(r, "time_lost_s") is not None and v(r, "time_lost_s") <= 0.02]
    quiet = sum(1 for r in zero if v(r, "reported_s") <= 0.02)
    summary = ("\nCounted within ±25 %% of the work the guest lost by its own count in %d of %d cells where it "
               "lost more than 20 ms (%d of %d counted on its vCPU thread's clock); reported as zero in %d of the "
               "%d cells where it lost more than 5 %% of the window; at most 20 ms in %d of %d cells where its "
               "guest time lost was none.\n"
               % (within, len(cells), within_cpu, len(on_cpu), unseen, len(lossy), quiet, len(zero)))
    return table(header, out) + summary


def skeleton(names):
    parts = ["# Migration-readiness experiments\n"]
    for n in names:
        parts.append("\n<!-- BEGIN generated:%s -->\n<!-- END generated:%s -->\n" % (n, n))
    return "".join(parts)


def update_docs(out, path):
    """Rewrites every `<!-- BEGIN generated:NAME -->` block of the doc at `path`
    from the CSVs in `out` (a missing doc is created with bare blocks)."""
    with open(os.path.join(out, "meta.json")) as f:
        meta = json.load(f)
    blocks = {"run": block_run(meta)}
    for name, make in (("estimates", block_estimates), ("cost", block_cost), ("dirtyrate", block_dirtyrate),
                       ("observer", block_observer), ("misleads", block_misleads),
                       ("migration", experiments_report_migration.block_migration),
                       ("converge", experiments_report_converge.block_converge),
                       ("published", experiments_report_published.block_published), ("stall", block_stall)):
        rows = load(out, name)
        blocks[name] = make(rows) if rows else "(not run)\n"
    text = open(path).read() if os.path.exists(path) else skeleton(blocks)
    for name, body in blocks.items():
        pattern = re.compile(r"(<!-- BEGIN generated:%s -->\n).*?(<!-- END generated:%s -->)" % (name, name), re.S)
        if not pattern.search(text):
            raise SystemExit("experiments: %s has no generated:%s block" % (path, name))
        text = pattern.sub(lambda m: m.group(1) + body + m.group(2), text)
    with open(path, "w") as f:
        f.write(text)
