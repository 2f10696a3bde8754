"""The migration part: readiness predictions against real live migrations.

Each cell is a fresh source (`kvmscope run --socket --dirty-log bitmap`) that
writes part of its RAM (non-zero or zeros) and may dirty pages on its last
vCPUs; the migration parameters are set (link, downtime limit, and a round
limit so that a guest that never converges still ends), `query-readiness`
predicts with them (exact scan, 0.5 s dirty-rate window), and the guest then
moves to a second `kvmscope run --incoming unix:PATH`. The row holds the
prediction and the outcome field by field, `query-migrate`'s names, and the
destination's `verify` of every page written. The old model (before this
part existed: 8-byte headers per page, 9 bytes per zero page, no setup, stop
or device-state costs, the link's nominal rate) is recomputed from the same
inputs, so that both errors come from one run."""

import math
import os
import subprocess
import tempfile
import time

from experiments_vm import Vm, call, log, shut_down, spawn, unix_listening
from kvmscope_client import Connection

MIB = 1 << 20
PAGE = 4096
LINKS = {"1Gbit": 125_000_000, "10Gbit": 1_250_000_000, "unlimited": 0}
# Rounds after which the source stops whatever is left (x-max-rounds), so
# that cells which never converge still end.
MAX_ROUNDS = 4
# pages/s per dirtying vCPU; "above" dirties at full speed (rate=0) on
# every vCPU but the first.
DIRTY_RATES = {"0": 0, "slow": 2000, "near": 27000, "above": 0}
CALC_TIME = 0.5


class Dest:
    """A `kvmscope run --incoming unix:PATH --socket` child; given `like` (the
    source's Vm), it builds the same VM before it listens, as QEMU's
    `-incoming` builds its machine, so that no slow build (a new memory slot
    can wait seconds for an SRCU grace period on a busy host) falls inside
    a migration's setup."""

    def __init__(self, binary, like=None):
        self.dir = tempfile.mkdtemp(prefix="kvmscope-mig-")
        self.uri = "unix:" + os.path.join(self.dir, "in.sock")
        self.socket = os.path.join(self.dir, "ctl.sock")
        self.log_path = os.path.join(self.dir, "run.log")
        args = [binary, "run", "--incoming", self.uri, "--socket", self.socket, "--sample-interval", "off"]
        args += like.shape if like is not None else []
        with open(self.log_path, "w") as out:
            spawn(self, args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.conn = None
        deadline = time.monotonic() + 30
        while not unix_listening(self.uri[5:]):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the destination did not listen: %s" % self.tail())
            time.sleep(0.005)

    def tail(self):
        with open(self.log_path) as f:
            return f.read()[-2000:]

    def connect(self):
        deadline = time.monotonic() + 30
        while self.conn is None:
            try:
                self.conn = Connection(self.socket, 900)
            except (FileNotFoundError, ConnectionRefusedError):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the destination did not serve: %s" % self.tail())
                time.sleep(0.005)
        return self

    def guest(self, command, vcpu=0):
        return call(self.conn, "guest-command", {"vcpu": vcpu, "command": command, "wait": True})["results"]

    def close(self):
        shut_down(self, self.conn)


def old_model(n, k, rate, bandwidth, downtime):
    """The model before this part (docs/READINESS.md, "old"): (transferred,
    rounds, downtime s, total s, converges)."""
    b = bandwidth or 1.25e9  # it assumed 10 Gbit/s when no link was given
    bytes0 = 4104 * k + 9 * (n - k)
    rounds = [(n, bytes0, bytes0 / b)]
    while True:
        last = rounds[-1]
        d = min(math.ceil(rate * last[2]), n)
        nxt = (d, 4104 * d, 4104 * d / b)
        if nxt[2] <= downtime:
            total = sum(r[1] for r in rounds) + nxt[1]
            return total, len(rounds), nxt[2], sum(r[2] for r in rounds) + nxt[2], True
        if (d >= last[0] and len(rounds) > 1) or len(rounds) >= 30:
            return sum(r[1] for r in rounds), len(rounds), math.inf, math.inf, False
        rounds.append(nxt)


def cells(m):
    """The matrix's cells as dicts."""
    keys = ("memory", "vcpus", "hugepages", "write", "fraction", "dirty", "link", "limit_ms")
    return [dict(zip(keys, c)) for c in m["migration_cells"]]


def run_migration(binary, m):
    """Each cell's row as it ends (experiments.py writes the CSV after each)."""
    for c in cells(m):
        row = migration_cell(binary, c, m["migration_ws"], m["migration_dirty_s"])
        log("migration %-5s %dv hp=%d %-7s %.2f dirty=%-5s %-9s %3d ms: transferred %s/%s B, rounds %s/%s, "
            "downtime %s/%s ms, %s/%s, verify bad %s"
            % (c["memory"], c["vcpus"], c["hugepages"], c["write"], c["fraction"], c["dirty"], c["link"],
               c["limit_ms"], row["pred_transferred"], row["transferred"], row["pred_rounds"], row["rounds"],
               row["pred_downtime_ms"], row["downtime_ms"], row["pred_verdict"], row["verdict"],
               row["verify_bad"]))
        yield row


def workload(c, arena, ws, seconds):
    """(write command, verify command, dirty commands per vCPU)."""
    size = max(int(arena * c["fraction"]) // (2 * MIB), 0) * 2 * MIB
    if size == 0:
        return None, None, {}
    verb = "touch" if c["write"] == "nonzero" else "touch-zero"
    check = "verify" if c["write"] == "nonzero" else "verify-zero"
    dirty = {}
    if c["dirty"] != "0":
        ws = max(min(ws, arena - size - 2 * MIB), 4 * MIB)
        rate = DIRTY_RATES[c["dirty"]]
        who = range(1, c["vcpus"]) if c["dirty"] == "above" and c["vcpus"] > 1 else [c["vcpus"] - 1]
        for v in who:
            pace = "%d/s" % rate if rate else "max"
            dirty[v] = "dirty offset=%d ws=%d rate=%s for=%ds seed=%d" % (size, ws, pace, seconds, v + 1)
    return "%s size=%d" % (verb, size), "%s size=%d" % (check, size), dirty


def migration_cell(binary, c, ws, seconds):
    src = Vm(binary, c["memory"], hugepages=c["hugepages"], dirty_log="bitmap", vcpus=c["vcpus"])
    dst = None
    try:
        write, check, dirty = workload(c, src.arena["size"], ws, seconds)
        if write:
            src.guest(write)
        for v, spec in dirty.items():
            src.wait_running(src.start(spec, vcpu=v), vcpu=v)
        bandwidth = LINKS[c["link"]]
        src.call("migrate-set-parameters", **{"max-bandwidth": bandwidth, "downtime-limit": c["limit_ms"],
                                              "x-max-rounds": MAX_ROUNDS})
        rep = src.readiness(scan=True, calc_time=CALC_TIME if dirty else 0.0)
        dst = Dest(binary, like=src)
        info = migrate(src, dst.uri)
        if info.get("status") != "completed":
            raise RuntimeError("migration %s: %s" % (info.get("status"), info.get("error-desc")))
        dst.connect()
        bad, checked = "", ""
        if check:
            r = dst.guest(check, vcpu=0)[0]
            checked, bad = r["values"][0], r["values"][2]
            if r["status"] != "ok" or bad != 0:
                raise RuntimeError("verify on the destination: %s, %s bad pages" % (r["status"], bad))
        return row_of(c, rep, info, checked, bad, bandwidth)
    finally:
        if dst is not None:
            dst.close()
        src.close()


def migrate(src, uri):
    """Migrates to `uri`; the final `query-migrate`. The destination's socket
    file exists from its bind, a moment before it listens: a refused connect
    fails the migration at once (nothing sent, the guest never stopped), and
    is tried again, bounded."""
    for attempt in range(50):
        src.call("migrate", uri=uri)
        deadline = time.monotonic() + 300
        while True:
            info = src.call("query-migrate")
            if info.get("status") in ("completed", "failed", "cancelled") or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        if info.get("status") != "failed" or "Connection refused" not in info.get("error-desc", ""):
            return info
        time.sleep(0.02)
    return info


def band(rate, bandwidth):
    """The dirty rate as a multiple of the link's page rate (4112 B a page)."""
    link_rate = (bandwidth or 2.4e9) / 4112
    return rate / link_rate


def row_of(c, rep, info, checked, bad, bandwidth):
    p = rep["prediction"]
    pm, ram = p["migrate"], info["ram"]
    n, k = rep["ram"]["pages"], rep["scan"]["nonzero_pages"]
    rate = (rep.get("dirty_rate") or {}).get("pages_per_s", 0.0)
    o_bytes, o_rounds, o_down, o_total, o_conv = old_model(n, k, rate, bandwidth, c["limit_ms"] / 1e3)
    limit = c["limit_ms"]
    converged = info.get("expected-downtime", 0) <= limit
    ms = lambda s: round(s * 1e3, 3) if math.isfinite(s) else ""  # noqa: E731
    return {
        **c, "ram_pages": n, "scan_nonzero": k, "mapped_pages": rep["mapped"]["bytes"] // PAGE,
        "resident_pages": rep["resident"]["pages"],
        "written_pages": (rep.get("written_since_boot") or {}).get("pages", ""),
        "dirty_rate": round(rate, 1), "rate_x_link": round(band(rate, bandwidth), 3),
        "half_window_pages": (rep.get("dirty_rate") or {}).get("half_window_pages", ""),
        "model_rate": round((rep.get("dirty_rate") or {}).get("model_rate") or 0.0, 1),
        "model_ws": (rep.get("dirty_rate") or {}).get("model_working_set") or "",
        "link_from": rep["link"]["from"],
        "pred_transferred": pm["ram"]["transferred"], "transferred": ram["transferred"],
        "pred_duplicate": pm["ram"]["duplicate"], "duplicate": ram["duplicate"],
        "pred_normal": pm["ram"]["normal"], "normal": ram["normal"],
        "pred_rounds": pm["ram"]["dirty-sync-count"], "rounds": ram["dirty-sync-count"],
        "pred_downtime_ms": "" if pm["downtime"] is None else pm["downtime"], "downtime_ms": info.get("downtime"),
        "pred_total_ms": "" if pm["total-time"] is None else pm["total-time"], "total_ms": info.get("total-time"),
        "setup_ms": info.get("setup-time"), "expected_downtime_ms": info.get("expected-downtime"),
        "pred_verdict": "converges" if p["converges"] else "no", "verdict": "converges" if converged else "no",
        "old_transferred": o_bytes, "old_rounds": o_rounds, "old_downtime_ms": ms(o_down), "old_total_ms": ms(o_total),
        "old_verdict": "converges" if o_conv else "no",
        "downtime_bytes": ram.get("downtime-bytes"), "mbps": ram.get("mbps"),
        "verify_pages": checked, "verify_bad": bad,
    }


COLUMNS = ["memory", "vcpus", "hugepages", "write", "fraction", "dirty", "link", "limit_ms",
           "ram_pages", "scan_nonzero", "mapped_pages", "resident_pages", "written_pages", "dirty_rate",
           "rate_x_link", "half_window_pages", "model_rate", "model_ws", "link_from",
           "pred_transferred", "transferred", "pred_duplicate", "duplicate", "pred_normal", "normal",
           "pred_rounds", "rounds", "pred_downtime_ms", "downtime_ms", "pred_total_ms", "total_ms",
           "setup_ms", "expected_downtime_ms", "pred_verdict", "verdict",
           "old_transferred", "old_rounds", "old_downtime_ms", "old_total_ms", "old_verdict",
           "downtime_bytes", "mbps", "verify_pages", "verify_bad"]
