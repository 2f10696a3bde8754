"""The published part's generated block of docs/EXPERIMENTS.md: what a
VMM's own stats said at a random moment against the migration started then."""

from experiments_published import PHASED, SETTLE
from experiments_report_migration import pct, rel, table


def block_published(rows):
    out = []
    for r in rows:
        fig = lambda k, scale=1.0, unit="": (  # noqa: E731
            "%s / %s (%s)" % (fmt(r["pred_" + k], scale), fmt(r[k], scale), pct(rel(r["pred_" + k], r[k])))
            if r["pred_" + k] not in ("", None) else "never / %s" % fmt(r[k], scale))
        out.append(("`%s`" % r["workload"], "%.1f s" % r["age_s"], streak(r),
                    "%s / %s" % (r["pred_verdict"], r["verdict"]),
                    fig("transferred", 1e6), fig("total_ms"), fig("downtime_ms"), r["passes"]))
    header = ["workload", "page read after the measurement", "verdict's streak", "verdict, page / actual",
              "MB sent, page / actual",
              "total ms, page / actual", "downtime ms, page / actual", "passes"]
    ages = sorted(r["age_s"] for r in rows)
    steady = [r for r in rows if r["workload"] not in PHASED]
    phased = [r for r in rows if r["workload"] in PHASED]
    overall = score(rows, "cells")
    summary = "\n%s%s" % (overall[0].upper(), overall[1:])
    if phased:
        summary += " (%s; %s)" % (score(steady, "steady cells"), score(phased, "cells whose workload changes phase"))
    settled = [r for r in rows if settled_row(r)]
    if any(r.get("pred_streak") not in ("", None) for r in rows):
        summary += (". Where the page's verdict had held for at least %d measurements in a row (%d of %d cells): %s; "
                    "the page said its verdict was unsettled in %d cells (%d of them phase-changing)"
                    % (SETTLE, len(settled), len(rows), score(settled, "cells"), len(rows) - len(settled),
                       sum(1 for r in rows if not settled_row(r) and r["workload"] in PHASED)))
    summary += (". The page was %.1f-%.1f s old when read. Actual verdict: the sender stopped because "
                "what was left fit the downtime limit (its stop test, which the model predicts), not because "
                "`x-max-rounds` forced the stop; the downtime measured is in its own column.\n"
                % (ages[0], ages[-1]))
    return table(header, out) + summary


def settled_row(r):
    """The page's verdict had held for SETTLE measurements when it was read."""
    return r.get("pred_streak") not in ("", None) and int(r["pred_streak"]) >= SETTLE


def streak(r):
    return "–" if r.get("pred_streak") in ("", None) else str(r["pred_streak"])


def score(rows, what):
    """How often the page was right about `rows`: verdicts, and bytes where both call converging."""
    right = sum(1 for r in rows if r["pred_verdict"] == r["verdict"])
    conv = [r for r in rows if r["verdict"] == "converges" and r["pred_verdict"] == "converges"]
    close = sum(1 for r in conv if abs(rel(r["pred_transferred"], r["transferred"]) or 0) <= 0.10)
    return ("verdict right in %d of %d %s, bytes within 10 %% in %d of %d of them both call converging"
            % (right, len(rows), what, close, len(conv)))


def fmt(x, scale):
    if x in ("", None):
        return "–"
    v = float(x) / scale
    return "%.1f" % v if scale != 1.0 else "%.0f" % v
