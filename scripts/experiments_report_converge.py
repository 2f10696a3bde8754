"""The converge part's generated block of docs/EXPERIMENTS.md: each throttled
migration cell side by side (what was set, predicted and actual, the
guest's price per vCPU), then the goals of the convergence issue."""

from experiments_report_migration import pct, rel, table


def split(row, key):
    """A per-vCPU column ("985/0") as numbers (None where empty)."""
    return [float(x) if x not in ("", None) else None for x in str(row[key]).split("/")]


def control_pace(rows):
    """The reader's pace during the control cell's migration (nothing throttled)."""
    c = [r for r in rows if r["shape"] == "reader-only"]
    return split(c[0], "during_per_s")[-1] if c else None


def kept(row, control):
    """Each vCPU's progress kept, as "role %" strings; a reader's also
    against the control's pace (in brackets)."""
    roles = str(row["roles"]).split("/")
    cells = []
    for role, k, during in zip(roles, split(row, "kept_pct"), split(row, "during_per_s")):
        text = "%s %s" % (role, "–" if k is None else "%.0f %%" % k)
        if role == "reads" and control and during is not None and row["shape"] != "reader-only":
            text += " (%.0f %%)" % (100 * during / control)
        cells.append(text)
    return ", ".join(cells)


def block_converge(rows):
    control = control_pace(rows)
    out = []
    for r in rows:
        predicted = r["pred_total_ms"] not in ("", None)
        out.append((
            "%s, %s" % (r["shape"], r["mode"]), "`%s`" % r["how"], "%s → %s" % (r["set"], r["end"]),
            "%s / %s (%s)" % (r["pred_total_ms"], r["total_ms"], pct(rel(r["pred_total_ms"], r["total_ms"])))
            if predicted else "– / %s" % r["total_ms"],
            "%.1f / %.1f (%s)" % (r["pred_transferred"] / 1e6, r["transferred"] / 1e6,
                                  pct(rel(r["pred_transferred"], r["transferred"])))
            if predicted else "– / %.1f" % (r["transferred"] / 1e6),
            "%s / %s" % (r["downtime_ms"], r["limit_ms"]),
            "%s / %s" % (r["pred_passes"] if predicted else "–", r["passes"]),
            r["throttled_ms"], kept(r, control)))
    header = ["guest", "--converge", "set first → in force at the end", "total ms, predicted / actual",
              "MB sent, predicted / actual", "downtime / limit, ms", "passes", "vCPU time asleep, ms",
              "guest's progress kept: against untracked (a reader's against the control's migration)"]
    return table(header, out) + "\n" + goals(rows)


def num(x):
    """A CSV figure as a number; None where the cell has none."""
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def amount(what):
    """The figure in a throttle or limit as the row names it ("throttle 93 %",
    "limit 2 MB/s at start"); None for "none" or "none set"."""
    words = str(what).split()
    return num(words[1]) if len(words) > 1 else None


def goals(rows):
    auto = [r for r in rows if r["how"] == "auto"]
    done = [r for r in auto if r["status"] == "completed" and num(r["downtime_ms"]) is not None]
    within_limit = [r for r in done if num(r["downtime_ms"]) <= num(r["limit_ms"])]
    faster = []
    for r in done:
        slow = [o for o in rows if o["how"] == "auto-converge" and o["shape"] == r["shape"] and o["mode"] == r["mode"]
                and o["status"] == "completed"]
        if slow and num(r["total_ms"]) and num(slow[0]["total_ms"]):
            faster.append((r, num(slow[0]["total_ms"]) / num(r["total_ms"])))

    def within_25(r):
        first, last = amount(r["set"]), amount(r["end"])
        return first is not None and last is not None and last > 0 and abs(first / last - 1) <= 0.25
    steady = [r for r in auto if within_25(r)]
    right = [r for r in auto if r["pred_verdict"] == r["verdict"]]
    close = [r for r in auto if all(abs(rel(r["pred_" + k], r[k]) or 0) <= 0.15 for k in ("transferred", "total_ms"))]
    # The readers under a mechanism that throttles only vCPUs that dirty
    # memory: a dirty limit, and `auto` in either mode (on a bitmap VM the
    # throttle of the vCPUs the window saw write, x-cpu-throttle-vcpus).
    control = control_pace(rows)
    spared = [r for r in rows if r["how"] in ("auto", "dirty-limit")]
    readers = [(r, 100 * d / control if control and d is not None else None)
               for r in spared
               for role, d in zip(str(r["roles"]).split("/"), split(r, "during_per_s")) if role == "reads"]
    slept = [r for r in spared
             if all(ms == 0 for role, ms in zip(str(r["roles"]).split("/"), split(r, "throttled_ms"))
                    if role == "reads")]
    lines = [
        ("every non-converging cell completes with `--converge auto`, downtime within its limit",
         "%d of %d" % (len(within_limit), len(auto)), len(within_limit) == len(auto)),
        ("`--converge auto` ≥ 3x faster in total time than `auto-converge` on the same cells",
         ", ".join("%s %.1fx" % (r["shape"], x) for r, x in faster), all(x >= 3 for _, x in faster)),
        ("the throttle set first within 25 % of the one it ends with",
         "%d of %d" % (len(steady), len(auto)), len(steady) == len(auto)),
        ("the throttled prediction: verdict right in every cell",
         "%d of %d" % (len(right), len(auto)), len(right) == len(auto)),
        ("transferred and total time within 15 % in 90 % of cells",
         "%d of %d" % (len(close), len(auto)), len(close) >= 0.9 * len(auto)),
        ("vCPUs that do not dirty memory are not throttled under `--converge auto` or a dirty limit",
         "asleep 0 ms in %d of %d cells" % (len(slept), len(spared)), len(slept) == len(spared)),
        ("... and keep ≥ 99 % of their progress (against the control: a migration that throttles nothing)",
         ", ".join("%s%s %s %.0f %%" % (r["shape"], " (bitmap)" if r["mode"] == "bitmap" else "", r["how"], k)
                   for r, k in readers if k is not None),
         all(k is not None and k >= 99 for _, k in readers)),
    ]
    return table(["goal (issue 22)", "this run", ""],
                 [(g, got, "met" if ok else "**not met**") for g, got, ok in lines])
