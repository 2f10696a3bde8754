"""How evenly a dirty limit holds: one ring VM, a full-speed random writer on
each vCPU, every vCPU limited with `set-vcpu-dirty-limit`, then a row of short
`query-readiness` windows; prints each vCPU's dirty rate in every window and
its mean and standard deviation. A limit that holds only on average (a writer
that bursts and then sleeps for longer than a window) shows as windows of 0
beside windows far above the limit.

    python3 scripts/dirty_limit_grain.py --kvmscope target/release/kvmscope
"""

import argparse
import statistics
import time

from experiments_vm import Vm

MIB = 1 << 20


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kvmscope", default="target/release/kvmscope")
    p.add_argument("--vcpus", type=int, default=2)
    p.add_argument("--limit", type=int, default=10, help="MB/s per vCPU (QEMU's MB: 2^20 bytes)")
    p.add_argument("--window", type=float, default=0.25, help="seconds")
    p.add_argument("--windows", type=int, default=16)
    args = p.parse_args()
    with Vm(args.kvmscope, "256M", dirty_log="ring", vcpus=args.vcpus) as vm:
        for v in range(args.vcpus):
            vm.start("dirty ws=96M rate=max for=600s seed=%d" % (v + 1), vcpu=v)
        time.sleep(0.5)
        vm.call("set-vcpu-dirty-limit", **{"dirty-rate": args.limit})
        time.sleep(1.0)
        rates = [[] for _ in range(args.vcpus)]
        for _ in range(args.windows):
            r = vm.readiness(False, args.window)["dirty_rate"]
            for v, pages in enumerate(r["per_vcpu"]):
                rates[v].append(pages * 4096 / r["window_s"] / MIB)
        print("limit %d MB/s, %d windows of %.2f s" % (args.limit, args.windows, args.window))
        for v, xs in enumerate(rates):
            print("vcpu %d MB/s: %s  mean %.2f sd %.2f min %.1f max %.1f" % (
                v, " ".join("%.1f" % x for x in xs), statistics.mean(xs), statistics.pstdev(xs), min(xs), max(xs)))


if __name__ == "__main__":
    main()
