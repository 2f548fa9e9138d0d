"""CPU seconds an idle SuperNode's pulls cost, by pull wait (issue 33).

Starts a SuperLink and one SuperNode (``LoopbackFederation``, warm ClientApp mode, no run
submitted), waits ``--settle`` s, then reads the CPU seconds (user + system, ``/proc``) of every
process in the SuperLink's and the SuperNode's process groups over ``--seconds`` s of idling:
what the node's empty pulls cost both ends, per second. Usage::

    .venv/bin/python benchmarks/results/flower_cost/warm/pull_wait/idle_cost.py \\
        --out benchmarks/results/flower_cost/warm/pull_wait
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def group_cpu(pgid: int) -> float:
    """User + system CPU seconds of the live processes in process group ``pgid``."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields after the name: state ppid pgrp ...
            total += int(fields[11]) + int(fields[12])
    return total / TICK


def measure(wait: float | None, settle: float, seconds: float) -> dict:
    from securefed.flower.loopback import FAST_TASK_POLL, LoopbackFederation
    from securefed.recsys.fedmf_flower import PRELOAD

    with tempfile.TemporaryDirectory(prefix="securefed-idle-") as tmp:
        federation = LoopbackFederation(
            tmp, 1, env=FAST_TASK_POLL, warm_clientapp=PRELOAD, supernode_pull_wait=wait
        )
        with federation:
            time.sleep(settle)
            link, node = federation.processes[0].pid, federation.processes[1].pid
            before = group_cpu(link), group_cpu(node)
            time.sleep(seconds)
            after = group_cpu(link), group_cpu(node)
    row = {
        "node_pull_wait": "Flower 3 s" if wait is None else f"launcher {wait:g} s",
        "seconds": seconds,
        "superlink_cpu_per_s": (after[0] - before[0]) / seconds,
        "supernode_cpu_per_s": (after[1] - before[1]) / seconds,
        "loadavg": os.getloadavg(),
    }
    print(row, flush=True)
    return row


def main() -> int:
    from securefed.records import dumps_record

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--settle", type=float, default=20.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--waits", default="flower,0.1,0.5,flower")
    args = parser.parse_args()
    rows = [
        measure(None if w == "flower" else float(w), args.settle, args.seconds)
        for w in args.waits.split(",")
    ]
    record = {
        "command": " ".join(sys.argv),
        "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
        "rows": rows,
    }
    path = Path(args.out) / "idle_cost.json"
    path.write_text(dumps_record(record, indent=2))
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
