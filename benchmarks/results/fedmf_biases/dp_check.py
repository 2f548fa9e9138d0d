"""Distributed DP at epsilon 8 on ML-100K u1: the DP preset with the given overrides (JSON list).

Run: OMP_NUM_THREADS=1 python benchmarks/results/fedmf_biases/dp_check.py NAME '[{...}, ...]'
[DATA [SEED]]
(the placement and options of ``securefed bench fedmf-dp``: distributed noise over the plaintext
inner transport, clip 1, delta 1e-5, every user every round).
"""

import json
import sys

from securefed.bench import datasets
from securefed.bench.experiment import FedMFRun, run_fedmf, save_json
from securefed.recsys.fedmf import user_level_dp_config

name, settings = sys.argv[1], json.loads(sys.argv[2])
split = datasets.load(sys.argv[3] if len(sys.argv) > 3 else "/work/shared/data/ml-100k", "u1")
seed = int(sys.argv[4]) if len(sys.argv) > 4 else 0
rows = []
for overrides in settings:
    run = FedMFRun(
        config=user_level_dp_config(**overrides),
        transport="dp",
        seed=seed,
        progress=False,
        transport_options={"epsilon": 8.0, "delta": 1e-5, "clip": 1.0, "placement": "distributed"},
    )
    record, _, _ = run_fedmf(split, run)
    rows.append(
        {"overrides": overrides}
        | {
            k: record[k]
            for k in (
                "rmse",
                "mae",
                "epsilon",
                "epsilon_server",
                "noise_multiplier",
                "rounds",
                "seconds",
            )
        }
    )
    print(rows[-1], flush=True)
out = f"benchmarks/results/fedmf_biases/dp_eps8_{name}.json"
save_json({"rows": rows, "data": split.name, "seed": seed}, out)
