"""The `published` part: the migration prediction a VMM publishes in its own
stats (`run --readiness-every`, provider `kvmscope`, what `kvmscope exporter`
shows with no request), read at a random moment, against a real migration
started at that moment.

Each cell is a fresh source (`kvmscope run --socket --dirty-log ring
--readiness-every P`) with the migration parameters set (link, downtime
limit, a round limit so that a guest that never converges still ends), whose
guest writes its working set once and then runs the cell's workload. At a
moment drawn at random (seeded per cell) after the third measurement, the
script reads the VMM's own VM stats (`query-stats`, provider `kvmscope`:
the same values the exporter's page renders, the verdict's streak included)
and at once migrates the guest
to a second `kvmscope run --incoming`. The row holds what the page said
(and how old it was) against what the migration did."""

import random
import time

from experiments_migration import Dest, migrate
from experiments_vm import Vm, log

MIB = 1 << 20
LINK = 125_000_000  # 1 Gbit/s
LIMIT_MS = 300
MAX_ROUNDS = 4


def workloads(ws):
    """name -> the requests (`guest-command` batches) vCPU 0 is sent after
    writing the working set."""
    return {
        "idle": [],
        "slow": ["dirty ws=%d rate=2000/s for=600s" % ws],
        "near": ["dirty ws=%d rate=27000/s for=600s" % ws],
        "above": ["dirty ws=%d rate=max for=600s" % ws],
        # Sweeps go in batches (a request is at most 64 KiB): 16,000 of
        # them, tens of seconds, where 2,000 could end before the migration.
        "sweeps": ["; ".join(["touch size=%d" % ws] * 2000)] * 8,
        # Workloads that change phase, on a beat that is not the period's:
        # what the page says may be the other phase's by the time it is read.
        "phases": ["; ".join(["dirty ws=%d rate=max for=4s; dirty ws=%d rate=2000/s for=4s" % (ws, ws)] * 75)],
        "bursts": ["; ".join(["dirty ws=%d rate=max for=2s; wait for=5s" % ws] * 85)],
    }


# The workloads above whose behaviour changes while they run.
PHASED = ("phases", "bursts")

# Measurements in a row with one verdict (`prediction_verdict_streak`) for
# the page's verdict to count as settled; the script waits for this many
# before its random moment.
SETTLE = 3


def own_stats(vm):
    """The VMM's own VM stats, name -> value."""
    reply = vm.call("query-stats", target="vm", providers=[{"provider": "kvmscope"}])
    return {s["name"]: s["value"] for r in reply for s in r["stats"]}


def run_published(binary, m):
    """Each cell's row as it ends (experiments.py writes the CSV after each)."""
    for i, name in enumerate(m["published_cells"]):
        row = published_cell(binary, m, name, random.Random(i + 1))
        log("published %-6s read %.1f s after the measurement: %s / %s, transferred %s / %s B, total %s / %s ms, "
            "downtime %s / %s ms" % (name, row["age_s"], row["pred_verdict"], row["verdict"], row["pred_transferred"],
                                     row["transferred"], row["pred_total_ms"], row["total_ms"],
                                     row["pred_downtime_ms"], row["downtime_ms"]))
        yield row


def published_cell(binary, m, name, rng):
    every = m["published_every_s"]
    src = Vm(binary, m["published_memory"], dirty_log="ring",
             extra=["--readiness-every", "%gs" % every, "--readiness-window", "%gs" % m["published_window_s"]])
    dst = None
    try:
        src.call("migrate-set-parameters", **{"max-bandwidth": LINK, "downtime-limit": LIMIT_MS,
                                              "x-max-rounds": MAX_ROUNDS})
        ws = m["published_ws"]
        src.guest("touch size=%d" % ws)
        for batch in workloads(ws)[name]:
            src.start(batch)
        # At a random moment once SETTLE measurements have been published,
        # so that the verdict's streak on the page can say "settled".
        deadline = time.monotonic() + (SETTLE + 8) * every
        seen = set()
        while len(seen - {0}) < SETTLE:
            if time.monotonic() > deadline:
                raise RuntimeError("%d readiness measurements published in %g s, not %d"
                                   % (len(seen - {0}), (SETTLE + 8) * every, SETTLE))
            seen.add(own_stats(src).get("readiness_at_ns", 0))
            time.sleep(0.05)
        time.sleep(rng.uniform(0, 2 * every))
        page = own_stats(src)
        age = time.time() - page["readiness_at_ns"] / 1e9
        dst = Dest(binary, like=src)
        info = migrate(src, dst.uri)
        if info.get("status") != "completed":
            raise RuntimeError("migration %s: %s" % (info.get("status"), info.get("error-desc")))
        return row_of(name, m, page, age, info)
    finally:
        if dst is not None:
            dst.close()
        src.close()


def row_of(name, m, page, age, info):
    never = (1 << 64) - 1
    ms = lambda ns: "" if ns >= never else round(ns / 1e6)  # noqa: E731
    ram = info.get("ram", {})
    return {
        "workload": name, "memory": m["published_memory"], "ws_bytes": m["published_ws"],
        "every_s": m["published_every_s"], "window_s": m["published_window_s"], "age_s": round(age, 2),
        "dirty_bytes_per_s": page.get("readiness_dirty_bytes_per_second"),
        "pred_nonzero": page.get("readiness_nonzero"),
        "pred_verdict": "converges" if page.get("prediction_converges") else "no",
        "pred_streak": page.get("prediction_verdict_streak"),
        # Converged: the sender stopped because what was left fit the limit
        # (its stop test, what the model's verdict predicts), not because
        # x-max-rounds forced it; the downtime measured is its own column.
        "verdict": "converges" if info.get("expected-downtime", 0) <= LIMIT_MS else "no",
        "pred_transferred": page.get("prediction_transferred"), "transferred": ram.get("transferred"),
        "pred_total_ms": ms(page.get("prediction_total_time_ns", never)), "total_ms": info.get("total-time"),
        "pred_downtime_ms": ms(page.get("prediction_downtime_ns", never)), "downtime_ms": info.get("downtime"),
        "pred_throttle_pct": page.get("prediction_throttle_percentage"),
        "passes": ram.get("dirty-sync-count"),
    }


COLUMNS = ["workload", "memory", "ws_bytes", "every_s", "window_s", "age_s", "dirty_bytes_per_s", "pred_nonzero",
           "pred_verdict", "pred_streak", "verdict", "pred_transferred", "transferred", "pred_total_ms", "total_ms",
           "pred_downtime_ms", "downtime_ms", "pred_throttle_pct", "passes"]
