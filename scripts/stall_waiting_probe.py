"""What a window reads as waiting for a CPU on a VM whose vCPUs began to
work just before it: four vCPUs (a full-speed writer over 256 MiB, a writer
of 20,000 pages a second over 64 MiB, a reader, an idle one) started
`--lead` seconds before a 2 s readiness window; per vCPU, the stall the
window reports, the part of it that is waiting for a CPU beyond the usual,
and the guest's pace in the window and the second after it. On two cores
three busy vCPUs wait a third of the time whether or not anyone watches:
with a lead of 1 s the usual must come from the last second, when they
worked, not from the seconds before, when the reader and the paced writer
slept.

    python3 scripts/stall_waiting_probe.py --kvmscope target/release/kvmscope --lead 1 --lead 5
"""

import argparse
import time

from experiments_stall import progress, start_all
from experiments_vm import Vm

MIB = 1 << 20
LARGE, WS = 256 * MIB, 64 * MIB
ROLES = [("writer", "dirty offset=0 ws=%d rate=max for=30s" % LARGE),
         ("paced", "dirty offset=%d ws=%d rate=20000/s for=30s" % (LARGE, WS)),
         ("reader", "; ".join(["read size=%d" % LARGE] * 3000)),
         ("idle", None)]


def pace(a, b):
    return (b[1] - a[1]) / max(b[0] - a[0], 1e-9)


def probe(binary, mode, lead, window):
    with Vm(binary, "%dM" % ((LARGE + WS + 64 * MIB) // MIB), dirty_log=mode, vcpus=4) as vm:
        vm.wait_calibrated()
        vm.guest("touch size=%d" % (LARGE + WS))
        for i, (_, command) in enumerate(ROLES):
            if command:
                start_all(vm, command, vcpu=i)
        time.sleep(lead)
        before = [progress(vm, i) for i in range(4)]
        report = vm.readiness(False, window)
        end = [progress(vm, i) for i in range(4)]
        time.sleep(1.0)
        after = [progress(vm, i) for i in range(4)]
    for i, (role, _) in enumerate(ROLES):
        v = report["guest_stall"]["vcpus"][i]
        waited = v.get("waited_ms")
        print("%-6s lead %.1f s  vCPU %d %-6s  stall %7.1f ms  of it waiting %7s ms  "
              "pace in the window %12.0f/s, the second after %12.0f/s"
              % (mode, lead, i, role, v["ms"], "-" if waited is None else "%.1f" % waited,
                 pace(before[i], end[i]), pace(end[i], after[i])), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kvmscope", default="target/release/kvmscope")
    p.add_argument("--lead", type=float, action="append", help="seconds of work before the window (repeatable)")
    p.add_argument("--dirty-log", action="append", choices=["ring", "bitmap"], help="(repeatable; both by default)")
    p.add_argument("--window", type=float, default=2.0)
    a = p.parse_args()
    for mode in a.dirty_log or ["ring", "bitmap"]:
        for lead in a.lead or [1.0, 5.0]:
            probe(a.kvmscope, mode, lead, a.window)


if __name__ == "__main__":
    main()
