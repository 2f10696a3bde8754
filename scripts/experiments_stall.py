"""The `stall` experiment: what dirty tracking costs a guest, reported by the
VMM against what the guest lost, in the same run.

Each cell runs two VMs at once (one vCPU each): one untracked, one with the
cell's dirty log, both given the same workload; a `query-readiness` window is
taken on the tracked one while both run. Three figures per cell:

- reported: the window's `guest_stall.total_ms` (the VMM's figure);
- time lost: the untracked vCPU thread's user (guest) time less the tracked
  one's over the same span, from /proc (the guest's time taken; not for the
  sweeps, which both run to their end);
- throughput lost: for a writer with a time limit, the tracked guest's
  writes short of the untracked one's, as seconds at the untracked rate;
  for a fixed amount of work (sweeps), how much longer it took;
- work lost, by the guest's own count (guest ABI `progress`, read through
  `query-guest` with no exit): in the tracked VM alone, its pace over the
  lead's second half, before the window, against what it did from the window's start
  to 0.3 s after its end (the faults the window leaves behind), as seconds
  at that pace. One VM, so the other VM's noise is not in it;
- the same on its vCPU thread's clock (schedstat's time on a CPU): the vCPU
  time that did no guest work, leaving out the time the thread waited for a
  CPU while the host ran something else (on two cores, the other VM, the
  VMMs' threads and this script), which the wall-clock figure reads as loss;
  `waited_s` is that extra waiting.

An idle guest and a reader are there to show zero. Four-vCPU cells
(`four_vcpus_cell`): one tracked VM whose vCPUs run a full-speed writer over
the large set, a paced writer, a reader and nothing, a row per vCPU.

Migration cells (`migration_cells`): the same writers in a source that
`kvmscope migrate` moves to a second kvmscope over a 1 Gbit/s link, at most
four passes: the reported stall is `query-migrate`'s `x-guest-stall`, the
work lost is from `x-guest-progress` (the guest's own count over pre-copy
against its untracked pace over the second before the migration).
"""

import json
import os
import statistics
import subprocess
import time

from experiments_migration import Dest
from experiments_vm import Vm, log

MIB = 1 << 20
COLUMNS = ["workload", "what", "dirty_log", "window_s", "reported_s", "counted_s", "time_lost_s", "throughput_lost_s",
           "untracked_work", "tracked_work", "error_vs_time", "error_vs_throughput", "work_lost_s",
           "error_vs_work", "work_lost_on_cpu_s", "error_vs_on_cpu", "waited_s", "repeats"]
# After the window, how long its aftermath (pages left protected) is counted.
AFTER_S = 0.3


def workloads(ws, seconds, large=None):
    """(name, what, command, kind, working set): kind `timed` (work done in
    `seconds`), `fixed` (time to finish), `none` (no work to compare).
    `large`: a second, larger working set for the full-speed writer, whose
    stall (a fault per page) stands well above the guest's own drift."""
    # A sweep of a quarter of the set takes about 1 ms untracked: enough of
    # them to outlast the window (a first version's ended before it began).
    sweeps = max(4, int(seconds * 1000))
    writers = [("random-max", ws)] + ([("random-max-large", large)] if large else [])
    return [
        (name, "random writes over %d MiB, as fast as it can" % (w // MIB),
         "dirty ws=%d rate=max for=%gs" % (w, seconds), "timed", w) for name, w in writers
    ] + [
        ("random-paced", "random writes over %d MiB at 20,000 pages/s" % (ws // MIB),
         "dirty ws=%d rate=20000/s for=%gs" % (ws, seconds), "timed", ws),
        ("sweep", "%d sequential sweeps of %d MiB" % (sweeps, ws // (4 * MIB)),
         "; ".join(["touch size=%d" % (ws // 4)] * sweeps), "fixed", ws),
        ("read", "reads of %d MiB" % (ws // MIB), "; ".join(["read size=%d" % ws] * 20), "none", ws),
        ("idle", "nothing", None, "none", ws),
    ]


def vcpu_task(vm, vcpu=0):
    """/proc's directory of the VM's vCPU thread `vcpu`."""
    task = "/proc/%d/task" % vm.proc.pid
    for tid in os.listdir(task):
        try:
            with open(os.path.join(task, tid, "comm")) as f:
                if f.read().strip() == "vcpu%d" % vcpu:
                    return os.path.join(task, tid)
        except FileNotFoundError:
            pass  # a thread that ended since the listing
    raise RuntimeError("no vcpu%d thread in %s" % (vcpu, task))


def guest_ticks(vm):
    """User (guest) and system time of the VM's vCPU 0 thread, clock ticks."""
    with open(os.path.join(vcpu_task(vm), "stat")) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12])


def on_cpu_s(vm, vcpu=0):
    """Seconds the VM's vCPU thread has run on a CPU (schedstat's first
    field, nanoseconds): its time less the time it waited to be run."""
    with open(os.path.join(vcpu_task(vm, vcpu), "schedstat")) as f:
        return int(f.read().split()[0]) / 1e9


# Bytes of commands per guest-command request (requests are at most 64 KiB).
REQUEST_BYTES = 60_000


def start_all(vm, command, vcpu=0):
    """Queues `command` (commands joined by "; ") on `vcpu`, in requests
    under the limit; the sequence number of its last command."""
    parts, seq = command.split("; "), None
    while parts:
        n, size = 0, 0
        while n < len(parts) and size + len(parts[n]) + 2 <= REQUEST_BYTES:
            size += len(parts[n]) + 2
            n += 1
        seq = vm.start("; ".join(parts[:max(n, 1)]), vcpu=vcpu)
        parts = parts[max(n, 1):]
    return seq


def progress(vm, vcpu=0):
    """The guest's own count on a vCPU, when it was read, whether the vCPU
    was running a command then, and its thread's time on a CPU."""
    g = vm.call("query-guest", vcpus=[vcpu])[0]
    return time.monotonic(), g.get("progress") or 0, g.get("state") == "running", on_cpu_s(vm, vcpu)


def finish(vms, seqs, started):
    """Each VM's last result and how long after `started` it came (polled
    every 10 ms, both VMs in turn)."""
    results, took = [None] * len(vms), [None] * len(vms)
    while None in results:
        for i, (vm, seq) in enumerate(zip(vms, seqs)):
            if results[i] is None:
                last = vm.call("query-guest", vcpus=[0])[0].get("last-result") or {}
                if last.get("seq") == seq:
                    if last["status"] != "ok":
                        raise RuntimeError("guest command %r: %s" % (last["command"], last["status"]))
                    results[i], took[i] = last, time.monotonic() - started
        time.sleep(0.01)
    return results, took


def run_stall(binary, m):
    """Each cell's row (its median) as it ends (experiments.py writes the CSV after each)."""
    for mode in m["stall_modes"]:
        for window in m["stall_windows"]:
            for name, what, command, kind, ws in workloads(m["stall_ws"], m["stall_seconds"],
                                                           m.get("stall_large_ws")):
                runs = [stall_cell(binary, m, mode, window, name, what, command, kind, ws)
                        for _ in range(m.get("stall_repeats", 1))]
                yield median_row(runs)
        for window in m.get("stall_four_windows", []):
            runs = [four_vcpus_cell(binary, m, mode, window) for _ in range(m.get("stall_repeats", 1))]
            yield from (median_row([r[i] for r in runs]) for i in range(len(runs[0])))
    for mode, name in m.get("stall_migrations", []):
        yield migration_cell(binary, m, mode, name)


def four_vcpus_cell(binary, m, mode, window):
    """One tracked VM of four vCPUs, each with its own workload (a
    full-speed writer over the large set, a paced writer over a set of its
    own, a reader, an idle one), a window over all of them: a row per vCPU,
    its share of the window's reply and of the VMM's running total against
    the work its own count says it lost (no untracked twin: eight vCPUs on
    two cores would bury the figures in waiting; the loss on the vCPU's
    clock leaves the waiting out)."""
    ws, large, seconds = m["stall_ws"], m["stall_large_ws"], m["stall_seconds"]
    roles = [("random-max-large", "random writes over %d MiB, as fast as it can" % (large // MIB),
              "dirty offset=0 ws=%d rate=max for=%gs" % (large, seconds)),
             ("random-paced", "random writes over %d MiB at 20,000 pages/s" % (ws // MIB),
              "dirty offset=%d ws=%d rate=20000/s for=%gs" % (large, ws, seconds)),
             # A word a page: 1.3 ms per read of 512 MiB, so 5,000 outlast the cell.
             ("read", "reads of %d MiB" % (large // MIB), "; ".join(["read size=%d" % large] * 5000)),
             ("idle", "nothing", None)]
    memory = large + ws + 64 * MIB
    with Vm(binary, "%dM" % (memory // MIB), dirty_log=mode, vcpus=4) as vm:
        vm.wait_calibrated()
        vm.guest("touch size=%d" % (large + ws))
        for i, (_, _, command) in enumerate(roles):
            if command:
                start_all(vm, command, vcpu=i)
        read = lambda: [progress(vm, i) for i in range(4)]  # noqa: E731
        time.sleep(m["stall_lead"] / 2)
        pace_from = read()
        time.sleep(m["stall_lead"] / 2)
        window_from, total_from = read(), own_stall_s(vm, 4)
        report = vm.readiness(False, window)
        time.sleep(AFTER_S)
        window_to, total_to = read(), own_stall_s(vm, 4)
        time.sleep(m["stall_lead"] / 2)
        pace_to = read()
    rows = []
    for i, (name, what, command) in enumerate(roles):
        reported = report["guest_stall"]["vcpus"][i]["ms"] / 1e3
        counted = round(total_to[i] - total_from[i], 4)
        row = {"workload": "4 vCPUs: %d, %s" % (i, name), "what": what, "dirty_log": mode,
               "window_s": round(report["dirty_rate"]["window_s"], 3), "reported_s": reported, "counted_s": counted}
        if command:
            for key, on_cpu in (("work_lost_s", False), ("work_lost_on_cpu_s", True)):
                row[key] = work_lost(pace_from[i], window_from[i], window_to[i], on_cpu=on_cpu, after=pace_to[i])
            row["waited_s"] = waited(pace_from[i], window_from[i], window_to[i])
        rows.append(with_errors(row))
    log("stall %s 4 vCPUs window %.1fs: counted %s s, work lost %s s"
        % (mode, window, [r["counted_s"] for r in rows], [r.get("work_lost_on_cpu_s") for r in rows]))
    return rows


def migration_cell(binary, m, mode, name):
    """A migration of a writing guest: the stall `query-migrate` reports
    against the work the guest's own count says it lost during pre-copy."""
    _, what, command, _, ws = next(w for w in workloads(m["stall_ws"], 60, m.get("stall_large_ws"))
                                   if w[0] == name)
    memory = max(parse_size(m["stall_memory"]), ws + 64 * MIB)
    src = Vm(binary, "%dM" % (memory // MIB), dirty_log=mode)
    dst = None
    try:
        src.wait_calibrated()
        src.guest("touch size=%d" % ws)
        src.start(command)
        # A second of untracked pace for `before-per-second`; its second
        # half is the pace on the vCPU's clock.
        time.sleep(0.75)
        pace_from = progress(src)
        dst = Dest(binary, like=src)
        time.sleep(0.75)
        start = progress(src)
        cmd = [binary, "migrate", "--socket", src.socket, "--to", dst.uri, "--bandwidth", "1Gbit",
               "--max-downtime", "300ms", "--max-rounds", "4", "--json"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if "{" not in out.stdout:
            raise RuntimeError("kvmscope migrate: %s" % out.stderr[-2000:])
        j = json.loads(out.stdout[out.stdout.index("{"):])
        # Stopped at the end of pre-copy: its count and time on a CPU stand
        # still from there.
        end = progress(src)
    finally:
        if dst is not None:
            dst.close()
        src.close()
    reported = j.get("x-guest-stall", {}).get("total-ms", 0) / 1e3
    p = (j.get("x-guest-progress", {}).get("vcpus") or [{}])[0]
    before, during, units = p.get("before-per-second"), p.get("per-second"), p.get("units")
    precopy = units / during if during and units else None
    lost = (round(max(0.0, (before - during) / before * precopy), 3)
            if before and precopy is not None else None)
    row = {"workload": "migration, " + name, "what": what + "; migrated, 1 Gbit/s", "dirty_log": mode,
           "window_s": round(precopy, 3) if precopy else 0.0, "reported_s": reported, "counted_s": reported, "time_lost_s": None,
           "throughput_lost_s": None, "untracked_work": round(before) if before else None,
           "tracked_work": round(during) if during else None, "work_lost_s": lost,
           "work_lost_on_cpu_s": work_lost(pace_from, start, end, on_cpu=True, ran_to_end=False)}
    log("stall %s migration %s: pre-copy %s s, reported %.3fs, work lost %s s" % (mode, name, row["window_s"],
                                                                               reported, lost))
    return with_errors(row)


def stall_cell(binary, m, mode, window, name, what, command, kind, ws):
    tick = os.sysconf("SC_CLK_TCK")
    # The cell's set, with room for the guest's own pages beside it.
    memory = max(parse_size(m["stall_memory"]), ws + 64 * MIB)
    with Vm(binary, "%dM" % (memory // MIB)) as plain, Vm(binary, "%dM" % (memory // MIB), dirty_log=mode) as tracked:
        tracked.wait_calibrated()
        for vm in (plain, tracked):
            vm.guest("touch size=%d" % ws)
        before = [guest_ticks(vm) for vm in (plain, tracked)]
        started = time.monotonic()
        seqs = [start_all(vm, command) for vm in (plain, tracked)] if command else None
        # The pace before the window: over the lead's second half.
        time.sleep(m["stall_lead"] / 2)
        pace_from = progress(tracked)
        time.sleep(m["stall_lead"] / 2)
        window_from = progress(tracked)
        total_from = own_stall_s(tracked)
        report = tracked.readiness(False, window)
        time.sleep(AFTER_S)
        window_to = progress(tracked)
        total_to = own_stall_s(tracked)
        # The pace after, over as long again: the loss is taken at the mean
        # of the paces before and after, so that a pace drifting steadily
        # (this host's: ~0.1 s per 2 s, docs/EXPERIMENTS.md section 7) is
        # not read as loss or gain.
        time.sleep(m["stall_lead"] / 2)
        pace_to = progress(tracked)
        if seqs:
            results, took = finish((plain, tracked), seqs, started)
        else:
            time.sleep(m["stall_lead"])
        after = [guest_ticks(vm) for vm in (plain, tracked)]
    user = [(a[0] - b[0]) / tick for a, b in zip(after, before)]
    reported = report["guest_stall"]["total_ms"] / 1e3
    counted = round(total_to - total_from, 4)
    row = {"workload": name, "what": what, "dirty_log": mode, "window_s": round(report["dirty_rate"]["window_s"], 3),
           "reported_s": reported, "counted_s": counted, "time_lost_s": round(user[0] - user[1], 3)}
    if kind == "timed":
        work = [r["values"][0] for r in results]
        span = results[0]["host_time_s"]
        row.update(untracked_work=work[0], tracked_work=work[1],
                   throughput_lost_s=round((work[0] - work[1]) / work[0] * span, 3) if work[0] else None)
    elif kind == "fixed":
        # Both run to the end: the one that ends first stops gaining guest
        # time, so the time-based loss means nothing here; the delay does.
        row.update(untracked_work=round(took[0], 3), tracked_work=round(took[1], 3),
                   throughput_lost_s=round(took[1] - took[0], 3), time_lost_s=None)
    row["work_lost_s"] = work_lost(pace_from, window_from, window_to, after=pace_to)
    row["work_lost_on_cpu_s"] = work_lost(pace_from, window_from, window_to, on_cpu=True, after=pace_to)
    row["waited_s"] = waited(pace_from, window_from, window_to)
    log("stall %s %s window %.1fs: reported %.3fs, counted %s s, guest time lost %s s, throughput lost %s s, "
        "work lost %s s (%s s on its CPU clock)"
        % (mode, name, window, reported, row["counted_s"], row["time_lost_s"], row.get("throughput_lost_s"),
           row["work_lost_s"], row["work_lost_on_cpu_s"]))
    return with_errors(row)


def own_stall_s(vm, vcpus=1):
    """Each vCPU's running stall total, as the VMM's own stats say (provider
    `kvmscope`, `guest_stall_ns`: observations so far and their
    aftermaths), seconds; vCPU 0's alone for `vcpus` 1."""
    paths = ["/machine/unattached/device[%d]" % i for i in range(vcpus)]
    r = vm.call("query-stats", target="vcpu", vcpus=paths,
                providers=[{"provider": "kvmscope", "names": ["guest_stall_ns"]}])
    totals = {e["qom-path"]: e["stats"][0]["value"] / 1e9 for e in r}
    values = [totals[p] for p in paths]
    return values[0] if vcpus == 1 else values


def parse_size(text):
    """Bytes in a size such as `256M` or `1G`."""
    units = {"K": 1 << 10, "M": MIB, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def median_row(runs):
    """One row for a cell run several times: each figure's median over the
    runs that have it (the guest's pace drifts from run to run, the stall
    does not); the errors are taken again from the medians."""
    def number(v):
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    row = dict(runs[0])
    # Every figure, including one the first run lacks (None, or absent)
    # and a later run has.
    for k in list(row) + [k for k in COLUMNS if k not in row]:
        if row.get(k) is None or number(row[k]):
            values = [r[k] for r in runs if number(r.get(k))]
            row[k] = round(statistics.median(values), 3) if values else None
    row["repeats"] = len(runs)
    return with_errors(row)


def with_errors(row):
    """`row` with each error set: the VMM's figure against a loss, where
    the loss is above 20 ms (the running total against the guest's own
    count, the window's reply against the two-VM measures)."""
    for err, lost, said in (("error_vs_work", "work_lost_s", "counted_s"),
                            ("error_vs_on_cpu", "work_lost_on_cpu_s", "counted_s"),
                            ("error_vs_time", "time_lost_s", "reported_s"),
                            ("error_vs_throughput", "throughput_lost_s", "reported_s")):
        w = row.get(lost)
        row[err] = round(row[said] / w - 1, 3) if w is not None and w > 0.02 else None
    return row


def work_lost(before, start, end, on_cpu=False, ran_to_end=True, after=None):
    """Seconds of work the guest did not do from `start` to `end` at its pace
    from `before` to `start` (each a `progress` reading), or at the mean of
    that pace and its pace from `end` to `after` when it was still running
    then; None when it had no pace (idle) or its work ended before `end`. `on_cpu`:
    time and pace counted in its vCPU thread's time on a CPU rather than on
    the clock, so that time the thread waited for a CPU (the host's other
    work: on two cores, the other VM, the VMMs' threads, this script) is
    not read as loss; what is left is vCPU time that did no guest work.
    `ran_to_end` False: the vCPU was stopped before `end` (a migration's
    source), its work not ended."""
    at = 3 if on_cpu else 0
    (t0, c0, _), (t1, c1, _), (t2, c2, running) = [(p[at], p[1], p[2]) for p in (before, start, end)]
    if t1 <= t0 or c1 <= c0 or (ran_to_end and not running):
        return None
    pace = (c1 - c0) / (t1 - t0)
    if after is not None and after[2]:
        t3, c3 = after[at], after[1]
        if t3 > t2 and c3 > c2:
            pace = (pace + (c3 - c2) / (t3 - t2)) / 2
    return round(max(0.0, (t2 - t1) - (c2 - c1) / pace), 3)


def waited(before, start, end):
    """Seconds the vCPU thread waited for a CPU from `start` to `end` beyond
    its share of waiting from `before` to `start` (the host's contention
    that the window's span added)."""
    (t0, r0), (t1, r1), (t2, r2) = [(p[0], p[3]) for p in (before, start, end)]
    if t1 <= t0:
        return None
    share = 1 - (r1 - r0) / (t1 - t0)
    return round(((t2 - t1) - (r2 - r1)) - share * (t2 - t1), 3)
