"""The choice of the cyclic schedule and server step of the correlated-noise FedMF points.

``python -m securefed.bench.select_correlated_settings`` trains ``dp_biased_config`` under central
``dp`` with each correlation (independent, tree, banded) on ML-100K **u2** (never the u1 test
fold the frontier reports), seed 0, over groups {2, 4}, passes {10, 20} (rounds = groups x
passes) and server steps {1, 2}, at epsilon 1 and 8, and writes
``benchmarks/results/frontier/ftrl_selection_u2.json``
(benchmarks/results/frontier/README_correlated.md reads it).
"""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

from securefed import ClientSampling
from securefed.bench import datasets
from securefed.bench.experiment import FedMFRun, run_fedmf, save_json
from securefed.privacy.correlated import CORRELATIONS
from securefed.recsys.fedmf import dp_biased_config


def main() -> int:
    split = datasets.load("ml-100k", "u2")
    rows, started, load = [], time.perf_counter(), os.getloadavg()[0]
    for groups, passes, lr in itertools.product((2, 4), (10, 20), (1.0, 2.0)):
        for epsilon in (1.0, 8.0):
            for correlation in CORRELATIONS:
                run = FedMFRun(
                    config=dp_biased_config(rounds=groups * passes, server_lr=lr),
                    transport="dp",
                    seed=0,
                    progress=False,
                    sampling=ClientSampling("cyclic", groups=groups),
                    transport_options={
                        "epsilon": epsilon,
                        "correlation": correlation,
                        "groups": groups,
                    },
                )
                record = run_fedmf(split, run)[0]
                rows.append(
                    {
                        "groups": groups,
                        "passes": passes,
                        "server_lr": lr,
                        "epsilon": epsilon,
                        "correlation": correlation,
                        "rmse": record["rmse"],
                    }
                )
                print(rows[-1], flush=True)
    save_json(
        {
            "command": "python -m securefed.bench.select_correlated_settings",
            "split": "u2",
            "load_before": load,
            "seconds": time.perf_counter() - started,
            "rows": rows,
        },
        Path("benchmarks/results/frontier/ftrl_selection_u2.json"),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
