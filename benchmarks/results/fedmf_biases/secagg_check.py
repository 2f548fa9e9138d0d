"""Biased FedMF on ML-100K u1 in plaintext and through secure aggregation (same seed).

Run: OMP_NUM_THREADS=1 python benchmarks/results/fedmf_biases/secagg_check.py WARM [NAME]
(writes secagg_NAME.json, default secagg_u1.json)
The secagg run takes its first WARM rounds over plaintext (FedMFRun.warm_start_rounds, as
``bench fedmf-transport`` does) and the rest through secagg; ``upload="full"`` in both runs.
"""

import sys

from securefed.bench import datasets
from securefed.bench.experiment import FedMFRun, run_fedmf, save_json
from securefed.recsys.fedmf import biased_config

warm = int(sys.argv[1])
split = datasets.load("/work/shared/data/ml-100k", "u1")
cfg = biased_config(upload="full")
plain, _, _ = run_fedmf(split, FedMFRun(config=cfg, seed=0, progress=False))
secure, _, _ = run_fedmf(
    split,
    FedMFRun(config=cfg, transport="secagg", seed=0, progress=False, warm_start_rounds=warm),
)
record = {
    "plaintext": plain,
    "secagg": secure,
    "rmse_difference": secure["rmse"] - plain["rmse"],
    "note": f"rounds 0..{warm - 1} over plaintext (warm start), the last "
    f"{cfg.rounds - warm} through secagg",
}
name = sys.argv[2] if len(sys.argv) > 2 else "u1"
save_json(record, f"benchmarks/results/fedmf_biases/secagg_{name}.json")
print(plain["rmse"], secure["rmse"], secure["rmse"] - plain["rmse"])
