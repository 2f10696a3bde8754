"""The `converge` part (the migration part's throttled cells): guests that
cannot converge by themselves, migrated with each way of making them
converge, side by side.

Each cell is a fresh source (`kvmscope run --socket`, ring or bitmap log)
whose first vCPUs dirty memory faster than the link sends it (a sequential
sweep, a random writer, two random writers) while its last vCPU reads
memory and dirties none; after a lead (the rates settle, the destination
listens) `kvmscope migrate --predict --json --converge HOW` moves it to a
second `kvmscope run --incoming`:

- auto: what the readiness model chose, from the start (a dirty limit on a
  ring VM, a CPU throttle on a bitmap VM);
- dirty-limit: QEMU 8.1+'s, every vCPU limited to `vcpu-dirty-limit`
  (1 MB/s by default) after two periods of dirtying too fast;
- auto-converge: QEMU's blind steps (20 %, then +10 %).

A control cell migrates the same guest with its writers idle (`--converge
off`): the reader's pace during a migration that throttles nothing (the
migration's own traffic shares the host's caches and cores with it).

A row holds the prediction of the throttled migration and the outcome
field by field (`query-migrate`'s names), the throttle set first and the
one in force at the end, and per vCPU: time asleep for the throttle, and
its progress as the guest counts it (`x-guest-progress`) during pre-copy
against its untracked pace (the guest's count read twice through
`query-guest` before any tracking): a writer's with every vCPU running, a
reader's while it runs alone (the writers' memory traffic slows a reader
by half here, so "with the writers running" would credit a throttle that
stops them with speeding the reader up)."""

import json
import subprocess
import threading
import time

from experiments_migration import Dest
from experiments_vm import Vm, call, log
from kvmscope_client import Connection

MIB = 1 << 20
# Bytes of commands per guest-command request (requests are at most 64 KiB).
REQUEST_BYTES = 60_000


def shapes(ws, arena):
    """name -> (vCPUs, {vCPU: (role, command)}): the last vCPU reads the
    whole arena (a word a page, the writers' pages too: reads dirty
    nothing), over and over."""
    sweep = "touch size=%d" % ws
    writer = lambda seed: "dirty ws=%d rate=max for=600s seed=%d" % (ws, seed)  # noqa: E731
    reader = "read size=%d" % arena
    return {
        "sweep": (2, {0: ("sweeps", sweep), 1: ("reads", reader)}),
        "random": (2, {0: ("writes", writer(1)), 1: ("reads", reader)}),
        "two-writers": (3, {0: ("writes", writer(1)), 1: ("writes", writer(2)), 2: ("reads", reader)}),
        # The control: the sweep's memory written once, then nothing to
        # throttle: the reader's pace while a migration moves the same
        # memory over the same link.
        "reader-only": (2, {0: ("wrote", sweep), 1: ("reads", reader)}),
    }


def queue(vm, vcpu, command, repeats):
    """Queues `command` `repeats` times on `vcpu` (a one-off command once)."""
    if command.startswith("dirty"):
        vm.start(command, vcpu=vcpu)
        return
    while repeats > 0:
        n = min(repeats, REQUEST_BYTES // (len(command) + 2))
        vm.call("guest-command", vcpu=vcpu, command="; ".join([command] * n))
        repeats -= n


class Refill:
    """Keeps the readers' queues from running dry for as long as a cell
    lasts: a reader reads the whole arena thousands of times a second, and a
    queue long enough for the slowest migration (30 s and more) would be
    hundreds of thousands of commands, all of them sent in the stop. A
    thread of its own, with its own connection, tops each reader up to
    `LOW + BATCH` commands every 200 ms."""

    LOW, BATCH = 1000, 2000

    def __init__(self, vm, readers, command):
        self.conn = Connection(vm.socket, 60)
        self.readers, self.command = readers, command
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        try:
            while not self.stop.wait(0.2):
                for g in call(self.conn, "query-guest", {"vcpus": self.readers}):
                    if g.get("queued", 0) < self.LOW:
                        call(self.conn, "guest-command",
                             {"vcpu": g["vcpu"], "command": "; ".join([self.command[g["vcpu"]]] * self.BATCH)})
        except (OSError, RuntimeError, ValueError):
            pass  # the VM is going away

    def close(self):
        self.stop.set()
        self.thread.join(5)
        self.conn.sock.close()


def untracked_rates(vm, vcpus, seconds):
    """Each vCPU's progress per second over `seconds`, from the guest's own
    count (two `query-guest` reads)."""
    def counts():
        return time.monotonic(), [g["progress"] for g in vm.call("query-guest", vcpus=list(range(vcpus)))]
    t0, c0 = counts()
    time.sleep(seconds)
    t1, c1 = counts()
    return [(b - a) / (t1 - t0) for a, b in zip(c0, c1)]


def run_converge(binary, m):
    """Each cell's row as it ends (experiments.py writes the CSV after each)."""
    for shape, mode, how in m["converge_cells"]:
        row = converge_cell(binary, m, shape, mode, how)
        log("converge %-11s %-6s %-13s: %s in %s ms (predicted %s), downtime %s ms, %s passes, set %s, end %s, "
            "kept %s %%, throttled %s ms" % (shape, mode, how, row["status"], row["total_ms"], row["pred_total_ms"],
                                              row["downtime_ms"], row["passes"], row["set"], row["end"],
                                              row["kept_pct"], row["throttled_ms"]))
        yield row


def converge_cell(binary, m, shape, mode, how):
    src = Vm(binary, m["converge_memory"], dirty_log=mode, vcpus=3 if shape == "two-writers" else 2)
    vcpus, work = shapes(m["converge_ws"], src.arena["size"])[shape]
    dst = refill = None
    try:
        # Its cost per fault measured first: the calibration VM's sweeps
        # (2-2.7 s on a 2-core host) would lower the untracked paces below,
        # and a migration waits for them in setup.
        src.wait_calibrated()
        # The readers alone first: their own untracked pace, which the
        # writers' memory traffic lowers once they start.
        # A first read of a page maps it (the host's zero page): a reader's
        # first pass runs at half its pace, so one pass comes first.
        readers = [v for v, (role, _) in work.items() if role == "reads"]
        for v in readers:
            src.guest(work[v][1], vcpu=v)
        refill = Refill(src, readers, {v: work[v][1] for v in readers})
        time.sleep(0.3)
        alone = untracked_rates(src, vcpus, m["converge_lead"] / 2)
        for v, (role, command) in work.items():
            if role == "wrote":  # once, before the migration: data to send
                src.guest(command, vcpu=v)
            elif v not in readers:
                queue(src, v, command, m["converge_repeats"])
        time.sleep(0.5)  # every vCPU under way
        untracked = untracked_rates(src, vcpus, m["converge_lead"])
        for v in readers:
            untracked[v] = alone[v]
        dst = Dest(binary, like=src)
        cmd = [binary, "migrate", "--socket", src.socket, "--to", dst.uri, "--bandwidth", m["converge_link"],
               "--max-downtime", "%dms" % m["converge_limit_ms"], "--predict", "--json", "--converge", how]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if "{" not in out.stdout:
            raise RuntimeError("kvmscope migrate: %s" % out.stderr[-2000:])
        j = json.loads(out.stdout[out.stdout.index("{"):])
        return row_of(shape, mode, how, m, work, untracked, j)
    finally:
        if refill is not None:
            refill.close()
        if dst is not None:
            dst.close()
        src.close()


def what_was_set(j):
    """The throttle or limit set before the migration, and the one in force at its end."""
    set_ = j.get("x-converge", {})
    caps, params = set_.get("capabilities", {}), set_.get("parameters", {})
    if caps.get("dirty-limit"):
        mb = params.get("vcpu-dirty-limit", 1)
        at_start = params.get("x-vcpu-dirty-limit-at-start")
        limited = j.get("dirty-limit-ring-full-time") is not None
        return ("limit %s MB/s%s" % (mb, " at start" if at_start else ""),
                "limit %s MB/s" % mb if limited else "none set")
    if caps.get("auto-converge"):
        first = params.get("cpu-throttle-initial", 20)
        at_start = params.get("x-cpu-throttle-at-start")
        end = j.get("cpu-throttle-percentage")
        return ("throttle %s %%%s" % (first, " at start" if at_start else ""),
                "throttle %s %%" % end if end is not None else "none set")
    return "none", "none"


def row_of(shape, mode, how, m, work, untracked, j):
    fields = j.get("x-predicted", {}).get("fields", {})
    pred = lambda k: (fields.get(k) or {}).get("predicted")  # noqa: E731
    ram = j.get("ram", {})
    throttled = {v["cpu-index"]: v["ms"] for v in j.get("x-cpu-throttled", {}).get("vcpus", [])}
    progress = {v["cpu-index"]: v for v in j.get("x-guest-progress", {}).get("vcpus", [])}
    roles, kept, during = [], [], []
    for v in sorted(work):
        roles.append(work[v][0])
        p = progress.get(v, {}).get("per-second")
        during.append("" if p is None else round(p))
        kept.append("" if p is None or untracked[v] <= 0 else round(100 * p / untracked[v], 1))
    set_, end = what_was_set(j)
    limit = m["converge_limit_ms"]
    down = j.get("downtime")
    return {
        "shape": shape, "mode": mode, "how": how, "link": m["converge_link"], "limit_ms": limit,
        "status": j.get("status"), "set": set_, "end": end,
        "pred_verdict": {True: "converges", False: "no"}.get(
            (j.get("x-predicted") or {}).get("converges", {}).get("predicted"), ""),
        "verdict": "converges" if j.get("status") == "completed" and down is not None and down <= limit else "no",
        "pred_transferred": pred("transferred") or "", "transferred": ram.get("transferred"),
        "pred_total_ms": pred("total-time") or "", "total_ms": j.get("total-time"),
        "pred_downtime_ms": pred("downtime") or "", "downtime_ms": down,
        "pred_passes": pred("dirty-sync-count") or "", "passes": ram.get("dirty-sync-count"),
        "throttled_ms": "/".join(str(round(throttled.get(v, 0))) for v in sorted(work)),
        "stall_ms": round(j.get("x-guest-stall", {}).get("total-ms", 0)),
        "roles": "/".join(roles), "untracked_per_s": "/".join(str(round(u)) for u in untracked),
        "during_per_s": "/".join(str(d) for d in during), "kept_pct": "/".join(str(k) for k in kept),
        # The sender's own stop test at its last sync (what it stopped on):
        # what was left, at the last pass's rate.
        "expected_downtime_ms": j.get("expected-downtime"),
    }


COLUMNS = ["shape", "mode", "how", "link", "limit_ms", "status", "set", "end", "pred_verdict", "verdict",
           "pred_transferred", "transferred", "pred_total_ms", "total_ms", "pred_downtime_ms", "downtime_ms",
           "pred_passes", "passes", "throttled_ms", "stall_ms", "roles", "untracked_per_s", "during_per_s",
           "kept_pct", "expected_downtime_ms"]
