"""Where a window's cost to the guest goes: one VM whose vCPU 0 writes
`dirty ws=64M rate=max`; for each dirty log (and none: a plain sleep in place
of the window), a readiness window of 0.5 s and of 2 s, and around it the
guest's own count, the vCPU thread's user and system time (/proc), and the
stall the VMM reports. The work lost is counted from the window's start to
0.3 s after its end, at the pace of the same span just before.

    python3 scripts/stall_probe.py --kvmscope target/release/kvmscope
"""

import argparse
import os
import time

from experiments_stall import guest_ticks, progress
from experiments_vm import Vm

MIB = 1 << 20
AFTER_S = 0.3


def cpu_times(vm):
    """User and system seconds of the VM's vCPU 0 thread."""
    tick = os.sysconf("SC_CLK_TCK")
    return tuple(t / tick for t in guest_ticks(vm))


def probe(binary, mode, window):
    with Vm(binary, "256M", dirty_log=mode) as vm:
        vm.guest("touch size=%d" % (64 * MIB))
        vm.start("dirty ws=%d rate=max for=30s" % (64 * MIB))
        time.sleep(1.0)
        a, ta = progress(vm), cpu_times(vm)
        time.sleep(window + AFTER_S)
        b, tb = progress(vm), cpu_times(vm)
        if mode:
            reported = vm.readiness(False, window)["guest_stall"]["total_ms"] / 1e3
        else:
            time.sleep(window)
            reported = 0.0
        time.sleep(AFTER_S)
        c, tc = progress(vm), cpu_times(vm)
    pace = (b[1] - a[1]) / (b[0] - a[0])
    lost = (c[0] - b[0]) - (c[1] - b[1]) / pace
    print("%-6s window %.1f s: reported %.3f s, lost by the guest's count %.3f s; vCPU user/system s "
          "before %.2f/%.2f, around the window %.2f/%.2f"
          % (mode or "none", window, reported, lost, tb[0] - ta[0], tb[1] - ta[1], tc[0] - tb[0], tc[1] - tb[1]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kvmscope", default="target/release/kvmscope")
    args = ap.parse_args()
    binary = os.path.abspath(args.kvmscope)
    for mode in ("ring", "bitmap", None):
        for window in (0.5, 2.0):
            probe(binary, mode, window)


if __name__ == "__main__":
    main()
