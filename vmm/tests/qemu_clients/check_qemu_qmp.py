#!/usr/bin/env python3
"""Drives a kvmscope control socket with QEMU's own Python QMP library
(`qemu.qmp` from PyPI), unpatched: QMPClient (asyncio), the legacy
QEMUMonitorProtocol, and events. Prints one JSON object with what it saw;
vmm/tests/qemu_clients.rs checks it. Exits non-zero on any failure."""

import asyncio
import json
import sys

from qemu.qmp import QMPClient
from qemu.qmp.legacy import QEMUMonitorProtocol


async def modern(path):
    qmp = QMPClient("kvmscope-test")
    await asyncio.wait_for(qmp.connect(path), 10)
    out = {"greeting": qmp.greeting._raw if qmp.greeting else None}
    out["status"] = await asyncio.wait_for(qmp.execute("query-status"), 10)
    out["version"] = await asyncio.wait_for(qmp.execute("query-version"), 10)
    out["cpus"] = await asyncio.wait_for(qmp.execute("query-cpus-fast"), 10)
    qom = out["cpus"][0]["qom-path"]
    out["stats"] = await asyncio.wait_for(
        qmp.execute(
            "query-stats",
            {"target": "vcpu", "providers": [{"provider": "kvm", "names": ["exits"]}], "vcpus": [qom]},
        ),
        10,
    )
    out["schemas"] = await asyncio.wait_for(qmp.execute("query-stats-schemas", {"provider": "kvm"}), 10)
    try:
        await qmp.execute("no-such-command")
        out["error"] = None
    except Exception as e:  # qemu.qmp raises ExecuteError with the class
        out["error"] = {"type": type(e).__name__, "class": getattr(e, "error_class", None)}
    # Events: subscribe to the sampler's SAMPLE events and take two.
    with qmp.listener() as listener:
        await asyncio.wait_for(qmp.execute("subscribe-samples"), 10)
        events = []
        async for event in listener:
            events.append(event["event"])
            if len(events) == 2:
                break
    out["events"] = events
    # Run-state events, as libvirt follows them: STOP after stop, RESUME after cont.
    with qmp.listener(("STOP", "RESUME")) as listener:
        run_events = []
        for command in ("stop", "cont"):
            await asyncio.wait_for(qmp.execute(command), 10)
            event = await asyncio.wait_for(listener.get(), 10)
            run_events.append(event["event"])
    out["run_events"] = run_events
    await qmp.disconnect()
    return out


def legacy(path):
    mon = QEMUMonitorProtocol(path)
    mon.connect(negotiate=True)
    status = mon.cmd("query-status")
    mon.close()
    return status


def main():
    path = sys.argv[1]
    out = asyncio.run(asyncio.wait_for(modern(path), 60))
    out["legacy"] = legacy(path)
    # qemu.qmp returns its Message objects (mappings) in places.
    print(json.dumps(out, default=dict))


if __name__ == "__main__":
    main()
