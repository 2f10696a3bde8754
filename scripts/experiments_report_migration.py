"""The migration part's generated block of docs/EXPERIMENTS.md: predicted vs
actual per cell and field, error distributions (this model and the old one),
the verdict confusion table, the booted 16 GiB guest next to QEMU's published
figures, which non-zero estimate predicts the transfer best, and the goals."""

import math

# QEMU's published figures for a 16 GiB guest that only booted its firmware.
QEMU_BOOTED = {"transferred": 37 * 10**6, "normal": 283, "duplicate": 4_198_330, "total_ms": 3064, "downtime_ms": 10}
FIELDS = [("transferred", "transferred"), ("duplicate", "duplicate"), ("normal", "normal"),
          ("rounds", "dirty-sync-count"), ("downtime_ms", "downtime (ms)"), ("total_ms", "total-time (ms)")]


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def cell_name(r):
    fill = "idle" if r["fraction"] == 0 else "%s %g" % (r["write"], r["fraction"])
    return "%s %dv%s %s, dirty %s, %s, %d ms" % (r["memory"], r["vcpus"], " THP" if r["hugepages"] in (1, "True") else "",
                                               fill, r["dirty"], r["link"], r["limit_ms"])


def rel(p, a):
    """Relative error of p against a (None when either is missing)."""
    if p is None or a is None or p == "" or a == "":
        return None
    if a == 0:
        return 0.0 if p == 0 else math.inf
    return (p - a) / a


def pct(x):
    if x is None:
        return "–"
    return "∞" if math.isinf(x) else "%+.1f %%" % (x * 100)


def mag(x):
    if x is None:
        return "–"
    return "∞" if math.isinf(x) else "%.1f %%" % (abs(x) * 100)


def quantile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(math.ceil(q * len(xs))) - 1)] if xs else None


def distribution(rows, pred, actual):
    """(median |err|, p90 |err|, worst err, worst cell) over rows with both figures."""
    errs = [(abs(e), e, cell_name(r)) for r in rows for e in [rel(r[pred], r[actual])] if e is not None]
    if not errs:
        return None
    mags = [e[0] for e in errs]
    worst = max(errs, key=lambda e: e[0])
    return quantile(mags, 0.5), quantile(mags, 0.9), worst[1], worst[2]


def block_cells(rows):
    out = []
    for r in rows:
        cells = [cell_name(r), "%.2f" % r["rate_x_link"]]
        for f, _ in FIELDS:
            p, a = r["pred_" + f], r[f]
            cells.append("%s / %s (%s)" % ("–" if p in ("", None) else p, a, pct(rel(p, a))))
        cells.append("%s / %s" % (r["pred_verdict"], r["verdict"]))
        cells.append(r["verify_bad"] if r["verify_bad"] != "" else "–")
        out.append(cells)
    header = ["cell", "dirty ÷ link page rate"] + ["%s: predicted / actual (error)" % n for _, n in FIELDS] + [
        "verdict: predicted / actual", "verify: bad pages"]
    return table(header, out)


def block_errors(rows):
    out = []
    conv = [r for r in rows if r["verdict"] == "converges"]
    for f, name in FIELDS:
        for model, prefix in (("this", "pred_"), ("old", "old_")):
            key = prefix + f
            if key not in rows[0]:
                continue
            d = distribution(conv, key, f)
            if d:
                out.append((name, model, mag(d[0]), mag(d[1]), pct(d[2]), d[3]))
    return table(["field (converging cells)", "model", "median |error|", "p90 |error|", "worst", "worst cell"], out)


def block_confusion(rows):
    out = []
    for model, key in (("this", "pred_verdict"), ("old", "old_verdict")):
        for p in ("converges", "no"):
            n = lambda a: sum(1 for r in rows if r[key] == p and r["verdict"] == a)  # noqa: E731
            out.append((model, "converges" if p == "converges" else "does not", n("converges"), n("no")))
    return table(["model", "predicted", "actual: converged", "actual: did not (stopped by x-max-rounds)"], out)


def block_booted(rows):
    r = next((r for r in rows if r["memory"] == "16G" and r["fraction"] == 0), None)
    if r is None:
        return "(no 16 GiB booted cell in this run)\n"
    q = QEMU_BOOTED
    out = [("transferred", "%.2f MB" % (r["pred_transferred"] / 1e6), "%.2f MB" % (r["transferred"] / 1e6),
            "%.1f MB" % (q["transferred"] / 1e6)),
           ("duplicate", r["pred_duplicate"], r["duplicate"], "{:,}".format(q["duplicate"])),
           ("normal", r["pred_normal"], r["normal"], q["normal"]),
           ("total-time", "%s ms" % r["pred_total_ms"], "%s ms" % r["total_ms"], "%d ms" % q["total_ms"]),
           ("downtime", "%s ms" % r["pred_downtime_ms"], "%s ms" % r["downtime_ms"], "%d ms" % q["downtime_ms"]),
           ("old model's transferred", "%.2f MB" % (r["old_transferred"] / 1e6), "", "")]
    return table(["16 GiB, only booted", "kvmscope predicted", "kvmscope actual", "QEMU published"], out)


def block_estimates(rows):
    """Transfer predicted with each non-zero estimate in place of the scan's
    count: pass 0 changes by 4096 bytes per page of difference."""
    out = []
    for est in ("scan_nonzero", "mapped_pages", "resident_pages", "written_pages"):
        errs = []
        for r in rows:
            if r[est] in ("", None) or r["verdict"] != "converges":
                continue
            k = min(r[est], r["ram_pages"])
            p = r["pred_transferred"] + (k - r["scan_nonzero"]) * 4096
            errs.append(abs(rel(p, r["transferred"])))
        if errs:
            out.append((est.split("_")[0], len(errs), mag(quantile(errs, 0.5)), mag(quantile(errs, 0.9)), mag(max(errs))))
    return table(["non-zero estimate", "cells", "median |error| of transferred", "p90", "worst"], out)


def block_goals(rows):
    conv = [r for r in rows if r["verdict"] == "converges"]
    t = [abs(rel(r["pred_transferred"], r["transferred"])) for r in conv]
    within10 = sum(1 for e in t if e <= 0.10)
    outside = [r for r in rows if not 0.8 <= r["rate_x_link"] <= 1.2]
    right = sum(1 for r in outside if r["pred_verdict"] == r["verdict"])
    band = [r for r in rows if 0.8 <= r["rate_x_link"] <= 1.2]
    down = [r for r in conv if r["pred_downtime_ms"] != ""]
    down_ok = sum(1 for r in down if abs(r["pred_downtime_ms"] - r["downtime_ms"]) <= 5
                  or (r["pred_downtime_ms"] <= 2 * r["downtime_ms"] and r["downtime_ms"] <= 2 * r["pred_downtime_ms"]))
    rounds_ok = sum(1 for r in rows if abs(r["pred_rounds"] - r["rounds"]) <= 1)
    out = [("transferred within 10 % in ≥ 90 % of converging cells", "%d of %d" % (within10, len(t)),
            "met" if t and within10 >= 0.9 * len(t) else "not met"),
           ("transferred within 25 % in all converging cells", "worst %s" % pct(max(t) if t else None),
            "met" if t and max(t) <= 0.25 else "not met"),
           ("verdict right outside 0.8x–1.2x of the link's page rate", "%d of %d" % (right, len(outside)),
            "met" if right == len(outside) else "not met"),
           ("(in the band: verdict right)", "%d of %d" % (sum(1 for r in band if r["pred_verdict"] == r["verdict"]),
                                                       len(band)), "reported"),
           ("downtime within 2x or 5 ms", "%d of %d" % (down_ok, len(down)),
            "met" if down_ok == len(down) else "not met"),
           ("dirty-sync-count exact or within one", "%d of %d" % (rounds_ok, len(rows)),
            "met" if rounds_ok == len(rows) else "not met")]
    return table(["goal", "this run", ""], out)


def block_migration(rows):
    parts = ["Per cell (predicted by `query-readiness` just before; actual from the source's final `query-migrate`):\n",
             block_cells(rows), "\nError distribution over the converging cells, this model and the old one:\n",
             block_errors(rows), "\nVerdicts:\n", block_confusion(rows), "\nThe seed's case:\n", block_booted(rows),
             "\nWhich estimate of non-zero pages predicts the transfer best (the scan costs a pause; see `cost`):\n",
             block_estimates(rows)]
    # The block starts with a table (the goals), as every generated block does.
    return block_goals(rows) + "\n" + "".join(parts)


def chart(rows, out):
    """predicted ÷ actual per cell for transferred, dirty-sync-count and
    downtime, this model and the old one (log scale): migration.svg."""
    import os

    from charts import Series, bar_chart
    if not rows:
        return []
    ratio = lambda p, a: (p / a) if p not in ("", None) and a not in ("", None, 0) and p > 0 else None  # noqa: E731
    labels = ["%s %dv\n%s %s\n%s %dms" % (r["memory"], r["vcpus"], r["write"][:4], r["dirty"], r["link"], r["limit_ms"])
              for r in rows]
    series = [Series("transferred, this model", [ratio(r["pred_transferred"], r["transferred"]) for r in rows]),
              Series("transferred, old model", [ratio(r["old_transferred"], r["transferred"]) for r in rows]),
              Series("downtime, this model", [ratio(r["pred_downtime_ms"], max(r["downtime_ms"] or 0, 1)) for r in rows]),
              Series("total-time, this model", [ratio(r["pred_total_ms"], r["total_ms"]) for r in rows])]
    path = os.path.join(out, "migration.svg")
    bar_chart(path, "Predicted ÷ actual, per migration cell", "predicted ÷ actual", labels, series, ylog=True,
              band=(0.9, 1.1, "within 10%"), hlines=[(1, "")], width=1500, height=560, dots=True,
              xlabel="guest, vCPUs, written, dirty rate, link, downtime limit (downtime: actual 0 ms counted as 1)")
    return [path]
