"""Per-message launch cost on a SuperNode's host: Flower 1.42's SuperExec starts a fresh
``flwr-clientapp`` interpreter that imports Flower's ClientApp runtime and the FedMF app's modules
(``PRELOAD``); ``securefed.flower.warm`` forks a parent that imported them once. Alternated,
``--repeats`` times each; wall and CPU seconds of the child (``RUSAGE_CHILDREN``).

    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 .venv/bin/python \\
        benchmarks/results/flower_cost/warm_launch/launch.py \\
        --out benchmarks/results/flower_cost/warm_launch
"""

import argparse
import importlib
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import flwr.supernode.runtime.run_clientapp  # noqa: F401  (the warm parent's imports)

from securefed.flower import warm
from securefed.records import dumps_record
from securefed.recsys.fedmf_flower import PRELOAD

IMPORTS = "import flwr.supernode.runtime.run_clientapp, flwr.supernode.cli.flwr_clientapp; " + (
    "; ".join(f"import {name}" for name in PRELOAD)
)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    for name in PRELOAD:
        importlib.import_module(name)
    rows, load_start = [], os.getloadavg()
    for _ in range(args.repeats):
        cpu, start = _children_cpu(), time.perf_counter()
        subprocess.run([sys.executable, "-c", IMPORTS], check=True)
        rows.append(
            {
                "launch": "fresh interpreter + imports (flwr-clientapp)",
                "wall_s": time.perf_counter() - start,
                "cpu_s": _children_cpu() - cpu,
            }
        )
        cpu, start = _children_cpu(), time.perf_counter()
        os.waitpid(warm.fork_task(lambda: None), 0)
        rows.append(
            {
                "launch": "fork of the warm parent (securefed.flower.warm)",
                "wall_s": time.perf_counter() - start,
                "cpu_s": _children_cpu() - cpu,
            }
        )
        print(rows[-2], rows[-1], flush=True)
    record = {
        "preload": list(PRELOAD),
        "rows": rows,
        "loadavg_start": load_start,
        "loadavg_end": os.getloadavg(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "launch.json").write_text(dumps_record(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
